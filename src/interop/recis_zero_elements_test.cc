// Zero-element blocks with INT64_MAX-sized and near-overflow dims in RecIS checkpoints (issue 37:
// all arithmetic on numbers read from a file is checked): slot and dense blocks are safetensors
// tensors (their shapes checked as safetensors' are), a table's slot is the concatenation of its
// shards' blocks along dim 0, and the index and tensorkey.json hold shard counts and slice ranges
// as decimal text. A concatenation whose element count would overflow int64 is Corruption naming
// the block and the table; numbers of 19 digits or more are Corruption naming the block.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "interop/recis_layout.h"
#include "io/mem_fs.h"
#include "savepoint/recis.h"
#include "savepoint/safetensors.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr char kDir[] = "/recis";
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

class RecisZeroElementsTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(fs_.CreateDirs(kDir)); }

  // Table "emb" in `shards` shards, shard s holding ids {s} when `rows` is 1 (none when 0) and a
  // slot "embedding" block of `row_shape` rows, plus a dense block "step" of `dense`; one data file
  // per shard.
  void Build(int shards, int64_t rows, const Shape& row_shape, const Shape& dense) {
    std::string files, blocks;
    for (int s = 0; s < shards; ++s) {
      State st;
      const std::string part = fmt::format("/part_{}_{}", s, shards);
      Tensor ids = Tensor::Zeros(DType::kI64, {rows}).value();
      if (rows == 1) ids.as<int64_t>()[0] = s;
      Shape slot = row_shape;
      slot.insert(slot.begin(), rows);
      SP_ASSERT_OK(st.Put("emb.id" + part, std::move(ids)));
      SP_ASSERT_OK(st.Put("emb.embedding" + part, Tensor::Empty(DType::kF32, slot).value()));
      if (s == 0) SP_ASSERT_OK(st.Put("step^ ", Tensor::Empty(DType::kI64, dense).value()));
      const std::string file = fmt::format("model-{:06}-of-{:06}.safetensors", s, shards);
      SP_ASSERT_OK(SaveSafetensors(st, JoinPath(kDir, file), {.overwrite = true}, {.fs = &fs_}));
      for (const auto& [name, e] : st.entries()) {
        blocks += fmt::format("{}\"{}\":{}", blocks.empty() ? "" : ",", name, s);
      }
      files += fmt::format("{}\"{}\":{}", files.empty() ? "" : ",", file, s);
    }
    SP_ASSERT_OK(fs_.WriteFileSynced(
        JoinPath(kDir, "index"),
        fmt::format(R"({{"file_index":{{{}}},"block_index":{{{}}}}})", files, blocks)));
  }

  Result<RecisCheckpoint> Load() { return LoadRecisCheckpoint(kDir, {}, {.fs = &fs_}); }

  MemFileSystem fs_;
};

TEST_F(RecisZeroElementsTest, ZeroElementsWithInt64MaxDimension) {
  Build(2, 0, {kMax}, {kMax, 0});
  SP_ASSERT_OK_AND_ASSIGN(RecisCheckpoint c, Load());
  const SparseTable* t = c.state.FindTable("emb");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->num_rows(), 0);
  ASSERT_NE(t->FindSlot("embedding"), nullptr);
  EXPECT_EQ(t->FindSlot("embedding")->shape(), (Shape{0, kMax}));
  ASSERT_NE(c.state.FindTensor("step"), nullptr);
  EXPECT_EQ(c.state.FindTensor("step")->shape(), (Shape{kMax, 0}));

  // Rows of no element each, as many rows as shards: [1, 0, 2^63-1] blocks make [2, 0, 2^63-1].
  Build(2, 1, {0, kMax}, {0});
  SP_ASSERT_OK_AND_ASSIGN(c, Load());
  EXPECT_EQ(c.state.FindTable("emb")->FindSlot("embedding")->shape(), (Shape{2, 0, kMax}));
}

// [1, 2^63-1, 0] is a valid block; two of them concatenate to [2, 2^63-1, 0], which is not.
TEST_F(RecisZeroElementsTest, ConcatenationOverflowingInt64IsCorruption) {
  Build(2, 1, {kMax, 0}, {0});
  EXPECT_THAT(Load(), StatusIs(StatusCode::kCorruption,
                               "slot block \"emb.embedding/part_0_2\" of table \"emb\""));
  Build(1, 1, {kMax, 0}, {0});  // one shard: the block itself, which is valid
  SP_ASSERT_OK_AND_ASSIGN(RecisCheckpoint c, Load());
  EXPECT_EQ(c.state.FindTable("emb")->FindSlot("embedding")->shape(), (Shape{1, kMax, 0}));
}

TEST(RecisLayoutHostileTest, NumbersOf19DigitsAreCorruption) {
  for (const char* slice : {"0@9223372036854775807@9223372036854775807", "0@1@18446744073709551616",
                            "-9223372036854775808@0@1"}) {
    EXPECT_THAT(interop::ParseRecisSlice(slice, "key"),
                StatusIs(StatusCode::kCorruption, "bad slice"))
        << slice;
  }
  SP_ASSERT_OK_AND_ASSIGN(interop::RecisSlice s,
                          interop::ParseRecisSlice("0@999999999999999999@999999999999999999", "k"));
  EXPECT_EQ(s.end, 999999999999999999);
  for (const char* part :
       {"part_0_9223372036854775807", "part_9223372036854775806_9223372036854775807",
        "part_0_18446744073709551617", "part_-1_2"}) {
    const std::string index = fmt::format(
        R"({{"file_index":{{"f":0}},"block_index":{{"t.id/{0}":0,"t.s/{0}":0}}}})", part);
    EXPECT_THAT(interop::PlanRecis(index, "index", {}, {}),
                StatusIs(StatusCode::kCorruption, "bad shard part"))
        << part;
  }
  const std::string index = R"({"file_index":{"f":9223372036854775807},"block_index":{"w^ ":)"
                            R"(9223372036854775807}})";
  SP_ASSERT_OK_AND_ASSIGN(interop::RecisPlan p, interop::PlanRecis(index, "index", {}, {}));
  EXPECT_EQ(p.dense.count("w"), 1u);
  EXPECT_THAT(interop::PlanRecis(R"({"file_index":{"f":18446744073709551615},"block_index":{}})",
                                 "index", {}, {}),
              StatusIs(StatusCode::kCorruption, "file_index[\"f\"] is not a file number"));
}

}  // namespace
}  // namespace savepoint
