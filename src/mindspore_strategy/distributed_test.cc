// MindSpore distributed checkpoints without an offline step: loading rank directories into a
// strategy's rank or a ShardLayout, the remove_redundancy save, and exporting a native sharded
// checkpoint as rank files. The source rank files are cut by the transform from a whole model
// (the transform itself is checked against MindSpore in tests/mindspore/).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <set>

#include "engine/box.h"
#include "io/mem_fs.h"
#include "mindspore_strategy/strategy_testutil.h"
#include "savepoint/mindspore.h"
#include "savepoint/mindspore_strategy.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::Layout;

MindSporeStrategy Strategy(std::vector<std::pair<std::string, MindSporeParamLayout>> layouts) {
  return {0, {{"op", 0, {{1}}}}, std::move(layouts)};
}

// dp 2 x mp 2, b optimizer-sharded over the dp axis.
MindSporeStrategy Dp2Mp2() {
  return Strategy({{"w", Layout({2, 2}, {{1}, {-1}})},
                   {"v", Layout({2, 2}, {{-1}, {0}})},
                   {"b", Layout({2, 2}, {{-1}}, 2, 1)}});
}

MindSporeStrategy Mp4() {
  return Strategy({{"w", Layout({4}, {{-1}, {0}})},
                   {"v", Layout({4}, {{0}, {-1}})},
                   {"b", Layout({4}, {{0}})}});
}

State WholeModel() {
  State s;
  const std::vector<std::tuple<std::string, DType, Shape>> model = {
      {"w", DType::kF32, {8, 8}},
      {"v", DType::kBF16, {4, 8}},
      {"b", DType::kF16, {8}},
      {"global_step", DType::kI32, {1}}};
  uint64_t seed = 1;
  for (const auto& [name, dtype, shape] : model) {
    Tensor t = Tensor::Empty(dtype, shape).value();
    testing::FillPattern(t.view(), seed++);
    EXPECT_TRUE(s.Put(name, std::move(t)).ok());
  }
  return s;
}

// A part of a tensor, as its own tensor.
Tensor Slice(const TensorView& whole, const ShardSpec& box) {
  Tensor out = Tensor::Empty(whole.dtype(), box.sizes).value();
  const Shape zero(box.sizes.size(), 0);
  engine::CopyRegion({whole.data(), whole.shape(), box.offsets}, {out.data(), box.sizes, zero},
                     box.sizes, DTypeSize(whole.dtype()));
  return out;
}

void ExpectSameTensor(const TensorView& a, const TensorView& b, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << what;
}

// The tensors of `want` and `got` agree (names, dtypes, shapes, bytes).
void ExpectSameTensors(const State& want, const State& got) {
  std::set<std::string> a, b;
  for (const auto& [n, e] : want.entries()) a.insert(n);
  for (const auto& [n, e] : got.entries()) b.insert(n);
  EXPECT_EQ(a, b);
  for (const auto& [n, e] : want.entries()) {
    if (e.is_tensor() && got.Find(n) != nullptr)
      ExpectSameTensor(e.tensor(), got.Find(n)->tensor(), n);
  }
}

// A counting file system: which files were opened for reading.
class OpenCounter : public ForwardingFileSystem {
 public:
  using ForwardingFileSystem::ForwardingFileSystem;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const FileOptions& o) override {
    std::lock_guard<std::mutex> lock(mu_);
    opened_.insert(p);
    return ForwardingFileSystem::NewRandomAccessFile(p, o);
  }
  bool Opened(const std::string& p) {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_.count(p) > 0;
  }

 private:
  std::mutex mu_;
  std::set<std::string> opened_;
};

class MindSporeDistributedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SP_ASSERT_OK(SaveMindSporeCheckpoint(whole_, "/m/whole/rank_0/whole.ckpt", {}, io_));
    SP_ASSERT_OK(
        WriteMindSporeStrategy(Dp2Mp2(), "/m/src.ckpt", MindSporeStrategyFormat::kProtobuf, io_));
    SP_ASSERT_OK(WriteMindSporeStrategy(Mp4(), "/m/dst.json", MindSporeStrategyFormat::kJson, io_));
    SP_ASSERT_OK(MindSporeTransformCheckpoints("/m/whole", "/m/src", "src",
                                               {.dst_strategy_file = "/m/src.ckpt"}, io_));
  }

  MemFileSystem fs_;
  IoOptions io_{.fs = &fs_};
  State whole_ = WholeModel();
};

TEST_F(MindSporeDistributedTest, RankFormEqualsTheTransformsFile) {
  const MindSporeTransformOptions t{.src_strategy_file = "/m/src.ckpt",
                                    .dst_strategy_file = "/m/dst.json"};
  SP_ASSERT_OK(MindSporeTransformCheckpoints("/m/src", "/m/out", "d", t, io_));
  for (int64_t r = 0; r < 4; ++r) {
    SP_ASSERT_OK_AND_ASSIGN(
        State got,
        LoadMindSporeDistributedRank(
            "/m/src", r, {.src_strategy_file = "/m/src.ckpt", .dst_strategy_file = "/m/dst.json"},
            io_));
    SP_ASSERT_OK_AND_ASSIGN(
        State want, LoadMindSporeCheckpoint(fmt::format("/m/out/rank_{}/d{}.ckpt", r, r), {}, io_));
    ExpectSameTensors(want, got);
  }
  // No destination strategy: the whole model.
  SP_ASSERT_OK_AND_ASSIGN(State all, LoadMindSporeDistributedRank(
                                         "/m/src", 0, {.src_strategy_file = "/m/src.ckpt"}, io_));
  ExpectSameTensors(whole_, all);
  EXPECT_EQ(LoadMindSporeDistributedRank(
                "/m/src", 4,
                {.src_strategy_file = "/m/src.ckpt", .dst_strategy_file = "/m/dst.json"}, io_)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(MindSporeDistributedTest, LayoutFormReadsUnevenBoxesAndOnlyTheFilesItNeeds) {
  // Rank 1 of 3 in a layout MindSpore cannot express: w split 3 ways over columns (uneven), b over
  // rows; v and global_step whole.
  ShardLayout layout;
  SP_ASSERT_OK_AND_ASSIGN(layout["w"], SplitDim({8, 8}, 1, 3, 1));
  SP_ASSERT_OK_AND_ASSIGN(layout["b"], SplitDim({8}, 0, 3, 1));
  layout["v"] = {{4, 8}, {0, 0}, {4, 8}, {}};
  layout["global_step"] = {{1}, {0}, {1}, {}};
  OpenCounter counter(&fs_);
  SP_ASSERT_OK_AND_ASSIGN(
      State got, LoadMindSporeDistributedAlloc(
                     "/m/src", layout, {.src_strategy_file = "/m/src.ckpt"}, {.fs = &counter}));
  for (const auto& [name, spec] : layout) {
    ExpectSameTensor(Slice(whole_.Find(name)->tensor(), spec).view(), got.Find(name)->tensor(),
                     name);
  }
  // w's rows are split over ranks {0, 1} | {2, 3}, v's columns over {0, 2} | {1, 3}, b's rows 2..5
  // are optimizer pieces 0 and 1, held by {0, 2} and {1, 3}: one holder each (the home rank 0
  // when it holds one, else the first) means ranks 0, 1 and 2; rank 3 is never opened.
  EXPECT_TRUE(counter.Opened("/m/src/rank_0/src0.ckpt"));
  EXPECT_FALSE(counter.Opened("/m/src/rank_3/src3.ckpt"));

  // Into caller buffers: a target without a layout entry is the whole tensor.
  State targets;
  SP_ASSERT_OK(targets.Put("v", Tensor::Empty(DType::kBF16, {4, 8}).value()));
  SP_ASSERT_OK(targets.Put("w", Tensor::Empty(DType::kF32, {8, 3}).value()));
  ShardLayout half{{"w", SplitDim({8, 8}, 1, 2, 0).value()}};
  half["w"].sizes = {8, 3};  // a box of its own: columns 0..3
  SP_ASSERT_OK(
      LoadMindSporeDistributed("/m/src", targets, half, {.src_strategy_file = "/m/src.ckpt"}, io_));
  ExpectSameTensor(whole_.Find("v")->tensor(), targets.Find("v")->tensor(), "v");
  ExpectSameTensor(Slice(whole_.Find("w")->tensor(), half["w"]).view(), targets.Find("w")->tensor(),
                   "w");
}

TEST_F(MindSporeDistributedTest, LayoutFormErrorsNameTheParameter) {
  const MindSporeDistributedLoadOptions o{.src_strategy_file = "/m/src.ckpt"};
  auto fails = [&](const ShardLayout& layout, StatusCode code, std::string_view word,
                   const MindSporeDistributedLoadOptions& opts) {
    Result<State> r = LoadMindSporeDistributedAlloc("/m/src", layout, opts, io_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(word), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("/m/src"), std::string::npos) << r.status().ToString();
  };
  fails({{"w", {{8, 9}, {0, 0}, {8, 9}, {}}}}, StatusCode::kInvalidArgument, "\"w\"", o);
  fails({{"nope", {{1}, {0}, {1}, {}}}}, StatusCode::kNotFound, "\"nope\"", o);
  fails({{"w", {{8, 8}, {6, 0}, {4, 8}, {}}}}, StatusCode::kInvalidArgument, "w", o);
  MindSporeDistributedLoadOptions both = o;
  both.dst_strategy_file = "/m/dst.json";
  fails({}, StatusCode::kInvalidArgument, "dst_strategy_file", both);
  // A strategy that says 8 ranks for a directory of 4.
  SP_ASSERT_OK(WriteMindSporeStrategy(Strategy({{"w", Layout({8}, {{0}, {-1}})}}), "/m/liar.ckpt",
                                      MindSporeStrategyFormat::kProtobuf, io_));
  fails({}, StatusCode::kInvalidArgument, "liar.ckpt", {.src_strategy_file = "/m/liar.ckpt"});
}

std::vector<std::string> Names(const State& s) {
  std::vector<std::string> out;
  for (const auto& [n, e] : s.entries()) out.push_back(n);
  return out;
}

TEST_F(MindSporeDistributedTest, RedundancyFreeFilesHoldEachSliceOnce) {
  // Groups (sorted names b, v, w): b and v {0, 2} | {1, 3}, w {0, 1} | {2, 3}; the k-th parameter
  // of a group goes to member k % 2.
  const std::vector<std::vector<std::string>> want = {{"b", "global_step", "w"},
                                                      {"b", "global_step"},
                                                      {"global_step", "v", "w"},
                                                      {"global_step", "v"}};
  for (int64_t r = 0; r < 4; ++r) {
    SP_ASSERT_OK_AND_ASSIGN(
        State local,
        LoadMindSporeCheckpoint(fmt::format("/m/src/rank_{}/src{}.ckpt", r, r), {}, io_));
    const std::string out = fmt::format("/m/rr/rank_{}/r{}.ckpt", r, r);
    SP_ASSERT_OK(SaveMindSporeRedundancyFree(local, "/m/src.ckpt", r, out, {}, io_));
    SP_ASSERT_OK_AND_ASSIGN(State saved, LoadMindSporeCheckpoint(out, {}, io_));
    EXPECT_EQ(Names(saved), want[r]) << r;
    for (const auto& [n, e] : saved.entries())
      ExpectSameTensor(local.Find(n)->tensor(), e.tensor(), n);
  }
  SP_ASSERT_OK_AND_ASSIGN(State local, LoadMindSporeCheckpoint("/m/src/rank_0/src0.ckpt", {}, io_));
  State partial;
  SP_ASSERT_OK(partial.PutView("w", local.Find("w")->tensor()));
  Status s = SaveMindSporeRedundancyFree(partial, "/m/src.ckpt", 0, "/m/x.ckpt", {}, io_);
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound, "\"b\""));
  EXPECT_NE(s.message().find("src.ckpt"), std::string::npos) << s.ToString();
  EXPECT_EQ(SaveMindSporeRedundancyFree(local, "/m/src.ckpt", 4, "/m/x.ckpt", {}, io_).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(MindSporeDistributedTest, ExportOfASavepointShardedCheckpointEqualsTheTransform) {
  // The whole model saved by 2 ranks (w in row halves, the rest replicated), then exported.
  const std::vector<Status> saved = testing::OnRanks(2, [&](Communicator& comm) -> Status {
    ShardSpec half = SplitDim({8, 8}, 0, 2, comm.rank()).value();
    State local;
    SP_RETURN_IF_ERROR(local.Put("w", Slice(whole_.Find("w")->tensor(), half)));
    for (const char* n : {"v", "b", "global_step"}) {
      SP_RETURN_IF_ERROR(local.PutView(n, whole_.Find(n)->tensor()));
    }
    return SaveDistributed(comm, local, {{"w", half}}, "/n/ck", {}, io_);
  });
  for (const Status& s : saved) SP_ASSERT_OK(s);
  SP_ASSERT_OK(
      ExportMindSporeDistributed("/n/ck", "/n/ex", "e", {.dst_strategy_file = "/m/dst.json"}, io_));
  SP_ASSERT_OK(MindSporeTransformCheckpoints("/m/whole", "/m/out", "d",
                                             {.dst_strategy_file = "/m/dst.json"}, io_));
  for (int64_t r = 0; r < 4; ++r) {
    SP_ASSERT_OK_AND_ASSIGN(
        State got, LoadMindSporeCheckpoint(fmt::format("/n/ex/rank_{}/e{}.ckpt", r, r), {}, io_));
    SP_ASSERT_OK_AND_ASSIGN(
        State want, LoadMindSporeCheckpoint(fmt::format("/m/out/rank_{}/d{}.ckpt", r, r), {}, io_));
    ExpectSameTensors(want, got);
  }
  // A strategy that cannot split the tensors writes nothing.
  SP_ASSERT_OK(WriteMindSporeStrategy(Strategy({{"w", Layout({3}, {{0}, {-1}})}}), "/m/bad.ckpt",
                                      MindSporeStrategyFormat::kProtobuf, io_));
  Status s =
      ExportMindSporeDistributed("/n/ck", "/n/bad", "e", {.dst_strategy_file = "/m/bad.ckpt"}, io_);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "\"w\""));
  EXPECT_FALSE(fs_.Stat("/n/bad").ok());
}

}  // namespace
}  // namespace savepoint
