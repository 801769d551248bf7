// The coordinator's merge of per-rank plans, each save's checksums, and the plan cache (see
// merge.h).
#include "distributed/merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "distributed/descriptor.h"
#include "distributed/wire.h"
#include "engine/paths.h"
#include "format/endian.h"
#include "format/manifest_index.h"
#include "util/crc32c.h"
#include "util/parallel.h"

namespace savepoint::dist {
namespace {

// The bytes of a box of `sizes` (nd values) of `dtype`; false on overflow or a negative size.
bool BoxBytes(DType dtype, const int64_t* sizes, size_t nd, uint64_t* bytes) {
  if (std::any_of(sizes, sizes + nd, [](int64_t s) { return s < 0; })) return false;
  *bytes = 0;
  if (std::find(sizes, sizes + nd, 0) != sizes + nd) return true;  // (as NumBytes: no elements)
  uint64_t n = DTypeSize(dtype);
  for (size_t d = 0; d < nd; ++d) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(sizes[d]), &n)) return false;
  }
  *bytes = n;
  return n <= static_cast<uint64_t>(INT64_MAX);  // (NumBytes' limit)
}

// The error for rank `r`'s plan when it is not the one the rank sent the digest of.
Status PlanNotDigested(size_t r) {
  return InvalidArgumentError(fmt::format(
      "rank {} sent a plan other than the one it sent the digest of (the second round of "
      "SaveCoordinator::Decide must carry the plans of the first's digests)",
      r));
}

// The error for a tensor whose manifest section would be `bytes` bytes, over the readers' cap.
Status SectionOverCap(const std::string& tensor, uint64_t bytes) {
  return ResourceExhaustedError(
      fmt::format("tensor {:?}: its manifest section would be {} bytes, over the cap of {} (raise "
                  "SaveOptions.chunk_bytes)",
                  tensor, bytes, format::kMaxManifestBodyBytes));
}

// Runs fn(first, last) on ranges of [0, n) on `threads` threads (8 ranges per thread, so that an
// uneven range does not hold the others up); the error of the lowest failing range.
Status ForRanges(size_t n, int threads, const std::function<Status(size_t, size_t)>& fn) {
  const size_t ranges = static_cast<size_t>(std::max(threads, 1)) * 8;
  return ParallelFor(ranges, threads,
                     [&](size_t b, int) { return fn(n * b / ranges, n * (b + 1) / ranges); });
}

// The order of `count` flat boxes (2 * nd values each: offsets, then sizes) by their offsets,
// then sizes (for layouts that are not grids: GridOrder orders those). Ranks usually send them in
// that order already, which is checked first. Boxes of one or two dimensions whose offsets fit a
// 64-bit key (the offsets, 32 bits each for two) are sorted by that key, ties by the whole box;
// others by the whole box.
std::vector<uint32_t> BoxOrder(const int64_t* b, size_t count, size_t nd) {
  std::vector<uint32_t> order(count);
  std::iota(order.begin(), order.end(), 0u);
  const size_t w = 2 * nd;
  auto less = [&](uint32_t x, uint32_t y) {
    return std::lexicographical_compare(b + w * x, b + w * (x + 1), b + w * y, b + w * (y + 1));
  };
  if (std::is_sorted(order.begin(), order.end(), less)) return order;
  const int64_t limit = nd == 1 ? INT64_MAX : INT64_C(0xffffffff);
  bool keyed = nd == 1 || nd == 2;
  for (size_t k = 0; k < count && keyed; ++k) {
    for (size_t d = 0; d < nd; ++d) keyed = keyed && b[w * k + d] >= 0 && b[w * k + d] <= limit;
  }
  if (!keyed) {
    std::sort(order.begin(), order.end(), less);
    return order;
  }
  std::vector<std::pair<uint64_t, uint32_t>> keys(count);
  for (uint32_t k = 0; k < count; ++k) {
    const auto o0 = static_cast<uint64_t>(b[w * k]);
    keys[k] = {nd == 1 ? o0 : (o0 << 32 | static_cast<uint64_t>(b[w * k + 1])), k};
  }
  std::sort(keys.begin(), keys.end(), [&](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : less(x.second, y.second);
  });
  for (size_t i = 0; i < count; ++i) order[i] = keys[i].second;
  return order;
}

// (Boxes that tile a tensor hold at most 2^63 bytes; the chunks of boxes that overlap, which
// Finish refuses, may add up past 2^64.)
uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

// A varint of Merged::boxes (the rank PutVarint wrote, or a plan's, decoded once and checked),
// again.
uint64_t DecodeVarint(const char** p) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<uint8_t>(*(*p)++);
    v |= uint64_t{b & 0x7fu} << shift;
    if (b < 0x80) return v;
  }
}

}  // namespace

int CoordinatorThreads(size_t world) {
  if (world < 512) return 1;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

Result<ManifestMerger::Merged*> ManifestMerger::TensorOf(int rank, size_t i, std::string_view name,
                                                         std::string_view dtype,
                                                         const int64_t* shape, size_t ndim) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    if (tensors_.size() >= UINT32_MAX - 1) return InternalError("too many tensors");
    std::optional<DType> dt = DTypeFromName(dtype);
    if (!dt) return InternalError(fmt::format("unknown dtype {:?}", dtype));
    if (name.size() > name_budget_) {
      return ResourceExhaustedError(fmt::format(
          "tensor {:.64?}: rank {}'s plans name new tensors in more bytes than the plans "
          "allow ({} MiB, and {} per byte of plan)",
          name, rank, kNameAllowance >> 20, kNameBytesPerPlanByte));
    }
    name_budget_ -= name.size();
    it = index_.emplace(std::string(name), static_cast<uint32_t>(tensors_.size())).first;
    Merged& t = tensors_.emplace_back();
    t.name = name;
    t.dtype = *dt;
    t.shape.assign(shape, shape + ndim);
    WireWriter w;
    w.Dims(t.shape);
    t.shape_wire = std::move(w.bytes());
  }
  const uint32_t at = it->second;
  HintOf(i) = at;
  prev_ = at;
  Merged& t = tensors_[at];
  if (DTypeName(t.dtype) != dtype ||
      !std::equal(shape, shape + ndim, t.shape.begin(), t.shape.end())) {
    std::optional<DType> dt = DTypeFromName(dtype);
    if (!dt) return InternalError(fmt::format("unknown dtype {:?}", dtype));
    return InvalidArgumentError(fmt::format(
        "tensor {:?}: rank {} has {} {} but another rank has {} {}", name, rank, DTypeName(*dt),
        ShapeToString(Shape(shape, shape + ndim)), DTypeName(t.dtype), ShapeToString(t.shape)));
  }
  return &t;
}

Status ManifestMerger::AddPlan(int rank, std::string_view bytes) {
  if (rank < 0 || rank >= world_) {
    return InternalError(fmt::format("plan of rank {} in a save of {} ranks", rank, world_));
  }
  WireReader r(bytes, fmt::format("plan of rank {}", rank));
  name_budget_ += kNameBytesPerPlanByte * bytes.size();
  Status st;
  Status wf = ReadStatus(r, &st);
  if (!wf.ok()) return Malformed("plan", rank, wf);
  if (!st.ok()) return st.WithContext(fmt::format("rank {}", rank));
  Status s = [&]() -> Status {
    SP_ASSIGN_OR_RETURN(uint64_t version, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t encrypted, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t chunk_bytes, r.U64());
    SP_RETURN_IF_ERROR(SameSettings(rank, version, encrypted != 0, chunk_bytes));
    SP_ASSIGN_OR_RETURN(ranks_[rank].file_bytes, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(8));  // (a shard takes 8 bytes or more)
    SP_RETURN_IF_ERROR(AddShards(rank, n, r));
    return r.done() ? Status::OK() : InternalError("trailing bytes");
  }();
  if (s.code() == StatusCode::kInternal) return Malformed("plan", rank, s);
  return s;
}

Status ManifestMerger::SameSettings(int rank, uint64_t version, bool encrypted,
                                    uint64_t chunk_bytes) {
  if (chunk_bytes < format::kMinChunkBytes || chunk_bytes > format::kMaxChunkBytes ||
      chunk_bytes % format::kMinChunkBytes != 0) {  // (a rank checks its options)
    return InternalError(fmt::format("chunk size {}", chunk_bytes));
  }
  if (version > format::kMaxFormatVersion) {  // (0: the coordinator chooses, Finish)
    return InternalError(fmt::format("format version {}", version));
  }
  if (chunk_bytes_ == 0) {  // (the first plan)
    version_ = version, version_rank_ = rank, encrypted_ = encrypted;
    chunk_bytes_ = chunk_bytes;
  }
  if (chunk_bytes != chunk_bytes_) {
    return InvalidArgumentError(fmt::format(
        "rank {} writes chunks of {} bytes, rank {} of {} (SaveOptions.chunk_bytes must be the "
        "same on every rank)",
        rank, chunk_bytes, version_rank_, chunk_bytes_));
  }
  if (version != version_) {
    auto named = [](uint64_t v) {
      return v == 0 ? std::string("0 (savepoint's choice)") : std::to_string(v);
    };
    return InvalidArgumentError(fmt::format(
        "rank {} writes format version {}, rank {} version {} (SaveOptions.format_version must "
        "be the same on every rank)",
        rank, named(version), version_rank_, named(version_)));
  }
  if (encrypted != encrypted_) {
    return InvalidArgumentError(
        fmt::format("SaveOptions.key is set on rank {} but not on rank {} (every rank must pass "
                    "the same key)",
                    encrypted_ ? version_rank_ : rank, encrypted_ ? rank : version_rank_));
  }
  return Status::OK();
}

namespace {

// The next shard's front-coded name into *name, which holds the previous shard's, and its dtype
// into *dtype, which keeps the last one given (docs/FORMAT.md §16). Shard `i` of its plan.
Status NextName(WireReader& r, uint64_t i, std::string* name, std::string_view* dtype) {
  uint64_t shared = 0;
  std::string_view rest, dt;
  if (!r.Next(&shared) || !r.NextView(&rest) || !r.NextView(&dt)) return r.Truncated();
  if (shared > name->size()) {
    return InternalError(fmt::format("shard {}: its name shares {} bytes with a name of {}", i,
                                     shared, name->size()));
  }
  if (rest.size() > kMaxNameBytes - shared) {
    return InternalError(fmt::format("shard {}: a name of {} bytes, over the limit of {}", i,
                                     shared + rest.size(), kMaxNameBytes));
  }
  name->resize(shared);
  name->append(rest);
  if (dt.empty() && i == 0) return InternalError("shard 0: no dtype");
  if (!dt.empty()) *dtype = dt;
  return Status::OK();
}

}  // namespace

ManifestMerger::Merged* ManifestMerger::Hinted(size_t i, std::string_view name,
                                               std::string_view dtype, WireReader& r) {
  // Ranks list their tensors in one order, some of them fewer (replicas that do not write): the
  // tensor that followed the previous shard's in the last plan that had it is likely this one.
  const uint32_t at = HintOf(i);
  if (at >= tensors_.size()) return nullptr;
  Merged& t = tensors_[at];
  // (Bytes equal to the shape's encoding decode to it: the encoding is self-delimiting.)
  if (t.name != name || DTypeName(t.dtype) != dtype || !r.Skip(t.shape_wire)) return nullptr;
  prev_ = at;
  return &t;
}

Status ManifestMerger::AddShards(int rank, uint64_t n, WireReader& r) {
  RankInfo& info = ranks_[rank];
  info.shards.reserve(n);
  int64_t shape[kMaxRank], box[2 * kMaxRank];
  std::string name;        // the shard's: `shared` bytes of the previous shard's name, then its own
  std::string_view dtype;  // the last one given
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t offset = 0, bytes = 0;
    size_t nd, no, ns;
    SP_RETURN_IF_ERROR(NextName(r, i, &name, &dtype));
    Merged* t = Hinted(i, name, dtype, r);
    if (t == nullptr) {
      if (!r.NextDims(shape, &nd)) return r.Truncated();
      SP_ASSIGN_OR_RETURN(t, TensorOf(rank, i, name, dtype, shape, nd));
    }
    nd = t->shape.size();
    const char* from = r.at();
    if (!r.NextDims(box, &no) || !r.NextDims(box + no, &ns) || !r.Next(&offset) ||
        !r.Next(&bytes)) {
      return r.Truncated();
    }
    if (no != nd || ns != nd) {
      return InvalidArgumentError(fmt::format("tensor {:?}: box rank differs from shape {}", name,
                                              ShapeToString(t->shape)));
    }
    // The extent holds the box's bytes (distributed saves do not compress) and lies in the
    // rank's file.
    uint64_t box_bytes = 0;
    if (!BoxBytes(t->dtype, box + nd, nd, &box_bytes) || box_bytes != bytes) {
      return InvalidArgumentError(
          fmt::format("tensor {:?}: rank {} writes {} bytes for a box of {}", name, rank, bytes,
                      ShapeToString(Shape(box + nd, box + 2 * nd))));
    }
    if (offset > info.file_bytes || bytes > info.file_bytes - offset) {
      return InvalidArgumentError(
          fmt::format("tensor {:?}: rank {} places a shard of {} bytes at {} in a file of {}", name,
                      rank, bytes, offset, info.file_bytes));
    }
    if (t->shards >= UINT32_MAX - 1) return InternalError("too many shards");
    t->chunks = SaturatingAdd(t->chunks, format::NumChunks(bytes, chunk_bytes_));
    info.shards.emplace_back(static_cast<uint32_t>(t - tensors_.data()),
                             static_cast<uint32_t>(t->shards++));
    // (One append of the rank and the box's bytes, which are short unless the rank is high.)
    char buf[kMaxVarintBytes + 64];
    const size_t box = static_cast<size_t>(r.at() - from);
    char* end = PutVarint(static_cast<uint64_t>(rank), buf);
    if (box <= 64) {
      std::memcpy(end, from, box);
      t->boxes.append(buf, static_cast<size_t>(end - buf) + box);
    } else {
      t->boxes.append(buf, end).append(from, box);
    }
  }
  return Status::OK();
}

Status ManifestMerger::Absorb(ManifestMerger&& later) {
  if (later.chunk_bytes_ == 0) return Status::OK();  // (no plan)
  SP_RETURN_IF_ERROR(
      SameSettings(later.version_rank_, later.version_, later.encrypted_, later.chunk_bytes_));
  // later's tensor i is this one's tensor at[i], whose shards it extends from base[i].
  std::vector<uint32_t> at(later.tensors_.size()), base(later.tensors_.size());
  for (size_t i = 0; i < later.tensors_.size(); ++i) {
    Merged& t = later.tensors_[i];
    auto it = index_.find(t.name);
    if (it == index_.end()) {
      if (tensors_.size() >= UINT32_MAX - 1) return InternalError("too many tensors");
      it = index_.emplace(t.name, static_cast<uint32_t>(tensors_.size())).first;
      Merged& added = tensors_.emplace_back();
      added.name = t.name, added.dtype = t.dtype, added.shape = t.shape;
      added.shape_wire = std::move(t.shape_wire);
    }
    Merged& mine = tensors_[it->second];
    if (mine.dtype != t.dtype || mine.shape != t.shape) {
      const char* first = (t.boxes.empty() ? t.later.front() : t.boxes).data();
      return InvalidArgumentError(
          fmt::format("tensor {:?}: rank {} has {} {} but another rank has {} {}", mine.name,
                      DecodeVarint(&first), DTypeName(t.dtype), ShapeToString(t.shape),
                      DTypeName(mine.dtype), ShapeToString(mine.shape)));
    }
    if (mine.shards + t.shards >= UINT32_MAX - 1) return InternalError("too many shards");
    at[i] = it->second;
    base[i] = static_cast<uint32_t>(mine.shards);
    mine.shards += t.shards;
    mine.chunks = SaturatingAdd(mine.chunks, t.chunks);
    if (!t.boxes.empty()) mine.later.push_back(std::move(t.boxes));
    for (std::string& more : t.later) mine.later.push_back(std::move(more));
    t = Merged();
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    RankInfo& info = later.ranks_[r];
    if (info.shards.empty() && info.file_bytes == 0) continue;
    for (auto& [t, k] : info.shards) k += base[t], t = at[t];
    ranks_[r] = std::move(info);
  }
  later = ManifestMerger(0);
  return Status::OK();
}

struct ManifestMerger::Scratch {
  std::vector<int64_t> boxes;
  std::vector<uint32_t> ranks;
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // (offset, bytes)
  std::vector<uint32_t> order;                         // the boxes' order in the records
  std::unique_ptr<char[]> out;  // records as encoded, before they are copied to their tensor
  uint64_t out_bytes = 0;
};

Result<std::shared_ptr<const MergedPlan>> ManifestMerger::Finish(int threads) {
  if (chunk_bytes_ == 0) return InvalidArgumentError("SaveOptions.chunk_bytes is 0");
  auto plan = std::make_shared<MergedPlan>();
  plan->world_ = world_;
  plan->version_ = static_cast<uint32_t>(version_);
  if (version_ == 0) {  // the ranks left the version to the coordinator
    uint64_t shards = 0, chunks = 0;
    for (const Merged& t : tensors_) shards += t.shards, chunks = SaturatingAdd(chunks, t.chunks);
    plan->version_ = shards > kIndexedAboveShards || chunks > kIndexedAboveChunks
                         ? format::kCompactFormatVersion
                         : format::kFormatVersion;
  }
  plan->encrypted_ = encrypted_;
  plan->chunk_bytes_ = chunk_bytes_;
  plan->file_index_.assign(world_, -1);
  for (int r = 0; r < world_; ++r) {
    if (ranks_[r].shards.empty()) continue;
    plan->file_index_[r] = static_cast<int64_t>(plan->files_.size());
    plan->files_.push_back({engine::DataFileName(r, 0), ranks_[r].file_bytes});
  }
  Status over_cap;  // (reported after the tiling: a layout that overlaps is named as such)
  SP_ASSIGN_OR_RETURN(std::vector<Place> places, PlaceTensors(plan.get(), &over_cap));
  // Per shard, in the merger's order: its chunk entries (first, count) in the plan.
  std::vector<ChunkSpan> spans(plan->chunk_at_.size() - 1);
  std::vector<Scratch> scratch(std::max(threads, 1));
  const bool lay = over_cap.ok();  // (else only the tiling is checked: the error comes first)
  SP_RETURN_IF_ERROR(ParallelFor(tensors_.size(), threads, [&](size_t ti, int w) {
    return LayTensor(static_cast<uint32_t>(ti), places[ti], lay, scratch[w], plan.get(), &spans);
  }));
  SP_RETURN_IF_ERROR(over_cap);
  SP_RETURN_IF_ERROR(CheckSections(*plan));
  plan->rank_first_.assign(world_ + 1, 0);
  for (int r = 0; r < world_; ++r) {
    plan->rank_first_[r + 1] = plan->rank_first_[r] + ranks_[r].shards.size();
  }
  plan->rank_chunks_.resize(plan->rank_first_[world_]);  // (= spans.size(): one rank per shard)
  (void)ForRanges(ranks_.size(), threads, [&](size_t first, size_t last) {
    for (size_t r = first; r < last; ++r) {
      ChunkSpan* out = plan->rank_chunks_.data() + plan->rank_first_[r];
      for (auto [t, k] : ranks_[r].shards) *out++ = spans[places[t].id + k];
    }
    return Status::OK();
  });
  *this = ManifestMerger(0);
  return std::shared_ptr<const MergedPlan>(std::move(plan));
}

// The fewest bytes the records of `shards` shards of `ndim` dimensions take in format `version`
// (exact below version 4).
uint64_t LeastRecordBytes(uint32_t version, uint64_t shards, size_t ndim) {
  return shards * (version >= format::kCompactFormatVersion ? format::MinCompactRecordBytes(ndim)
                                                            : format::ShardRecordBytes(ndim));
}

Result<std::vector<ManifestMerger::Place>> ManifestMerger::PlaceTensors(MergedPlan* plan,
                                                                        Status* over_cap) {
  const uint32_t version = plan->version_;
  uint64_t shards = 0, record_bytes = 0;
  for (const Merged& t : tensors_) {
    shards += t.shards;
    record_bytes += LeastRecordBytes(version, t.shards, t.shape.size());
  }
  // A manifest holds at most kMaxManifestFileBytes: more records and chunk entries cannot be
  // written (and are not allocated).
  const uint64_t entry = format::ChunkEntryBytes(false, encrypted_);
  if (shards >= UINT32_MAX || record_bytes > format::kMaxManifestFileBytes ||
      (version >= format::kIndexedFormatVersion && shards > format::kMaxIndexedShards)) {
    return ResourceExhaustedError(
        fmt::format("{} shards: over what a manifest holds ({} bytes, {} shards)", shards,
                    format::kMaxManifestFileBytes, format::kMaxIndexedShards));
  }
  const uint64_t kMaxEntries = (format::kMaxManifestFileBytes - record_bytes) / entry;
  std::vector<uint32_t> names(tensors_.size());
  std::iota(names.begin(), names.end(), 0u);
  std::sort(names.begin(), names.end(),
            [&](uint32_t x, uint32_t y) { return tensors_[x].name < tensors_[y].name; });
  std::vector<Place> places(tensors_.size());
  for (size_t i = 1; i < tensors_.size(); ++i) {
    places[i].id = places[i - 1].id + tensors_[i - 1].shards;
  }
  plan->tensors_.reserve(tensors_.size());
  Place next;
  for (uint32_t ti : names) {
    const Merged& t = tensors_[ti];
    if (t.chunks > kMaxEntries - std::min(next.chunk, kMaxEntries) && over_cap->ok()) {
      *over_cap = ResourceExhaustedError(fmt::format(
          "over {} chunks: the manifest would exceed {} bytes (raise SaveOptions.chunk_bytes)",
          kMaxEntries, format::kMaxManifestFileBytes));
    }
    const uint64_t section =
        SaturatingAdd(LeastRecordBytes(version, t.shards, t.shape.size()),
                      t.chunks > UINT64_MAX / entry ? UINT64_MAX : t.chunks * entry);
    if (section > format::kMaxManifestBodyBytes && over_cap->ok()) {
      *over_cap = SectionOverCap(t.name, section);
    }
    if (t.shards > format::kMaxShardsPerTensor && over_cap->ok()) {
      *over_cap = ResourceExhaustedError(
          fmt::format("tensor {:?}: {} shards, over the {} a manifest reader accepts", t.name,
                      t.shards, format::kMaxShardsPerTensor));
    }
    next.index = plan->tensors_.size();
    next.id = places[ti].id;
    places[ti] = next;
    MergedPlan::Tensor& laid = plan->tensors_.emplace_back();
    laid.name = t.name;
    laid.dtype = t.dtype;
    laid.shape = t.shape;
    laid.first_shard = next.shard;
    laid.shards = t.shards;
    next.shard += t.shards;
    next.chunk = SaturatingAdd(next.chunk, t.chunks);
  }
  plan->chunk_at_.resize(next.shard + 1);
  plan->chunk_at_.back() = next.chunk;
  return places;
}

Status ManifestMerger::LayTensor(uint32_t ti, const Place& at, bool lay, Scratch& scratch,
                                 MergedPlan* plan, std::vector<ChunkSpan>* spans) {
  Merged& t = tensors_[ti];
  const size_t nd = t.shape.size(), n = t.shards;
  scratch.boxes.resize(2 * nd * n);
  scratch.ranks.resize(n);
  scratch.extents.resize(n);
  size_t k = 0;
  int64_t* b = scratch.boxes.data();
  auto decode = [&](const std::string& part) {  // (the fields AddShards decoded and checked)
    for (const char* p = part.data(); p < part.data() + part.size(); ++k) {
      scratch.ranks[k] = static_cast<uint32_t>(DecodeVarint(&p));
      for (int half = 0; half < 2; ++half) {
        DecodeVarint(&p);  // (the count: nd)
        for (size_t d = 0; d < nd; ++d) *b++ = static_cast<int64_t>(DecodeVarint(&p));
      }
      scratch.extents[k].first = DecodeVarint(&p);
      scratch.extents[k].second = DecodeVarint(&p);
    }
  };
  decode(t.boxes);
  for (const std::string& part : t.later) decode(part);
  std::string().swap(t.boxes);
  std::vector<std::string>().swap(t.later);
  // A grid (the usual layout) is checked and ordered at once; other layouts are swept, then sorted.
  std::vector<uint32_t>& order = scratch.order;
  if (!format::GridOrder(t.shape, scratch.boxes.data(), n, &order)) {
    Status s = format::CheckFlatTiling(t.shape, scratch.boxes.data(), n, "sharded save",
                                       fmt::format("tensor {:?}", t.name));
    if (!s.ok()) return InvalidArgumentError(s.message());
    if (lay) order = BoxOrder(scratch.boxes.data(), n, nd);
  }
  if (!lay) return Status::OK();
  format::RecordEncoder encoder(plan->version_, nd);
  if (const uint64_t most = n * encoder.MaxBytes(); most > scratch.out_bytes) {
    scratch.out = std::make_unique_for_overwrite<char[]>(most);
    scratch.out_bytes = most;
  }
  char* out = scratch.out.get();
  uint64_t shard = at.shard, chunk = at.chunk;
  for (uint32_t k : order) {
    const auto [offset, bytes] = scratch.extents[k];
    const int64_t* b = scratch.boxes.data() + 2 * nd * k;
    const uint64_t chunks = format::NumChunks(bytes, chunk_bytes_);
    // (Laid only within the caps: fewer than 2^30 chunk entries in all.)
    (*spans)[at.id + k] = {static_cast<uint32_t>(chunk), static_cast<uint32_t>(chunks)};
    plan->chunk_at_[shard++] = chunk;
    chunk += chunks;
    const auto file = static_cast<uint32_t>(plan->file_index_[scratch.ranks[k]]);
    out = encoder.Write({b, b + nd, nd, offset, bytes, file}, out);
  }
  MergedPlan::Tensor& laid = plan->tensors_[at.index];
  laid.record_bytes = static_cast<uint64_t>(out - scratch.out.get());
  laid.records = std::make_unique_for_overwrite<char[]>(laid.record_bytes);
  std::memcpy(laid.records.get(), scratch.out.get(), laid.record_bytes);
  laid.records_crc = Crc32c(laid.view());
  return Status::OK();
}

Status ManifestMerger::CheckSections(const MergedPlan& plan) {
  const uint64_t entry = format::ChunkEntryBytes(false, plan.encrypted_);
  uint64_t total = 0;  // (each section <= 256 MiB, at most 2^24 tensors: no overflow)
  for (const MergedPlan::Tensor& t : plan.tensors_) {
    const uint64_t chunks =
        plan.chunk_at_[t.first_shard + t.shards] - plan.chunk_at_[t.first_shard];
    const uint64_t section = t.record_bytes + chunks * entry;  // (PlaceTensors capped chunks)
    if (section > format::kMaxManifestBodyBytes) return SectionOverCap(t.name, section);
    total += section;
  }
  if (total > format::kMaxManifestFileBytes) {
    return ResourceExhaustedError(
        fmt::format("the manifest's sections would be {} bytes, over the cap of {} (raise "
                    "SaveOptions.chunk_bytes)",
                    total, format::kMaxManifestFileBytes));
  }
  return Status::OK();
}

SaveChecksums::SaveChecksums(std::shared_ptr<const MergedPlan> plan) : plan_(std::move(plan)) {
  crcs_.resize(plan_->chunk_at_.back());
  if (plan_->encrypted_) tags_.resize(crcs_.size());
}

Status SaveChecksums::Add(int rank, std::string_view bytes, const format::KeyCheck* key_check) {
  if (rank < 0 || rank >= plan_->world_) {
    return InternalError(
        fmt::format("checksums of rank {} in a save of {} ranks", rank, plan_->world_));
  }
  WireReader r(bytes, fmt::format("checksums of rank {}", rank));
  Status st;
  Status wf = ReadStatus(r, &st);
  if (!wf.ok()) return Malformed("checksums", rank, wf);
  if (!st.ok()) return st.WithContext(fmt::format("rank {}", rank));
  Result<std::string_view> check = r.View();
  if (!check.ok()) return Malformed("checksums", rank, check.status());
  const std::string_view expect =
      key_check == nullptr
          ? std::string_view()
          : std::string_view(reinterpret_cast<const char*>(key_check->data()), key_check->size());
  if (*check != expect) {
    return InvalidArgumentError(fmt::format(
        "rank {}: SaveOptions.key differs from rank 0's (every rank must pass the same key)",
        rank));
  }
  const MergedPlan& p = *plan_;
  Status s = [&]() -> Status {
    SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(2));  // (a shard takes 2 bytes or more)
    const uint64_t first = p.rank_first_[rank], last = p.rank_first_[rank + 1];
    if (n != last - first) return InternalError("shard count differs from plan");
    for (uint64_t i = first; i < last; ++i) {
      const auto [at, chunks] = p.rank_chunks_[i];
      uint64_t k = 0, tags = 0;  // (each checked against the plan, which caps them)
      if (!r.Next(&k)) return r.Truncated();
      if (k != chunks) return InternalError("bad chunk count");
      SP_ASSIGN_OR_RETURN(std::string_view crcs, r.Raw(4 * k));  // (little-endian: wire.h)
      std::memcpy(crcs_.data() + at, crcs.data(), crcs.size());
      if (!r.Next(&tags)) return r.Truncated();
      if (tags != (key_check != nullptr && p.encrypted_ ? k : 0)) {
        return InternalError("bad tag count");
      }
      for (uint64_t c = 0; c < tags; ++c) {
        SP_ASSIGN_OR_RETURN(std::string_view tag, r.Raw(tags_[at + c].size()));
        std::memcpy(tags_[at + c].data(), tag.data(), tag.size());
      }
    }
    return r.done() ? Status::OK() : InternalError("trailing bytes");
  }();
  return s.ok() ? s : Malformed("checksums", rank, s);
}

Status SaveChecksums::AddAll(const std::vector<std::string>& reports,
                             const format::KeyCheck* key_check, int threads) {
  if (reports.size() != static_cast<size_t>(plan_->world_)) {
    return InternalError(
        fmt::format("{} checksum reports for {} ranks", reports.size(), plan_->world_));
  }
  return ForRanges(reports.size(), threads, [&](size_t first, size_t last) -> Status {
    for (size_t r = first; r < last; ++r) {
      SP_RETURN_IF_ERROR(Add(static_cast<int>(r), reports[r], key_check));
    }
    return Status::OK();
  });
}

void SaveChecksums::TakeInto(format::Manifest* m) const {
  const MergedPlan& p = *plan_;
  m->files = p.files_;
  m->tensors.clear();
  m->tensors.reserve(p.tensors_.size());
  for (const MergedPlan::Tensor& t : p.tensors_) {
    format::TensorRecord& rec = m->tensors.emplace_back();
    rec.name = t.name;
    rec.dtype = t.dtype;
    rec.shape = t.shape;
    const size_t nd = t.shape.size(), size = format::ShardRecordBytes(nd);
    for (uint64_t k = 0; k < t.shards; ++k) {  // back from the records (of version 3: LayTensor)
      const std::string_view b = t.view().substr(k * size, size);
      format::ShardRecord& s = rec.shards.emplace_back();
      for (size_t d = 0; d < nd; ++d) {
        s.offsets.push_back(static_cast<int64_t>(format::GetU64(b, 8 * d)));
        s.sizes.push_back(static_cast<int64_t>(format::GetU64(b, 8 * (nd + d))));
      }
      s.offset = format::GetU64(b, 16 * nd);
      s.bytes = format::GetU64(b, 16 * nd + 8);
      s.file = format::GetU32(b, 16 * nd + 16);
      const uint64_t at = p.chunk_at_[t.first_shard + k], end = p.chunk_at_[t.first_shard + k + 1];
      s.crc32c.assign(crcs_.begin() + at, crcs_.begin() + end);
      if (p.encrypted_) s.tags.assign(tags_.begin() + at, tags_.begin() + end);
    }
  }
}

std::vector<std::string_view> SaveChecksums::EncodeIndexed(format::Manifest* m,
                                                           const format::CheckpointKeys* keys,
                                                           std::string* front,
                                                           uint64_t* largest_section) const {
  const MergedPlan& p = *plan_;
  const bool encrypted = m->encryption.enabled;  // (then Add took one tag per checksum)
  const crypto::GcmTag none{};
  std::string sections;  // encrypted: the sections, which the MAC covers with the head
  std::vector<std::string_view> pieces(1);  // [0]: *front
  std::vector<format::SectionRef> refs;
  refs.reserve(p.tensors_.size());
  m->files = p.files_;
  m->tensors.clear();
  m->tensors.reserve(p.tensors_.size());
  *largest_section = 0;
  for (const MergedPlan::Tensor& t : p.tensors_) {
    const std::string_view records = t.view();
    const uint64_t first = p.chunk_at_[t.first_shard], end = p.chunk_at_[t.first_shard + t.shards];
    if (!encrypted) {  // an entry is its CRC32C, little-endian (the hosts' order: format/endian.h)
      const std::string_view entries(reinterpret_cast<const char*>(crcs_.data() + first),
                                     4 * (end - first));
      format::SectionRef r;
      r.bytes = records.size() + entries.size();
      r.crc32c = Crc32cExtend(t.records_crc, std::as_bytes(std::span(entries)));
      r.shards = t.shards;
      r.chunks = end - first;
      refs.push_back(r);
      pieces.push_back(records);
      pieces.push_back(entries);
    } else {
      const size_t start = sections.size();
      sections.append(records);
      for (uint64_t c = first; c < end; ++c) {
        format::AppendChunkEntry(crcs_[c], false, nullptr, c < tags_.size() ? &tags_[c] : &none,
                                 &sections);
      }
      refs.push_back(format::CloseSection(sections, start, t.shards, end - first, false));
    }
    *largest_section = std::max(*largest_section, refs.back().bytes);
    m->tensors.push_back({.name = t.name, .dtype = t.dtype, .shape = t.shape, .shards = {}});
  }
  // Unencrypted: the encoding with no sections is exactly the header and head.
  *front = format::EncodeIndexedManifest(*m, refs, std::move(sections), keys);
  pieces[0] = *front;
  if (encrypted) pieces.resize(1);
  return pieces;
}

namespace {

struct Cache {
  std::mutex mu;
  crypto::Sha256 key{};
  std::shared_ptr<const MergedPlan> plan;
};

Cache& TheCache() {
  static Cache* cache = new Cache();  // never destroyed: saves may run at exit
  return *cache;
}

}  // namespace

std::shared_ptr<const MergedPlan> CachedPlan(const crypto::Sha256& key) {
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.plan != nullptr && c.key == key ? c.plan : nullptr;
}

void CachePlan(const crypto::Sha256& key, std::shared_ptr<const MergedPlan> plan) {
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.key = key;
  c.plan = std::move(plan);
}

crypto::Sha256 PlanKey(const std::vector<std::string>& plans, bool* any_digest, int threads) {
  std::vector<crypto::Sha256> digests(plans.size());
  std::vector<char> digest(plans.size());
  ForRanges(plans.size(), threads, [&](size_t first, size_t last) {
    for (size_t i = first; i < last; ++i) {
      bool d = false;
      digests[i] = PlanDigest(plans[i], &d);
      digest[i] = d;
    }
    return Status::OK();
  }).IgnoreError();
  *any_digest = std::find(digest.begin(), digest.end(), 1) != digest.end();
  WireWriter w;
  w.U64(plans.size());
  for (const crypto::Sha256& d : digests) {
    w.Raw({reinterpret_cast<const char*>(d.data()), d.size()});
  }
  return crypto::Sha256Of(std::as_bytes(std::span(w.bytes())));
}

Status CheckPlansAgainstDigests(const std::vector<std::string>& plans,
                                const std::vector<std::string>& digests, int threads) {
  if (plans.size() != digests.size()) {
    return InvalidArgumentError(
        fmt::format("{} plans for {} digests", plans.size(), digests.size()));
  }
  return ForRanges(plans.size(), threads, [&](size_t first, size_t last) -> Status {
    for (size_t r = first; r < last; ++r) {
      if (!PlanMatchesDigest(plans[r], digests[r])) return PlanNotDigested(r);
    }
    return Status::OK();
  });
}

Result<std::shared_ptr<const MergedPlan>> MergePlans(const std::vector<std::string>& plans,
                                                     int threads,
                                                     const std::vector<std::string>* digests) {
  if (digests != nullptr && digests->size() != plans.size()) {
    return CheckPlansAgainstDigests(plans, *digests, threads);  // (names the mismatch)
  }
  const int world = static_cast<int>(plans.size());
  const size_t parts = static_cast<size_t>(std::clamp(threads, 1, std::max(world, 1)));
  std::vector<ManifestMerger> mergers(parts, ManifestMerger(world));
  const Status parts_added = ParallelFor(parts, threads, [&](size_t p, int) -> Status {
    for (size_t r = plans.size() * p / parts; r < plans.size() * (p + 1) / parts; ++r) {
      // (Hashed just before it is decoded, a plan is read from memory once.)
      if (digests != nullptr && !PlanMatchesDigest(plans[r], (*digests)[r])) {
        return PlanNotDigested(r);
      }
      SP_RETURN_IF_ERROR(mergers[p].AddPlan(static_cast<int>(r), plans[r]));
    }
    return Status::OK();
  });
  Status joined = parts_added;
  for (size_t p = 1; p < parts && joined.ok(); ++p)
    joined = mergers[0].Absorb(std::move(mergers[p]));
  if (joined.ok()) return mergers[0].Finish(threads);
  // An error: a plan that is not its digest's first, then the one a single merger finds first (a
  // conflict between ranges is found only when they are joined, after the ranges' own errors).
  if (digests != nullptr) SP_RETURN_IF_ERROR(CheckPlansAgainstDigests(plans, *digests, threads));
  ManifestMerger one(world);
  for (size_t r = 0; r < plans.size(); ++r) {
    SP_RETURN_IF_ERROR(one.AddPlan(static_cast<int>(r), plans[r]));
  }
  return joined;
}

}  // namespace savepoint::dist
