// Sparse tables whose slots have zero-element rows with huge dims, and hostile numbers in the
// sparse-table description (issue 37: all arithmetic on numbers read from a file is checked).
// A table's slot tensors are [rows, row shape...] in the manifest (each dim at most 2^62), so a
// table of no rows may have rows of [2^62] elements, and one row of [2^62, 0]; a delta chain whose
// merge would make a shape the format cannot hold ([2, 2^62, 0]) is Corruption naming the chain
// link, the table and the slot.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "format/endian.h"
#include "format/manifest.h"
#include "io/mem_fs.h"
#include "savepoint/sparse.h"
#include "sparse/stored.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr int64_t k2p62 = int64_t{1} << 62;

// Table "emb" of `ids` with slot "wide" F32 of rows of `row_shape` (no element in any row unless
// the shape says so) and slot "count" I64 [rows].
SparseTable Table(const std::vector<int64_t>& ids, const Shape& row_shape) {
  const int64_t rows = static_cast<int64_t>(ids.size());
  Tensor id = Tensor::Empty(DType::kI64, {rows}).value();
  for (int64_t i = 0; i < rows; ++i) id.as<int64_t>()[i] = ids[i];
  Shape wide = row_shape;
  wide.insert(wide.begin(), rows);
  std::vector<std::pair<std::string, Tensor>> slots;
  slots.emplace_back("wide", Tensor::Zeros(DType::kF32, wide).value());
  slots.emplace_back("count", Tensor::Zeros(DType::kI64, {rows}).value());
  return SparseTable::FromTensors(std::move(id), std::move(slots)).value();
}

class SparseZeroElementsTest : public ::testing::Test {
 protected:
  // Saves the table as a full checkpoint at `path`, or as a delta on `base`.
  Status SaveTable(SparseTable t, const std::string& path, const std::string& base = "") {
    State s;
    SP_RETURN_IF_ERROR(s.PutTable("emb", std::move(t)));
    SparseSaveOptions o;
    o.base = base;
    return SaveSparse(s, path, o, io_);
  }
  Result<State> LoadTable(const std::string& path) { return LoadSparse(path, {}, io_); }

  MemFileSystem fs_;
  IoOptions io_{.fs = &fs_};
};

TEST_F(SparseZeroElementsTest, ZeroRowsOfHugeRowShapes) {
  for (const Shape& row : {Shape{k2p62}, Shape{k2p62, k2p62}, Shape{0, k2p62}}) {
    SCOPED_TRACE(ShapeToString(row));
    SP_ASSERT_OK(SaveTable(Table({}, row), "/full"));
    SP_ASSERT_OK(SaveTable(Table({}, row), "/delta", "/full"));
    for (const char* path : {"/full", "/delta"}) {
      SP_ASSERT_OK_AND_ASSIGN(State s, LoadTable(path));
      const SparseTable* t = s.FindTable("emb");
      ASSERT_NE(t, nullptr) << path;
      EXPECT_EQ(t->num_rows(), 0);
      Shape want = row;
      want.insert(want.begin(), 0);
      EXPECT_EQ(t->FindSlot("wide")->shape(), want) << path;
    }
    SP_ASSERT_OK(fs_.RemoveAll("/full"));
    SP_ASSERT_OK(fs_.RemoveAll("/delta"));
  }
}

// One row of [2^62, 0] is a valid [1, 2^62, 0] slot; a delta adding a second row would make
// [2, 2^62, 0] (2^63 elements before the zero), which no tensor can have.
TEST_F(SparseZeroElementsTest, MergeToAnInvalidShapeIsCorruption) {
  SP_ASSERT_OK(SaveTable(Table({3}, {k2p62, 0}), "/full"));
  SP_ASSERT_OK(SaveTable(Table({5}, {k2p62, 0}), "/delta", "/full"));
  SP_ASSERT_OK_AND_ASSIGN(State base, LoadTable("/full"));
  EXPECT_EQ(base.FindTable("emb")->FindSlot("wide")->shape(), (Shape{1, k2p62, 0}));
  EXPECT_THAT(LoadTable("/delta"),
              StatusIs(StatusCode::kCorruption,
                       "checkpoint /delta: table \"emb\": slot \"wide\": the merged rows make the "
                       "invalid shape [2, 4611686018427387904, 0]"));
  // A delta replacing the row merges to one row again.
  SP_ASSERT_OK(fs_.RemoveAll("/delta"));
  SP_ASSERT_OK(SaveTable(Table({3}, {k2p62, 0}), "/delta", "/full"));
  SP_ASSERT_OK_AND_ASSIGN(State merged, LoadTable("/delta"));
  EXPECT_EQ(merged.FindTable("emb")->FindSlot("wide")->shape(), (Shape{1, k2p62, 0}));
}

// The description's numbers: the chain depth and the base's checkpoint id.
TEST_F(SparseZeroElementsTest, HugeNumbersInTheDescriptionAreCorruption) {
  SP_ASSERT_OK(SaveTable(Table({}, {k2p62}), "/full"));
  SP_ASSERT_OK_AND_ASSIGN(std::string bytes, fs_.ReadFile("/full/MANIFEST", 1 << 26));
  SP_ASSERT_OK_AND_ASSIGN(format::Manifest m, format::DecodeManifest(bytes, "m"));
  const Json desc = m.values.FindValue(format::kSparseValueName)->as_json();
  const std::vector<std::pair<Json, std::string>> cases = {
      {INT64_MAX, "depth is not an integer"},
      {UINT64_MAX, "depth is not an integer"},
      {INT64_MIN, "depth is not an integer"},
      {1e300, "depth is not an integer"},
  };
  for (const auto& [depth, message] : cases) {
    SCOPED_TRACE(depth.dump());
    Json d = desc;
    d["depth"] = depth;
    m.values.Erase(format::kSparseValueName);
    SP_ASSERT_OK(m.values.PutValue(std::string(format::kSparseValueName), Value::FromJson(d)));
    bool found = false;
    EXPECT_THAT(sparse::DecodeDesc(m, "checkpoint /full", &found),
                StatusIs(StatusCode::kCorruption, message));
  }
  Json d = desc;
  d["depth"] = 1;
  d["base"] = {{"path", "/b"}, {"checkpoint_id", "ffffffffffffffff"}};
  d["tables"][0]["deleted"] = d["tables"][0]["ids"];
  d["tables"][0]["deleted_slices"] = d["tables"][0]["slices"];
  for (format::TensorRecord& t : m.tensors) {
    if (t.name.ends_with("/ranks")) t.shape = {1, 6};  // a delta's ranks tensor
  }
  m.values.Erase(format::kSparseValueName);
  SP_ASSERT_OK(m.values.PutValue(std::string(format::kSparseValueName), Value::FromJson(d)));
  bool found = false;
  SP_ASSERT_OK_AND_ASSIGN(sparse::Desc back, sparse::DecodeDesc(m, "checkpoint /full", &found));
  EXPECT_EQ(back.base_id, UINT64_MAX);
  for (const char* id : {"1ffffffffffffffff", "-000000000000001", "+fffffffffffffff"}) {
    d["base"]["checkpoint_id"] = id;
    m.values.Erase(format::kSparseValueName);
    SP_ASSERT_OK(m.values.PutValue(std::string(format::kSparseValueName), Value::FromJson(d)));
    EXPECT_THAT(sparse::DecodeDesc(m, "checkpoint /full", &found),
                StatusIs(StatusCode::kCorruption, "checkpoint_id"))
        << id;
  }
}

}  // namespace
}  // namespace savepoint
