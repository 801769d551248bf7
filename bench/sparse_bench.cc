// Sparse embedding tables (docs/SPARSE.md): a table of --rows ids x --dim f32 with two Adam slots
// (exp_avg, exp_avg_sq), held by --shards thread ranks (each the ids of its RecIS slice range, in
// hash-table order: the save sorts them), measured in one run against references taken in the
// same run:
//   dd        dd if=/dev/zero bs=8M oflag=direct conv=fsync of the full save's bytes
//   full      SaveSparseDistributed of every row
//   raw       the baseline a RecIS user has today: each shard writes its ids and rows to its own
//             files (write + fsync, what torch.save of each shard's tensors amounts to)
//   delta     SaveSparseDistributed with --touched (default 1%) of the rows, and --deleted ids
//             per shard deleted, as a delta on `full`; its bytes against the goal of
//             docs/PERFORMANCE.md: 1.1% of the full save + 8 KiB per table per rank
//   load N->N and N->(N-1): every loader (a thread) loads its shard of the table (--reps pairs,
//             ABBA, medians)
//   async     Checkpointer::SaveAsync of shard 0's tables (one process), full and a delta of its
//             touched rows: the time SaveAsync blocks the caller against a memcpy of the same
//             bytes (ids and slots) into pre-touched memory, in the same run (--reps each,
//             alternating, medians); building the delta (MakeDelta) is timed apart
// Usage: sparse_bench --dir DIR [--rows 1048576] [--dim 32] [--shards 4] [--touched 0.01]
//                     [--deleted 0] [--tables 1] [--threads 4] [--sorted 0|1] [--reps 3]
// --tables T saves T tables of the same rows (emb0 ... emb<T-1>; their memory shared), so the
// per-table overhead shows; --rows and the sizes are per table.
// The final line lists every ratio. The full size is --rows 4194304 --dim 128 (~6 GiB).
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/savepoint.h"
#include "timer.h"

namespace sp = savepoint;

namespace {

using sp::bench::Seconds;

struct Flags {
  std::string dir;
  int64_t rows = int64_t{1} << 20;
  int64_t dim = 32;
  int shards = 4;
  double touched = 0.01;
  int64_t deleted = 0;  // ids deleted per shard in the delta
  int tables = 1;
  int threads = 4;
  bool sorted = false;  // ids already in storage order (the save then copies nothing)
  int reps = 3;         // repetitions of dd, full save and raw files (medians; ABBA order)
};

void Must(const sp::Status& s, std::string_view what) {
  if (s.ok()) return;
  fmt::print(stderr, "sparse_bench: {}: {}\n", what, s.ToString());
  std::exit(1);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      f.dir = v;
    else if (k == "--rows")
      f.rows = std::stoll(v);
    else if (k == "--dim")
      f.dim = std::stoll(v);
    else if (k == "--shards")
      f.shards = std::stoi(v);
    else if (k == "--touched")
      f.touched = std::stod(v);
    else if (k == "--deleted")
      f.deleted = std::stoll(v);
    else if (k == "--tables")
      f.tables = std::stoi(v);
    else if (k == "--threads")
      f.threads = std::stoi(v);
    else if (k == "--sorted")
      f.sorted = v == "1";
    else if (k == "--reps")
      f.reps = std::stoi(v);
    else
      Must(sp::InvalidArgumentError("unknown flag " + k), "flags");
  }
  if (f.dir.empty() || f.shards < 2 || f.reps < 1 || f.tables < 1 || f.deleted < 0)
    Must(sp::InvalidArgumentError("need --dir, --shards >= 2, --reps >= 1, --tables >= 1, "
                                  "--deleted >= 0"),
         "flags");
  return f;
}

// One shard's rows: random ids of its slice range (in random order), three f32 slots.
struct Shard {
  sp::Tensor ids, emb, m, v;
  // `tables` tables of these rows; with `subset`, a delta of them deleting `deleted`.
  sp::State Table(int tables, const std::vector<int64_t>* subset = nullptr,
                  const std::vector<int64_t>& deleted = {}) const;
};

sp::State Shard::Table(int tables, const std::vector<int64_t>* subset,
                       const std::vector<int64_t>& deleted) const {
  std::vector<sp::SparseTable::Slot> slots = {
      {"embedding", emb.view()}, {"exp_avg", m.view()}, {"exp_avg_sq", v.view()}};
  sp::State s;
  for (int k = 0; k < tables; ++k) {
    sp::SparseTable t = sp::SparseTable::FromViews(ids.view(), slots).value();
    if (subset != nullptr) t = sp::MakeDelta(t, *subset, deleted).value();
    Must(s.PutTable(tables == 1 ? "emb" : fmt::format("emb{}", k), std::move(t)), "table");
  }
  return s;
}

std::vector<Shard> Generate(const Flags& f) {
  std::vector<Shard> shards(f.shards);
  for (int r = 0; r < f.shards; ++r) {
    const sp::SliceRange range = sp::GenSlice(r, f.shards).value();
    const int64_t n = f.rows / f.shards;
    Shard& s = shards[r];
    s.ids = sp::Tensor::Empty(sp::DType::kI64, {n}).value();
    std::mt19937_64 rng(r);
    const int64_t width = range.end - range.begin;
    const int64_t per = (n + width - 1) / width;  // rows per slice (the last ones fewer)
    for (int64_t i = 0; i < n; ++i) {  // storage order: slice begin + i / per, ids ascending in it
      s.ids.as<int64_t>()[i] = (i % per) * sp::kNumSlices + range.begin + i / per;
    }
    if (!f.sorted) std::shuffle(s.ids.as<int64_t>().begin(), s.ids.as<int64_t>().end(), rng);
    for (sp::Tensor* t : {&s.emb, &s.m, &s.v}) {
      *t = sp::Tensor::Empty(sp::DType::kF32, {n, f.dim}).value();
      for (float& x : t->as<float>()) x = static_cast<float>(rng() % 1000) / 1000.0f;
    }
  }
  return shards;
}

// Runs fn(rank, comm) on one thread per shard.
void OnRanks(int n, const std::function<sp::Status(int, sp::Communicator&)>& fn,
             std::string_view what) {
  auto comms = sp::NewThreadCommunicators(n);
  std::vector<sp::Status> st(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { st[r] = fn(r, *comms[r]); });
  for (auto& t : threads) t.join();
  for (const auto& s : st) Must(s, what);
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

void WriteRaw(const std::string& path, const sp::Tensor& t) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || ::write(fd, t.data(), t.nbytes()) != static_cast<ssize_t>(t.nbytes()) ||
      ::fsync(fd) != 0) {
    Must(sp::IOError("raw write " + path), "raw");
  }
  ::close(fd);
}

struct CpuTimes {
  double user = 0, sys = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The bytes of a full save before one was made: the tables' rows and ids.
uint64_t EstimatedBytes(const Flags& f) {
  return static_cast<uint64_t>(f.tables) * static_cast<uint64_t>(f.rows) *
         (8 + 3 * 4 * static_cast<uint64_t>(f.dim));
}

// dd of `bytes` (rounded up to 8 MiB) with O_DIRECT and a final fsync, into DIR/dd (removed).
double DdSeconds(const std::string& dir, uint64_t bytes) {
  const std::string dd =
      fmt::format("dd if=/dev/zero of='{}/dd' bs=8M count={} oflag=direct conv=fsync status=none",
                  dir, (bytes + (8 << 20) - 1) >> 23);
  const double t =
      Seconds([&] { Must(std::system(dd.c_str()) == 0 ? sp::Status() : sp::IOError(dd), "dd"); });
  std::filesystem::remove(dir + "/dd");
  return t;
}

// The RecIS user's baseline: every shard writes each table's ids and rows to files of its own
// (removed).
double RawSeconds(const std::string& dir, const std::vector<Shard>& shards, int tables) {
  auto name = [&](size_t r, int table, int k) {
    return fmt::format("{}/raw-{}-{}-{}", dir, r, table, k);
  };
  const double t = Seconds([&] {
    std::vector<std::thread> threads;
    for (size_t r = 0; r < shards.size(); ++r) {
      threads.emplace_back([&, r] {
        for (int table = 0; table < tables; ++table) {
          int k = 0;
          for (const sp::Tensor* t : {&shards[r].ids, &shards[r].emb, &shards[r].m, &shards[r].v}) {
            WriteRaw(name(r, table, k++), *t);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  });
  for (size_t r = 0; r < shards.size(); ++r) {
    for (int table = 0; table < tables; ++table) {
      for (int k = 0; k < 4; ++k) std::filesystem::remove(name(r, table, k));
    }
  }
  return t;
}

// Loads shard r of the full save for every rank r and checks that it holds exactly the rows
// rank r saved (ids in storage order, every slot's row bytes); exits non-zero otherwise.
void Verify(const std::string& path, const std::vector<Shard>& shards, const std::string& table,
            const sp::IoOptions& io) {
  const int n = static_cast<int>(shards.size());
  for (int r = 0; r < n; ++r) {
    sp::State s = sp::LoadSparse(path, {.shard_id = r, .shard_num = n}, io).value();
    const sp::SparseTable* t = s.FindTable(table);
    const auto ids = shards[r].ids.as<int64_t>();
    std::vector<int64_t> order(ids.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const int64_t sa = sp::SliceOf(ids[a]), sb = sp::SliceOf(ids[b]);
      return sa != sb ? sa < sb : ids[a] < ids[b];
    });
    bool ok = t != nullptr && t->ids().size() == ids.size();
    const sp::Tensor* slots[] = {&shards[r].emb, &shards[r].m, &shards[r].v};
    const char* names[] = {"embedding", "exp_avg", "exp_avg_sq"};
    for (size_t i = 0; ok && i < order.size(); ++i) {
      ok = t->ids()[i] == ids[order[i]];
      for (int k = 0; ok && k < 3; ++k) {
        const uint64_t rb = slots[k]->nbytes() / ids.size();
        ok = std::memcmp(t->FindSlot(names[k])->data() + i * rb, slots[k]->data() + order[i] * rb,
                         rb) == 0;
      }
    }
    if (!ok)
      Must(sp::InternalError(fmt::format("shard {} did not load back as saved", r)), "verify");
  }
  fmt::print("verified: every shard loaded back exactly as saved\n");
}

// Checks that the delta chain at `path` loads each shard's rows less its `deleted` ids.
void VerifyDelta(const std::string& path, const std::vector<Shard>& shards,
                 const std::vector<std::vector<int64_t>>& deleted, const std::string& table,
                 const sp::IoOptions& io) {
  const int n = static_cast<int>(shards.size());
  for (int r = 0; r < n; ++r) {
    sp::State s = sp::LoadSparse(path, {.shard_id = r, .shard_num = n}, io).value();
    const sp::SparseTable* t = s.FindTable(table);
    const size_t want = shards[r].ids.as<int64_t>().size() - deleted[r].size();
    if (t == nullptr || t->ids().size() != want)
      Must(sp::InternalError(fmt::format("shard {} of the delta chain lost rows", r)), "verify");
  }
  fmt::print("verified: the delta chain loads every shard's rows less its deleted ids\n");
}

struct AsyncTimes {
  double full = 0, full_copy = 0, delta = 0, delta_copy = 0;
  double make_delta = 0;  // building the delta table (SparseTable views + MakeDelta)
  double first = 0;       // the first full save's blocked time (its staging buffers are new)
  double total = 0;       // median full save from SaveAsync to the end of Wait
};

// Seconds of a memcpy of `bytes` from `src` into the pre-touched `dst`.
double CopySeconds(const std::vector<const sp::Tensor*>& src, std::vector<std::byte>& dst) {
  return Seconds([&] {
    std::byte* at = dst.data();
    for (const sp::Tensor* t : src) {
      std::memcpy(at, t->data(), t->nbytes());
      at += t->nbytes();
    }
  });
}

// The async saves of shard `s` (see the file comment): medians of --reps blocked times, each
// beside a memcpy of the same bytes.
AsyncTimes AsyncSeconds(const Flags& f, const Shard& s, const std::vector<int64_t>& touched,
                        const std::string& dir) {
  const uint64_t bytes = static_cast<uint64_t>(f.tables) *
                         (s.ids.nbytes() + s.emb.nbytes() + s.m.nbytes() + s.v.nbytes());
  auto ckpt = sp::Checkpointer::Create(
                  {.staging_bytes = bytes + (uint64_t{256} << 20), .prefault_bytes = bytes},
                  {.io_threads = f.threads})
                  .value();
  while (ckpt->staging_allocated_bytes() < std::min(bytes, ckpt->staging_cap_bytes())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the staging is reserved
  }
  std::vector<std::byte> buffer(bytes);
  std::memset(buffer.data(), 1, buffer.size());
  std::vector<const sp::Tensor*> all;
  for (int k = 0; k < f.tables; ++k) {
    for (const sp::Tensor* t : {&s.ids, &s.emb, &s.m, &s.v}) all.push_back(t);
  }
  // The delta's bytes: its rows (ids and slots), as MakeDelta gathers them.
  const uint64_t row_bytes = 8 + 3 * 4 * static_cast<uint64_t>(f.dim);
  sp::Tensor delta_src =
      sp::Tensor::Empty(sp::DType::kU8,
                        {static_cast<int64_t>(touched.size() * row_bytes * f.tables)})
          .value();
  std::vector<std::vector<double>> t(6);
  for (int rep = 0; rep < f.reps; ++rep) {
    const std::string path = fmt::format("{}/async-{}", dir, rep);
    const sp::State state = s.Table(f.tables);
    sp::bench::Timer total;
    sp::SaveHandle h = ckpt->SaveAsync(state, path).value();
    Must(h.Wait(), "async save");
    t[5].push_back(total.seconds());
    t[0].push_back(h.stats().blocked_seconds);
    t[1].push_back(CopySeconds(all, buffer));
    sp::bench::Timer timer;
    const sp::State delta = s.Table(f.tables, &touched);
    t[4].push_back(timer.seconds());
    sp::SaveHandle d =
        ckpt->SaveAsync(delta, path + "-delta", sp::SparseSaveOptions{.base = path}).value();
    t[2].push_back(d.stats().blocked_seconds);
    Must(d.Wait(), "async delta save");
    t[3].push_back(CopySeconds({&delta_src}, buffer));
    std::filesystem::remove_all(path);
    std::filesystem::remove_all(path + "-delta");
  }
  return {Median(t[0]), Median(t[1]), Median(t[2]), Median(t[3]),
          Median(t[4]), t[0][0],      Median(t[5])};
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  std::filesystem::remove_all(f.dir);
  std::filesystem::create_directories(f.dir);
  const std::vector<Shard> shards = Generate(f);
  const sp::IoOptions io{.io_threads = f.threads};
  const std::string full = f.dir + "/full", delta = f.dir + "/delta";

  // Repetitions in ABBA order (dd first in odd ones); every full save but the last is removed.
  std::vector<double> fulls, dds, raws;
  CpuTimes cpu;  // of the full saves
  uint64_t full_bytes = 0;
  for (int rep = 0; rep < f.reps; ++rep) {
    const std::string path = rep + 1 == f.reps ? full : fmt::format("{}/full-{}", f.dir, rep);
    auto save = [&] {
      sp::bench::Timer t;
      OnRanks(
          f.shards,
          [&](int r, sp::Communicator& c) {
            return sp::SaveSparseDistributed(c, shards[r].Table(f.tables), {}, path, {}, io);
          },
          "full save");
      fulls.push_back(t.seconds());
      const auto [user, sys] = t.cpu_seconds();
      cpu.user += user;
      cpu.sys += sys;
      full_bytes = DirBytes(path);
    };
    if (rep % 2 == 0) save();
    dds.push_back(DdSeconds(f.dir, full_bytes > 0 ? full_bytes : EstimatedBytes(f)));
    if (rep % 2 == 1) save();
    raws.push_back(RawSeconds(f.dir, shards, f.tables));
    if (path != full) std::filesystem::remove_all(path);
  }
  const double t_full = Median(fulls), t_dd = Median(dds), t_raw = Median(raws);

  std::vector<std::vector<int64_t>> touched(f.shards), deleted(f.shards);
  for (int r = 0; r < f.shards; ++r) {
    const auto ids = shards[r].ids.as<int64_t>();
    const size_t n = static_cast<size_t>(f.touched * ids.size());
    const size_t d = std::min(static_cast<size_t>(f.deleted), ids.size() - n);
    touched[r].assign(ids.begin(), ids.begin() + n);  // ids are in random order
    deleted[r].assign(ids.begin() + n, ids.begin() + n + d);
  }
  std::vector<sp::State> deltas;
  for (int r = 0; r < f.shards; ++r) {
    deltas.push_back(shards[r].Table(f.tables, &touched[r], deleted[r]));
  }
  const double t_delta = Seconds([&] {
    OnRanks(
        f.shards,
        [&](int r, sp::Communicator& c) {
          return sp::SaveSparseDistributed(c, deltas[r], {}, delta, {.base = full}, io);
        },
        "delta save");
  });
  const uint64_t delta_bytes = DirBytes(delta);
  const double delta_goal = 0.011 * static_cast<double>(full_bytes) + 8192.0 * f.tables * f.shards;

  auto load = [&](int m) {
    return Seconds([&] {
      OnRanks(
          m,
          [&](int r, sp::Communicator&) {
            return sp::LoadSparse(full, {.shard_id = r, .shard_num = m}, io).status();
          },
          "load");
    });
  };
  std::vector<double> nns, nms;  // --reps pairs, ABBA
  for (int rep = 0; rep < f.reps; ++rep) {
    if (rep % 2 == 0) nns.push_back(load(f.shards));
    nms.push_back(load(f.shards - 1));
    if (rep % 2 == 1) nns.push_back(load(f.shards));
  }
  const double nn = Median(nns), nm = Median(nms);
  const AsyncTimes async = AsyncSeconds(f, shards[0], touched[0], f.dir);
  const std::string first_table = f.tables == 1 ? "emb" : "emb0";
  Verify(full, shards, first_table, io);  // untimed: every rank's rows came back, in storage order
  VerifyDelta(delta, shards, deleted, first_table, io);

  const double gib = static_cast<double>(full_bytes) / (1 << 30);
  fmt::print("{} table(s) of {} ids x {} f32 x 3 slots over {} shards, {:.2f} GiB on disk\n",
             f.tables, f.rows, f.dim, f.shards, gib);
  fmt::print("medians of {} repetitions (ABBA); each run's seconds in brackets\n", f.reps);
  fmt::print("dd          {:.3f} s  {:.2f} GiB/s  [{:.3f}]\n", t_dd, gib / t_dd,
             fmt::join(dds, " "));
  fmt::print("full save   {:.3f} s  {:.2f} GiB/s  [{:.3f}]\n", t_full, gib / t_full,
             fmt::join(fulls, " "));
  fmt::print("full save CPU per save: {:.2f} s user, {:.2f} s sys\n", cpu.user / f.reps,
             cpu.sys / f.reps);
  fmt::print("raw files   {:.3f} s  {:.2f} GiB/s  [{:.3f}]\n", t_raw, gib / t_raw,
             fmt::join(raws, " "));
  fmt::print(
      "delta save  {:.3f} s  {} bytes ({:.2f}% touched, {} deleted per shard); goal {:.0f} bytes "
      "(1.1% of full + 8 KiB per table per rank): {}\n",
      t_delta, delta_bytes, 100 * f.touched, f.deleted, delta_goal,
      static_cast<double>(delta_bytes) <= delta_goal ? "met" : "NOT met");
  fmt::print("load {}->{}  {:.3f} s [{:.3f}]; {}->{}  {:.3f} s [{:.3f}]\n", f.shards, f.shards, nn,
             fmt::join(nns, " "), f.shards, f.shards - 1, nm, fmt::join(nms, " "));
  fmt::print(
      "async (shard 0, one process): full blocked {:.4f} s (first save {:.4f} s), memcpy {:.4f} "
      "s, until written {:.3f} s; delta blocked {:.4f} s, memcpy of its rows {:.5f} s, MakeDelta "
      "{:.4f} s\n",
      async.full, async.first, async.full_copy, async.total, async.delta, async.delta_copy,
      async.make_delta);
  fmt::print(
      "ratios: full/dd speed {:.2f} (goal >= 0.9); full/raw speed {:.2f}; delta bytes {:.3f}% of "
      "full (goal <= {:.3f}%: 1.1% + 8 KiB per table per rank); delta time {:.2f}% of full (goal "
      "<= 3%); load {}->{} / {}->{} {:.2f} (goal <= 1.2); async blocked / memcpy: full {:.2f}, "
      "delta {:.2f} (goal <= 1.2)\n",
      t_dd / t_full, t_raw / t_full, 100.0 * delta_bytes / full_bytes,
      100.0 * delta_goal / full_bytes, 100.0 * t_delta / t_full, f.shards, f.shards - 1, f.shards,
      f.shards, nm / nn, async.full / async.full_copy, async.delta / async.delta_copy);
  std::filesystem::remove_all(f.dir);
  return 0;
}
