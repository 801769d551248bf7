// LoadDistributed: fills this rank's boxes of tensors from a (possibly differently sharded)
// checkpoint, reading only the chunks that overlap them.
//
// For every target box: every stored shard that intersects it becomes a "piece"; the byte runs of
// the intersection inside the shard's extent give the chunks to read (a chunk is read and verified
// whole, as its CRC covers it whole). Runs of consecutive chunks (up to 32 MiB:
// engine::ReadBatchChunks) are read with one batched submission, runs in parallel. A piece that is
// one contiguous byte run in both the shard and the target (row blocks) is read straight into the
// target; only the chunks at its two ends, which it needs part of, go through a chunk-sized buffer
// per reader. Other pieces are read in parallel into one buffer spanning their first to last needed
// chunk, then the intersection is copied into the target. Stored shards never overlap (the manifest
// decoder checks), so the pieces' volumes must add up to the box: when they do not, the checkpoint
// lacks part of the box and the load names it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "distributed/shard.h"
#include "engine/box.h"
#include "engine/reader.h"
#include "engine/select.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint::dist {
namespace {

using engine::BoxByteRuns;
using engine::CopyRegion;

constexpr size_t kMaxRunsPerPiece = size_t{1} << 20;

struct Target {
  std::string name;
  size_t tensor = 0;  // index in the manifest
  Shape offsets;      // the target box in the global tensor
  TensorView view;
};

struct Piece {
  const Target* target = nullptr;
  size_t shard = 0;
  Shape offsets, sizes;          // intersection, global coordinates
  std::vector<uint64_t> chunks;  // sorted chunk indices to read
  // When the intersection is one contiguous byte run in the shard and in the target (e.g. row
  // blocks), its chunks go straight into the target: the shard's bytes [begin, end) are the
  // target's bytes from `to`. Otherwise `to` is null and the chunks are read into `buffer`.
  uint64_t begin = 0, end = 0;
  std::byte* to = nullptr;
  Tensor buffer;  // chunks [chunks.front(), chunks.back()] of the shard (when `to` is null)
};

struct Plan {
  std::vector<Target> targets;
  std::vector<Piece> pieces;
};

// Checks the target box (offsets, sizes) of tensor `name` of global shape `global`, into `view`,
// against the checkpoint.
Result<Target> CheckTarget(const engine::Reader& r, const std::string& name, const Shape& global,
                           const Shape& offsets, const Shape& sizes, const TensorView& view) {
  int64_t i = r.IndexOf(name);
  if (i < 0) return NotFoundError(fmt::format("checkpoint {}: no tensor {:?}", r.path(), name));
  const format::TensorRecord& t = r.manifest().tensors[i];
  std::string where = fmt::format("checkpoint {}: tensor {:?}", r.path(), name);
  if (global != t.shape || t.dtype != view.dtype()) {
    return InvalidArgumentError(fmt::format("{} is {} {}, the target layout says {} {}", where,
                                            DTypeName(t.dtype), ShapeToString(t.shape),
                                            DTypeName(view.dtype()), ShapeToString(global)));
  }
  SP_RETURN_IF_ERROR(CheckBox(name, t.shape, offsets, sizes));
  if (sizes != view.shape()) {
    return InvalidArgumentError(fmt::format("{}: target buffer is {}, the layout's box is {}",
                                            where, ShapeToString(view.shape()),
                                            ShapeToString(sizes)));
  }
  return Target{name, static_cast<size_t>(i), offsets, view};
}

// The target of `view` under `layout` (the whole tensor when the layout has no entry).
Result<Target> ResolveTarget(const engine::Reader& r, const std::string& name,
                             const TensorView& view, const ShardLayout& layout) {
  auto it = layout.find(name);
  if (it != layout.end()) {
    const ShardSpec& spec = it->second;
    return CheckTarget(r, StoredName(name, spec), spec.global_shape, spec.offsets, spec.sizes,
                       view);
  }
  int64_t i = r.IndexOf(name);
  if (i < 0) return NotFoundError(fmt::format("checkpoint {}: no tensor {:?}", r.path(), name));
  const Shape& shape = r.manifest().tensors[i].shape;
  return CheckTarget(r, name, shape, Shape(shape.size(), 0), shape, view);
}

// The chunks of `shard` holding bytes of the box (offsets, sizes), in global coordinates.
std::vector<uint64_t> ChunksFor(const format::ShardRecord& s, const Shape& offsets,
                                const Shape& sizes, size_t elem, uint64_t chunk_bytes) {
  Shape local(offsets.size());
  for (size_t d = 0; d < offsets.size(); ++d) local[d] = offsets[d] - s.offsets[d];
  std::vector<uint64_t> out;
  for (auto [b, e] : BoxByteRuns(s.sizes, local, sizes, elem, kMaxRunsPerPiece)) {
    for (uint64_t c = std::max(b / chunk_bytes, out.empty() ? 0 : out.back() + 1);
         c <= (e - 1) / chunk_bytes; ++c) {
      out.push_back(c);
    }
  }
  return out;
}

// Sets p->begin, p->end and p->to when the piece is one byte run in both its shard and its target.
void FindDirectRun(const format::ShardRecord& s, size_t elem, Piece* p) {
  if (s.compressed()) return;  // compressed chunks decompress whole: read them via a buffer
  const Target& t = *p->target;
  Shape in_shard(p->offsets.size()), in_target(p->offsets.size());
  for (size_t d = 0; d < p->offsets.size(); ++d) {
    in_shard[d] = p->offsets[d] - s.offsets[d];
    in_target[d] = p->offsets[d] - t.offsets[d];
  }
  // One run of exactly the box's bytes (with more than max_runs runs, BoxByteRuns returns one
  // run from the first to the last byte, longer than the box).
  const uint64_t bytes = static_cast<uint64_t>(NumElements(p->sizes).value()) * elem;
  auto one_run = [&](const std::vector<std::pair<uint64_t, uint64_t>>& runs) {
    return runs.size() == 1 && runs[0].second - runs[0].first == bytes;
  };
  auto src = BoxByteRuns(s.sizes, in_shard, p->sizes, elem, 1);
  auto dst = BoxByteRuns(t.view.shape(), in_target, p->sizes, elem, 1);
  if (!one_run(src) || !one_run(dst)) return;
  p->begin = src[0].first;
  p->end = src[0].second;
  // (Integer arithmetic: a plan-only target has no data, and its address is never dereferenced,
  // but null + offset is undefined.)
  p->to = reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(t.view.data()) + dst[0].first);
}

Status AddPieces(const engine::Reader& r, const Target& t, Plan* plan) {
  const format::TensorRecord& rec = r.manifest().tensors[t.tensor];
  int64_t covered = 0;
  for (size_t k = 0; k < rec.shards.size(); ++k) {
    Piece p;
    p.target = &t;
    p.shard = k;
    const format::ShardRecord& s = rec.shards[k];
    if (!IntersectBoxes(t.offsets, t.view.shape(), s.offsets, s.sizes, &p.offsets, &p.sizes)) {
      continue;
    }
    covered += NumElements(p.sizes).value();
    p.chunks = ChunksFor(s, p.offsets, p.sizes, DTypeSize(rec.dtype), r.manifest().chunk_bytes);
    if (!p.chunks.empty()) FindDirectRun(s, DTypeSize(rec.dtype), &p);
    plan->pieces.push_back(std::move(p));
  }
  int64_t want = NumElements(t.view.shape()).value();
  if (covered == want) return Status::OK();
  return CorruptionError(fmt::format(
      "checkpoint {}: tensor {:?}: stored shards cover {} of the {} elements of box offsets {} "
      "sizes {} (the checkpoint lacks part of it)",
      r.path(), t.name, covered, want, ShapeToString(t.offsets), ShapeToString(t.view.shape())));
}

using TargetViews = std::map<std::string, TensorView, std::less<>>;

TargetViews TensorsOf(const State& targets) {
  TargetViews out;
  for (const auto& [name, e] : targets.entries()) {
    if (e.is_tensor()) out.emplace(name, e.tensor());
  }
  return out;
}

// What a load reads of the checkpoint: per stored tensor, the boxes of its targets (empty: the
// whole tensor), so that a version 3 manifest is read only in those parts.
engine::ShardFilter FilterOf(const std::vector<std::string>& names, const ShardLayout& layout) {
  engine::ShardFilter f;
  std::set<std::string> whole;
  for (const std::string& name : names) {
    auto it = layout.find(name);
    if (it == layout.end()) {
      whole.insert(name);
      continue;
    }
    f[StoredName(name, it->second)].push_back({it->second.offsets, it->second.sizes});
  }
  for (const std::string& name : whole) f[name].clear();
  return f;
}

engine::ShardFilter FilterOf(const TargetViews& targets, const ShardLayout& layout) {
  std::vector<std::string> names;
  for (const auto& [name, view] : targets) names.push_back(name);
  return FilterOf(names, layout);
}

engine::ShardFilter FilterOf(const ShardLayout& layout) {
  std::vector<std::string> names;
  for (const auto& [name, spec] : layout) names.push_back(name);
  return FilterOf(names, layout);
}

engine::ShardFilter FilterOf(const std::vector<BoxTarget>& boxes) {
  engine::ShardFilter f;
  for (const BoxTarget& b : boxes) f[b.name].push_back({b.offsets, b.view.shape()});
  return f;
}

Result<Plan> MakePlan(const engine::Reader& r, const TargetViews& targets,
                      const ShardLayout& layout) {
  Plan plan;
  plan.targets.reserve(targets.size());  // pieces point at targets
  for (const auto& [name, view] : targets) {
    SP_ASSIGN_OR_RETURN(Target t, ResolveTarget(r, name, view, layout));
    plan.targets.push_back(std::move(t));
  }
  for (const auto& [name, spec] : layout) {
    if (targets.count(name) == 0) {
      return InvalidArgumentError(
          fmt::format("layout names tensor {:?}, not in the targets", name));
    }
  }
  for (const Target& t : plan.targets) SP_RETURN_IF_ERROR(AddPieces(r, t, &plan));
  return plan;
}

Result<Plan> MakeBoxPlan(const engine::Reader& r, const std::vector<BoxTarget>& boxes) {
  Plan plan;
  plan.targets.reserve(boxes.size());  // pieces point at targets
  for (const BoxTarget& b : boxes) {
    int64_t i = r.IndexOf(b.name);
    if (i < 0) return NotFoundError(fmt::format("checkpoint {}: no tensor {:?}", r.path(), b.name));
    SP_ASSIGN_OR_RETURN(Target t, CheckTarget(r, b.name, r.manifest().tensors[i].shape, b.offsets,
                                              b.view.shape(), b.view));
    plan.targets.push_back(std::move(t));
  }
  for (const Target& t : plan.targets) SP_RETURN_IF_ERROR(AddPieces(r, t, &plan));
  return plan;
}

// Bytes of chunk `c` of shard `s`.
uint64_t ChunkLen(const format::ShardRecord& s, uint64_t c, uint64_t chunk_bytes) {
  return std::min(chunk_bytes, s.bytes - c * chunk_bytes);
}

const format::ShardRecord& ShardOf(const engine::Reader& r, const Piece& p) {
  return r.manifest().tensors[p.target->tensor].shards[p.shard];
}

// Opens every data file the plan needs, naming the rank whose file is missing.
Status OpenFiles(engine::Reader& r, const Plan& plan) {
  std::set<uint32_t> files;
  for (const Piece& p : plan.pieces) {
    if (!p.chunks.empty()) files.insert(ShardOf(r, p).file);
  }
  for (uint32_t f : files) {
    Status s = r.OpenFile(f);
    if (s.code() == StatusCode::kNotFound) {
      const std::string& name = r.manifest().files[f].name;
      return NotFoundError(
          fmt::format("checkpoint {}: data file {} (written by rank {}) is "
                      "missing: {}",
                      r.path(), name, name.substr(5, 5), s.message()));
    }
    SP_RETURN_IF_ERROR(s);
  }
  return Status::OK();
}

// Consecutive chunks [first, first + count) of one piece, read with one batched submission.
struct Read {
  Piece* piece;
  uint64_t first, count;
};

// Whether chunk `c` of direct piece `p` lies wholly inside the piece's bytes (else the piece
// needs only part of it: a chunk at one of its ends).
bool Inside(const engine::Reader& r, const Piece& p, uint64_t c) {
  const uint64_t cb = r.manifest().chunk_bytes;
  return c * cb >= p.begin && c * cb + ChunkLen(ShardOf(r, p), c, cb) <= p.end;
}

// The piece's chunks as runs of up to ReadBatchChunks() consecutive chunks that are read the same
// way (into the assembly buffer, straight into the target, or one partial chunk through a bounce).
void AddReads(const engine::Reader& r, Piece& p, std::vector<Read>* reads) {
  const uint64_t batch = engine::ReadBatchChunks(r.manifest().chunk_bytes);
  for (size_t i = 0; i < p.chunks.size();) {
    bool straight = p.to == nullptr || Inside(r, p, p.chunks[i]);
    size_t end = i + 1;
    while (straight && end < p.chunks.size() && end - i < batch &&
           p.chunks[end] == p.chunks[end - 1] + 1 &&
           (p.to == nullptr || Inside(r, p, p.chunks[end]))) {
      ++end;
    }
    reads->push_back({&p, p.chunks[i], end - i});
    i = end;
  }
}

// Reads chunk `c` of direct piece `p`, which the piece needs only part of, into the worker's
// bounce buffer, then its needed bytes into the target.
Status ReadPartialChunk(engine::Reader& r, const Piece& p, uint64_t c, engine::Reader::Buffers* b,
                        Tensor* bounce, bool verify) {
  const uint64_t cb = r.manifest().chunk_bytes;
  const uint64_t from = c * cb, to = from + ChunkLen(ShardOf(r, p), c, cb);
  if (bounce->capacity() < cb) {
    SP_ASSIGN_OR_RETURN(*bounce, Tensor::Empty(DType::kU8, {static_cast<int64_t>(cb)}));
  }
  SP_RETURN_IF_ERROR(r.ReadShardChunk(p.target->tensor, p.shard, c,
                                      {bounce->data(), bounce->capacity()}, b, verify));
  const uint64_t lo = std::max(from, p.begin), hi = std::min(to, p.end);
  std::memcpy(p.to + (lo - p.begin), bounce->data() + (lo - from), hi - lo);
  return Status::OK();
}

// Runs one Read. Straight into the target, the destination's capacity ends with the piece: a
// direct read rounded up to the I/O alignment must not spill into target bytes another reader
// fills (the reader bounces such a read).
Status RunRead(engine::Reader& r, const Read& rd, engine::Reader::Buffers* b, Tensor* bounce,
               bool verify) {
  const Piece& p = *rd.piece;
  const uint64_t from = rd.first * r.manifest().chunk_bytes;
  engine::Destination d;
  if (p.to == nullptr) {
    uint64_t pos = from - p.chunks.front() * r.manifest().chunk_bytes;
    d = {p.buffer.data() + pos, p.buffer.capacity() - pos};
  } else if (Inside(r, p, rd.first)) {
    d = {p.to + (from - p.begin), p.end - from};
  } else {
    return ReadPartialChunk(r, p, rd.first, b, bounce, verify);
  }
  return r.ReadShardChunks(p.target->tensor, p.shard, rd.first, rd.count, d, b, verify);
}

// Bytes of the chunks of `rd` (whole chunks, as read).
uint64_t ReadBytes(const engine::Reader& r, const Read& rd) {
  uint64_t n = 0;
  for (uint64_t c = rd.first; c < rd.first + rd.count; ++c) {
    n += ChunkLen(ShardOf(r, *rd.piece), c, r.manifest().chunk_bytes);
  }
  return n;
}

// Reads every piece's chunks on io.io_threads threads; counts them in *stats and `o.progress`.
Status ReadPieces(engine::Reader& r, Plan& plan, const LoadOptions& o, const IoOptions& io,
                  LoadStats* stats) {
  const uint64_t cb = r.manifest().chunk_bytes;
  std::vector<Read> reads;
  for (Piece& p : plan.pieces) {
    if (p.chunks.empty()) continue;
    if (p.to == nullptr) {  // an assembly buffer for chunks front() .. back()
      uint64_t first = p.chunks.front(), last = p.chunks.back();
      uint64_t span = (last - first) * cb + ChunkLen(ShardOf(r, p), last, cb);
      SP_ASSIGN_OR_RETURN(p.buffer, Tensor::Empty(DType::kU8, {static_cast<int64_t>(span)}));
    }
    AddReads(r, p, &reads);
  }
  uint64_t total = 0;
  for (const Read& rd : reads) {
    total += ReadBytes(r, rd);
    stats->chunks += rd.count;
  }
  stats->stored_bytes = total;
  Progress progress(o.progress, total);
  std::vector<engine::Reader::Buffers> buffers(io.io_threads);
  std::vector<Tensor> bounce(io.io_threads);
  SP_RETURN_IF_ERROR(ParallelFor(reads.size(), io.io_threads, [&](size_t i, int w) -> Status {
    SP_RETURN_IF_ERROR(RunRead(r, reads[i], &buffers[w], &bounce[w], o.verify_checksums));
    progress.Add(ReadBytes(r, reads[i]));
    return Status::OK();
  }));
  progress.Finish();
  return Status::OK();
}

Status CopyPieces(const engine::Reader& r, const Plan& plan, int threads) {
  return ParallelFor(plan.pieces.size(), threads, [&](size_t i, int) -> Status {
    const Piece& p = plan.pieces[i];
    if (p.to != nullptr) return Status::OK();  // read straight into the target
    const format::TensorRecord& rec = r.manifest().tensors[p.target->tensor];
    const format::ShardRecord& s = rec.shards[p.shard];
    Shape src_off(p.offsets.size()), dst_off(p.offsets.size());
    for (size_t d = 0; d < p.offsets.size(); ++d) {
      src_off[d] = p.offsets[d] - s.offsets[d];
      dst_off[d] = p.offsets[d] - p.target->offsets[d];
    }
    uint64_t base = p.chunks.empty() ? 0 : p.chunks.front() * r.manifest().chunk_bytes;
    CopyRegion({p.buffer.data(), s.sizes, src_off, base},
               {p.target->view.data(), p.target->view.shape(), dst_off, 0}, p.sizes,
               DTypeSize(rec.dtype));
    return Status::OK();
  });
}

// Opens the files, reads the pieces and copies them into place.
Status Execute(engine::Reader& r, Plan& plan, const LoadOptions& o, const IoOptions& io,
               LoadStats* stats) {
  SP_RETURN_IF_ERROR(OpenFiles(r, plan));
  SP_RETURN_IF_ERROR(ReadPieces(r, plan, o, io, stats));
  return CopyPieces(r, plan, io.io_threads);
}

}  // namespace
}  // namespace savepoint::dist

namespace savepoint {

Status LoadDistributed(const std::string& path, State& targets, const ShardLayout& layout,
                       const LoadOptions& options, const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  if (options.mmap || options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "distributed load {}: LoadOptions.mmap and map_mode do not apply (the boxes are read into "
        "the targets): leave them at their defaults",
        path));
  }
  const dist::TargetViews views = dist::TensorsOf(targets);
  const engine::ShardFilter only = dist::FilterOf(views, layout);
  SP_ASSIGN_OR_RETURN(auto reader, engine::Reader::OpenImpl(path, options, io, &only));
  SP_ASSIGN_OR_RETURN(dist::Plan plan, dist::MakePlan(*reader, views, layout));
  LoadStats stats;
  SP_RETURN_IF_ERROR(dist::Execute(*reader, plan, options, io, &stats));
  SP_RETURN_IF_ERROR(engine::CopyValues(reader->values(), &targets));
  if (options.stats != nullptr) {
    stats.bytes = targets.tensor_bytes();
    stats.direct_io = reader->AnyFileDirect();
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *options.stats = stats;
  }
  return Status::OK();
}

Status LoadBoxes(const std::string& path, const std::vector<BoxTarget>& boxes,
                 const LoadOptions& options, const IoOptions& io) {
  if (options.mmap || options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "box load {}: LoadOptions.mmap and map_mode do not apply: leave them at their defaults",
        path));
  }
  const engine::ShardFilter only = dist::FilterOf(boxes);
  SP_ASSIGN_OR_RETURN(auto reader, engine::Reader::OpenImpl(path, options, io, &only));
  SP_ASSIGN_OR_RETURN(dist::Plan plan, dist::MakeBoxPlan(*reader, boxes));
  LoadStats stats;
  SP_RETURN_IF_ERROR(dist::Execute(*reader, plan, options, io, &stats));
  if (options.stats != nullptr) {
    for (const BoxTarget& b : boxes) stats.bytes += b.view.nbytes();
    *options.stats = stats;
  }
  return Status::OK();
}

Result<State> LoadDistributedAlloc(const std::string& path, const ShardLayout& layout,
                                   const LoadOptions& options, const IoOptions& io) {
  const engine::ShardFilter only = dist::FilterOf(layout);
  SP_ASSIGN_OR_RETURN(auto reader, engine::Reader::OpenImpl(path, options, io, &only));
  State state;
  for (const auto& [name, spec] : layout) {
    const TensorInfo* info = reader->FindTensor(dist::StoredName(name, spec));
    if (info == nullptr) {
      return NotFoundError(
          fmt::format("checkpoint {}: no tensor {:?}", path, dist::StoredName(name, spec)));
    }
    SP_RETURN_IF_ERROR(dist::CheckBox(name, spec.global_shape, spec.offsets, spec.sizes));
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info->dtype, spec.sizes));
    SP_RETURN_IF_ERROR(state.Put(name, std::move(t)));
  }
  SP_RETURN_IF_ERROR(LoadDistributed(path, state, layout, options, io));
  return state;
}

Result<ReadPlanSummary> PlanDistributedLoad(const std::string& path, const ShardLayout& layout,
                                            FileSystem* fs) {
  const engine::ShardFilter only = dist::FilterOf(layout);
  SP_ASSIGN_OR_RETURN(auto reader, engine::Reader::OpenImpl(path, {}, {.fs = fs}, &only));
  dist::TargetViews targets;  // views without memory: planning never touches data
  for (const auto& [name, spec] : layout) {
    const TensorInfo* info = reader->FindTensor(dist::StoredName(name, spec));
    if (info == nullptr) {
      return NotFoundError(
          fmt::format("checkpoint {}: no tensor {:?}", path, dist::StoredName(name, spec)));
    }
    targets.emplace(name, TensorView(static_cast<void*>(nullptr), info->dtype, spec.sizes));
  }
  SP_ASSIGN_OR_RETURN(dist::Plan plan, dist::MakePlan(*reader, targets, layout));
  ReadPlanSummary out;
  std::set<uint32_t> files;
  const uint64_t cb = reader->manifest().chunk_bytes;
  for (const dist::Piece& p : plan.pieces) {
    const format::ShardRecord& s = dist::ShardOf(*reader, p);
    for (uint64_t c : p.chunks) out.bytes += dist::ChunkLen(s, c, cb);
    if (!p.chunks.empty()) files.insert(s.file);
  }
  std::set<int> ranks;
  for (uint32_t f : files) {
    const std::string& name = reader->manifest().files[f].name;
    out.files.push_back(name);
    ranks.insert(std::atoi(name.substr(5, 5).c_str()));
  }
  std::sort(out.files.begin(), out.files.end());
  out.source_ranks.assign(ranks.begin(), ranks.end());
  return out;
}

}  // namespace savepoint
