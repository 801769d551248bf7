// Several boxes of one tensor on one rank (ShardSpec::tensor): saved as boxes of the stored
// tensor, checked for tiling across all ranks' boxes, loaded into boxes again, and carried through
// ValidateLayouts.
#include <gtest/gtest.h>

#include <cstring>

#include "io/mem_fs.h"
#include "savepoint/distributed.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;
using testing::OnRanks;

constexpr int64_t kRows = 8, kCols = 3;

IoOptions Io(FileSystem* fs) { return IoOptions{.fs = fs, .io_threads = 2, .direct_io = false}; }

// The global tensor "w" [8, 3] F32: element (r, c) = 10 * r + c.
float At(int64_t r, int64_t c) { return static_cast<float>(10 * r + c); }

// A box of rows [first, first + rows) of "w", with its values.
Tensor Rows(int64_t first, int64_t rows) {
  Tensor t = Tensor::Empty(DType::kF32, {rows, kCols}).value();
  auto* p = reinterpret_cast<float*>(t.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) p[r * kCols + c] = At(first + r, c);
  }
  return t;
}

::testing::AssertionResult SameRows(const TensorView& got, int64_t first, int64_t rows) {
  Tensor want = Rows(first, rows);
  if (got.shape() == want.shape() && std::memcmp(got.data(), want.data(), want.nbytes()) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "not rows [" << first << ", " << first + rows << ")";
}

ShardSpec RowBox(int64_t first, int64_t rows, std::string tensor) {
  return ShardSpec{.global_shape = {kRows, kCols},
                   .offsets = {first, 0},
                   .sizes = {rows, kCols},
                   .replicas = {},
                   .tensor = std::move(tensor)};
}

// Rank r of 2 holds rows in two interleaved boxes: [2r, 2r + 2) as "w" and [4 + 2r, 6 + 2r) as
// "w.second" (tensor "w"), like a ShardedTensor with two local shards per rank.
struct TwoBoxes {
  std::vector<State> locals{2};
  std::vector<ShardLayout> layouts{2};
  TwoBoxes() {
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(locals[r].Put("w", Rows(2 * r, 2)).ok());
      EXPECT_TRUE(locals[r].Put("w.second", Rows(4 + 2 * r, 2)).ok());
      layouts[r]["w"] = RowBox(2 * r, 2, "");
      layouts[r]["w.second"] = RowBox(4 + 2 * r, 2, "w");
    }
  }
  Status Save(const std::string& path, FileSystem* fs) const {
    for (const Status& s : OnRanks(2, [&](Communicator& c) {
           return SaveDistributed(c, locals[c.rank()], layouts[c.rank()], path, {}, Io(fs));
         })) {
      if (!s.ok()) return s;
    }
    return Status::OK();
  }
};

TEST(SeveralBoxesTest, SavedAsOneTensorAndLoadedWhole) {
  MemFileSystem fs;
  TwoBoxes job;
  SP_ASSERT_OK(ValidateLayouts(job.layouts));
  SP_ASSERT_OK(job.Save("/ckpt", &fs));
  SP_ASSERT_OK_AND_ASSIGN(State all, Load("/ckpt", {}, Io(&fs)));
  EXPECT_EQ(all.FindTensor("w.second"), nullptr);  // the local alias is not stored
  const TensorView* w = all.FindTensor("w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->shape(), (Shape{kRows, kCols}));
  EXPECT_TRUE(SameRows(*w, 0, kRows));
}

TEST(SeveralBoxesTest, LoadedIntoSeveralBoxesOfAnotherLayout) {
  MemFileSystem fs;
  SP_ASSERT_OK(TwoBoxes().Save("/ckpt", &fs));
  // One rank, three boxes of "w" under local names of its own: rows 5..8, 0..1, 1..5.
  State targets;
  ShardLayout layout;
  const std::vector<std::pair<int64_t, int64_t>> boxes = {{5, 3}, {0, 1}, {1, 4}};
  for (size_t i = 0; i < boxes.size(); ++i) {
    const std::string local = "box" + std::to_string(i);
    SP_ASSERT_OK(targets.Put(local, Tensor::Zeros(DType::kF32, {boxes[i].second, kCols}).value()));
    layout[local] = RowBox(boxes[i].first, boxes[i].second, "w");
  }
  SP_ASSERT_OK(LoadDistributed("/ckpt", targets, layout, {}, Io(&fs)));
  for (size_t i = 0; i < boxes.size(); ++i) {
    EXPECT_TRUE(
        SameRows(*targets.FindTensor("box" + std::to_string(i)), boxes[i].first, boxes[i].second))
        << "box " << i;
  }
  SP_ASSERT_OK_AND_ASSIGN(State alloc, LoadDistributedAlloc("/ckpt", layout, {}, Io(&fs)));
  EXPECT_TRUE(testing::StatesEqual(targets, alloc));
  SP_ASSERT_OK_AND_ASSIGN(ReadPlanSummary plan, PlanDistributedLoad("/ckpt", layout, &fs));
  EXPECT_EQ(plan.source_ranks, (std::vector<int>{0, 1}));
}

TEST(SeveralBoxesTest, OverlappingBoxesOfOneRankAreRefused) {
  MemFileSystem fs;
  TwoBoxes job;
  job.layouts[1]["w.second"] = RowBox(0, 2, "w");  // rank 0's first box again
  EXPECT_THAT(ValidateLayouts(job.layouts), StatusIs(StatusCode::kInvalidArgument));
  Status s = job.Save("/ckpt", &fs);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("\"w\""), std::string::npos) << s.ToString();
  EXPECT_FALSE(fs.Stat("/ckpt").ok());
}

TEST(SeveralBoxesTest, ABoxLeftOutIsAGap) {
  MemFileSystem fs;
  TwoBoxes job;
  job.locals[1] = State();
  ASSERT_TRUE(job.locals[1].Put("w", Rows(2, 2)).ok());
  job.layouts[1].erase("w.second");  // rows 6..8 are nobody's
  EXPECT_THAT(ValidateLayouts(job.layouts), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(job.Save("/ckpt", &fs), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SeveralBoxesTest, LoadOfAMissingStoredTensorNamesIt) {
  MemFileSystem fs;
  SP_ASSERT_OK(TwoBoxes().Save("/ckpt", &fs));
  State targets;
  SP_ASSERT_OK(targets.Put("x", Tensor::Zeros(DType::kF32, {2, kCols}).value()));
  ShardLayout layout{{"x", RowBox(0, 2, "v")}};
  Status s = LoadDistributed("/ckpt", targets, layout, {}, Io(&fs));
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(s.message().find("\"v\""), std::string::npos) << s.ToString();
  EXPECT_THAT(LoadDistributedAlloc("/ckpt", layout, {}, Io(&fs)).status(),
              StatusIs(StatusCode::kNotFound));
}

}  // namespace
}  // namespace savepoint
