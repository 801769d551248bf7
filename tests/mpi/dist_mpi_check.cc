// Multi-process checks of the distributed save and load, run under mpirun by ctest (label mpi):
//   dist_mpi_check roundtrip DIR   save with every rank (DP x TP), load into other layouts
//                                  (world size + 1, other split dims), a bad layout and a failing
//                                  rank leave no checkpoint and reach every rank
//                                  a late rank makes the others time out, naming it
//   dist_mpi_check sparse DIR      sparse table "emb" saved sharded (full, then a delta of updates,
//                                  inserts and deletions), loaded as world - 1, world, world + 1
//                                  and 1 shards, bit for bit against a reference; a rank passing
//                                  an id outside its slices fails every rank, nothing committed
//   dist_mpi_check kill DIR        the last rank kills itself (SIGKILL) while writing its data:
//                                  the job must end (mpirun exits non-zero) with no commit
// Exits 0 when every check passed on this rank.
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "engine/box.h"
#include "io/fault_fs.h"
#include "savepoint/distributed.h"
#include "savepoint/mpi.h"
#include "savepoint/savepoint.h"
#include "savepoint/sparse.h"
#include "testutil/sparse_tables.h"
#include "testutil/testutil.h"
#include "testutil/write_hook_fs.h"

namespace savepoint {
namespace {

using namespace std::chrono_literals;
using Globals = std::map<std::string, Tensor>;

// The global tensors, identical on every rank (derived from the seed).
Globals MakeGlobals(uint64_t seed) {
  Globals g;
  std::pair<DType, Shape> specs[] = {{DType::kF32, {37, 19}},
                                     {DType::kU8, {4099}},
                                     {DType::kBF16, {5, 6, 7}},
                                     {DType::kF64, {64, 130}}};
  int i = 0;
  for (auto& [dt, shape] : specs) {
    Tensor t = Tensor::Empty(dt, shape).value();
    testing::FillPattern(t.view(), seed + i);
    g.emplace(fmt::format("layer{}.w", i++), std::move(t));
  }
  Tensor u = Tensor::Empty(DType::kI32, {5}).value();
  testing::FillPattern(u.view(), seed + 99);
  g.emplace("unsharded", std::move(u));
  return g;
}

// Rank `rank` of `world` in a DP x TP layout (tp parts along dim (i + shift) % rank).
ShardLayout Layout(const Globals& g, int world, int rank, int tp, int shift) {
  ShardLayout l;
  int i = 0;
  for (const auto& [name, t] : g) {
    if (name == "unsharded") continue;
    std::vector<int> reps;
    for (int q = rank % tp; q < world; q += tp) reps.push_back(q);
    int dim = (i++ + shift) % static_cast<int>(t.shape().size());
    l[name] = SplitDim(t.shape(), dim, tp, rank % tp, reps).value();
  }
  return l;
}

State Slice(const Globals& g, const ShardLayout& l) {
  State s;
  for (const auto& [name, t] : g) {
    auto it = l.find(name);
    Shape sizes = it == l.end() ? t.shape() : it->second.sizes;
    Shape offs = it == l.end() ? Shape(t.shape().size(), 0) : it->second.offsets;
    Tensor local = Tensor::Empty(t.dtype(), sizes).value();
    engine::CopyRegion({t.data(), t.shape(), offs, 0},
                       {local.data(), sizes, Shape(sizes.size(), 0), 0}, sizes,
                       DTypeSize(t.dtype()));
    s.Put(name, std::move(local)).IgnoreError();
  }
  s.PutValue("step", Value(int64_t{7})).IgnoreError();
  return s;
}

int failures = 0;
void Check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    ++failures;
    fmt::print(stderr, "rank {}: FAILED: {}\n", rank, what);
  }
}

bool Equal(const State& a, const State& b) { return testing::StatesEqual(a, b); }

void RoundTrip(Communicator& c, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  Globals g = MakeGlobals(1234);
  int tp = n % 2 == 0 ? 2 : n;
  ShardLayout mine = Layout(g, n, r, tp, 0);
  DistributedSaveOptions o;
  o.save.overwrite = true;
  o.timeout = 60s;
  std::string path = dir + "/ckpt";
  Status s = SaveDistributed(c, Slice(g, mine), mine, path, o);
  Check(s.ok(), "save: " + s.ToString(), r);
  // Load as ranks r, r + n, ... of a job of n + 1 ranks with another split.
  for (int target = r; target < n + 1; target += n) {
    ShardLayout l = Layout(g, n + 1, target, n + 1, 1);
    const Shape& us = g["unsharded"].shape();
    l["unsharded"] = ShardSpec{us, Shape(us.size(), 0), us, {}};
    Result<State> got = LoadDistributedAlloc(path, l);
    Check(got.ok() && Equal(Slice(g, l), *got),
          fmt::format("load as rank {} of {}: {}", target, n + 1, got.status().ToString()), r);
  }
  if (r == 0) {
    Result<State> full = Load(path);
    Check(full.ok() && Equal(Slice(g, {}), *full), "full load: " + full.status().ToString(), r);
  }
  // Every rank claims the same box of "layer0.w": rejected everywhere, nothing written.
  ShardLayout bad = mine;
  bad["layer0.w"] = SplitDim(g["layer0.w"].shape(), 0, 2, 0).value();
  s = SaveDistributed(c, Slice(g, bad), bad, dir + "/bad", o);
  Check(n == 1 || s.code() == StatusCode::kInvalidArgument, "bad layout: " + s.ToString(), r);
  Check(n == 1 || !DefaultFileSystem()->Exists(dir + "/bad"), "bad layout left a checkpoint", r);
}

// The last rank fails its second data write: every rank gets the error, nothing is committed.
void FailingRank(Communicator& c, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  State s;
  for (int i = 0; i < n; ++i)
    s.Put(fmt::format("p{}", i), Tensor::Zeros(DType::kU8, {9000}).value()).IgnoreError();
  FaultInjectionFileSystem faulty(DefaultFileSystem());
  faulty.FailNth(FaultInjectionFileSystem::Op::kWrite, 2, EIO);
  DistributedSaveOptions o;
  o.timeout = 60s;
  IoOptions io;
  if (r == n - 1) io.fs = &faulty;
  Status st = SaveDistributed(c, s, {}, dir + "/fail", o, io);
  Check(st.code() == StatusCode::kIOError &&
            st.message().find(fmt::format("rank {}", n - 1)) != std::string::npos,
        "failing rank: " + st.ToString(), r);
  c.Barrier(60s).IgnoreError();
  Check(!DefaultFileSystem()->Exists(dir + "/fail"), "failed save was committed", r);
}

// The last rank arrives 4 s late; the others time out after 1 s: every rank fails (the late
// one finds the group broken), rank 0's error names the late rank, nothing is committed. Leaves
// the group broken, so it runs last. The ranks line up first; the coordinator then starts 250 ms
// after the others (as a descheduled coordinator would on a loaded machine), while they already
// wait for its verdict: they must wait for it rather than time out first and name rank 0.
void LateRank(Communicator& c, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  State s;
  s.Put("p", Tensor::Zeros(DType::kU8, {100}).value()).IgnoreError();
  DistributedSaveOptions o;
  o.timeout = 1s;
  c.Barrier(60s).IgnoreError();
  if (r == 0) std::this_thread::sleep_for(250ms);
  if (r == n - 1) std::this_thread::sleep_for(4s);
  Status st = SaveDistributed(c, s, {}, dir + "/late", o);
  Check(!st.ok(), "late rank: save succeeded", r);
  if (r == 0) {
    Check(st.code() == StatusCode::kDeadlineExceeded &&
              st.message().find(fmt::format("ranks [{}]", n - 1)) != std::string::npos,
          "late rank: " + st.ToString(), r);
  }
  Check(!DefaultFileSystem()->Exists(dir + "/late"), "late rank: committed", r);
}

// Kills this process at its first data-file write.
class KillingFs final : public testing::WriteHookFileSystem {
 public:
  using WriteHookFileSystem::WriteHookFileSystem;
  void OnWrite(const std::string& path, uint64_t) override {
    if (path.find("/data-") != std::string::npos) std::raise(SIGKILL);
  }
};

int Kill(Communicator& c, const std::string& dir) {
  Globals g = MakeGlobals(5);
  ShardLayout mine = Layout(g, c.size(), c.rank(), c.size(), 0);
  KillingFs killer(DefaultFileSystem());
  DistributedSaveOptions o;
  o.timeout = 20s;
  IoOptions io;
  if (c.rank() == c.size() - 1) io.fs = &killer;
  Status s = SaveDistributed(c, Slice(g, mine), mine, dir + "/ckpt", o, io);
  fmt::print(stderr, "rank {}: save returned {}\n", c.rank(), s.ToString());
  return s.ok() ? 0 : 1;
}

// --- sparse: table "emb" saved by every rank (its slices), then a delta, loaded as M shards. ---

constexpr int64_t kSparseDim = 8;
using SparseRef = std::map<int64_t, int64_t>;  // id -> version of its rows

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The row of `id` at `version` in slot `slot`: 0 = "embedding" (F32, exact values), 1 =
// "exp_avg" (BF16, any bits, NaNs included: compared bit for bit).
void FillRow(int slot, int64_t id, int64_t version, std::span<std::byte> row) {
  for (int64_t k = 0; k < kSparseDim; ++k) {
    uint64_t h = Mix(static_cast<uint64_t>(id) ^ Mix(version * 16 + slot * 8 + k));
    if (slot == 0) {
      float f = static_cast<float>(h >> 40) / 1024.0f;
      std::memcpy(row.data() + k * 4, &f, 4);
    } else {
      uint16_t b = static_cast<uint16_t>(h);
      std::memcpy(row.data() + k * 2, &b, 2);
    }
  }
}

// 20,000 ids at version 0: random int64s (half negative) plus, for 1 to 8 shards, the first and
// last slice of every shard (as a positive and a negative id), and the extreme int64s.
SparseRef MakeSparseRef(uint64_t seed) {
  std::mt19937_64 rng(seed);
  SparseRef ref = {{std::numeric_limits<int64_t>::min(), 0},
                   {std::numeric_limits<int64_t>::max(), 0}};
  for (int m = 1; m <= 8; ++m) {
    for (int i = 0; i < m; ++i) {
      SliceRange s = GenSlice(i, m).value();
      for (int64_t slice : {s.begin, s.end - 1}) {
        ref[slice] = 0;
        ref[slice - 3 * kNumSlices] = 0;
      }
    }
  }
  while (ref.size() < 20000) ref[static_cast<int64_t>(rng())] = 0;
  return ref;
}

struct SparseDelta {
  std::vector<int64_t> touched;  // updated or inserted, now at version 1
  std::vector<int64_t> deleted;
};

// About 5% of the rows updated, 1% deleted and 600 inserted; applied to `ref`.
SparseDelta MakeSparseDelta(uint64_t seed, SparseRef& ref) {
  std::mt19937_64 rng(seed);
  SparseDelta d;
  for (const auto& [id, version] : ref) {
    uint64_t x = rng() % 100;
    if (x < 5) d.touched.push_back(id);
    if (x == 5) d.deleted.push_back(id);
  }
  for (int64_t id : d.deleted) ref.erase(id);
  for (int64_t id : d.touched) ref[id] = 1;
  for (int inserted = 0; inserted < 600;) {
    int64_t id = static_cast<int64_t>(rng());
    if (ref.count(id) > 0 || std::count(d.deleted.begin(), d.deleted.end(), id) > 0) continue;
    ref[id] = 1;
    d.touched.push_back(id);
    ++inserted;
  }
  return d;
}

std::vector<int64_t> Keys(const SparseRef& ref) {
  std::vector<int64_t> out;
  for (const auto& [id, version] : ref) out.push_back(id);
  return out;
}

// The ids of `ids` in `range`'s slices, in a hash-like order (not the storage order).
std::vector<int64_t> Mine(const std::vector<int64_t>& ids, SliceRange range) {
  std::vector<int64_t> out;
  for (int64_t id : ids) {
    if (range.Contains(SliceOf(id))) out.push_back(id);
  }
  std::sort(out.begin(), out.end(), [](int64_t a, int64_t b) { return Mix(a) < Mix(b); });
  return out;
}

// An owning table of rows `ids` at their versions in `ref` (0 for ids it lacks).
SparseTable SparseTableOf(const SparseRef& ref, const std::vector<int64_t>& ids) {
  auto slot = [&ref](int s) {
    return [&ref, s](int64_t id, std::span<std::byte> row) {
      auto it = ref.find(id);
      FillRow(s, id, it == ref.end() ? 0 : it->second, row);
    };
  };
  return testing::MakeTable(ids, {{"embedding", DType::kF32, kSparseDim, slot(0)},
                                  {"exp_avg", DType::kBF16, kSparseDim, slot(1)}});
}

// Saves `table` as this rank's rows, with its part of the dense tensors of `g` (DP x TP), at
// `path`, as a delta of `base` unless empty. A table this rank could not build breaks the group.
Status SaveSparseRank(Communicator& c, const Globals& g, Result<SparseTable> table,
                      const std::string& path, const std::string& base) {
  ShardLayout mine = Layout(g, c.size(), c.rank(), c.size() % 2 == 0 ? 2 : c.size(), 0);
  State local = Slice(g, mine);
  Status put = table.ok() ? local.PutTable("emb", std::move(*table)) : table.status();
  if (!put.ok()) {
    c.Abort(put);
    return put;
  }
  SparseSaveOptions o;
  o.save.overwrite = true;
  o.save.chunk_bytes = 64 << 10;
  o.base = base;
  o.timeout = 60s;
  return SaveSparseDistributed(c, local, mine, path, o);
}

bool RowMatches(const TensorView& slot, int s, int64_t row, int64_t id, int64_t version) {
  const uint64_t bytes = SparseTable::RowBytes(slot);
  std::vector<std::byte> want(bytes);
  FillRow(s, id, version, want);
  return std::memcmp(slot.data() + row * bytes, want.data(), bytes) == 0;
}

// What differs between `t` and the rows of `ref` whose slices lie in `range` ("" when nothing):
// the slots, the ids (each in `range`, in (slice, id) order, each once, all of them) and the rows.
std::string TableError(const SparseTable& t, SliceRange range, const SparseRef& ref) {
  const int64_t n = t.num_rows();
  const TensorView* emb = t.FindSlot("embedding");
  const TensorView* avg = t.FindSlot("exp_avg");
  if (t.slots().size() != 2 || emb == nullptr || avg == nullptr) return "slots differ";
  if (emb->dtype() != DType::kF32 || avg->dtype() != DType::kBF16 ||
      emb->shape() != Shape{n, kSparseDim} || avg->shape() != Shape{n, kSparseDim}) {
    return "slot dtypes or shapes differ";
  }
  auto in_range = [&](const auto& e) { return range.Contains(SliceOf(e.first)); };
  const int64_t want = std::count_if(ref.begin(), ref.end(), in_range);
  if (n != want) return fmt::format("{} rows, want {}", n, want);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t id = t.ids()[r];
    if (!range.Contains(SliceOf(id))) return fmt::format("id {} outside its slices", id);
    if (r > 0 && std::pair(SliceOf(t.ids()[r - 1]), t.ids()[r - 1]) >= std::pair(SliceOf(id), id))
      return fmt::format("id {} out of (slice, id) order or repeated", id);
    auto it = ref.find(id);
    if (it == ref.end()) return fmt::format("id {} not in the reference", id);
    if (!RowMatches(*emb, 0, r, id, it->second)) return fmt::format("embedding of id {}", id);
    if (!RowMatches(*avg, 1, r, id, it->second)) return fmt::format("exp_avg of id {}", id);
  }
  return "";
}

// Loads shard `i` of `m` of `path` and checks its table against `ref` and its dense tensors and
// value against `g`.
void CheckShard(const std::string& path, int i, int m, const SparseRef& ref, const Globals& g,
                int rank) {
  const std::string what = fmt::format("load {} as shard {} of {}: ", path, i, m);
  Result<State> got = LoadSparse(path, {.shard_id = i, .shard_num = m});
  Check(got.ok(), what + got.status().ToString(), rank);
  if (!got.ok()) return;
  Check(Equal(Slice(g, {}), *got), what + "dense tensors or values differ", rank);
  const SparseTable* t = got->FindTable("emb");
  Check(t != nullptr && got->tables().size() == 1, what + "tables differ", rank);
  if (t == nullptr) return;
  std::string err = TableError(*t, GenSlice(i, m).value(), ref);
  Check(err.empty(), what + err, rank);
}

// Rank r of n loads shards r, r + n, ... of m (for m = 1, rank 0 loads the whole table): between
// them, the ranks load every shard.
void CheckShards(Communicator& c, const std::string& path, int m, const SparseRef& ref,
                 const Globals& g) {
  for (int i = c.rank(); i < m; i += c.size()) CheckShard(path, i, m, ref, g, c.rank());
}

// Rank n - 1 passes one id of rank n - 2's slices: every rank's save fails naming the rank and
// the id, and nothing is committed.
void SparseBadId(Communicator& c, const Globals& g, const SparseRef& ref, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  std::vector<int64_t> ids = Mine(Keys(ref), GenSlice(r, n).value());
  const int64_t bad = GenSlice(n - 1, n).value().begin - 1 - 5 * kNumSlices;
  if (r == n - 1) ids.insert(ids.begin() + static_cast<int64_t>(ids.size() / 2), bad);
  Status s = SaveSparseRank(c, g, SparseTableOf(ref, ids), dir + "/bad", "");
  Check(s.code() == StatusCode::kInvalidArgument &&
            s.message().find(fmt::format("rank {}: ", n - 1)) != std::string::npos &&
            s.message().find(fmt::format("id {}", bad)) != std::string::npos,
        "bad id: " + s.ToString(), r);
  c.Barrier(60s).IgnoreError();
  Check(!DefaultFileSystem()->Exists(dir + "/bad"), "bad id: committed", r);
}

void Sparse(Communicator& c, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  const Globals g = MakeGlobals(77);
  SparseRef ref = MakeSparseRef(2024);
  const SliceRange range = GenSlice(r, n).value();
  Status s = SaveSparseRank(c, g, SparseTableOf(ref, Mine(Keys(ref), range)), dir + "/full", "");
  Check(s.ok(), "full save: " + s.ToString(), r);
  CheckShards(c, dir + "/full", n, ref, g);
  SparseDelta d = MakeSparseDelta(2025, ref);
  Result<SparseTable> delta = MakeDelta(SparseTableOf(ref, Mine(Keys(ref), range)),
                                        Mine(d.touched, range), Mine(d.deleted, range));
  Check(delta.ok(), "MakeDelta: " + delta.status().ToString(), r);
  s = SaveSparseRank(c, g, std::move(delta), dir + "/delta", dir + "/full");
  Check(s.ok(), "delta save: " + s.ToString(), r);
  for (int m : {n - 1, n, n + 1, 1}) CheckShards(c, dir + "/delta", m, ref, g);
  if (r == 0) {
    Result<std::vector<SparseChainLink>> chain = SparseChain(dir + "/delta");
    Check(chain.ok() && chain->size() == 2 && (*chain)[0].depth == 1,
          "chain: " + chain.status().ToString(), r);
  }
  SparseBadId(c, g, ref, dir);
}

}  // namespace
}  // namespace savepoint

int main(int argc, char** argv) {
  using namespace savepoint;
  if (argc != 3) {
    fmt::print(stderr, "usage: {} roundtrip|sparse|kill DIR\n", argv[0]);
    return 2;
  }
  auto comm = NewMpiCommunicator();
  if (!comm.ok()) {
    fmt::print(stderr, "{}\n", comm.status().ToString());
    return 2;
  }
  Communicator& c = **comm;
  std::string mode = argv[1], dir = argv[2];
  if (c.rank() == 0) DefaultFileSystem()->CreateDirs(dir).IgnoreError();
  c.Barrier(std::chrono::seconds(60)).IgnoreError();
  if (mode == "kill") return Kill(c, dir);
  if (mode == "sparse") {
    Sparse(c, dir);
  } else {
    RoundTrip(c, dir);
    FailingRank(c, dir);
    LateRank(c, dir);
  }
  fmt::print("rank {} of {}: {}\n", c.rank(), c.size(), failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
