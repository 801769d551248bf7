// Asynchronous saves of sparse tables (Checkpointer::SaveAsync): the rows are gathered into the
// staging slabs by the snapshot, so the caller may change its tables once SaveAsync returns; full
// saves and delta chains, compressed and encrypted, and the errors found before the snapshot.
#include "savepoint/async.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <map>
#include <random>

#include "format/manifest.h"
#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/sparse.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// 20,000 rows of 16 floats: the embedding slot (1.25 MiB) is gathered into storage order by the
// snapshot (sparse::kGatherSlotBytes), the count slot sorted into a copy first. Tables of
// kStagedRows rows (ids of more than 1 MiB) are staged instead: copied as they lie, sorted later
// (sparse/stage.h).
constexpr int64_t kDim = 16;
constexpr size_t kStagedRows = 140000;

// id -> (embedding row, step counter).
using Rows = std::map<int64_t, std::pair<std::vector<float>, int64_t>>;

// A table whose memory the test owns (FromViews), rows in an order that is not storage order.
struct OwnedTable {
  std::vector<int64_t> ids;
  std::vector<float> emb;
  std::vector<int64_t> count;
  std::vector<int64_t> deleted;

  SparseTable View() const {
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<SparseTable::Slot> slots = {
        {"embedding", TensorView(emb.data(), DType::kF32, {n, kDim})},
        {"count", TensorView(count.data(), DType::kI64, {n})}};
    TensorView del;
    if (!deleted.empty()) {
      del = TensorView(deleted.data(), DType::kI64, {static_cast<int64_t>(deleted.size())});
    }
    return SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {n}), std::move(slots), del)
        .value();
  }
  // Overwrites every row and id (what training does after the snapshot).
  void Scribble() {
    std::fill(emb.begin(), emb.end(), -1.0f);
    std::fill(count.begin(), count.end(), -1);
    std::reverse(ids.begin(), ids.end());
  }
};

OwnedTable TableOf(const Rows& rows, std::mt19937_64& rng) {
  OwnedTable t;
  for (const auto& [id, row] : rows) t.ids.push_back(id);
  std::shuffle(t.ids.begin(), t.ids.end(), rng);
  for (int64_t id : t.ids) {
    const auto& [emb, count] = rows.at(id);
    t.emb.insert(t.emb.end(), emb.begin(), emb.end());
    t.count.push_back(count);
  }
  return t;
}

Rows RowsOf(const SparseTable& t) {
  Rows out;
  const float* emb = reinterpret_cast<const float*>(t.FindSlot("embedding")->data());
  const int64_t* count = reinterpret_cast<const int64_t*>(t.FindSlot("count")->data());
  for (int64_t i = 0; i < t.num_rows(); ++i) {
    out[t.ids()[i]] = {std::vector<float>(emb + i * kDim, emb + (i + 1) * kDim), count[i]};
  }
  return out;
}

std::pair<std::vector<float>, int64_t> RowFor(int64_t id, int64_t version) {
  std::vector<float> emb;
  for (int64_t k = 0; k < kDim; ++k) emb.push_back(static_cast<float>(id % 977 + version + k));
  return {emb, version};
}

class SparseAsync : public ::testing::Test {
 protected:
  void SetUp() override {
    const uint64_t seed = std::random_device{}();
    std::cout << "seed " << seed << "\n";
    rng_.seed(seed);
    // Random ids (in hash order, so the rows are sorted), spanning many 64 KiB slabs.
    Grow(20000);
    ckpt_ = Checkpointer::Create({.staging_bytes = 8 << 20, .slab_bytes = 64 << 10}, Io()).value();
  }
  void Grow(size_t rows) {
    while (rows_.size() < rows) {
      const int64_t id = static_cast<int64_t>(rng_());
      rows_[id] = RowFor(id, 0);
    }
  }
  IoOptions Io() { return {.fs = &mem_, .io_threads = 2, .direct_io = false}; }

  Rows Load(const std::string& path) {
    State s = LoadSparse(path, {}, Io()).value();
    return RowsOf(*s.FindTable("emb"));
  }

  MemFileSystem mem_;
  std::mt19937_64 rng_;
  Rows rows_;
  std::unique_ptr<Checkpointer> ckpt_;
};

TEST_F(SparseAsync, FullSaveIsTheSnapshotWhateverTheCallerDoesAfter) {
  OwnedTable table = TableOf(rows_, rng_);
  State state;
  SP_ASSERT_OK(state.PutTable("emb", table.View()));
  SP_ASSERT_OK(state.PutValue("step", int64_t{5}));
  SP_ASSERT_OK_AND_ASSIGN(SaveHandle h, ckpt_->SaveAsync(state, "/ck/full"));
  table.Scribble();  // the snapshot is done: the caller's rows are no longer read
  SP_ASSERT_OK(h.Wait());
  EXPECT_EQ(Load("/ck/full"), rows_);
  EXPECT_GT(h.stats().blocked_seconds, 0.0);
  SP_EXPECT_OK(VerifyCheckpoint("/ck/full", {}, Io()));
  // The same bytes of table data as a synchronous save of the same rows.
  OwnedTable again = TableOf(rows_, rng_);
  State sync;
  SP_ASSERT_OK(sync.PutTable("emb", again.View()));
  SP_ASSERT_OK(sync.PutValue("step", int64_t{5}));
  SP_ASSERT_OK(SaveSparse(sync, "/ck/sync", {}, Io()));
  auto a = CheckpointReader::Open("/ck/full", {}, Io()).value();
  auto b = CheckpointReader::Open("/ck/sync", {}, Io()).value();
  for (const char* name : {"savepoint.sparse/0.emb/ids", "savepoint.sparse/0.emb/slot/embedding",
                           "savepoint.sparse/0.emb/slot/count"}) {
    SP_ASSERT_OK_AND_ASSIGN(Tensor x, a->ReadTensor(name));
    SP_ASSERT_OK_AND_ASSIGN(Tensor y, b->ReadTensor(name));
    ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << name;
  }
}

TEST_F(SparseAsync, DeltaChainOfAsyncSaves) {
  OwnedTable table = TableOf(rows_, rng_);
  State full;
  SP_ASSERT_OK(full.PutTable("emb", table.View()));
  SP_ASSERT_OK(ckpt_->SaveAsync(full, "/ck/0").status());
  std::string base = "/ck/0";
  for (int step = 1; step <= 3; ++step) {
    // Touch 1% of the rows, add a few, delete a few; record them as training would.
    DirtySet dirty;
    std::vector<int64_t> ids;
    for (const auto& [id, row] : rows_) ids.push_back(id);
    for (int i = 0; i < 200; ++i) {
      const int64_t id = ids[rng_() % ids.size()];
      rows_[id] = RowFor(id, step);
      dirty.Touch({&id, 1});
    }
    for (int i = 0; i < 20; ++i) {
      const int64_t id = static_cast<int64_t>(rng_());
      rows_[id] = RowFor(id, step);
      dirty.Touch({&id, 1});
    }
    for (int i = 0; i < 10; ++i) {
      const int64_t id = ids[rng_() % ids.size()];
      rows_.erase(id);
      dirty.Delete({&id, 1});
    }
    table = TableOf(rows_, rng_);
    SP_ASSERT_OK_AND_ASSIGN(SparseTable delta, MakeDelta(table.View(), dirty));
    State state;
    SP_ASSERT_OK(state.PutTable("emb", std::move(delta)));
    const std::string path = fmt::format("/ck/{}", step);
    // The base is the save before, still in flight: SaveAsync waits for it first.
    SparseSaveOptions o{.base = base, .concurrency = 2};
    SP_ASSERT_OK_AND_ASSIGN(SaveHandle h, ckpt_->SaveAsync(state, path, o));
    base = path;
  }
  SP_ASSERT_OK(ckpt_->WaitAll());
  EXPECT_EQ(Load(base), rows_);
  EXPECT_EQ(SparseChain(base, Io()).value().size(), 4u);
}

TEST_F(SparseAsync, CompressedAndEncrypted) {
  OwnedTable table = TableOf(rows_, rng_);
  State state;
  SP_ASSERT_OK(state.PutTable("emb", table.View()));
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(32, 'k'));
  SaveOptions zstd;
  zstd.compression.codec = Compression::Codec::kZstd;
  SaveOptions sealed;
  sealed.key = key;
  SaveOptions both = zstd;
  both.key = key;
  int i = 0;
  for (const SaveOptions& o : {zstd, sealed, both}) {
    const std::string path = fmt::format("/ck/{}", i++);
    SP_ASSERT_OK_AND_ASSIGN(SaveHandle h, ckpt_->SaveAsync(state, path, o));
    ASSERT_TRUE(h.Wait().ok()) << path;
    LoadOptions lo;
    if (o.key) lo.key = key;
    State back = LoadSparse(path, {.load = lo}, Io()).value();
    EXPECT_EQ(RowsOf(*back.FindTable("emb")), rows_) << path;
  }
}

// A large hash-ordered table is staged: the caller waits for copies of its rows as they lie,
// the sort and the gather into storage order run afterwards. The checkpoint holds the snapshot's
// rows, byte for byte what a synchronous save writes, beside dense tensors named before and
// after the table's tensors; the staged copies serve the next save.
TEST_F(SparseAsync, StagedTableIsSortedAfterTheCallerReturns) {
  Grow(kStagedRows);
  std::vector<float> dense_a(50000, 1.5f), dense_z(70000, -2.5f);
  for (int round = 0; round < 2; ++round) {
    OwnedTable table = TableOf(rows_, rng_);
    State state;
    SP_ASSERT_OK(state.PutTable("emb", table.View()));
    SP_ASSERT_OK(state.PutView("a", TensorView(dense_a.data(), DType::kF32, {50000})));
    SP_ASSERT_OK(state.PutView("z", TensorView(dense_z.data(), DType::kF32, {70000})));
    const std::string path = fmt::format("/ck/staged{}", round);
    SP_ASSERT_OK_AND_ASSIGN(SaveHandle h, ckpt_->SaveAsync(state, path));
    table.Scribble();
    std::fill(dense_a.begin(), dense_a.end(), 0.0f);
    SP_ASSERT_OK(h.Wait());
    EXPECT_EQ(Load(path), rows_);
    SP_EXPECT_OK(VerifyCheckpoint(path, {}, Io()));
    // Staged: the table's tensors lie after "z" in the data file (name order puts them before).
    SP_ASSERT_OK_AND_ASSIGN(std::string bytes, mem_.ReadFile(path + "/MANIFEST", 1 << 24));
    SP_ASSERT_OK_AND_ASSIGN(format::Manifest m, format::DecodeManifest(bytes, path));
    std::map<std::string, uint64_t> at;
    for (const auto& t : m.tensors) at[t.name] = t.shards[0].offset;
    EXPECT_GT(at.at("savepoint.sparse/0.emb/ids"), at.at("z"));
    EXPECT_GT(at.at("savepoint.sparse/0.emb/slot/embedding"), at.at("z"));
    auto r = CheckpointReader::Open(path, {}, Io()).value();
    SP_ASSERT_OK_AND_ASSIGN(Tensor a, r->ReadTensor("a"));
    EXPECT_EQ(a.as<float>()[49999], round == 0 ? 1.5f : 0.0f);
    SP_ASSERT_OK_AND_ASSIGN(Tensor z, r->ReadTensor("z"));
    EXPECT_EQ(z.as<float>()[69999], -2.5f);
  }
  OwnedTable again = TableOf(rows_, rng_);
  State sync;
  SP_ASSERT_OK(sync.PutTable("emb", again.View()));
  SP_ASSERT_OK(SaveSparse(sync, "/ck/sync", {}, Io()));
  auto a = CheckpointReader::Open("/ck/staged1", {}, Io()).value();
  auto b = CheckpointReader::Open("/ck/sync", {}, Io()).value();
  for (const char* name :
       {"savepoint.sparse/0.emb/ids", "savepoint.sparse/0.emb/slices",
        "savepoint.sparse/0.emb/slot/embedding", "savepoint.sparse/0.emb/slot/count"}) {
    SP_ASSERT_OK_AND_ASSIGN(Tensor x, a->ReadTensor(name));
    SP_ASSERT_OK_AND_ASSIGN(Tensor y, b->ReadTensor(name));
    ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << name;
  }
}

TEST_F(SparseAsync, StagedTableCompressedAndEncrypted) {
  Grow(kStagedRows);
  OwnedTable table = TableOf(rows_, rng_);
  State state;
  SP_ASSERT_OK(state.PutTable("emb", table.View()));
  SaveOptions sealed;
  sealed.key = EncryptionKey::FromBytes(std::string(32, 'k'));
  SaveOptions zstd;
  zstd.compression.codec = Compression::Codec::kZstd;
  SaveOptions both = zstd;
  both.key = sealed.key;
  int i = 0;
  for (const SaveOptions& o : {sealed, zstd, both}) {
    const std::string path = fmt::format("/ck/staged{}", i++);
    SP_ASSERT_OK_AND_ASSIGN(SaveHandle h, ckpt_->SaveAsync(state, path, o));
    ASSERT_TRUE(h.Wait().ok()) << path;
    LoadOptions lo;
    lo.key = o.key;
    State back = LoadSparse(path, {.load = lo}, Io()).value();
    EXPECT_EQ(RowsOf(*back.FindTable("emb")), rows_) << path;
  }
}

// A failing write, of the snapshot's slabs or of the staged rows, fails the save: nothing is
// committed, and a save after it succeeds.
TEST_F(SparseAsync, StagedTableWriteFailureCommitsNothing) {
  Grow(kStagedRows);
  FaultInjectionFileSystem faulty(&mem_);
  IoOptions io = Io();
  io.fs = &faulty;
  auto ckpt = Checkpointer::Create({.staging_bytes = 8 << 20, .slab_bytes = 64 << 10}, io).value();
  OwnedTable table = TableOf(rows_, rng_);
  State state;
  SP_ASSERT_OK(state.PutTable("emb", table.View()));
  SP_ASSERT_OK(ckpt->SaveAsync(state, "/ck/probe").value().Wait());
  const uint64_t writes = faulty.count(FaultInjectionFileSystem::Op::kWrite);
  // A write of the snapshot's slabs (the late thread then writes nothing), one of the staged rows,
  // and one near the end.
  for (uint64_t n : {uint64_t{2}, writes / 2, writes - 2}) {
    faulty.Reset();
    faulty.FailNth(FaultInjectionFileSystem::Op::kWrite, n, ENOSPC);
    const std::string path = fmt::format("/ck/fail{}", n);
    SP_ASSERT_OK_AND_ASSIGN(SaveHandle h, ckpt->SaveAsync(state, path));
    EXPECT_THAT(h.Wait(), StatusIs(StatusCode::kNoSpace)) << n;
    EXPECT_FALSE(mem_.Exists(path));
  }
  faulty.Reset();
  SP_ASSERT_OK(ckpt->SaveAsync(state, "/ck/after").value().Wait());
  EXPECT_EQ(Load("/ck/after"), rows_);
}

// A staged table built with IdCheck::kAtSave: the background sort finds the id that appears
// twice; the handle reports it and nothing is committed.
TEST_F(SparseAsync, StagedTableWithAnIdTwiceFailsItsHandle) {
  Grow(kStagedRows);
  OwnedTable table = TableOf(rows_, rng_);
  table.ids[100] = table.ids[7];
  const int64_t n = static_cast<int64_t>(table.ids.size());
  auto t =
      SparseTable::FromViews(TensorView(table.ids.data(), DType::kI64, {n}),
                             {{"embedding", TensorView(table.emb.data(), DType::kF32, {n, kDim})}},
                             {}, SparseTable::IdCheck::kAtSave);
  SP_ASSERT_OK(t.status());
  State state;
  SP_ASSERT_OK(state.PutTable("emb", std::move(t).value()));
  SP_ASSERT_OK_AND_ASSIGN(SaveHandle h, ckpt_->SaveAsync(state, "/ck/twice"));
  EXPECT_THAT(h.Wait(), StatusIs(StatusCode::kInvalidArgument,
                                 fmt::format("id {} appears twice", table.ids[7])));
  EXPECT_FALSE(mem_.Exists("/ck/twice"));
}

TEST_F(SparseAsync, ErrorsBeforeTheSnapshot) {
  OwnedTable table = TableOf(rows_, rng_);
  table.deleted = {table.ids[0] + 1};  // an id that is not a row
  State state;
  SP_ASSERT_OK(state.PutTable("emb", table.View()));
  // Deleted ids need a base; the base must exist; the timeout is for distributed saves.
  EXPECT_THAT(ckpt_->SaveAsync(state, "/ck/a"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ckpt_->SaveAsync(state, "/ck/a", SparseSaveOptions{.base = "/ck/none"}),
              StatusIs(StatusCode::kNotFound));
  SparseSaveOptions timed;
  timed.timeout = std::chrono::seconds(1);
  EXPECT_THAT(ckpt_->SaveAsync(state, "/ck/a", timed), StatusIs(StatusCode::kInvalidArgument));
  SparseSaveOptions chunked;
  chunked.save.chunk_bytes = 4096;
  EXPECT_THAT(ckpt_->SaveAsync(state, "/ck/a", chunked), StatusIs(StatusCode::kInvalidArgument));
  // Nothing was left behind.
  EXPECT_FALSE(mem_.Exists("/ck/a"));
}

}  // namespace
}  // namespace savepoint
