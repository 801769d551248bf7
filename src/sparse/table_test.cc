// The slice partition, SparseTable validation, State's tables, DirtySet and MakeDelta.
#include <gtest/gtest.h>

#include <vector>

#include "io/mem_fs.h"
#include "savepoint/sparse.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

TEST(SparsePartition, GenSliceMatchesRecIS) {
  // 65536 = 3 * 21845 + 1: the first shard gets one more.
  EXPECT_EQ(GenSlice(0, 3).value(), (SliceRange{0, 21846}));
  EXPECT_EQ(GenSlice(1, 3).value(), (SliceRange{21846, 43691}));
  EXPECT_EQ(GenSlice(2, 3).value(), (SliceRange{43691, 65536}));
  EXPECT_EQ(GenSlice(0, 1).value(), (SliceRange{0, 65536}));
  for (int n : {1, 2, 5, 7, 1000, 65536}) {
    int64_t next = 0;
    for (int i = 0; i < n; ++i) {
      SliceRange r = GenSlice(i, n).value();
      EXPECT_EQ(r.begin, next);
      EXPECT_EQ(r.end - r.begin, 65536 / n + (i < 65536 % n ? 1 : 0));
      next = r.end;
    }
    EXPECT_EQ(next, 65536);
  }
  EXPECT_THAT(GenSlice(0, 0), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(GenSlice(3, 3), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(GenSlice(0, 65537), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SparsePartition, NegativeIdsTakeTheNonNegativeResidue) {
  EXPECT_EQ(SliceOf(0), 0);
  EXPECT_EQ(SliceOf(65537), 1);
  EXPECT_EQ(SliceOf(-1), 65535);
  EXPECT_EQ(SliceOf(-65536), 0);
  EXPECT_EQ(SliceOf(INT64_MIN), 0);
  EXPECT_EQ(SliceOf(INT64_MAX), 65535);
  EXPECT_EQ(ChildOf(int64_t{5} << 52), 5);
  EXPECT_EQ(ChildOf(-1), 4095);
}

TEST(SparseTable, ValidatesIdsAndSlots) {
  std::vector<int64_t> ids = {3, -7, 70000};
  std::vector<float> emb(3 * 4, 1.0f);
  std::vector<float> short_rows(2 * 4);
  TensorView idv(ids.data(), DType::kI64, {3});
  auto t =
      SparseTable::FromViews(idv, {{"embedding", TensorView(emb.data(), DType::kF32, {3, 4})}});
  SP_ASSERT_OK(t.status());
  EXPECT_EQ(t->num_rows(), 3);
  EXPECT_NE(t->FindSlot("embedding"), nullptr);
  EXPECT_EQ(SparseTable::RowBytes(*t->FindSlot("embedding")), 16u);

  auto rows = SparseTable::FromViews(
      idv, {{"embedding", TensorView(short_rows.data(), DType::kF32, {2, 4})}});
  EXPECT_THAT(rows, StatusIs(StatusCode::kInvalidArgument, "slot \"embedding\""));

  std::vector<int64_t> dup = {3, 9, 3};
  auto d = SparseTable::FromViews(TensorView(dup.data(), DType::kI64, {3}), {});
  EXPECT_THAT(d, StatusIs(StatusCode::kInvalidArgument, "id 3 appears twice"));

  std::vector<int32_t> narrow = {1, 2, 3};
  EXPECT_EQ(SparseTable::FromViews(TensorView(narrow.data(), DType::kI32, {3}), {}).status().code(),
            StatusCode::kInvalidArgument);

  std::vector<int64_t> del = {-7};
  auto both = SparseTable::FromViews(idv, {}, TensorView(del.data(), DType::kI64, {1}));
  EXPECT_THAT(both, StatusIs(StatusCode::kInvalidArgument, "both a row and deleted"));

  auto twice = SparseTable::FromViews(idv, {{"a", TensorView(emb.data(), DType::kF32, {3, 4})},
                                            {"a", TensorView(emb.data(), DType::kF32, {3, 4})}});
  EXPECT_THAT(twice, StatusIs(StatusCode::kInvalidArgument));
}

// Ascending ids (by value or in storage order) are checked in one pass: duplicates among them are
// found as well as among ids in any other order.
TEST(SparseTable, DuplicatesInAnyOrderAreFound) {
  for (std::vector<int64_t> ids :
       {std::vector<int64_t>{1, 2, 2, 5}, std::vector<int64_t>{65536, 1, 65537, 65537},
        std::vector<int64_t>{9, 4, 7, 4}}) {
    auto t = SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {4}), {});
    EXPECT_THAT(t, StatusIs(StatusCode::kInvalidArgument, "appears twice")) << ids[1];
  }
}

// IdCheck::kAtSave: the table is built without indexing its ids; the save's sort finds an id
// that appears twice, whatever the order (a sorted table's too), and nothing is committed.
TEST(SparseTable, IdsCheckedAtSaveAreCheckedByTheSave) {
  MemFileSystem mem;
  const IoOptions io{.fs = &mem, .direct_io = false};
  std::vector<float> emb(4 * 2, 1.0f);
  for (std::vector<int64_t> ids :
       {std::vector<int64_t>{9, 4, 7, 4}, std::vector<int64_t>{1, 4, 4, 5}}) {
    auto t = SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {4}),
                                    {{"e", TensorView(emb.data(), DType::kF32, {4, 2})}}, {},
                                    SparseTable::IdCheck::kAtSave);
    SP_ASSERT_OK(t.status());
    State state;
    SP_ASSERT_OK(state.PutTable("emb", std::move(t).value()));
    EXPECT_THAT(SaveSparse(state, "/ck", {}, io),
                StatusIs(StatusCode::kInvalidArgument, "id 4 appears twice"))
        << ids[1];
    EXPECT_FALSE(mem.Exists("/ck"));
  }
  // Other checks are made at once.
  std::vector<int64_t> ids = {1, 2};
  auto rows = SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {2}),
                                     {{"e", TensorView(emb.data(), DType::kF32, {4, 2})}}, {},
                                     SparseTable::IdCheck::kAtSave);
  EXPECT_THAT(rows, StatusIs(StatusCode::kInvalidArgument, "slot \"e\""));
}

TEST(SparseTable, LivesInAStateBesideEntries) {
  std::vector<int64_t> ids = {1, 2};
  State s;
  SP_ASSERT_OK(s.PutValue("step", int64_t{3}));
  SP_ASSERT_OK(s.PutTable(
      "emb", SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {2}), {}).value()));
  EXPECT_EQ(s.PutTable("emb",
                       SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {2}), {}).value())
                .code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(s.PutTable("step",
                       SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {2}), {}).value())
                .code(),
            StatusCode::kAlreadyExists);
  EXPECT_THAT(s.PutValue("emb", int64_t{1}), StatusIs(StatusCode::kAlreadyExists));
  ASSERT_NE(s.FindTable("emb"), nullptr);
  EXPECT_EQ(s.FindTable("emb")->ids()[1], 2);
  State moved = std::move(s);
  EXPECT_EQ(moved.tables().size(), 1u);
  EXPECT_TRUE(moved.EraseTable("emb"));
  EXPECT_EQ(moved.FindTable("emb"), nullptr);
}

TEST(SparseTable, DirtySetAndMakeDelta) {
  std::vector<int64_t> ids = {10, 20, 30};
  std::vector<int32_t> rows = {1, 1, 2, 2, 3, 3};
  SparseTable t = SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {3}),
                                         {{"v", TensorView(rows.data(), DType::kI32, {3, 2})}})
                      .value();
  DirtySet dirty;
  std::vector<int64_t> touch = {30, 10, 40}, erase = {40, 50};
  dirty.Touch(touch);
  dirty.Delete(erase);  // 40 touched, then deleted: only deleted
  EXPECT_EQ(dirty.touched(), (std::vector<int64_t>{10, 30}));
  EXPECT_EQ(dirty.deleted(), (std::vector<int64_t>{40, 50}));
  SP_ASSERT_OK_AND_ASSIGN(SparseTable d, MakeDelta(t, dirty));
  ASSERT_EQ(d.num_rows(), 2);
  EXPECT_EQ(d.ids()[1], 30);
  EXPECT_EQ(reinterpret_cast<const int32_t*>(d.FindSlot("v")->data())[2], 3);
  EXPECT_EQ(d.deleted().size(), 2u);
  std::vector<int64_t> missing = {99};
  EXPECT_THAT(MakeDelta(t, missing, {}), StatusIs(StatusCode::kNotFound));
  dirty.Clear();
  EXPECT_TRUE(dirty.touched().empty());
}

}  // namespace
}  // namespace savepoint
