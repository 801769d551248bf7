// Staging of hash-ordered tables (stage.h): the staged copy sorted later gives what SortTable
// gives at once; the buffers are reused and trimmed; bad ids are refused while the caller waits.
#include "sparse/stage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <random>
#include <set>

#include "testutil/testutil.h"

namespace savepoint::sparse {
namespace {

using ::savepoint::testing::StatusIs;

constexpr int64_t kRows = 200000;  // ids of 1.6 MB: staged (kStageIdsBytes)

struct Owned {
  std::vector<int64_t> ids;
  std::vector<float> emb;  // 4 floats a row
  std::vector<int64_t> deleted;
  SparseTable View() const {
    const int64_t n = static_cast<int64_t>(ids.size());
    TensorView del;
    if (!deleted.empty()) {
      del = TensorView(deleted.data(), DType::kI64, {static_cast<int64_t>(deleted.size())});
    }
    return SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {n}),
                                  {{"emb", TensorView(emb.data(), DType::kF32, {n, 4})}}, del)
        .value();
  }
};

Owned Random(std::mt19937_64& rng, int64_t rows) {
  Owned t;
  std::set<int64_t> seen;
  while (static_cast<int64_t>(t.ids.size()) < rows) {
    const int64_t id = static_cast<int64_t>(rng() >> 8);
    if (seen.insert(id).second) t.ids.push_back(id);
  }
  for (int64_t id : t.ids) {
    for (int k = 0; k < 4; ++k) t.emb.push_back(static_cast<float>(id % 1000 + k));
  }
  return t;
}

// What an asynchronous save decides (sparse/save.cc, SortAll): staged when large and not in order.
bool IsStaged(const SparseTable& t) { return Stageable(t) && !InStorageOrder(t.ids()); }

class Stage : public ::testing::Test {
 protected:
  void SetUp() override {
    const uint64_t seed = std::random_device{}();
    std::cout << "seed " << seed << "\n";
    rng_.seed(seed);
  }
  std::mt19937_64 rng_;
};

TEST_F(Stage, StagedThenSortedEqualsSortTable) {
  Owned t = Random(rng_, kRows);
  t.deleted = {t.ids[0] + 1, t.ids[1] + 1};
  const Owned original = t;
  ASSERT_TRUE(IsStaged(t.View()));
  CopyBuffers buffers;
  std::vector<Tensor> leased;
  Staged staged;
  SP_ASSERT_OK_AND_ASSIGN(SortedTable s, StageTable(t.View(), {}, 2, &buffers, &leased, &staged));
  EXPECT_TRUE(s.late);
  // The copies are the caller's rows as they lay: the caller may change its own now.
  std::fill(t.ids.begin(), t.ids.end(), 0);
  std::fill(t.emb.begin(), t.emb.end(), -1.0f);
  SP_ASSERT_OK(SortStaged(staged));
  SP_ASSERT_OK_AND_ASSIGN(SortedTable want, SortTable(original.View(), {}, 1));
  ASSERT_EQ(s.ids.nbytes(), want.ids.nbytes());
  EXPECT_EQ(std::memcmp(s.ids.data(), want.ids.data(), s.ids.nbytes()), 0);
  EXPECT_TRUE(std::equal(s.perm.begin(), s.perm.end(), want.perm.begin(), want.perm.end()));
  ASSERT_EQ(s.slices.nbytes(), want.slices.nbytes());
  EXPECT_EQ(std::memcmp(s.slices.data(), want.slices.data(), s.slices.nbytes()), 0);
  ASSERT_EQ(s.deleted.nbytes(), want.deleted.nbytes());
  EXPECT_EQ(std::memcmp(s.deleted.data(), want.deleted.data(), s.deleted.nbytes()), 0);
  ASSERT_EQ(s.deleted_slices.nbytes(), want.deleted_slices.nbytes());
  EXPECT_EQ(
      std::memcmp(s.deleted_slices.data(), want.deleted_slices.data(), s.deleted_slices.nbytes()),
      0);
  // The slot copy gathered through perm is the slot in storage order.
  ASSERT_TRUE(s.gathered[0]);
  const float* copy = reinterpret_cast<const float*>(s.slots[0].data());
  const int64_t* sorted_ids = reinterpret_cast<const int64_t*>(s.ids.data());
  for (int64_t i = 0; i < kRows; i += 997) {
    EXPECT_EQ(copy[s.perm[i] * 4 + 3], static_cast<float>(sorted_ids[i] % 1000 + 3)) << i;
  }
  // Leased: the ids copy, the slot, the sorted ids and the permutation.
  EXPECT_EQ(leased.size(), 4u);
}

TEST_F(Stage, SmallOrSortedTablesAreNotStaged) {
  Owned small = Random(rng_, 1000);
  EXPECT_FALSE(IsStaged(small.View()));
  Owned sorted = Random(rng_, kRows);
  std::sort(sorted.ids.begin(), sorted.ids.end(), KeyLess);
  EXPECT_FALSE(IsStaged(sorted.View()));
}

TEST_F(Stage, IdsOutsideTheRangeAreRefused) {
  Owned t = Random(rng_, kRows);
  CopyBuffers buffers;
  std::vector<Tensor> leased;
  Staged staged;
  const SliceRange half{0, kNumSlices / 2};
  const Status s = StageTable(t.View(), half, 2, &buffers, &leased, &staged).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("lies outside this shard's slices [0, 32768)"), std::string::npos)
      << s.ToString();
}

TEST(CopyBuffersTest, ReusesFitsAndTrims) {
  CopyBuffers b;
  SP_ASSERT_OK_AND_ASSIGN(Tensor x, b.Take(1000));
  EXPECT_EQ(x.nbytes(), 1125u);  // with headroom: a table grown by up to 1/8 reuses it
  std::byte* at = x.data();
  std::vector<Tensor> back;
  back.push_back(std::move(x));
  b.Give(std::move(back));
  EXPECT_EQ(b.free_bytes(), 1125u);
  SP_ASSERT_OK_AND_ASSIGN(Tensor too_big, b.Take(5000));  // more than it holds: new
  EXPECT_NE(too_big.data(), at);
  SP_ASSERT_OK_AND_ASSIGN(Tensor grown, b.Take(1100));  // the table grew: reused
  EXPECT_EQ(grown.data(), at);
  EXPECT_EQ(b.free_bytes(), 0u);
  back.clear();
  back.push_back(std::move(grown));
  back.push_back(std::move(too_big));
  b.Give(std::move(back));
  SP_ASSERT_OK_AND_ASSIGN(Tensor tiny, b.Take(100));  // each free one is over twice that: new
  EXPECT_NE(tiny.data(), at);
  EXPECT_EQ(b.free_bytes(), 1125u + 5625u);
  // Kept up to twice the most one save staged, the oldest freed first.
  b.Trim(3400);
  EXPECT_EQ(b.free_bytes(), 1125u + 5625u);
  b.Trim(3000);  // (the most stays 3400)
  EXPECT_EQ(b.free_bytes(), 1125u + 5625u);
  CopyBuffers c;
  back.clear();
  back.push_back(std::move(tiny));  // 112 bytes
  c.Give(std::move(back));
  c.Trim(0);
  EXPECT_EQ(c.free_bytes(), 0u);
  SP_ASSERT_OK_AND_ASSIGN(Tensor y, c.Take(4000));
  SP_ASSERT_OK_AND_ASSIGN(Tensor z, c.Take(4000));
  back.clear();
  back.push_back(std::move(y));  // older
  back.push_back(std::move(z));
  c.Give(std::move(back));
  c.Trim(2500);  // keep 5000 of the 9000: the older one goes
  EXPECT_EQ(c.free_bytes(), 4500u);
}

}  // namespace
}  // namespace savepoint::sparse
