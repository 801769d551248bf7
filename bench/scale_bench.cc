// scale_bench: the coordination of a distributed save and the planning of a resharded load at
// 64 .. 16,384 simulated ranks in one process, through the real code (docs/PERFORMANCE.md,
// "Scale").
//
//   scale_bench [--ranks 64,1024,4096,16384] [--dir DIR] [--tp 8] [--pp 8] [--load-tp 4]
//               [--samples 5] [--format-version 4] [--repeats 3]
//
// Per world size N, on the layout of bench/scale_layout.h (70B, TP x PP x DP):
//  1. every simulated rank runs RankSave::Plan on its own tensors (views of one PROT_NONE
//     mapping: planning never touches data) and hands over its plan bytes and the report bytes a
//     write would send (RankSaveAccess::DryReport: nothing written, CRC32Cs zero);
//  2. the coordinator decides as SaveDistributed's does: SaveCoordinator::Decide on the N plans'
//     digests (a miss in the plan cache, emptied first, so its verdict asks for the plans),
//     Decide on the N plans, and Commit on the N reports, which writes the real MANIFEST into
//     DIR; timed --repeats times (the median is printed), with the process's peak memory over
//     them; then `dd` writes and syncs as many bytes as the MANIFEST has, the physical reference
//     of Commit's write (manifest_dd_s);
//  2b. a repeated save of the same layout (DIR/scale-bench-N-again...): Decide on the digests
//     finds the merged plan in the cache; Decide and Commit timed, --repeats times;
//  3. a few ranks of a load into another layout (TP --load-tp, N / 2 ranks) run
//     PlanDistributedLoad (open and decode the manifest, plan the reads), timed one by one.
// --format-version 2 writes the JSON manifest (docs/FORMAT.md §3), 3 the indexed one (§15) and 4
// (the default) the indexed one with compact records (§17), which a loading rank reads in parts;
// 0 leaves the choice to the coordinator (SaveOptions' default: 4 beyond 65,536 shards, else 2),
// and written_version says what it wrote.
// DIR/scale-bench-N must not exist; the checkpoint is deleted with DeleteCheckpoint after each N.
// Prints one JSON object per N (bench/scale_report.py makes the tables, plot and summary).
#include <fmt/format.h>
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distributed/descriptor.h"
#include "distributed/merge.h"
#include "distributed/save_access.h"
#include "savepoint/distributed.h"
#include "savepoint/savepoint.h"
#include "scale_layout.h"

namespace {

using namespace savepoint;
using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<int> ranks = {64, 1024, 4096, 16384};
  std::string dir = "/tmp";
  int tp = 8, pp = 8, load_tp = 4, samples = 5, repeats = 3;
  uint32_t format_version = 4;
};

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// VmRSS or VmHWM of this process, in bytes.
uint64_t ProcBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(line.find(':') + 1)) << 10;
  }
  return 0;
}

// Starts a new peak: the kernel's high-water mark is reset to the current RSS.
void ResetPeak() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

double MiB(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

// One address range, never readable, that every tensor view points into.
const void* NoData() {
  static void* p = mmap(nullptr, size_t{1} << 31, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p;
}

void Must(const Status& s, const char* what) {
  if (s.ok()) return;
  fmt::print(stderr, "scale_bench: {}: {}\n", what, s.ToString());
  std::exit(1);
}

struct Layout {
  State state;
  ShardLayout layout;
};

Layout RankState(const scale::Grid& g, int rank, int64_t rows) {
  Layout out;
  for (scale::Entry& e : scale::RankEntries(g, rank, rows)) {
    Must(out.state.PutView(e.name, TensorView(NoData(), e.dtype, e.spec.sizes)), "view");
    out.layout.emplace(std::move(e.name), std::move(e.spec));
  }
  return out;
}

struct Row {
  int ranks = 0;
  uint32_t format_version = 0, written_version = 0;  // asked for; in the MANIFEST's header
  uint64_t entries = 0, plan_bytes = 0, report_bytes = 0, manifest_bytes = 0;
  double rank_plan_ms_max = 0, rank_plan_ms_mean = 0, decide_s = 0, commit_s = 0;
  double repeat_decide_s = 0, repeat_commit_s = 0, manifest_dd_s = 0;
  double peak_mib = 0, load_plan_ms = 0, load_peak_mib = 0;
  std::string error;
};

// Step 2's decision (and 2b's): the digests, then the plans when the verdict asks for them (as
// dist::Write does).
void Decide(SaveCoordinator& c, int n, const std::vector<std::string>& digests,
            const std::vector<std::string>& plans) {
  std::string verdict = c.Decide(digests);
  Must(c.decided(), "decide");
  Result<dist::Verdict> v = dist::DecodeVerdict(verdict, n);
  Must(v.status(), "verdict");
  if (v->need_plans) {
    c.Decide(plans);
    Must(c.decided(), "decide");
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds `dd` takes to write and sync `bytes` (in 8 MiB blocks) into `dir`.
double DdSeconds(const std::string& dir, uint64_t bytes) {
  const std::string file = dir + "/scale-bench-dd";
  if (std::filesystem::exists(file)) {  // (it is removed afterwards: never someone else's file)
    fmt::print(stderr, "scale_bench: {} exists: remove it or choose another --dir\n", file);
    std::exit(1);
  }
  const std::string cmd = fmt::format("dd if=/dev/zero of={} bs=8M count={} conv=fsync status=none",
                                      file, (bytes + (8 << 20) - 1) / (8 << 20));
  const auto t0 = Clock::now();
  const int rc = std::system(cmd.c_str());
  const double s = Seconds(t0);
  std::filesystem::remove(file);
  if (rc != 0) Must(InternalError(fmt::format("{} failed", cmd)), "dd");
  return s;
}

// Rank `r`'s plan (and its RankSave); *entries += its tensors.
std::unique_ptr<RankSave> PlanRank(const scale::Grid& g, int r, int n, const SaveOptions& o,
                                   std::string* plan, uint64_t* entries) {
  Layout l = RankState(g, r, n);
  *entries += l.layout.size();
  auto save = std::make_unique<RankSave>(r, n);
  *plan = save->Plan(l.state, l.layout, o, {});
  Must(save->planned(), "plan");
  return save;
}

// Steps 1, 2 and 2b. Returns the checkpoint's path (empty when the commit failed: row->error).
std::string Save(const Args& a, int n, Row* row) {
  const scale::Grid g{n, a.tp, a.pp};
  const std::string path = fmt::format("{}/scale-bench-{}", a.dir, n);
  std::vector<std::string> paths;  // the first save's, then the repeats'
  for (int i = 0; i < 2 * a.repeats; ++i) {
    paths.push_back(i == 0 ? path : fmt::format("{}-again{}", path, i));
    if (std::filesystem::exists(paths.back())) {
      fmt::print(stderr, "scale_bench: {} exists: remove it or choose another --dir\n",
                 paths.back());
      std::exit(1);
    }
  }
  const SaveOptions o{.format_version = a.format_version};
  ResetPeak();
  const uint64_t base = ProcBytes("VmRSS");
  std::vector<std::string> plans(n), digests(n), reports(n);
  std::unique_ptr<RankSave> own;
  for (int r = 0; r < n; ++r) {
    const auto t0 = Clock::now();
    std::unique_ptr<RankSave> save = PlanRank(g, r, n, o, &plans[r], &row->entries);
    digests[r] = dist::EncodePlanDigest(plans[r]);
    const double ms = Seconds(t0) * 1e3;
    row->rank_plan_ms_max = std::max(row->rank_plan_ms_max, ms);
    row->rank_plan_ms_mean += ms / n;
    reports[r] = RankSaveAccess::DryReport(*save);
    row->plan_bytes += plans[r].size();
    row->report_bytes += reports[r].size();
    if (r == 0) own = std::move(save);
  }
  ResetPeak();
  std::vector<double> decide[2], commit[2];  // [0]: first saves, [1]: repeats
  for (size_t i = 0; i < paths.size(); ++i) {
    const bool first = i < static_cast<size_t>(a.repeats);
    if (first) dist::CachePlan({}, nullptr);  // (no earlier merge: a first save)
    auto t0 = Clock::now();
    SaveCoordinator c(paths[i], n, o, {});
    Decide(c, n, digests, plans);
    decide[!first].push_back(Seconds(t0));
    t0 = Clock::now();
    Status s = c.Commit(reports, *own);
    commit[!first].push_back(Seconds(t0));
    if (!s.ok()) {
      row->error = s.ToString();
      row->peak_mib = MiB(ProcBytes("VmHWM") - base);
      return "";
    }
    if (i == 0) {
      row->manifest_bytes = std::filesystem::file_size(path + "/MANIFEST");
      std::ifstream f(path + "/MANIFEST", std::ios::binary);
      unsigned char h[12] = {};
      f.read(reinterpret_cast<char*>(h), sizeof(h));  // (u32 version at 8, little-endian)
      row->written_version = h[8] | h[9] << 8 | h[10] << 16 | uint32_t{h[11]} << 24;
    }
    if (i > 0) Must(DeleteCheckpoint(paths[i]), "delete a repeated checkpoint");
    std::string plan;  // (Commit consumed rank 0's manifest: it plans again for the next save)
    uint64_t entries = 0;
    own = PlanRank(g, 0, n, o, &plan, &entries);
  }
  row->peak_mib = MiB(ProcBytes("VmHWM") - base);
  row->decide_s = Median(decide[0]), row->commit_s = Median(commit[0]);
  row->repeat_decide_s = Median(decide[1]), row->repeat_commit_s = Median(commit[1]);
  row->manifest_dd_s = DdSeconds(a.dir, row->manifest_bytes);
  return path;
}

// Step 3: the median over --samples loading ranks, spread over the pipeline stages.
void PlanLoads(const Args& a, int n, const std::string& path, Row* row) {
  const scale::Grid g{n / 2, a.load_tp, a.pp};
  std::vector<double> ms;
  for (int i = 0; i < a.samples; ++i) {
    const int rank = static_cast<int>(int64_t{g.world - 1} * i / std::max(1, a.samples - 1));
    Layout l = RankState(g, rank, n);
    ResetPeak();
    const uint64_t base = ProcBytes("VmRSS");
    const auto t0 = Clock::now();
    Result<ReadPlanSummary> plan = PlanDistributedLoad(path, l.layout);
    ms.push_back(Seconds(t0) * 1e3);
    Must(plan.status(), "load plan");
    row->load_peak_mib = std::max(row->load_peak_mib, MiB(ProcBytes("VmHWM") - base));
  }
  std::sort(ms.begin(), ms.end());
  row->load_plan_ms = ms[ms.size() / 2];
}

void Print(const Row& r) {
  fmt::print(
      "{{\"ranks\": {}, \"format_version\": {}, \"written_version\": {}, \"entries\": {}, "
      "\"plan_bytes\": {}, "
      "\"report_bytes\": {}, "
      "\"rank_plan_ms_mean\": {:.3f}, \"rank_plan_ms_max\": {:.3f}, \"decide_s\": {:.3f}, "
      "\"commit_s\": {:.3f}, \"coordinate_s\": {:.3f}, \"repeat_decide_s\": {:.3f}, "
      "\"repeat_commit_s\": {:.3f}, \"repeat_coordinate_s\": {:.3f}, \"manifest_dd_s\": {:.3f}, "
      "\"coordinator_peak_mib\": {:.0f}, "
      "\"manifest_bytes\": {}, \"load_plan_ms\": {:.1f}, \"load_peak_mib\": {:.0f}, "
      "\"error\": \"{}\"}}\n",
      r.ranks, r.format_version, r.written_version, r.entries, r.plan_bytes, r.report_bytes,
      r.rank_plan_ms_mean, r.rank_plan_ms_max, r.decide_s, r.commit_s, r.decide_s + r.commit_s,
      r.repeat_decide_s, r.repeat_commit_s, r.repeat_decide_s + r.repeat_commit_s, r.manifest_dd_s,
      r.peak_mib, r.manifest_bytes, r.load_plan_ms, r.load_peak_mib, r.error);
  std::fflush(stdout);
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (size_t at = 0; at <= s.size();) {
    size_t end = std::min(s.find(',', at), s.size());
    out.push_back(std::stoi(s.substr(at, end - at)));
    at = end + 1;
  }
  return out;
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--ranks")
      a.ranks = ParseList(v);
    else if (k == "--dir")
      a.dir = v;
    else if (k == "--tp")
      a.tp = std::stoi(v);
    else if (k == "--pp")
      a.pp = std::stoi(v);
    else if (k == "--load-tp")
      a.load_tp = std::stoi(v);
    else if (k == "--samples")
      a.samples = std::stoi(v);
    else if (k == "--repeats")
      a.repeats = std::max(1, std::stoi(v));
    else if (k == "--format-version")
      a.format_version = static_cast<uint32_t>(std::stoul(v));
    else {
      fmt::print(stderr, "scale_bench: unknown option {} (see the comment at the top)\n", k);
      std::exit(64);
    }
  }
  for (int n : a.ranks) {
    if (n % (a.tp * a.pp) != 0 || (n / 2) % (a.load_tp * a.pp) != 0) {
      fmt::print(stderr, "scale_bench: {} ranks do not fill TP x PP for the save and the load\n",
                 n);
      std::exit(64);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = ParseArgs(argc, argv);
  for (int n : a.ranks) {
    Row row;
    row.ranks = n;
    row.format_version = a.format_version;
    std::string path = Save(a, n, &row);
    if (!path.empty()) {
      PlanLoads(a, n, path, &row);
      Must(DeleteCheckpoint(path), "delete the checkpoint");
    }
    Print(row);
  }
  return 0;
}
