// Description format 1 stays readable: tests/data/sparse_v1/ was written by the last build that
// wrote format 1 (generator: tests/data/make_sparse_v1.cc). Its full checkpoint, its delta and its
// 3-rank save load exactly as any number of shards, a format 2 delta chains onto the format 1
// base, and compaction of a format 1 chain writes format 2 with the same rows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "io/mem_fs.h"
#include "savepoint/sparse.h"
#include "sparse/chain.h"
#include "testutil/testutil.h"

namespace savepoint::sparse {
namespace {

// The ids and slot formulas of tests/data/make_sparse_v1.cc.
const std::vector<int64_t> kFullIds = {5,       65541,  -1,     -65536,  7,     70000,
                                       1 << 20, 123456, 999999, -424242, 32768, 40000,
                                       65535,   131071, 3,      17};
const std::vector<int64_t> kTouched = {5, 70000, 555555};
const std::vector<int64_t> kDeleted = {-1, 32768};
float Emb(int64_t id, int version, int k) {
  return static_cast<float>(id % 1000) + static_cast<float>(version) * 0.5f + k;
}
int64_t Count(int64_t id, int version) { return id * 7 + version; }

// id -> version of its row.
using Versions = std::map<int64_t, int>;

Versions FullVersions() {
  Versions v;
  for (int64_t id : kFullIds) v[id] = 0;
  return v;
}

Versions DeltaVersions() {
  Versions v = FullVersions();
  for (int64_t id : kTouched) v[id] = 1;
  for (int64_t id : kDeleted) v.erase(id);
  return v;
}

std::string Fixture(std::string_view name) {
  return fmt::format("{}/sparse_v1/{}", SAVEPOINT_TEST_DATA, name);
}

IoOptions Io(FileSystem* fs = nullptr) { return {.fs = fs, .io_threads = 2, .direct_io = false}; }

// Loads table "emb" of `path` as `shards` shards and expects exactly the rows of `want`, each
// shard holding only ids of its slices, in storage order.
void ExpectRows(const std::string& path, const Versions& want, int shards, FileSystem* fs) {
  Versions got;
  for (int i = 0; i < shards; ++i) {
    SCOPED_TRACE(fmt::format("{} as shard {} of {}", path, i, shards));
    SP_ASSERT_OK_AND_ASSIGN(State s,
                            LoadSparse(path, {.shard_id = i, .shard_num = shards}, Io(fs)));
    const SparseTable* t = s.FindTable("emb");
    ASSERT_NE(t, nullptr);
    const SliceRange range = GenSlice(i, shards).value();
    const float* emb = reinterpret_cast<const float*>(t->FindSlot("embedding")->data());
    const int64_t* cnt = reinterpret_cast<const int64_t*>(t->FindSlot("count")->data());
    for (int64_t r = 0; r < t->num_rows(); ++r) {
      const int64_t id = t->ids()[r];
      ASSERT_TRUE(range.Contains(SliceOf(id))) << id;
      ASSERT_EQ(want.count(id), 1u) << "unexpected id " << id;
      const int version = want.at(id);
      for (int k = 0; k < 3; ++k) EXPECT_EQ(emb[r * 3 + k], Emb(id, version, k)) << id;
      EXPECT_EQ(cnt[r], Count(id, version)) << id;
      got[id] = version;
    }
  }
  EXPECT_EQ(got, want) << path << " as " << shards << " shards";
}

TEST(SparseFormatV1Test, FixturesAreFormat1) {
  for (const char* name : {"full", "delta", "dist3"}) {
    SP_ASSERT_OK_AND_ASSIGN(std::vector<Link> chain, OpenChain(Fixture(name), {}, Io()));
    for (const Link& l : chain) EXPECT_EQ(l.desc.format, 1) << l.path;
  }
}

TEST(SparseFormatV1Test, FullDeltaAndThreeRankSavesLoadAsAnyNumberOfShards) {
  for (int shards : {1, 2, 3, 5, 65536}) {
    if (shards == 65536) {  // every slice its own shard: spot-check the slices that hold ids
      for (int64_t id : kFullIds) {
        const int i = static_cast<int>(SliceOf(id));
        SP_ASSERT_OK_AND_ASSIGN(State s,
                                LoadSparse(Fixture("dist3"), {.shard_id = i, .shard_num = 65536}));
        EXPECT_GE(s.FindTable("emb")->num_rows(), 1) << id;
      }
      continue;
    }
    ExpectRows(Fixture("full"), FullVersions(), shards, nullptr);
    ExpectRows(Fixture("delta"), DeltaVersions(), shards, nullptr);
    ExpectRows(Fixture("dist3"), FullVersions(), shards, nullptr);
  }
}

TEST(SparseFormatV1Test, Format2DeltaOnAFormat1BaseAndCompactionWriteFormat2) {
  testing::TempDir dir;
  std::filesystem::copy(Fixture("full"), dir.Sub("full"));
  std::vector<int64_t> ids = {7, 131071, 888888};
  std::vector<float> emb;
  std::vector<int64_t> cnt;
  for (int64_t id : ids) {
    for (int k = 0; k < 3; ++k) emb.push_back(Emb(id, 2, k));
    cnt.push_back(Count(id, 2));
  }
  std::vector<int64_t> deleted = {65541};
  State s;
  SP_ASSERT_OK(s.PutTable(
      "emb", SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {3}),
                                    {{"embedding", TensorView(emb.data(), DType::kF32, {3, 3})},
                                     {"count", TensorView(cnt.data(), DType::kI64, {3})}},
                                    TensorView(deleted.data(), DType::kI64, {1}))
                 .value()));
  SparseSaveOptions o;
  o.base = dir.Sub("full");
  SP_ASSERT_OK(SaveSparse(s, dir.Sub("delta2"), o));
  SP_ASSERT_OK_AND_ASSIGN(std::vector<Link> chain, OpenChain(dir.Sub("delta2"), {}, Io()));
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(chain[0].desc.format, 2);
  EXPECT_EQ(chain[1].desc.format, 1);
  Versions want = FullVersions();
  for (int64_t id : ids) want[id] = 2;
  want.erase(65541);
  for (int shards : {1, 3, 4}) ExpectRows(dir.Sub("delta2"), want, shards, nullptr);

  SP_ASSERT_OK(CompactSparse(Fixture("delta"), dir.Sub("compact"), {}, {}, Io()));
  SP_ASSERT_OK_AND_ASSIGN(chain, OpenChain(dir.Sub("compact"), {}, Io()));
  ASSERT_EQ(chain.size(), 1u);
  EXPECT_EQ(chain[0].desc.format, 2);
  for (int shards : {1, 2, 7}) ExpectRows(dir.Sub("compact"), DeltaVersions(), shards, nullptr);
}

}  // namespace
}  // namespace savepoint::sparse
