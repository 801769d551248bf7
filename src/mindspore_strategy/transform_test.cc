// MindSporeTransformCheckpoints' progress callback and safetensors output, on an in-memory file
// system (the layouts themselves are checked against MindSpore in tests/mindspore/).
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "io/mem_fs.h"
#include "savepoint/mindspore.h"
#include "savepoint/mindspore_strategy.h"
#include "savepoint/safetensors.h"
#include "testutil/testutil.h"
#include "util/progress.h"

namespace savepoint {
namespace {

// rank_0/m.ckpt holds w (16 x 8 f32) and step; /dst.ckpt splits w over 2 ranks by rows.
void MakeSource(const IoOptions& io) {
  std::vector<float> w(16 * 8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  State s;
  SP_ASSERT_OK(s.PutView("w", TensorView(w.data(), DType::kF32, {16, 8})));
  SP_ASSERT_OK(s.Put("step", Tensor::Empty(DType::kI32, {1}).value()));
  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, "/src/rank_0/m.ckpt", {}, io));
  MindSporeParamLayout l;
  l.dev_matrix = {2};
  l.tensor_map = {{0}, {-1}};
  SP_ASSERT_OK(WriteMindSporeStrategy({0, {{"op", 0, {{1}}}}, {{"w", l}}}, "/dst.ckpt",
                                      MindSporeStrategyFormat::kProtobuf, io));
}

TEST(TransformTest, ProgressCountsDestinationBytesOnceEachAndEndsAtTotal) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs, .io_threads = 2};
  MakeSource(io);
  Progress::SetIntervalForTesting(0);
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  std::atomic<int> inside{0};
  bool overlapped = false;
  MindSporeTransformOptions o{.dst_strategy_file = "/dst.ckpt"};
  o.progress = [&](uint64_t done, uint64_t total) {
    overlapped |= inside.fetch_add(1) != 0;
    calls.emplace_back(done, total);
    inside.fetch_sub(1);
  };
  SP_ASSERT_OK(MindSporeTransformCheckpoints("/src", "/dst", "d", o, io));
  Progress::SetIntervalForTesting(Progress::kIntervalNs);
  ASSERT_FALSE(calls.empty());
  EXPECT_FALSE(overlapped);
  const uint64_t total = 2 * (8 * 8 * 4 + 4);  // two halves of w, and step on each rank
  EXPECT_EQ(calls.back(), std::make_pair(total, total));
  for (size_t i = 1; i < calls.size(); ++i) {
    EXPECT_LE(calls[i - 1].first, calls[i].first);
    EXPECT_EQ(calls[i].second, total);
  }
}

TEST(TransformTest, SafetensorsOutputInMindSporesFlavour) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  MakeSource(io);
  MindSporeTransformOptions o{.dst_strategy_file = "/dst.ckpt"};
  o.output_format = MindSporeTransformFormat::kSafetensors;
  SP_ASSERT_OK(MindSporeTransformCheckpoints("/src", "/dst", "d", o, io));
  SP_ASSERT_OK_AND_ASSIGN(SafetensorsInfo info,
                          InspectSafetensors("/dst/rank_1/d1.safetensors", &fs));
  EXPECT_TRUE(info.mindspore_format);
  EXPECT_EQ(info.raw_metadata, (std::map<std::string, std::string>{{"format", "ms"}}));
  ASSERT_EQ(info.tensors.size(), 2u);
  EXPECT_EQ(info.tensors[1].name, "w");
  EXPECT_EQ(info.tensors[1].shape, (Shape{8, 8}));
  // By rank: the name must end in the format's extension.
  EXPECT_EQ(
      MindSporeTransformCheckpointByRank(0, {{0, "/src/rank_0/m.ckpt"}}, "/x.ckpt", o, io).code(),
      StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace savepoint
