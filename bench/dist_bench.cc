// dist_bench: distributed save / resharded load throughput, and the coordinator's merge cost.
//
//   mpirun -np 4 dist_bench io --dir DIR --bytes N [--tensors K] [--threads T] [--dp D]
//                              [--chunk-mb C] [--reps N] [--phases P,...] [--pause-ms P]
//       Global model of N bytes (K f32 tensors [rows, 4096]), held DP D x TP (world / D): each
//       rank holds a row block of every tensor, replicas written once. Phases (each between two
//       barriers, timed on rank 0, the checkpoint dropped from the page cache before each load):
//         save     SaveDistributed (durable and committed when it returns), N times
//         ddw1, ddr1  the physical reference: rank 0 alone writes (dd oflag=direct conv=fsync)
//                  and reads back (iflag=direct, cache dropped) the model's bytes, 8 MiB blocks
//         ddwW, ddrW  the same bytes split W ways, one dd per rank at once
//         load44   every rank of world W loads rows [r*R/W, (r+1)*R/W) (the model read once)
//                  into fresh tensors (LoadDistributedAlloc)
//         load43   only W-1 ranks load, rows split W-1 ways (resharded: crosses shard borders)
//         into44, into43  the same into tensors built (allocated, touched) before the clock starts
//                  (LoadDistributed, as a job resuming into its model)
//       Every phase runs N times (default 3): odd repetitions in the order --phases lists them
//       (default load44, load43, into44, into43), even ones in reverse (ABBA, so that no phase
//       always follows the same one). --pause-ms P sleeps P ms before each load's clock starts.
//       Prints bytes, seconds, GB/s per phase (for loads also each rank's own seconds in the
//       load call, to show imbalance), then the medians: save
//       against dd writes, 4->4 load against dd reads, and the ratio 4->3 / 4->4. A target box
//       whose edge falls inside a chunk reads that chunk whole (it is verified whole), so two ranks
//       read it: load43 reads up to 2 chunks per tensor more than load44.
//   dist_bench merge --ranks P --tensors K
//       The coordinator's cost of merging P simulated ranks' plan descriptors (each rank writes a
//       row block of each of K tensors): descriptor bytes, merge + validation time, checksum merge
//       time and encoded manifest size.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>

#include "distributed/descriptor.h"
#include "distributed/merge.h"
#include "savepoint/distributed.h"
#include "savepoint/mpi.h"
#include "savepoint/savepoint.h"

namespace {

using namespace savepoint;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int64_t kCols = 4096;

struct Args {
  std::string mode, dir;
  uint64_t bytes = uint64_t{256} << 20;
  int tensors = 16, threads = 4, dp = 2, ranks = 64, reps = 3;
  int pause_ms = 0;  // sleep before each load (after its cache drop), before the clock starts
  uint64_t chunk_bytes = SaveOptions().chunk_bytes;
  // --phases, split at commas: dd, loadWW, loadWV, intoWW, intoWV (W the world, V = W - 1), in
  // the order to run them; empty = all.
  std::vector<std::string> phases;
  bool Want(const std::string& phase) const {
    return phases.empty() || std::find(phases.begin(), phases.end(), phase) != phases.end();
  }
};

uint64_t ParseSize(std::string s) {
  uint64_t mult = 1;
  char c = s.empty() ? 0 : s.back();
  if (c == 'K' || c == 'M' || c == 'G') {
    mult = uint64_t{1} << (c == 'K' ? 10 : c == 'M' ? 20 : 30);
    s.pop_back();
  }
  return std::stoull(s) * mult;
}

Args Parse(int argc, char** argv) {
  Args a;
  a.mode = argc > 1 ? argv[1] : "";
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    if (k == "--bytes") a.bytes = ParseSize(v);
    if (k == "--tensors") a.tensors = std::stoi(v);
    if (k == "--threads") a.threads = std::stoi(v);
    if (k == "--dp") a.dp = std::stoi(v);
    if (k == "--ranks") a.ranks = std::stoi(v);
    if (k == "--reps") a.reps = std::max(1, std::stoi(v));
    if (k == "--chunk-mb") a.chunk_bytes = std::stoull(v) << 20;
    if (k == "--phases") {
      for (size_t b = 0, e; b <= v.size(); b = e + 1) {
        e = std::min(v.find(',', b), v.size());
        a.phases.push_back(v.substr(b, e - b));
      }
    }
    if (k == "--pause-ms") a.pause_ms = std::stoi(v);
  }
  return a;
}

void Must(const Status& s, const char* what) {
  if (s.ok()) return;
  fmt::print(stderr, "dist_bench: {}: {}\n", what, s.ToString());
  std::exit(1);
}

// Drops the checkpoint's pages from the page cache (fadvise; every rank does it, so the whole
// cache is also dropped through /proc/sys/vm/drop_caches where writable, i.e. as root).
void DropCache(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    std::fputs("1\n", f);
    std::fclose(f);
  }
}

// Times `fn` between two barriers; returns rank 0's wall seconds. Each rank's own time in `fn`
// goes to rank 0, which keeps them in `per_rank` (when set) to show imbalance.
double Timed(Communicator& c, const std::function<void()>& fn,
             std::vector<double>* per_rank = nullptr) {
  Must(c.Barrier(600s), "barrier");
  auto t0 = Clock::now();
  fn();
  double mine = std::chrono::duration<double>(Clock::now() - t0).count();
  Must(c.Barrier(600s), "barrier");
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  auto all = c.Gather(fmt::format("{:.3f}", mine), 0, 600s);
  Must(all.status(), "gather");
  if (per_rank != nullptr) {
    per_rank->clear();
    for (const auto& v : *all) per_rank->push_back(std::stod(v));
  }
  return wall;
}

// Runs dd on this rank (when `active`) between two barriers: writes `bytes` (rounded up to 8 MiB
// blocks) of zeros to `file` with O_DIRECT and a final fsync, or reads them back with O_DIRECT
// after dropping the cache. Returns rank 0's wall seconds.
double Dd(Communicator& c, const std::string& file, uint64_t bytes, bool write, bool active) {
  const uint64_t blocks = (bytes + (uint64_t{8} << 20) - 1) >> 23;
  std::string cmd =
      write ? fmt::format("dd if=/dev/zero of='{}' bs=8M count={} oflag=direct conv=fsync", file,
                          blocks)
            : fmt::format("dd if='{}' of=/dev/null bs=8M count={} iflag=direct", file, blocks);
  cmd += " status=none";
  if (!write && active) DropCache(std::filesystem::path(file).parent_path());
  return Timed(c, [&] {
    if (active && std::system(cmd.c_str()) != 0) Must(IOError("dd failed: " + cmd), "dd");
  });
}

double Median(std::vector<double> v) {  // NaN for a phase that did not run (--phases)
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void Report(Communicator& c, const char* phase, uint64_t bytes, double s) {
  if (c.rank() == 0)
    fmt::print("{:8} bytes={} seconds={:.4f} gbps={:.3f}\n", phase, bytes, s, bytes / s / 1e9);
}

ShardLayout RowLayout(const Args& a, int64_t rows, int parts, int index, std::vector<int> reps) {
  ShardLayout l;
  for (int t = 0; t < a.tensors; ++t) {
    l[fmt::format("layer{:03}.w", t)] = SplitDim({rows, kCols}, 0, parts, index, reps).value();
  }
  return l;
}

// One timed load of the model as `world` row blocks (ranks from `world` on stay idle). `into`:
// into tensors allocated and touched before the clock starts (LoadDistributed: a job resuming into
// the model it has built); otherwise into fresh tensors (LoadDistributedAlloc, which also pays
// the kernel's first touch of new memory). The loaded tensors are freed after the clock stops.
double Load(Communicator& c, const Args& a, const std::string& path, int64_t rows, int world,
            bool into, std::vector<double>* per_rank_out) {
  DropCache(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(a.pause_ms));
  ShardLayout layout;
  if (c.rank() < world) layout = RowLayout(a, rows, world, c.rank(), {});
  State targets;
  if (into && c.rank() < world) {
    for (const auto& [name, spec] : layout) {
      Must(targets.Put(name, Tensor::Zeros(DType::kF32, spec.sizes).value()), "allocate");
    }
  }
  Result<State> loaded = State{};
  std::vector<double> per_rank;
  double wall = Timed(
      c,
      [&] {
        if (c.rank() >= world) return;
        const IoOptions io{.io_threads = a.threads};
        if (into) {
          Must(LoadDistributed(path, targets, layout, {}, io), "load");
        } else {
          loaded = LoadDistributedAlloc(path, layout, {}, io);
          Must(loaded.status(), "load");
        }
      },
      &per_rank);
  if (per_rank_out != nullptr) *per_rank_out = std::move(per_rank);
  return wall;
}

// A load phase's name: "load" (fresh tensors) or "into" (built ones), then W and the loading world.
std::string PhaseName(int into, int re, int w) {
  return fmt::format("{}{}{}", into ? "into" : "load", w, re ? w - 1 : w);
}

// The load phases to run, as {into, resharded}, in the order --phases names them (default: load,
// then into; W->W, then W->W-1). Exits naming a phase that is neither "dd" nor a load phase.
std::vector<std::pair<int, int>> LoadPhases(const Args& a, int w) {
  std::vector<std::pair<int, int>> all, out;
  for (int into = 0; into < 2; ++into) {
    for (int re = 0; re < 2; ++re) all.emplace_back(into, re);
  }
  if (a.phases.empty()) return all;
  for (const std::string& p : a.phases) {
    auto it = std::find_if(all.begin(), all.end(),
                           [&](auto ph) { return PhaseName(ph.first, ph.second, w) == p; });
    if (it != all.end()) {
      out.push_back(*it);
    } else if (p != "dd") {
      Must(InvalidArgumentError(fmt::format("--phases: unknown phase {:?} (world {}: dd, {}, {}, "
                                            "{}, {})",
                                            p, w, PhaseName(0, 0, w), PhaseName(0, 1, w),
                                            PhaseName(1, 0, w), PhaseName(1, 1, w))),
           "arguments");
    }
  }
  return out;
}

int RunIo(const Args& a) {
  // Every tensor of 1 MiB or more gets fresh pages from the kernel and returns them when freed, so
  // every "fresh tensors" load pays the first touch, as a job resuming in a new process does.
  // (By default glibc raises its mmap threshold after the first frees, up to 32 MiB, so repeated
  // 4->4 loads reused the 32 MiB blocks of the previous one while 4->3's 43 MiB ones were new.)
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  auto comm = NewMpiCommunicator();
  Must(comm.status(), "MPI");
  Communicator& c = **comm;
  const int w = c.size(), tp = w / a.dp;
  const std::vector<std::pair<int, int>> phases = LoadPhases(a, w);  // checked before any work
  const int64_t rows = static_cast<int64_t>(a.bytes / a.tensors / (kCols * 4));
  const uint64_t model = uint64_t(rows) * kCols * 4 * a.tensors;
  std::vector<int> reps;
  for (int q = c.rank() % tp; q < w; q += tp) reps.push_back(q);
  ShardLayout mine = RowLayout(a, rows, tp, c.rank() % tp, reps);
  State local;
  for (const auto& [name, spec] : mine) {
    Tensor t = Tensor::Empty(DType::kF32, spec.sizes).value();
    for (size_t i = 0; i < t.nbytes(); i += 64) t.data()[i] = std::byte(i * 131 + c.rank() % tp);
    Must(local.Put(name, std::move(t)), "put");
  }
  std::string path = a.dir + "/dist_bench_ckpt";
  if (c.rank() == 0) std::filesystem::remove_all(path);
  DistributedSaveOptions o;
  o.save.chunk_bytes = a.chunk_bytes;
  const IoOptions io{.io_threads = a.threads};
  // Each kind `reps` times, alternating; the first load of a process also pays for first-touching
  // fresh memory, which is slow in some VMs. Ratios of medians.
  std::vector<double> t[2][2];         // [into][resharded]
  std::vector<double> save, dd[2][2];  // dd[write][parallel]
  const std::string dd_file[2] = {a.dir + "/dist_bench_dd",
                                  fmt::format("{}/dist_bench_dd-{}", a.dir, c.rank())};
  for (int rep = 0; rep < a.reps; ++rep) {
    if (c.rank() == 0) std::filesystem::remove_all(path);  // before the clock (Timed's barrier)
    save.push_back(Timed(c, [&] { Must(SaveDistributed(c, local, mine, path, o, io), "save"); }));
    Report(c, fmt::format("save#{}", rep + 1).c_str(), model, save.back());
    for (int write : {1, 0}) {
      if (!a.Want("dd")) continue;
      for (int par = 0; par < 2; ++par) {
        uint64_t n = par ? (model + w - 1) / w : model;
        dd[write][par].push_back(Dd(c, dd_file[par], n, write, par || c.rank() == 0));
        Report(c, fmt::format("dd{}{}#{}", write ? 'w' : 'r', par ? w : 1, rep + 1).c_str(), model,
               dd[write][par].back());
      }
    }
  }
  for (const auto& f : dd_file) std::filesystem::remove(f);
  for (int rep = 0; rep < a.reps; ++rep) {
    // ABBA: every other repetition runs the phases in reverse order, so that no phase always
    // follows the same one (a load right after another load that freed its fresh memory runs at
    // a different speed in a VM that hands freed memory back to the host).
    std::vector<std::pair<int, int>> order = phases;
    if (rep % 2 == 1) std::reverse(order.begin(), order.end());
    for (auto [into, re] : order) {
      std::string name = PhaseName(into, re, w);
      std::vector<double> per_rank;
      t[into][re].push_back(Load(c, a, path, rows, re ? w - 1 : w, into, &per_rank));
      Report(c, fmt::format("{}#{}", name, rep + 1).c_str(), model, t[into][re].back());
      if (c.rank() == 0)
        fmt::print("         per-rank seconds: {:.3f}\n", fmt::join(per_rank, " "));
    }
  }
  if (c.rank() == 0) {
    double sv = Median(save);
    fmt::print(
        "median save {:.3f} s ({:.2f} GB/s): dd write 1 stream {:.3f} s = {:.2f}x, "
        "{} streams {:.3f} s = {:.2f}x (dd time / save time)\n",
        sv, model / sv / 1e9, Median(dd[1][0]), Median(dd[1][0]) / sv, w, Median(dd[1][1]),
        Median(dd[1][1]) / sv);
    double l44 = Median(t[1][0]);
    fmt::print(
        "median load {}->{} into built {:.3f} s: dd read 1 stream {:.3f} s = {:.2f}x, "
        "{} streams {:.3f} s = {:.2f}x\n",
        w, w, l44, Median(dd[0][0]), Median(dd[0][0]) / l44, w, Median(dd[0][1]),
        Median(dd[0][1]) / l44);
    for (int into = 0; into < 2; ++into) {
      double m44 = Median(t[into][0]), m43 = Median(t[into][1]);
      fmt::print("median {}: {}->{} {:.3f} s, {}->{} {:.3f} s, ratio {:.3f}\n",
                 into ? "into built tensors" : "into fresh tensors", w, w, m44, w, w - 1, m43,
                 m43 / m44);
    }
    std::filesystem::remove_all(path);
  }
  return 0;
}

// A simulated rank's local manifest: one row block of each tensor.
format::Manifest RankManifest(const Args& a, int rank, int64_t rows) {
  format::Manifest m;
  m.files.push_back({"x", 0});
  uint64_t off = 4096;
  for (int t = 0; t < a.tensors; ++t) {
    ShardSpec s = SplitDim({rows, kCols}, 0, a.ranks, rank).value();
    uint64_t bytes = uint64_t(s.sizes[0]) * kCols * 4;
    format::ShardRecord sh{s.offsets, s.sizes, 0, off, bytes, {}};
    sh.crc32c.assign(format::NumChunks(bytes, uint64_t{8} << 20), 0x12345678u);
    m.tensors.push_back(
        {fmt::format("model.layers.{:04}.weight", t), DType::kF32, {rows, kCols}, {std::move(sh)}});
    off = format::AlignUp(off + bytes);
  }
  m.files[0].bytes = off;
  return m;
}

int RunMerge(const Args& a) {
  const int64_t rows = int64_t{64} * 1024;  // 1 GiB of f32 per tensor
  std::vector<std::string> plans, crcs;
  uint64_t plan_bytes = 0, crc_bytes = 0;
  for (int r = 0; r < a.ranks; ++r) {
    format::Manifest m = RankManifest(a, r, rows);
    plans.push_back(dist::EncodePlan(Status::OK(), m));
    crcs.push_back(dist::EncodeCrcs(Status::OK(), m));
    plan_bytes += plans.back().size();
    crc_bytes += crcs.back().size();
  }
  auto t0 = Clock::now();
  dist::ManifestMerger merger(a.ranks);
  for (int r = 0; r < a.ranks; ++r) Must(merger.AddPlan(r, plans[r]), "plan");
  Result<std::shared_ptr<const dist::MergedPlan>> plan = merger.Finish();
  Must(plan.status(), "finish");
  auto t1 = Clock::now();
  dist::SaveChecksums sums(*plan);
  for (int r = 0; r < a.ranks; ++r) Must(sums.Add(r, crcs[r]), "crcs");
  format::Manifest m;
  sums.TakeInto(&m);
  auto t2 = Clock::now();
  std::string encoded = format::EncodeManifest(m);
  auto t3 = Clock::now();
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  fmt::print(
      "merge ranks={} tensors={} shards={} plan_bytes={} crc_bytes={} merge_validate_ms={:.2f} "
      "crc_merge_ms={:.2f} encode_ms={:.2f} manifest_bytes={}\n",
      a.ranks, a.tensors, a.ranks * a.tensors, plan_bytes, crc_bytes, ms(t1 - t0), ms(t2 - t1),
      ms(t3 - t2), encoded.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  if (a.mode == "io" && !a.dir.empty()) return RunIo(a);
  if (a.mode == "merge") return RunMerge(a);
  fmt::print(stderr,
             "usage: mpirun -np W dist_bench io --dir DIR [--bytes N] [--tensors K] [--threads T] "
             "[--dp D]\n       dist_bench merge [--ranks P] [--tensors K]\n");
  return 2;
}
