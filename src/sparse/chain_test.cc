// Incremental (delta) saves of sparse tables: chains applied on load, compaction, the errors of a
// broken chain, corruption, and a randomized property test of inserts, updates and deletions over
// many saves, each saved by N shards and loaded by M, against a reference map.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/sparse.h"
#include "testutil/sparse_tables.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr int64_t kDim = 4;

// id -> its row: an embedding of kDim floats, and a version counter.
using Ref = std::map<int64_t, std::pair<std::vector<float>, int64_t>>;

std::pair<std::vector<float>, int64_t> Row(int64_t id, int64_t version) {
  std::vector<float> emb;
  for (int64_t k = 0; k < kDim; ++k) emb.push_back(static_cast<float>(id % 977 + k) + version);
  return {emb, version};
}

IoOptions Io(FileSystem* fs) { return {.fs = fs, .io_threads = 2, .direct_io = false}; }

// A table "emb" (slots "embedding" F32 and "version" I64) of the ids of `ref` that `keep` selects,
// with `deleted`.
SparseTable TableOf(const Ref& ref, const std::function<bool(int64_t)>& keep,
                    const std::vector<int64_t>& deleted = {}) {
  std::vector<int64_t> ids;
  for (const auto& [id, row] : ref) {
    if (keep(id)) ids.push_back(id);
  }
  auto emb = [&](int64_t id, std::span<std::byte> row) {
    std::memcpy(row.data(), ref.at(id).first.data(), kDim * 4);
  };
  auto ver = [&](int64_t id, std::span<std::byte> row) {
    std::memcpy(row.data(), &ref.at(id).second, 8);
  };
  return testing::MakeTable(
      ids, {{"embedding", DType::kF32, kDim, emb}, {"version", DType::kI64, -1, ver}}, deleted);
}

Ref RefOf(const SparseTable& t) {
  Ref out;
  const float* emb = reinterpret_cast<const float*>(t.FindSlot("embedding")->data());
  const int64_t* ver = reinterpret_cast<const int64_t*>(t.FindSlot("version")->data());
  for (int64_t i = 0; i < t.num_rows(); ++i) {
    out[t.ids()[i]] = {std::vector<float>(emb + i * kDim, emb + (i + 1) * kDim), ver[i]};
  }
  return out;
}

// Saves "emb" from `n` thread ranks, each with the rows of its slices: all of `ref`, or, for a
// delta on `base`, the `touched` ids plus `deleted`.
Status SaveRanks(int n, const std::string& path, const Ref& ref, FileSystem* fs,
                 const std::string& base = "", const std::set<int64_t>& touched = {},
                 const std::vector<int64_t>& deleted = {}) {
  auto comms = NewThreadCommunicators(n);
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const SliceRange range = GenSlice(r, n).value();
      auto mine = [&](int64_t id) {
        return range.Contains(SliceOf(id)) && (base.empty() || touched.count(id) > 0);
      };
      std::vector<int64_t> my_deleted;
      for (int64_t id : deleted) {
        if (range.Contains(SliceOf(id))) my_deleted.push_back(id);
      }
      State local;
      st[r] = local.PutTable("emb", TableOf(ref, mine, my_deleted));
      SparseSaveOptions o{.base = base};
      o.save.chunk_bytes = 4096;
      if (st[r].ok()) st[r] = SaveSparseDistributed(*comms[r], local, {}, path, o, Io(fs));
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : st) SP_RETURN_IF_ERROR(s);
  return Status::OK();
}

// Loads "emb" of `path` as `m` shards; their union.
Result<Ref> LoadShards(const std::string& path, int m, FileSystem* fs) {
  Ref all;
  for (int i = 0; i < m; ++i) {
    SP_ASSIGN_OR_RETURN(State s, LoadSparse(path, {.shard_id = i, .shard_num = m}, Io(fs)));
    const SparseTable* t = s.FindTable("emb");
    if (t == nullptr) return NotFoundError("no table emb");
    const SliceRange range = GenSlice(i, m).value();
    for (int64_t id : t->ids()) {
      if (!range.Contains(SliceOf(id)))
        return InternalError(fmt::format("id {} on shard {}", id, i));
    }
    Ref part = RefOf(*t);
    all.insert(part.begin(), part.end());
  }
  return all;
}

// A base and two deltas: inserts, updates, deletions (one re-inserted later).
class ChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int64_t id = -300; id < 300; id += 3) ref_[id * 1009] = Row(id * 1009, 0);
    SP_ASSERT_OK(SaveRanks(2, "/ck/base", ref_, &mem_));
    std::set<int64_t> touched;
    std::vector<int64_t> deleted;
    int i = 0;
    for (auto it = ref_.begin(); it != ref_.end(); ++i) {
      if (i % 5 == 0) {
        deleted.push_back(it->first);
        it = ref_.erase(it);
        continue;
      }
      if (i % 3 == 0) {
        it->second = Row(it->first, 1);
        touched.insert(it->first);
      }
      ++it;
    }
    for (int64_t id = 1; id < 40; ++id) {
      ref_[id] = Row(id, 1);
      touched.insert(id);
    }
    SP_ASSERT_OK(SaveRanks(3, "/ck/d1", ref_, &mem_, "/ck/base", touched, deleted));
    readded_ = deleted[0];
    ref_[readded_] = Row(readded_, 2);
    std::vector<int64_t> deleted2 = {1, 2};
    ref_.erase(1);
    ref_.erase(2);
    SP_ASSERT_OK(SaveRanks(1, "/ck/d2", ref_, &mem_, "/ck/d1", {readded_}, deleted2));
  }

  MemFileSystem mem_;
  Ref ref_;
  int64_t readded_ = 0;
};

TEST_F(ChainTest, LoadsTheChainIntoAnyShardCount) {
  for (int m : {1, 2, 3, 5}) {
    SP_ASSERT_OK_AND_ASSIGN(Ref got, LoadShards("/ck/d2", m, &mem_));
    EXPECT_TRUE(got == ref_) << m << " shards";
  }
  SP_ASSERT_OK_AND_ASSIGN(std::vector<SparseChainLink> chain, SparseChain("/ck/d2", Io(&mem_)));
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0].depth, 2);
  EXPECT_EQ(chain[2].path, "/ck/base");
  EXPECT_EQ(chain[2].depth, 0);
}

TEST_F(ChainTest, CompactionFoldsTheChain) {
  SP_ASSERT_OK(CompactSparse("/ck/d2", "/ck/compact", {}, {}, Io(&mem_)));
  SP_ASSERT_OK_AND_ASSIGN(std::vector<SparseChainLink> chain,
                          SparseChain("/ck/compact", Io(&mem_)));
  EXPECT_EQ(chain.size(), 1u);
  SP_ASSERT_OK_AND_ASSIGN(Ref got, LoadShards("/ck/compact", 2, &mem_));
  EXPECT_TRUE(got == ref_);
  // The chain is untouched, and a delta on the compacted base works.
  SP_ASSERT_OK_AND_ASSIGN(Ref again, LoadShards("/ck/d2", 1, &mem_));
  EXPECT_TRUE(again == ref_);
  ref_[7] = Row(7, 9);
  SP_ASSERT_OK(SaveRanks(2, "/ck/d3", ref_, &mem_, "/ck/compact", {7}));
  SP_ASSERT_OK_AND_ASSIGN(Ref d3, LoadShards("/ck/d3", 4, &mem_));
  EXPECT_TRUE(d3 == ref_);
  EXPECT_TRUE(ShouldCompact(9, 1, 100));
  EXPECT_FALSE(ShouldCompact(2, 10, 100));
  EXPECT_TRUE(ShouldCompact(2, 60, 100));
}

// The number of data files of the checkpoint at `path`.
size_t DataFiles(const std::string& path, FileSystem* fs) {
  size_t n = 0;
  for (const FileInfo& f : fs->ListDir(path).value()) n += f.name.starts_with("data-") ? 1 : 0;
  return n;
}

TEST_F(ChainTest, StreamingCompactionWritesPartsThatLoadAsTheChain) {
  // About 8 KiB of rows: a part of 1 KiB means several parts, each its own data file.
  SparseSaveOptions o;
  SaveStats stats;
  o.save.stats = &stats;
  uint64_t last = 0, total = 0;
  o.save.progress = [&](uint64_t done, uint64_t all) {
    EXPECT_GE(done, last);
    last = done;
    total = all;
  };
  SP_ASSERT_OK(CompactSparse("/ck/d2", "/ck/parts", o, {}, Io(&mem_), 1024));
  EXPECT_GT(DataFiles("/ck/parts", &mem_), 4u);
  EXPECT_EQ(last, total);
  EXPECT_EQ(stats.bytes, total);
  EXPECT_GT(stats.bytes, 0u);
  SP_ASSERT_OK(CompactSparse("/ck/d2", "/ck/one", {}, {}, Io(&mem_), 0));
  EXPECT_EQ(DataFiles("/ck/one", &mem_), 1u);
  for (const char* path : {"/ck/parts", "/ck/one"}) {
    SP_ASSERT_OK_AND_ASSIGN(std::vector<SparseChainLink> chain, SparseChain(path, Io(&mem_)));
    EXPECT_EQ(chain.size(), 1u);
    for (int m : {1, 3}) {
      SP_ASSERT_OK_AND_ASSIGN(Ref got, LoadShards(path, m, &mem_));
      EXPECT_TRUE(got == ref_) << path << " as " << m << " shards";
    }
  }
  const Ref ref_before = ref_;
  // In place (as the manager compacts), then a delta on the result.
  SparseSaveOptions over;
  over.save.overwrite = true;
  SP_ASSERT_OK(CompactSparse("/ck/parts", "/ck/parts", over, {}, Io(&mem_), 2048));
  ref_[7] = Row(7, 9);
  SP_ASSERT_OK(SaveRanks(2, "/ck/d3", ref_, &mem_, "/ck/parts", {7}));
  SP_ASSERT_OK_AND_ASSIGN(Ref d3, LoadShards("/ck/d3", 2, &mem_));
  EXPECT_TRUE(d3 == ref_);
  // An existing destination without overwrite is refused before anything is written; a lower
  // link of the chain even with it (the deltas above it would break); shards are for ranks.
  EXPECT_THAT(CompactSparse("/ck/d2", "/ck/one", {}, {}, Io(&mem_), 1024),
              StatusIs(StatusCode::kAlreadyExists, "compact /ck/d2 into /ck/one"));
  EXPECT_THAT(CompactSparse("/ck/d2", "/ck/d1", over, {}, Io(&mem_), 1024),
              StatusIs(StatusCode::kInvalidArgument, "dst is link 1 of src's chain"));
  SP_ASSERT_OK_AND_ASSIGN(Ref still, LoadShards("/ck/d2", 1, &mem_));
  EXPECT_TRUE(still == ref_before);
  EXPECT_THAT(CompactSparse("/ck/d2", "/ck/x", {.shard_id = 0, .shard_num = 1}, {}, Io(&mem_)),
              StatusIs(StatusCode::kInvalidArgument, "shard_id / shard_num"));
}

TEST(SparseCompact, DenseTensorsValuesAndAKeyTravelWithTheFirstPart) {
  MemFileSystem mem;
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(32, 'c'));
  Ref ref;
  for (int64_t id = 0; id < 3000; id += 7) ref[id * 65537] = Row(id * 65537, 0);
  State state;
  SP_ASSERT_OK(state.PutTable("emb", TableOf(ref, [](int64_t) { return true; })));
  SP_ASSERT_OK(state.PutTable("empty", TableOf(ref, [](int64_t) { return false; })));
  SP_ASSERT_OK_AND_ASSIGN(Tensor w, Tensor::Empty(DType::kF32, {3, 5}));
  for (int i = 0; i < 15; ++i) w.as<float>()[i] = 0.5f * i;
  SP_ASSERT_OK_AND_ASSIGN(Tensor scalar, Tensor::Empty(DType::kI64, {}));
  scalar.as<int64_t>()[0] = 42;
  SP_ASSERT_OK(state.Put("model.w", std::move(w)));
  SP_ASSERT_OK(state.Put("scalar", std::move(scalar)));
  SP_ASSERT_OK(state.PutValue("step", int64_t{7}));
  state.metadata() = Json{{"run", "r1"}};
  SparseSaveOptions o;
  o.save.key = key;
  SP_ASSERT_OK(SaveSparse(state, "/ck/base", o, Io(&mem)));
  ref[65537 * 7] = Row(65537 * 7, 1);
  State delta;
  SP_ASSERT_OK(delta.PutTable("emb", TableOf(ref, [](int64_t id) { return id == 65537 * 7; })));
  SP_ASSERT_OK(delta.PutValue("step", int64_t{8}));
  SP_ASSERT_OK(delta.Put("model.w", Tensor::Empty(DType::kF32, {3, 5}).value()));
  o.base = "/ck/base";
  SP_ASSERT_OK(SaveSparse(delta, "/ck/delta", o, Io(&mem)));
  o.base.clear();
  LoadOptions lo;
  lo.key = key;
  SP_ASSERT_OK(CompactSparse("/ck/delta", "/ck/full", o, lo, Io(&mem), 4096));
  EXPECT_GT(DataFiles("/ck/full", &mem), 1u);
  SparseLoadOptions back_o{.load = lo};
  SP_ASSERT_OK_AND_ASSIGN(State back, LoadSparse("/ck/full", back_o, Io(&mem)));
  EXPECT_TRUE(RefOf(*back.FindTable("emb")) == ref);
  EXPECT_EQ(back.FindTable("empty")->num_rows(), 0);
  EXPECT_EQ(back.FindTensor("model.w")->shape(), (Shape{3, 5}));
  EXPECT_EQ(back.FindTensor("scalar"), nullptr);  // the delta's dense tensors are src's
  EXPECT_EQ(back.FindValue("step")->as_int(), 8);
  EXPECT_FALSE(back.metadata().contains("run"));  // src is the delta
  EXPECT_THAT(LoadSparse("/ck/full", {}, Io(&mem)), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(ChainTest, BatchedLoadHandsEachTableInSliceOrder) {
  Ref got;
  std::vector<std::string> names;
  std::optional<int64_t> previous;  // ids arrive in storage order, (slice, id) ascending
  const SliceRange range = GenSlice(1, 2).value();
  auto sink = [&](const std::string& table, SparseTable batch) {
    names.push_back(table);
    for (int64_t id : batch.ids()) {
      EXPECT_TRUE(range.Contains(SliceOf(id))) << id;
      if (previous) {
        EXPECT_TRUE(SliceOf(*previous) < SliceOf(id) ||
                    (SliceOf(*previous) == SliceOf(id) && *previous < id))
            << *previous << " then " << id;
      }
      previous = id;
    }
    Ref part = RefOf(batch);
    got.insert(part.begin(), part.end());
    return Status::OK();
  };
  SparseLoadOptions o{.shard_id = 1, .shard_num = 2, .rename = {{"emb", "table"}}, .dense = false};
  SP_ASSERT_OK_AND_ASSIGN(State rest, LoadSparseBatches("/ck/d2", sink, o, 512, Io(&mem_)));
  EXPECT_TRUE(rest.entries().empty());
  EXPECT_GT(names.size(), 2u);
  EXPECT_EQ(names.front(), "table");
  SP_ASSERT_OK_AND_ASSIGN(State whole, LoadSparse("/ck/d2", o, Io(&mem_)));
  EXPECT_TRUE(got == RefOf(*whole.FindTable("table")));

  int calls = 0;
  auto failing = [&](const std::string&, SparseTable) {
    ++calls;
    return ResourceExhaustedError("the table is full");
  };
  Status s = LoadSparseBatches("/ck/d2", failing, {}, 512, Io(&mem_)).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted, "sparse batched load /ck/d2"));
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(LoadSparseBatches("/ck/d2", nullptr, {}, 512, Io(&mem_)),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(ChainTest, MissingBaseIsNamed) {
  SP_ASSERT_OK(DeleteCheckpoint("/ck/d1", &mem_));
  Status s = LoadShards("/ck/d2", 1, &mem_).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(s.message().find("delta chain link /ck/d2 -> /ck/d1: the base is missing"),
            std::string::npos)
      << s.ToString();
}

TEST_F(ChainTest, ReplacedBaseIsRefused) {
  State other;
  SP_ASSERT_OK(other.PutTable("emb", TableOf(ref_, [](int64_t) { return true; })));
  SparseSaveOptions o;
  o.save.overwrite = true;
  SP_ASSERT_OK(SaveSparse(other, "/ck/base", o, Io(&mem_)));
  Status s = LoadShards("/ck/d2", 2, &mem_).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "delta chain link /ck/d1 -> /ck/base"));
  EXPECT_NE(s.message().find("the base was replaced"), std::string::npos) << s.ToString();
}

TEST_F(ChainTest, GapInTheChainIsRefused) {
  // d1 replaced by a full checkpoint: d2's link names it, but it is not what d2 was saved on.
  SparseSaveOptions o;
  o.save.overwrite = true;
  State full;
  SP_ASSERT_OK(full.PutTable("emb", TableOf(ref_, [](int64_t) { return true; })));
  SP_ASSERT_OK(SaveSparse(full, "/ck/d1", o, Io(&mem_)));
  Status s = LoadShards("/ck/d2", 1, &mem_).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "/ck/d2 -> /ck/d1"));
}

TEST_F(ChainTest, DeltaOfAnotherTableOrSlotIsRefused) {
  State other;
  SP_ASSERT_OK(other.PutTable("items", TableOf(ref_, [](int64_t id) { return id == 7; })));
  Status s = SaveSparse(other, "/ck/bad", {.base = "/ck/d2"}, Io(&mem_));
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("a delta of table \"items\", which its base does not have"),
            std::string::npos)
      << s.ToString();
  std::vector<int64_t> ids = {7};
  std::vector<double> wide(kDim);
  std::vector<int64_t> ver = {1};
  State dtype;
  SP_ASSERT_OK(dtype.PutTable(
      "emb", SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {1}),
                                    {{"embedding", TensorView(wide.data(), DType::kF64, {1, kDim})},
                                     {"version", TensorView(ver.data(), DType::kI64, {1})}})
                 .value()));
  s = SaveSparse(dtype, "/ck/bad", {.base = "/ck/d2"}, Io(&mem_));
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("slot \"embedding\" is F64 rows of [4] in the delta, F32"),
            std::string::npos)
      << s.ToString();
  EXPECT_FALSE(mem_.Exists("/ck/bad"));
}

TEST_F(ChainTest, CorruptChainFailsACompactionInPartsAndABatchedLoad) {
  const std::string path = "/ck/base/data-00000-00000.spd";
  std::string bytes = mem_.ReadFile(path, 1 << 30).value();
  for (size_t i = 4096; i < bytes.size(); i += 4096) bytes[i + 100] ^= 0x40;
  SP_ASSERT_OK(mem_.RemoveFile(path));
  SP_ASSERT_OK(mem_.WriteFileSynced(path, bytes));
  const Status c = CompactSparse("/ck/d2", "/ck/bad", {}, {}, Io(&mem_), 1024);
  EXPECT_THAT(c, StatusIs(StatusCode::kCorruption, "checkpoint /ck/base"));
  EXPECT_FALSE(mem_.Exists("/ck/bad"));
  auto keep = [](const std::string&, SparseTable) { return Status::OK(); };
  EXPECT_THAT(LoadSparseBatches("/ck/d2", keep, {}, 1024, Io(&mem_)),
              StatusIs(StatusCode::kCorruption, "checkpoint /ck/base"));
}

TEST_F(ChainTest, CorruptBaseChunkIsNamed) {
  // Flip one byte of every data file of the base's embedding rows: the load names the chunk.
  for (const std::string f : {"data-00000-00000.spd", "data-00001-00000.spd"}) {
    const std::string path = "/ck/base/" + f;
    std::string bytes = mem_.ReadFile(path, 1 << 30).value();
    for (size_t i = 4096; i < bytes.size(); i += 4096) bytes[i + 100] ^= 0x40;
    SP_ASSERT_OK(mem_.RemoveFile(path));
    SP_ASSERT_OK(mem_.WriteFileSynced(path, bytes));
  }
  Status s = LoadShards("/ck/d2", 2, &mem_).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "checkpoint /ck/base"));
  EXPECT_NE(s.message().find("savepoint.sparse/0.emb/"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("chunk"), std::string::npos) << s.ToString();
}

TEST(SparseChainProperty, RandomOpsOverManySavesLoadAnyShardCount) {
  const uint64_t seed =
      testing::TestSeed("SparseChainProperty.RandomOpsOverManySavesLoadAnyShardCount");
  std::mt19937_64 rng(seed);
  MemFileSystem mem;
  Ref ref;
  std::string prev;
  for (int save = 0; save < 10; ++save) {
    std::set<int64_t> touched;
    std::vector<int64_t> deleted;
    const int ops = 50 + static_cast<int>(rng() % 150);
    for (int op = 0; op < ops; ++op) {
      const uint64_t kind = rng() % 3;
      if (kind == 0 || ref.empty()) {  // insert (ids spread, negative ones too)
        int64_t id = static_cast<int64_t>(rng() % 400000) - 200000;
        if (rng() % 8 == 0) id = static_cast<int64_t>(rng());
        ref[id] = Row(id, save);
        touched.insert(id);
        std::erase(deleted, id);
      } else {
        auto it = std::next(ref.begin(), static_cast<int64_t>(rng() % ref.size()));
        if (kind == 1) {  // update
          it->second = Row(it->first, save * 100 + op);
          touched.insert(it->first);
        } else {  // delete
          touched.erase(it->first);
          deleted.push_back(it->first);
          ref.erase(it);
        }
      }
    }
    // Deleted then re-inserted in the same round: only a touch (the delta must not list both).
    std::erase_if(deleted, [&](int64_t id) { return ref.count(id) > 0; });
    const bool full = save == 0 || rng() % 4 == 0;
    const int n = 1 + static_cast<int>(rng() % 4);
    const std::string path = fmt::format("/ck/s{}", save);
    SCOPED_TRACE(
        fmt::format("seed {} save {} ({}, {} shards)", seed, save, full ? "full" : "delta", n));
    if (full) deleted.clear();  // a full save has every row and no deletions
    SP_ASSERT_OK(SaveRanks(n, path, ref, &mem, full ? "" : prev, touched, deleted));
    const int m = 1 + static_cast<int>(rng() % 5);
    SP_ASSERT_OK_AND_ASSIGN(Ref got, LoadShards(path, m, &mem));
    ASSERT_TRUE(got == ref) << "loaded as " << m << " shards: " << got.size() << " rows, "
                            << ref.size() << " expected";
    prev = path;
  }
}

// Saves `ref` from `n` thread ranks where rank r saves the rows of shard shard_of(r) of `num`.
std::vector<Status> SaveShards(int n, int num, const std::function<int(int)>& shard_of,
                               const std::string& path, const Ref& ref, FileSystem* fs) {
  auto comms = NewThreadCommunicators(n);
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const SliceRange range = GenSlice(shard_of(r) % num, num).value();
      State local;
      st[r] = local.PutTable("emb",
                             TableOf(ref, [&](int64_t id) { return range.Contains(SliceOf(id)); }));
      SparseSaveOptions o{.shard_id = shard_of(r), .shard_num = num};
      o.timeout = std::chrono::seconds(20);
      if (st[r].ok()) st[r] = SaveSparseDistributed(*comms[r], local, {}, path, o, Io(fs));
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

TEST(SparseSaveEdge, RanksSaveTheRowsOfOtherShards) {
  MemFileSystem mem;
  Ref ref;
  for (int64_t id = -200; id < 200; id += 3) ref[id * 7919] = Row(id * 7919, 0);
  // A failure dump's writers: rank r writes the slices of rank (r + 2) % 3.
  for (const Status& s : SaveShards(
           3, 3, [](int r) { return (r + 2) % 3; }, "/ck/moved", ref, &mem)) {
    SP_ASSERT_OK(s);
  }
  for (int m : {1, 2, 3}) {
    SP_ASSERT_OK_AND_ASSIGN(Ref got, LoadShards("/ck/moved", m, &mem));
    EXPECT_TRUE(got == ref) << m << " shards";
  }
  for (const Status& s : SaveShards(
           3, 3, [](int r) { return r == 2 ? 0 : r; }, "/ck/twice", ref, &mem)) {
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument,
                            "rank 2 saves the rows of shard 0, as rank 0 does"));
  }
  for (const Status& s : SaveShards(
           2, 3, [](int r) { return r; }, "/ck/short", ref, &mem)) {
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument,
                            "SparseSaveOptions.shard_num is 3, the communicator has 2 ranks"));
  }
  EXPECT_FALSE(mem.Exists("/ck/twice") || mem.Exists("/ck/short"));
  State one;
  SP_ASSERT_OK(one.PutTable("emb", TableOf(ref, [](int64_t) { return true; })));
  EXPECT_THAT(SaveSparse(one, "/ck/one", {.shard_id = 0, .shard_num = 1}, Io(&mem)),
              StatusIs(StatusCode::kInvalidArgument, "shard_id / shard_num are for distributed"));
}

TEST(SparseSaveEdge, RanksWithoutRowsAndEmptyTables) {
  MemFileSystem mem;
  Ref ref = {{5, Row(5, 0)}, {6, Row(6, 0)}};  // all in rank 0's slices of 3
  SP_ASSERT_OK(SaveRanks(3, "/ck/few", ref, &mem));
  SP_ASSERT_OK_AND_ASSIGN(Ref got, LoadShards("/ck/few", 4, &mem));
  EXPECT_TRUE(got == ref);
  SP_ASSERT_OK(SaveRanks(2, "/ck/none", {}, &mem));
  SP_ASSERT_OK_AND_ASSIGN(Ref none, LoadShards("/ck/none", 3, &mem));
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace savepoint
