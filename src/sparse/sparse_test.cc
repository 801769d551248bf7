// Saving and loading sparse tables: single process and N -> M shards over thread communicators,
// filters and renames, delta chains and their errors, corruption, and a randomized property test
// against a reference map.
#include "savepoint/sparse.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "io/mem_fs.h"
#include "sparse/stored.h"
#include "testutil/sparse_tables.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr int64_t kDim = 3;

// The reference: id -> (embedding row, a per-row counter).
struct RefRow {
  std::vector<float> emb;
  int64_t count = 0;
  friend bool operator==(const RefRow&, const RefRow&) = default;
};
using Ref = std::map<int64_t, RefRow>;

RefRow RowFor(int64_t id, int64_t version) {
  RefRow r;
  for (int64_t k = 0; k < kDim; ++k) r.emb.push_back(static_cast<float>(id % 1000) + version + k);
  r.count = static_cast<int64_t>(static_cast<uint64_t>(version) * 7 + static_cast<uint64_t>(id));
  return r;
}

// An owning table of the rows of `ref` whose ids `keep` selects (in map order, which is not
// storage order), with slots "embedding" F32 [n, kDim] and "count" I64 [n], and `deleted`.
SparseTable TableOf(const Ref& ref, const std::function<bool(int64_t)>& keep,
                    const std::vector<int64_t>& deleted = {}) {
  std::vector<int64_t> ids;
  for (const auto& [id, row] : ref) {
    if (keep(id)) ids.push_back(id);
  }
  auto emb = [&](int64_t id, std::span<std::byte> row) {
    std::memcpy(row.data(), ref.at(id).emb.data(), kDim * 4);
  };
  auto cnt = [&](int64_t id, std::span<std::byte> row) {
    std::memcpy(row.data(), &ref.at(id).count, 8);
  };
  return testing::MakeTable(
      ids, {{"embedding", DType::kF32, kDim, emb}, {"count", DType::kI64, -1, cnt}}, deleted);
}

// The rows of a loaded table as a reference map (slots that were not loaded stay empty / 0).
Ref RefOf(const SparseTable& t) {
  Ref out;
  const TensorView* emb = t.FindSlot("embedding");
  const TensorView* cnt = t.FindSlot("count");
  for (int64_t i = 0; i < t.num_rows(); ++i) {
    RefRow r;
    if (emb != nullptr) {
      const float* p = reinterpret_cast<const float*>(emb->data()) + i * kDim;
      r.emb.assign(p, p + kDim);
    }
    if (cnt != nullptr) r.count = reinterpret_cast<const int64_t*>(cnt->data())[i];
    out.emplace(t.ids()[i], std::move(r));
  }
  return out;
}

IoOptions Io(FileSystem* fs) { return {.fs = fs, .io_threads = 2, .direct_io = false}; }

SparseSaveOptions SmallChunks(std::string base = "") {
  SparseSaveOptions o;
  o.save.chunk_bytes = 4096;
  o.base = std::move(base);
  return o;
}

// Runs f(comm, rank) on `n` thread ranks; returns every rank's status.
std::vector<Status> RunRanks(int n, const std::function<Status(Communicator&, int)>& f) {
  auto comms = NewThreadCommunicators(n);
  std::vector<Status> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = f(*comms[r], r); });
  for (auto& t : threads) t.join();
  return out;
}

// Saves table "emb" of `ref` (and a dense tensor and a value) from `n` ranks, each passing the
// rows of its slices; `touched` (when given) makes it a delta of those ids plus `deleted`. With
// `plain`, through SaveDistributed (which sends a State with tables the same way) instead of
// SaveSparseDistributed.
Status SaveRanks(int n, const std::string& path, const Ref& ref, FileSystem* fs,
                 const std::string& base = "", const std::set<int64_t>* touched = nullptr,
                 const std::vector<int64_t>& deleted = {}, bool plain = false) {
  std::vector<Status> st = RunRanks(n, [&](Communicator& comm, int r) -> Status {
    SliceRange range = GenSlice(r, n).value();
    auto mine = [&](int64_t id) {
      return range.Contains(SliceOf(id)) && (touched == nullptr || touched->count(id) > 0);
    };
    std::vector<int64_t> my_deleted;
    for (int64_t id : deleted) {
      if (range.Contains(SliceOf(id))) my_deleted.push_back(id);
    }
    State local;
    SP_RETURN_IF_ERROR(local.PutTable("emb", TableOf(ref, mine, my_deleted)));
    SP_RETURN_IF_ERROR(local.PutValue("step", int64_t{42}));
    Tensor dense = Tensor::Zeros(DType::kF32, {8}).value();
    dense.as<float>()[0] = 1.5f;
    SP_RETURN_IF_ERROR(local.Put("dense.w", std::move(dense)));
    const SparseSaveOptions o = SmallChunks(base);
    if (plain) return SaveDistributed(comm, local, {}, path, {.save = o.save}, Io(fs));
    return SaveSparseDistributed(comm, local, {}, path, o, Io(fs));
  });
  for (const Status& s : st) SP_RETURN_IF_ERROR(s);
  return Status::OK();
}

// Loads "emb" as `m` shards and checks that each holds exactly the reference rows of its slices.
void ExpectShardsMatch(const std::string& path, const Ref& ref, int m, FileSystem* fs) {
  Ref all;
  for (int i = 0; i < m; ++i) {
    SparseLoadOptions o{.shard_id = i, .shard_num = m};
    SP_ASSERT_OK_AND_ASSIGN(State s, LoadSparse(path, o, Io(fs)));
    ASSERT_NE(s.FindTable("emb"), nullptr);
    SliceRange range = GenSlice(i, m).value();
    for (int64_t id : s.FindTable("emb")->ids()) ASSERT_TRUE(range.Contains(SliceOf(id))) << id;
    Ref part = RefOf(*s.FindTable("emb"));
    all.insert(part.begin(), part.end());
    ASSERT_NE(s.FindTensor("dense.w"), nullptr);
    EXPECT_EQ(reinterpret_cast<const float*>(s.FindTensor("dense.w")->data())[0], 1.5f);
    EXPECT_EQ(s.FindValue("savepoint.sparse"), nullptr);
  }
  EXPECT_EQ(all.size(), ref.size());
  EXPECT_TRUE(all == ref) << path << " loaded as " << m << " shards differs from the reference";
}

Ref RandomRef(std::mt19937_64& rng, int n) {
  Ref ref;
  while (static_cast<int>(ref.size()) < n) {
    int64_t id = static_cast<int64_t>(rng());
    if (rng() % 2 == 0) id %= 200000;  // small ids, some negative, many slices hit twice
    ref[id] = RowFor(id, 0);
  }
  return ref;
}

TEST(SparseSave, SingleProcessRoundTripWithNegativeIds) {
  MemFileSystem mem;
  Ref ref;
  for (int64_t id : {int64_t{-1}, int64_t{0}, int64_t{65536}, int64_t{-65536}, INT64_MIN, INT64_MAX,
                     int64_t{12345}})
    ref[id] = RowFor(id, 1);
  State state;
  SP_ASSERT_OK(state.PutTable("emb", TableOf(ref, [](int64_t) { return true; })));
  SP_ASSERT_OK(state.PutValue("step", int64_t{42}));
  Tensor dense = Tensor::Zeros(DType::kF32, {8}).value();
  dense.as<float>()[0] = 1.5f;
  SP_ASSERT_OK(state.PutView("dense.w", dense.view()));
  SP_ASSERT_OK(SaveSparse(state, "/ck/full", SmallChunks(), Io(&mem)));
  SP_ASSERT_OK_AND_ASSIGN(State back, LoadSparse("/ck/full", {}, Io(&mem)));
  ASSERT_NE(back.FindTable("emb"), nullptr);
  EXPECT_TRUE(RefOf(*back.FindTable("emb")) == ref);
  // Rows come back in storage order: (slice, id).
  std::vector<int64_t> want = {INT64_MIN,      int64_t{-65536}, int64_t{0}, int64_t{65536},
                               int64_t{12345}, int64_t{-1},     INT64_MAX};
  EXPECT_EQ(std::vector<int64_t>(back.FindTable("emb")->ids().begin(),
                                 back.FindTable("emb")->ids().end()),
            want);
  ExpectShardsMatch("/ck/full", ref, 3, &mem);
  // A plain verify covers the tables' chunks too.
  SP_EXPECT_OK(VerifyCheckpoint("/ck/full", {}, Io(&mem)));
}

TEST(SparseSave, PlainSaveAndLoadCarryTables) {
  MemFileSystem mem;
  Ref ref = {{-4, RowFor(-4, 2)}, {70000, RowFor(70000, 2)}};
  State state;
  SP_ASSERT_OK(state.PutTable("emb", TableOf(ref, [](int64_t) { return true; })));
  SP_ASSERT_OK(state.PutValue("step", int64_t{7}));
  SP_ASSERT_OK(Save(state, "/ck/plain", {}, Io(&mem)));
  SP_ASSERT_OK_AND_ASSIGN(State back, Load("/ck/plain", {}, Io(&mem)));
  ASSERT_NE(back.FindTable("emb"), nullptr);
  EXPECT_TRUE(RefOf(*back.FindTable("emb")) == ref);
  EXPECT_EQ(back.FindValue("step")->as_int(), 7);
  EXPECT_EQ(back.num_tensors(), 0u);  // the tables' tensors stay inside the tables
  // The manifest lists the feature; the tensors and the description are visible to tools.
  auto reader = CheckpointReader::Open("/ck/plain", {}, Io(&mem)).value();
  EXPECT_EQ(reader->manifest_json()["required_features"], Json::array({"sparse"}));
  EXPECT_NE(reader->FindTensor("savepoint.sparse/0.emb/slot/embedding"), nullptr);
}

TEST(SparseSave, EncryptedChainNeedsTheKey) {
  MemFileSystem mem;
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(32, 'k'));
  Ref ref = {{11, RowFor(11, 0)}, {-3, RowFor(-3, 0)}};
  State state;
  SP_ASSERT_OK(state.PutTable("emb", TableOf(ref, [](int64_t) { return true; })));
  SparseSaveOptions o = SmallChunks();
  o.save.key = key;
  SP_ASSERT_OK(SaveSparse(state, "/ck/enc", o, Io(&mem)));
  ref[11] = RowFor(11, 1);
  State delta;
  SP_ASSERT_OK(delta.PutTable("emb", TableOf(ref, [](int64_t id) { return id == 11; })));
  o.base = "/ck/enc";
  SP_ASSERT_OK(SaveSparse(delta, "/ck/enc2", o, Io(&mem)));
  SparseLoadOptions lo;
  lo.load.key = key;
  SP_ASSERT_OK_AND_ASSIGN(State back, LoadSparse("/ck/enc2", lo, Io(&mem)));
  EXPECT_TRUE(RefOf(*back.FindTable("emb")) == ref);
  EXPECT_THAT(LoadSparse("/ck/enc2", {}, Io(&mem)), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SparseSave, ReservedNamesAndFullSaveWithDeletions) {
  MemFileSystem mem;
  Ref ref = {{1, RowFor(1, 0)}};
  State state;
  SP_ASSERT_OK(state.PutTable("emb", TableOf(ref, [](int64_t) { return true; }, {5})));
  Status s = SaveSparse(state, "/ck/a", SmallChunks(), Io(&mem));
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "deleted ids"));
  State reserved;
  SP_ASSERT_OK(reserved.PutValue("savepoint.sparse", int64_t{1}));
  EXPECT_EQ(SaveSparse(reserved, "/ck/b", SmallChunks(), Io(&mem)).code(),
            StatusCode::kInvalidArgument);
}

// Slots of at least kGatherSlotBytes of a table in hash order are gathered into storage order by
// the writer threads, chunk by chunk: 12-byte rows straddle the 4 KiB chunks. Plain, compressed
// and encrypted single-process saves, and a 3-rank save, load back exactly.
TEST(SparseSave, LargeUnsortedSlotsAreGatheredWhileWritten) {
  uint64_t seed = testing::TestSeed("SparseSave.LargeUnsortedSlotsAreGatheredWhileWritten");
  std::mt19937_64 rng(seed);
  MemFileSystem mem;
  const Ref ref = RandomRef(rng, 300000);  // embedding: 3.6 MB, 1.2 MB per rank of 3
  ASSERT_GE(ref.size() * kDim * 4 / 3, sparse::kGatherSlotBytes);
  State state;
  SP_ASSERT_OK(state.PutTable("emb", TableOf(ref, [](int64_t) { return true; })));
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(32, 'g'));
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(fmt::format("variant {}", variant));
    SparseSaveOptions o = SmallChunks();
    if (variant == 1) o.save.compression.codec = Compression::Codec::kZstd;
    if (variant == 2) o.save.key = key;
    const std::string path = fmt::format("/ck/gather{}", variant);
    SP_ASSERT_OK(SaveSparse(state, path, o, Io(&mem)));
    SparseLoadOptions lo;
    if (variant == 2) lo.load.key = key;
    SP_ASSERT_OK_AND_ASSIGN(State back, LoadSparse(path, lo, Io(&mem)));
    EXPECT_TRUE(RefOf(*back.FindTable("emb")) == ref);
  }
  SP_ASSERT_OK(SaveRanks(3, "/ck/gather-ranks", ref, &mem));
  ExpectShardsMatch("/ck/gather-ranks", ref, 2, &mem);
}

TEST(SparseSave, SavedByNLoadedByM) {
  uint64_t seed = testing::TestSeed("SparseSave.SavedByNLoadedByM");
  std::mt19937_64 rng(seed);
  MemFileSystem mem;
  Ref ref = RandomRef(rng, 3000);
  for (int n : {1, 2, 3, 5}) {
    const std::string path = fmt::format("/ck/n{}", n);
    SP_ASSERT_OK(SaveRanks(n, path, ref, &mem));
    for (int m : {1, 2, 4, 7}) {
      SCOPED_TRACE(fmt::format("{} -> {} shards", n, m));
      ExpectShardsMatch(path, ref, m, &mem);
    }
  }
}

TEST(SparseSave, SaveDistributedRefusesTablesOnEveryRank) {
  uint64_t seed = testing::TestSeed("SparseSave.SaveDistributedRefusesTablesOnEveryRank");
  std::mt19937_64 rng(seed);
  MemFileSystem mem;
  Ref ref = RandomRef(rng, 200);
  Status s = SaveRanks(3, "/ck/plain-dist", ref, &mem, "", nullptr, {}, /*plain=*/true);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "SaveSparseDistributed"));
  // Only rank 1 holds a table: every rank runs the same collectives and fails, naming rank 1.
  std::vector<Status> st = RunRanks(3, [&](Communicator& comm, int r) -> Status {
    State local;
    if (r == 1)
      SP_RETURN_IF_ERROR(local.PutTable("emb", TableOf(ref, [](int64_t) { return true; }, {})));
    SP_RETURN_IF_ERROR(local.Put("dense.w", Tensor::Zeros(DType::kF32, {8}).value()));
    return SaveDistributed(comm, local, {}, "/ck/mixed", {}, Io(&mem));  // dense.w replicated
  });
  for (const Status& rs : st) EXPECT_THAT(rs, StatusIs(StatusCode::kInvalidArgument, "rank 1"));
  EXPECT_FALSE(mem.Exists("/ck/plain-dist"));
  EXPECT_FALSE(mem.Exists("/ck/mixed"));
}

TEST(SparseLoad, ReadsOnlyTheFilesOfItsSlices) {
  uint64_t seed = testing::TestSeed("SparseLoad.ReadsOnlyTheFilesOfItsSlices");
  std::mt19937_64 rng(seed);
  MemFileSystem mem;
  Ref ref = RandomRef(rng, 2000);
  SP_ASSERT_OK(SaveRanks(4, "/ck/four", ref, &mem));
  SP_ASSERT_OK(mem.RemoveFile("/ck/four/data-00003-00000.spd"));  // rank 3's rows and counts
  for (auto [i, m] : {std::pair{0, 4}, {1, 4}, {2, 4}, {0, 2}, {1, 3}}) {
    SCOPED_TRACE(fmt::format("shard {} of {}", i, m));
    SP_ASSERT_OK_AND_ASSIGN(
        State s, LoadSparse("/ck/four", {.shard_id = i, .shard_num = m, .dense = false}, Io(&mem)));
    SliceRange range = GenSlice(i, m).value();
    Ref want;
    for (const auto& [id, row] : ref) {
      if (range.Contains(SliceOf(id))) want[id] = row;
    }
    EXPECT_TRUE(RefOf(*s.FindTable("emb")) == want);
  }
  Status s =
      LoadSparse("/ck/four", {.shard_id = 3, .shard_num = 4, .dense = false}, Io(&mem)).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound, "data-00003-00000.spd"));
}

TEST(SparseSave, RankWithIdsOutsideItsSlicesFailsEverywhere) {
  MemFileSystem mem;
  Ref ref = {{1, RowFor(1, 0)}, {65535, RowFor(65535, 0)}};
  std::vector<Status> st = RunRanks(2, [&](Communicator& comm, int) -> Status {
    State local;  // every rank passes every row: rank 0 does not own slice 65535
    SP_RETURN_IF_ERROR(local.PutTable("emb", TableOf(ref, [](int64_t) { return true; })));
    return SaveSparseDistributed(comm, local, {}, "/ck/x", SmallChunks(), Io(&mem));
  });
  for (const Status& s : st) {
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "rank 0: "));
    EXPECT_NE(s.message().find("id 65535"), std::string::npos) << s.ToString();
  }
  EXPECT_FALSE(mem.Exists("/ck/x"));
}

TEST(SparseLoad, FilterRenameWarmStartAndSeveralCheckpoints) {
  MemFileSystem mem;
  Ref ref = {{3, RowFor(3, 0)}, {-9, RowFor(-9, 0)}};
  State a;
  SP_ASSERT_OK(a.PutTable("user", TableOf(ref, [](int64_t) { return true; })));
  SP_ASSERT_OK(a.PutTable("item", TableOf(ref, [](int64_t id) { return id > 0; })));
  SP_ASSERT_OK(SaveSparse(a, "/ck/a", SmallChunks(), Io(&mem)));
  State b;
  SP_ASSERT_OK(b.PutTable("ad", TableOf(ref, [](int64_t id) { return id < 0; })));
  SP_ASSERT_OK(SaveSparse(b, "/ck/b", SmallChunks(), Io(&mem)));

  SparseLoadOptions o{.tables = {"user"}, .slots = {"embedding"}, .rename = {{"user", "u"}}};
  o.dense = false;
  SP_ASSERT_OK_AND_ASSIGN(State got, LoadSparse("/ck/a", o, Io(&mem)));
  ASSERT_EQ(got.tables().size(), 1u);
  ASSERT_NE(got.FindTable("u"), nullptr);
  EXPECT_EQ(got.FindTable("u")->slots().size(), 1u);  // embeddings without optimizer slots
  EXPECT_EQ(got.FindTable("u")->num_rows(), 2);
  SP_ASSERT_OK(LoadSparseInto("/ck/b", got, {.dense = false}, Io(&mem)));
  EXPECT_NE(got.FindTable("ad"), nullptr);
  EXPECT_THAT(LoadSparseInto("/ck/b", got, {}, Io(&mem)), StatusIs(StatusCode::kAlreadyExists));

  EXPECT_EQ(LoadSparse("/ck/a", {.tables = {"nope*"}}, Io(&mem)).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(LoadSparse("/ck/a", {.slots = {"exp_avg"}}, Io(&mem)).status().code(),
            StatusCode::kNotFound);
  Status dtype =
      LoadSparse("/ck/a", {.slot_dtypes = {{"embedding", DType::kBF16}}}, Io(&mem)).status();
  EXPECT_THAT(dtype, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(dtype.message().find("slot \"embedding\" is F32 in the checkpoint, BF16"),
            std::string::npos)
      << dtype.ToString();
  EXPECT_EQ(LoadSparse("/ck/a", {.shard_id = 2, .shard_num = 2}, Io(&mem)).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace savepoint
