// MindSpore's transform_checkpoints / transform_checkpoint_by_rank / rank_list_for_transform
// (savepoint/mindspore_strategy.h) on the plan of transform_plan.cc.
//
// The sources are `.ckpt` or safetensors files (MindSpore writes both), read through the store
// seam (src/store/). Every source file is scanned once (headers only, bounded memory), every
// destination file is planned and checked, and only then are files written. A destination file is
// built in memory: each cut parameter is filled from the byte runs of the source slices that
// intersect its box (store::Reader::ReadRange: one run per slice when the slices are row blocks;
// otherwise a run per row, or the span between the first and last byte when there are more than
// 2^20 runs), each parameter copied whole is read with the store's Read; then the file is
// committed atomically. Destination files are built in
// parallel, as many at once as fit the memory budget, the io_threads shared out between them: a
// file's parts are read, and its bytes written, on its share of threads.
#include "mindspore_strategy/transform.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>

#include "engine/box.h"
#include "interop/ckpt_cipher.h"
#include "io/commit.h"
#include "savepoint/catalog.h"
#include "savepoint/checkpoint.h"
#include "savepoint/mindspore.h"
#include "savepoint/safetensors.h"
#include "store/store.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint {
namespace transform {

// One source rank's file, open (its header scanned).
struct SourceFile {
  std::string path;
  std::unique_ptr<store::Reader> reader;
  std::vector<std::pair<std::string, std::optional<SourceParam>>> params;
};

}  // namespace transform

namespace {

using transform::Copy;
using transform::FileSources;
using transform::Job;
using transform::OutTensor;
using transform::RankPlan;
using transform::Side;
using transform::SourceFile;
using transform::SourceParam;

constexpr size_t kMaxRuns = size_t{1} << 20;

// One destination file's share of the transform's Progress: twice its tensor bytes (each byte
// counts once read and once written), never more, all of it by Finish.
class RankMeter {
 public:
  RankMeter(Progress* progress, uint64_t share) : progress_(progress), share_(share) {}
  void Add(uint64_t n) {
    if (!progress_->enabled()) return;
    std::lock_guard<std::mutex> lock(mu_);
    n = std::min(n, share_ - added_);
    added_ += n;
    progress_->Add(n);
  }
  void Finish() { Add(share_); }
  // A ProgressFn for one sub-operation (a load, a save) that adds the growth of its done count.
  ProgressFn Deltas() {
    if (!progress_->enabled()) return nullptr;
    return [this, last = uint64_t{0}](uint64_t done, uint64_t) mutable {
      if (done > last) Add(done - last), last = done;
    };
  }

 private:
  Progress* progress_;
  const uint64_t share_;
  std::mutex mu_;
  uint64_t added_ = 0;  // guarded by mu_
};

// Unimplemented for an encrypted `.ckpt` file (the transform reads plain ones).
Status CheckPlain(FileSystem* fs, const std::string& path) {
  if (!path.ends_with(".ckpt")) return Status::OK();
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, fs->NewRandomAccessFile(path, {}));
  SP_ASSIGN_OR_RETURN(std::optional<MindSporeCipher> mode, interop::ckpt::SniffCipher(*file));
  if (!mode) return Status::OK();
  return UnimplementedError(
      fmt::format("MindSpore checkpoint {} is encrypted: transform reads plain files", path));
}

Result<std::unique_ptr<SourceFile>> OpenSource(FileSystem* fs, const std::string& path) {
  SP_RETURN_IF_ERROR(CheckPlain(fs, path));
  auto f = std::make_unique<SourceFile>();
  f->path = path;
  SP_ASSIGN_OR_RETURN(f->reader, store::OpenRead(path, Format::kAuto, {}, {.fs = fs}));
  SP_ASSIGN_OR_RETURN(std::vector<store::Entry> entries, f->reader->Entries());
  for (const store::Entry& e : entries) {
    std::optional<SourceParam> info;
    if (e.tensor) info = SourceParam{e.dtype, e.shape, e.int4};
    f->params.emplace_back(e.name, std::move(info));
  }
  return f;
}

Shape Minus(const Shape& a, const Shape& b) {
  Shape out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}

// Fills the part `c` of destination tensor `t` (its bytes at `dst`) from its source slice.
Status FillCopy(const SourceFile& f, const OutTensor& t, const Copy& c, std::byte* dst) {
  const size_t elem = DTypeSize(t.dtype);
  const Shape in_src = Minus(c.offsets, c.src_offsets), in_dst = Minus(c.offsets, t.offsets);
  const uint64_t need = NumElements(c.sizes).value() * elem;
  if (need == 0) return Status::OK();
  auto runs = engine::BoxByteRuns(c.src_sizes, in_src, c.sizes, elem, kMaxRuns);
  uint64_t listed = 0;
  for (const auto& [b, en] : runs) listed += en - b;
  const bool whole = c.sizes == t.sizes;  // the packed part is the destination itself
  std::vector<std::byte> buf;
  std::byte* packed = whole ? dst : nullptr;
  if (!whole || listed != need) buf.resize(listed), packed = buf.data();
  uint64_t at = 0;
  for (const auto& [b, en] : runs) {
    SP_RETURN_IF_ERROR(f.reader->ReadRange(t.name, b, {packed + at, en - b}));
    at += en - b;
  }
  if (whole && listed == need) return Status::OK();
  const Shape zero(c.sizes.size(), 0);
  const engine::RegionSide to{dst, t.sizes, in_dst};
  if (listed == need) {
    engine::CopyRegion({packed, c.sizes, zero}, to, c.sizes, elem);
  } else {
    engine::CopyRegion({packed, c.src_sizes, in_src, runs.front().first}, to, c.sizes, elem);
  }
  return Status::OK();
}

// Whether the loaded entry `name` belongs to one of `names` (a hash map's parts are named
// "<name>.keys", "<name>.values", "<name>.status").
bool Selected(const std::vector<std::string>& names, const std::string& name) {
  for (const char* part : {"", ".keys", ".values", ".status"}) {
    if (!name.ends_with(part)) continue;
    const std::string base = name.substr(0, name.size() - std::strlen(part));
    if (std::binary_search(names.begin(), names.end(), base)) return true;
  }
  return false;
}

// Adds the entries `names` (sorted) of source `f` to `out`, whole, with its store's Read.
Status CopyWhole(const SourceFile& f, const std::vector<std::string>& names, const IoOptions& io,
                 RankMeter* meter, State* out) {
  SP_ASSIGN_OR_RETURN(
      std::unique_ptr<store::Reader> reader,
      store::OpenRead(f.path, f.reader->format(), {.progress = meter->Deltas()}, io));
  SP_ASSIGN_OR_RETURN(State loaded, reader->Read(names));
  auto in = std::make_shared<State>(std::move(loaded));
  for (const auto& [name, e] : in->entries()) {
    if (!Selected(names, name)) continue;
    SP_RETURN_IF_ERROR(e.is_tensor() ? out->PutView(name, e.tensor())
                                     : out->PutValue(name, e.value()));
  }
  out->KeepAlive(in);
  const Json ms = in->metadata().is_object()
                      ? in->metadata().value(kMindSporeMetadataKey, Json::object())
                      : Json::object();
  for (const auto& [key, list] : ms.items()) {
    Json& to = out->metadata()[kMindSporeMetadataKey][key];
    for (const Json& n : list) {
      if (n.is_string() && Selected(names, n.get<std::string>())) to.push_back(n);
    }
  }
  return Status::OK();
}

// Adds the cut tensors of `plan` to `out`, their copies filled on `threads` threads (each copy
// is a disjoint part of its tensor).
Status FillCut(const RankPlan& plan, const FileSources& in, int threads, RankMeter* meter,
               State* out) {
  std::vector<Tensor> tensors;
  std::vector<std::pair<size_t, size_t>> work;  // (tensor, copy)
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const OutTensor& t = plan.tensors[i];
    SP_ASSIGN_OR_RETURN(Tensor dst, Tensor::Empty(t.dtype, t.sizes));
    tensors.push_back(std::move(dst));
    for (size_t k = 0; k < t.copies.size(); ++k) work.emplace_back(i, k);
  }
  SP_RETURN_IF_ERROR(ParallelFor(work.size(), threads, [&](size_t w, int) -> Status {
    const OutTensor& t = plan.tensors[work[w].first];
    const Copy& c = t.copies[work[w].second];
    SP_RETURN_IF_ERROR(FillCopy(in.File(c.src_rank), t, c, tensors[work[w].first].data())
                           .WithContext(fmt::format("parameter {:?}", t.name)));
    meter->Add(NumElements(c.sizes).value() * DTypeSize(t.dtype));
    return Status::OK();
  }));
  for (size_t i = 0; i < tensors.size(); ++i) {
    SP_RETURN_IF_ERROR(out->Put(plan.tensors[i].name, std::move(tensors[i])));
    if (plan.tensors[i].int4) {
      out->metadata()[kMindSporeMetadataKey]["int4"].push_back(plan.tensors[i].name);
    }
  }
  return Status::OK();
}

Result<State> BuildRank(const RankPlan& plan, const FileSources& in, const IoOptions& io,
                        RankMeter* meter) {
  State out;
  SP_RETURN_IF_ERROR(FillCut(plan, in, io.io_threads, meter, &out));
  for (auto [rank, names] : plan.whole) {
    std::sort(names.begin(), names.end());
    SP_RETURN_IF_ERROR(CopyWhole(in.File(rank), names, io, meter, &out));
  }
  return out;
}

// MindSpore's safetensors flavour has no place for the .ckpt bookkeeping: int4 tensors are
// marked as MindSpore marks them ("<name>": "Int4"), and hash maps stay three plain tensors.
void ToSafetensorsMetadata(State* state) {
  Json& meta = state->metadata();
  if (!meta.is_object() || !meta.contains(kMindSporeMetadataKey)) return;
  const Json ms = meta[kMindSporeMetadataKey];
  meta.erase(kMindSporeMetadataKey);
  for (const Json& n : ms.value("int4", Json::array())) {
    if (n.is_string()) meta[n.get<std::string>()] = "Int4";
  }
  if (meta.empty()) meta = nullptr;
}

// Writes one destination file in the options' format.
Status WriteRank(State* state, const std::string& path, const MindSporeTransformOptions& options,
                 ProgressFn progress, const IoOptions& io) {
  if (options.output_format == MindSporeTransformFormat::kCkpt) {
    return SaveMindSporeCheckpoint(
        *state, path, {.overwrite = options.overwrite, .progress = std::move(progress)}, io);
  }
  if (options.output_format == MindSporeTransformFormat::kNative) {
    return Save(*state, path, {.overwrite = options.overwrite, .progress = std::move(progress)},
                io);
  }
  ToSafetensorsMetadata(state);
  return SaveSafetensors(
      *state, path,
      {.overwrite = options.overwrite, .progress = std::move(progress), .mindspore_format = true},
      io);
}

// Builds and writes one destination file.
Status RunPlan(const RankPlan& p, const FileSources& in, const MindSporeTransformOptions& options,
               Progress* progress, const IoOptions& io) {
  const std::string context = fmt::format("transform: destination rank {}", p.job.rank);
  RankMeter meter(progress, 2 * p.bytes);
  Result<State> state = BuildRank(p, in, io, &meter);
  if (!state.ok()) return state.status().WithContext(context);
  SP_RETURN_IF_ERROR(
      WriteRank(&*state, p.job.path, options, meter.Deltas(), io).WithContext(context));
  meter.Finish();
  return Status::OK();
}

// Builds and writes the files, in waves that fit the memory budget.
Status RunPlans(const std::vector<RankPlan>& plans, const FileSources& in,
                const MindSporeTransformOptions& options, const IoOptions& io) {
  uint64_t total = 0;
  for (const RankPlan& p : plans) total += p.bytes;
  // Progress counts each byte twice (read, written); the caller sees destination bytes.
  ProgressFn halved = nullptr;
  if (options.progress) halved = [&](uint64_t d, uint64_t t) { options.progress(d / 2, t / 2); };
  Progress progress(halved, 2 * total);
  for (size_t begin = 0; begin < plans.size();) {
    size_t end = begin + 1;
    uint64_t bytes = plans[begin].bytes;
    while (end < plans.size() && static_cast<int>(end - begin) < io.io_threads &&
           bytes + plans[end].bytes <= options.memory_budget_bytes) {
      bytes += plans[end++].bytes;
    }
    // The threads are shared out between the ranks of the wave (reads and writes of each rank).
    IoOptions inner = io;
    inner.io_threads = std::max(1, io.io_threads / static_cast<int>(end - begin));
    SP_RETURN_IF_ERROR(ParallelFor(end - begin, io.io_threads, [&](size_t i, int) -> Status {
      return RunPlan(plans[begin + i], in, options, &progress, inner);
    }));
    begin = end;
  }
  progress.Finish();
  return Status::OK();
}

Result<Side> LoadSide(const std::optional<std::string>& file, FileSystem* fs) {
  Side side;
  if (!file) return side;
  SP_ASSIGN_OR_RETURN(side.map, ReadMindSporeLayouts(*file, fs));
  if (side.map->params.empty()) {
    return InvalidArgumentError(fmt::format("strategy file {} lists no parameter layouts", *file));
  }
  return side;
}

}  // namespace

namespace {

// "rank_N" (N decimal, at most 9 digits) -> N.
std::optional<int64_t> RankOfDir(const std::string& name) {
  if (!name.starts_with("rank_") || name.size() == 5 || name.size() > 14) return std::nullopt;
  int64_t rank = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    rank = rank * 10 + (c - '0');
  }
  return rank;
}

// The source file of every rank directory of `dir`: its lexicographically last "*.ckpt", or, in a
// directory without one, its lexicographically last "*.safetensors" (MindSpore writes either).
// Hidden files, such as a writer's temporary files, are not candidates.
Result<std::map<int64_t, std::string>> RankFiles(FileSystem* fs, const std::string& dir) {
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(dir));
  std::map<int64_t, std::string> out;
  for (const FileInfo& e : entries) {
    std::optional<int64_t> rank = RankOfDir(e.name);
    if (!e.is_dir || !rank) continue;
    const std::string sub = dir + "/" + e.name;
    SP_ASSIGN_OR_RETURN(std::vector<FileInfo> files, fs->ListDir(sub));
    std::string ckpt, st;
    for (const FileInfo& f : files) {
      if (f.is_dir || f.name.starts_with(".")) continue;
      if (f.name.ends_with(".ckpt")) ckpt = std::max(ckpt, f.name);
      if (f.name.ends_with(".safetensors")) st = std::max(st, f.name);
    }
    if (!ckpt.empty() || !st.empty()) out[*rank] = sub + "/" + (ckpt.empty() ? st : ckpt);
  }
  return out;
}

bool Excluded(const std::string& name) {
  return name.starts_with("accu_grads") || name.starts_with("adam_v") || name.starts_with("adam_m");
}

// MindSpore's "_part" case: one-stage strategies, the source's parameters (optimizer state aside)
// a strict subset of the destination's.
bool IsPartCase(const Side& src, const Side& dst) {
  if (!src.map || !dst.map || src.stages() != 1 || dst.stages() != 1) return false;
  size_t s = 0, d = 0;
  for (const auto& [name, p] : dst.map->params) d += Excluded(name) ? 0 : 1;
  for (const auto& [name, p] : src.map->params) {
    if (Excluded(name)) continue;
    if (!dst.Find(name)) return false;
    ++s;
  }
  return s < d;
}

// With a source strategy, the rank directories must be exactly its ranks.
Status CheckRankCount(const Side& src, const std::map<int64_t, std::string>& files,
                      const std::string& dir) {
  const int64_t want = src.devices() * src.stages();
  if (!src.map) return Status::OK();
  std::string problem;
  for (int64_t r = 0; r < want && problem.empty(); ++r) {
    if (files.count(r) == 0) problem = fmt::format("rank_{} (or its .ckpt file) is missing", r);
  }
  if (problem.empty() && files.rbegin()->first >= want) {
    problem = fmt::format("rank_{} is beyond them", files.rbegin()->first);
  }
  if (problem.empty()) return Status::OK();
  const auto& [first, p] = *src.map->params.begin();
  return InvalidArgumentError(fmt::format(
      "source strategy file {} says {} ranks per stage (parameter {:?}: dev_matrix [{}]) x {} "
      "stages = {} ranks, but in {} {}",
      src.map->file, src.devices(), first, fmt::join(p.layout.dev_matrix, ", "), src.stages(), want,
      dir, problem));
}

std::string_view Extension(MindSporeTransformFormat format) {
  switch (format) {
    case MindSporeTransformFormat::kCkpt:
      return ".ckpt";
    case MindSporeTransformFormat::kSafetensors:
      return ".safetensors";
    case MindSporeTransformFormat::kNative:
      break;
  }
  return "";
}

// transform_checkpoint_by_rank's destination: a file with the format's extension, or for a
// native checkpoint a directory whose name does not look like a file of the other formats.
Status CheckDestinationName(const std::string& dst_file, MindSporeTransformFormat format) {
  const std::string_view ext = Extension(format);
  if (!ext.empty() && !dst_file.ends_with(ext)) {
    return InvalidArgumentError(
        fmt::format("transform_checkpoint_by_rank: {} does not end in {}", dst_file, ext));
  }
  if (ext.empty() && (dst_file.ends_with(".ckpt") || dst_file.ends_with(".safetensors"))) {
    return InvalidArgumentError(fmt::format(
        "transform_checkpoint_by_rank: {} names a file, but output_format native writes a "
        "checkpoint directory",
        dst_file));
  }
  return Status::OK();
}

std::vector<Job> Jobs(const Side& src, const Side& dst, const std::string& dir,
                      const std::string& prefix, std::string_view ext) {
  std::vector<Job> jobs;
  if (IsPartCase(src, dst)) {
    const int64_t stage = src.map->file_stage;
    for (int64_t l = 0; l < dst.devices(); ++l) {
      jobs.push_back({l, stage * src.devices(),
                      fmt::format("{}/rank_{}/{}{}_part{}{}", dir, l, prefix, l, stage, ext)});
    }
    return jobs;
  }
  for (int64_t r = 0; r < dst.devices() * dst.stages(); ++r) {
    jobs.push_back({r, 0, fmt::format("{}/rank_{}/{}{}{}", dir, r, prefix, r, ext)});
  }
  return jobs;
}

Result<std::vector<Job>> SelectJobs(std::vector<Job> jobs, const std::vector<int64_t>& ranks) {
  if (ranks.empty()) return jobs;
  std::vector<Job> out;
  for (int64_t r : ranks) {
    auto it = std::find_if(jobs.begin(), jobs.end(), [&](const Job& j) { return j.rank == r; });
    if (it == jobs.end()) {
      return InvalidArgumentError(fmt::format(
          "transform: destination rank {} does not exist (the destination has {} ranks)", r,
          jobs.size()));
    }
    out.push_back(*it);
  }
  return out;
}

// The hidden debris a killed earlier run left in the destination rank directories (temporaries of
// processes that are gone; docs/FORMAT.md §5), removed before this run writes there.
Status RemoveDebris(FileSystem* fs, const std::vector<Job>& jobs) {
  std::set<std::string> dirs;
  for (const Job& job : jobs) dirs.insert(Dirname(job.path));
  for (const std::string& dir : dirs) {
    if (!fs->Exists(dir)) continue;
    SP_RETURN_IF_ERROR(GarbageCollect(dir, {.fs = fs}).status());
  }
  return Status::OK();
}

Status CheckRank(const Side& dst, int64_t rank) {
  const int64_t n = dst.devices() * dst.stages();
  if (rank >= 0 && rank < n) return Status::OK();
  return InvalidArgumentError(
      fmt::format("transform: destination rank {} is outside the destination's {} ranks", rank, n));
}

}  // namespace

Result<MindSporeTransformFormat> MindSporeTransformFormatFromName(std::string_view name) {
  if (name == "ckpt") return MindSporeTransformFormat::kCkpt;
  if (name == "safetensors") return MindSporeTransformFormat::kSafetensors;
  if (name == "native") return MindSporeTransformFormat::kNative;
  return InvalidArgumentError(fmt::format(
      "transform: output format {:?}: must be \"ckpt\", \"safetensors\" or \"native\"", name));
}

Result<std::vector<int64_t>> MindSporeRankListForTransform(int64_t rank,
                                                           const MindSporeTransformOptions& options,
                                                           const IoOptions& io) {
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(Side src, LoadSide(options.src_strategy_file, fs));
  SP_ASSIGN_OR_RETURN(Side dst, LoadSide(options.dst_strategy_file, fs));
  SP_RETURN_IF_ERROR(CheckRank(dst, rank));
  return transform::NeededRanks(src, dst, rank);
}

Status MindSporeTransformCheckpointByRank(int64_t rank,
                                          const std::map<int64_t, std::string>& src_files,
                                          const std::string& dst_file,
                                          const MindSporeTransformOptions& options,
                                          const IoOptions& io) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, "transform_checkpoint_by_rank"));
  SP_RETURN_IF_ERROR(CheckDestinationName(dst_file, options.output_format));
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(Side src, LoadSide(options.src_strategy_file, fs));
  SP_ASSIGN_OR_RETURN(Side dst, LoadSide(options.dst_strategy_file, fs));
  SP_RETURN_IF_ERROR(CheckRank(dst, rank));
  SP_ASSIGN_OR_RETURN(auto sources, FileSources::Open(fs, src_files, io.io_threads));
  SP_ASSIGN_OR_RETURN(RankPlan plan, transform::PlanRank(src, dst, {rank, 0, dst_file}, *sources));
  return RunPlans({plan}, *sources, options, io);
}

Status MindSporeTransformCheckpoints(const std::string& src_dir, const std::string& dst_dir,
                                     const std::string& prefix,
                                     const MindSporeTransformOptions& options,
                                     const IoOptions& io) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, "transform_checkpoints"));
  if (prefix.find('/') != std::string::npos) {
    return InvalidArgumentError(fmt::format("transform: ckpt_prefix {:?} holds a '/'", prefix));
  }
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(Side src, LoadSide(options.src_strategy_file, fs));
  SP_ASSIGN_OR_RETURN(Side dst, LoadSide(options.dst_strategy_file, fs));
  SP_ASSIGN_OR_RETURN(auto files, RankFiles(fs, src_dir));
  if (files.empty()) {
    return NotFoundError(fmt::format(
        "transform: no rank_N directory with a .ckpt or .safetensors file in {}", src_dir));
  }
  if (!IsPartCase(src, dst)) SP_RETURN_IF_ERROR(CheckRankCount(src, files, src_dir));
  SP_ASSIGN_OR_RETURN(
      std::vector<Job> jobs,
      SelectJobs(Jobs(src, dst, dst_dir, prefix, Extension(options.output_format)), options.ranks));
  SP_ASSIGN_OR_RETURN(auto sources, FileSources::Open(fs, files, io.io_threads));
  std::vector<RankPlan> plans;
  for (const Job& job : jobs) {
    SP_ASSIGN_OR_RETURN(RankPlan p, transform::PlanRank(src, dst, job, *sources));
    plans.push_back(std::move(p));
  }
  SP_RETURN_IF_ERROR(RemoveDebris(fs, jobs));
  return RunPlans(plans, *sources, options, io);
}

// --- Shared with the distributed loads (transform.h; distributed_load.cc). ---
namespace transform {

Result<std::map<int64_t, std::string>> SourceRankFiles(FileSystem* fs, const std::string& dir) {
  return RankFiles(fs, dir);
}

Result<Side> ReadSide(const std::optional<std::string>& file, FileSystem* fs) {
  return LoadSide(file, fs);
}

Status CheckSourceRanks(const Side& src, const std::map<int64_t, std::string>& files,
                        const std::string& dir) {
  return CheckRankCount(src, files, dir);
}

FileSources::FileSources() = default;
FileSources::~FileSources() = default;

Result<std::unique_ptr<FileSources>> FileSources::Open(FileSystem* fs,
                                                       const std::map<int64_t, std::string>& paths,
                                                       int threads) {
  auto out = std::make_unique<FileSources>();
  std::vector<std::pair<int64_t, std::string>> list(paths.begin(), paths.end());
  std::vector<std::unique_ptr<SourceFile>> files(list.size());
  SP_RETURN_IF_ERROR(ParallelFor(list.size(), threads, [&](size_t i, int) -> Status {
    SP_ASSIGN_OR_RETURN(files[i], OpenSource(fs, list[i].second));
    return Status::OK();
  }));
  for (size_t i = 0; i < list.size(); ++i) out->files_[list[i].first] = std::move(files[i]);
  return out;
}

bool FileSources::Has(int64_t rank) const { return files_.count(rank) > 0; }

std::string FileSources::Path(int64_t rank) const {
  return Has(rank) ? files_.at(rank)->path : fmt::format("(rank {}: none)", rank);
}

const std::vector<std::pair<std::string, std::optional<SourceParam>>>* FileSources::Params(
    int64_t rank) const {
  return Has(rank) ? &files_.at(rank)->params : nullptr;
}

const SourceFile& FileSources::File(int64_t rank) const { return *files_.at(rank); }

Status FillTensor(const OutTensor& t, const FileSources& in, std::byte* data) {
  for (const Copy& c : t.copies) {
    SP_RETURN_IF_ERROR(FillCopy(in.File(c.src_rank), t, c, data)
                           .WithContext(fmt::format("parameter {:?}", t.name)));
  }
  return Status::OK();
}

Result<State> BuildRankState(const RankPlan& plan, const FileSources& in, const IoOptions& io) {
  Progress none(nullptr, 0);
  RankMeter meter(&none, 0);
  return BuildRank(plan, in, io, &meter);
}

}  // namespace transform

}  // namespace savepoint
