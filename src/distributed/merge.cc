// The coordinator's merge of per-rank plans, each save's checksums, and the plan cache (see
// merge.h).
#include "distributed/merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>

#include "distributed/descriptor.h"
#include "distributed/wire.h"
#include "engine/paths.h"
#include "format/endian.h"
#include "format/manifest_index.h"
#include "util/crc32c.h"

namespace savepoint::dist {

Result<ManifestMerger::Merged*> ManifestMerger::TensorOf(int rank, size_t i, std::string_view name,
                                                         std::string_view dtype,
                                                         const int64_t* shape, size_t ndim) {
  // Ranks of one replica group list the same tensors: the i-th shard of the previous plan is
  // likely of the same tensor as this one.
  uint32_t at = i < hints_.size() ? hints_[i] : UINT32_MAX;
  if (at >= tensors_.size() || tensors_[at].name != name) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      if (tensors_.size() >= UINT32_MAX - 1) return InternalError("too many tensors");
      std::optional<DType> dt = DTypeFromName(dtype);
      if (!dt) return InternalError(fmt::format("unknown dtype {:?}", dtype));
      it = index_.emplace(std::string(name), static_cast<uint32_t>(tensors_.size())).first;
      Merged& t = tensors_.emplace_back();
      t.name = name;
      t.dtype = *dt;
      t.shape.assign(shape, shape + ndim);
    }
    at = it->second;
  }
  if (i >= hints_.size()) hints_.resize(i + 1, UINT32_MAX);
  hints_[i] = at;
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
  Status st;
  Status wf = ReadStatus(r, &st);
  if (!wf.ok()) return Malformed("plan", rank, wf);
  if (!st.ok()) return st.WithContext(fmt::format("rank {}", rank));
  Status s = [&]() -> Status {
    SP_ASSIGN_OR_RETURN(uint64_t version, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t encrypted, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t chunk_bytes, r.U64());
    if (version_ == 0) {
      version_ = version, version_rank_ = rank, encrypted_ = encrypted != 0;
      chunk_bytes_ = chunk_bytes;
    }
    if (chunk_bytes != chunk_bytes_) {
      return InvalidArgumentError(fmt::format(
          "rank {} writes chunks of {} bytes, rank {} of {} (SaveOptions.chunk_bytes must be the "
          "same on every rank)",
          rank, chunk_bytes, version_rank_, chunk_bytes_));
    }
    if (version != version_) {
      return InvalidArgumentError(fmt::format(
          "rank {} writes format version {}, rank {} version {} (SaveOptions.format_version must "
          "be the same on every rank)",
          rank, version, version_rank_, version_));
    }
    if ((encrypted != 0) != encrypted_) {
      return InvalidArgumentError(
          fmt::format("SaveOptions.key is set on rank {} but not on rank {} (every rank must pass "
                      "the same key)",
                      encrypted_ ? version_rank_ : rank, encrypted_ ? rank : version_rank_));
    }
    SP_ASSIGN_OR_RETURN(ranks_[rank].file_bytes, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(7));  // (a shard takes 7 bytes or more)
    SP_RETURN_IF_ERROR(AddShards(rank, n, r));
    return r.done() ? Status::OK() : InternalError("trailing bytes");
  }();
  if (s.code() == StatusCode::kInternal) return Malformed("plan", rank, s);
  return s;
}

Status ManifestMerger::AddShards(int rank, uint64_t n, WireReader& r) {
  RankInfo& info = ranks_[rank];
  info.shards.reserve(n);
  int64_t shape[kMaxRank], box[2 * kMaxRank];
  for (uint64_t i = 0; i < n; ++i) {
    std::string_view name, dtype;
    size_t nd, no, ns;
    Extent e{.rank = static_cast<uint32_t>(rank)};
    if (!r.NextView(&name) || !r.NextView(&dtype) || !r.NextDims(shape, &nd) ||
        !r.NextDims(box, &no) || !r.NextDims(box + no, &ns) || !r.Next(&e.offset) ||
        !r.Next(&e.bytes)) {
      return r.Truncated();
    }
    SP_ASSIGN_OR_RETURN(Merged * t, TensorOf(rank, i, name, dtype, shape, nd));
    if (no != nd || ns != nd) {
      return InvalidArgumentError(fmt::format("tensor {:?}: box rank differs from shape {}", name,
                                              ShapeToString(t->shape)));
    }
    // The extent holds the box's bytes (distributed saves do not compress) and lies in the
    // rank's file.
    const Shape sizes(box + nd, box + 2 * nd);
    Result<uint64_t> bytes = NumBytes(t->dtype, sizes);
    if (!bytes.ok() || *bytes != e.bytes) {
      return InvalidArgumentError(
          fmt::format("tensor {:?}: rank {} writes {} bytes for a box of {}", name, rank, e.bytes,
                      ShapeToString(sizes)));
    }
    if (e.offset > info.file_bytes || e.bytes > info.file_bytes - e.offset) {
      return InvalidArgumentError(
          fmt::format("tensor {:?}: rank {} places a shard of {} bytes at {} in a file of {}", name,
                      rank, e.bytes, e.offset, info.file_bytes));
    }
    const uint32_t k = static_cast<uint32_t>(t->extents.size());
    t->boxes.insert(t->boxes.end(), box, box + 2 * nd);
    t->extents.push_back(e);
    info.shards.emplace_back(static_cast<uint32_t>(t - tensors_.data()), k);
  }
  return Status::OK();
}

Result<std::shared_ptr<const MergedPlan>> ManifestMerger::Finish() {
  if (chunk_bytes_ == 0) return InvalidArgumentError("SaveOptions.chunk_bytes is 0");
  for (const Merged& t : tensors_) {
    Status s = format::CheckFlatTiling(t.shape, t.boxes.data(), t.extents.size(), "sharded save",
                                       fmt::format("tensor {:?}", t.name));
    if (!s.ok()) return InvalidArgumentError(s.message());
  }
  auto plan = std::make_shared<MergedPlan>();
  plan->world_ = world_;
  plan->version_ = static_cast<uint32_t>(version_);
  plan->encrypted_ = encrypted_;
  plan->chunk_bytes_ = chunk_bytes_;
  plan->file_index_.assign(world_, -1);
  for (int r = 0; r < world_; ++r) {
    if (ranks_[r].shards.empty()) continue;
    plan->file_index_[r] = static_cast<int64_t>(plan->files_.size());
    plan->files_.push_back({engine::DataFileName(r, 0), ranks_[r].file_bytes});
  }
  SP_RETURN_IF_ERROR(Lay(plan.get()));
  *this = ManifestMerger(0);
  return std::shared_ptr<const MergedPlan>(std::move(plan));
}

Status ManifestMerger::Lay(MergedPlan* plan) {
  uint64_t shards = 0, record_bytes = 0;
  for (const Merged& t : tensors_) {
    shards += t.extents.size();
    record_bytes += t.extents.size() * format::ShardRecordBytes(t.shape.size());
  }
  // A manifest holds at most kMaxManifestFileBytes: more records and chunk entries cannot be
  // written (and are not allocated).
  const uint64_t entry = format::ChunkEntryBytes(false, encrypted_);
  if (shards >= UINT32_MAX || record_bytes > format::kMaxManifestFileBytes) {
    return ResourceExhaustedError(fmt::format("{} shards: the manifest would exceed {} bytes",
                                              shards, format::kMaxManifestFileBytes));
  }
  const uint64_t kMaxEntries = (format::kMaxManifestFileBytes - record_bytes) / entry;
  std::vector<uint32_t> names(tensors_.size());
  std::iota(names.begin(), names.end(), 0u);
  std::sort(names.begin(), names.end(),
            [&](uint32_t x, uint32_t y) { return tensors_[x].name < tensors_[y].name; });
  std::vector<std::vector<uint32_t>> id(tensors_.size());  // (tensor, shard) -> shard in the plan
  plan->records_.reserve(record_bytes);
  plan->chunk_at_.reserve(shards + 1);
  uint64_t chunks = 0;
  for (uint32_t ti : names) {
    Merged& t = tensors_[ti];
    const size_t nd = t.shape.size();
    const size_t records_at = plan->records_.size();
    const std::vector<uint32_t> order = BoxOrder(t);  // (before t's shape moves)
    plan->tensors_.push_back({std::move(t.name), t.dtype, std::move(t.shape),
                              plan->chunk_at_.size(), t.extents.size(), records_at, 0});
    id[ti].resize(t.extents.size());
    for (uint32_t k : order) {
      const Extent& e = t.extents[k];
      const int64_t* b = t.boxes.data() + 2 * nd * k;
      id[ti][k] = static_cast<uint32_t>(plan->chunk_at_.size());
      plan->chunk_at_.push_back(chunks);
      if (__builtin_add_overflow(chunks, format::NumChunks(e.bytes, plan->chunk_bytes_), &chunks) ||
          chunks > kMaxEntries) {
        return ResourceExhaustedError(fmt::format(
            "over {} chunks: the manifest would exceed {} bytes (raise SaveOptions.chunk_bytes)",
            kMaxEntries, format::kMaxManifestFileBytes));
      }
      format::AppendShardRecord(
          {b, b + nd, nd, e.offset, e.bytes, static_cast<uint32_t>(plan->file_index_[e.rank])},
          &plan->records_);
    }
    const std::string_view records = std::string_view(plan->records_).substr(records_at);
    plan->tensors_.back().records_crc = Crc32c(records);
    // Each section is at most kMaxManifestBodyBytes, as readers require (refused here, at the
    // decision, before any rank writes).
    const uint64_t section =
        records.size() + (chunks - plan->chunk_at_[plan->tensors_.back().first_shard]) * entry;
    if (section > format::kMaxManifestBodyBytes) {
      return ResourceExhaustedError(fmt::format(
          "tensor {:?}: its manifest section would be {} bytes, over the cap of {} (raise "
          "SaveOptions.chunk_bytes)",
          plan->tensors_.back().name, section, format::kMaxManifestBodyBytes));
    }
    t = Merged();
  }
  plan->chunk_at_.push_back(chunks);
  plan->rank_first_.reserve(world_ + 1);
  plan->rank_shards_.reserve(shards);
  for (const RankInfo& info : ranks_) {
    plan->rank_first_.push_back(plan->rank_shards_.size());
    for (auto [t, k] : info.shards) plan->rank_shards_.push_back(id[t][k]);
  }
  plan->rank_first_.push_back(plan->rank_shards_.size());
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
      const uint32_t id = p.rank_shards_[i];
      const uint64_t at = p.chunk_at_[id], chunks = p.chunk_at_[id + 1] - at;
      SP_ASSIGN_OR_RETURN(uint64_t k, r.VCount(4));
      if (k != chunks) return InternalError("bad chunk count");
      for (uint64_t c = 0; c < k; ++c) {
        if (!r.Next32(&crcs_[at + c])) return r.Truncated();
      }
      SP_ASSIGN_OR_RETURN(uint64_t tags, r.VCount(16));
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

std::vector<uint32_t> ManifestMerger::BoxOrder(const Merged& t) const {
  std::vector<uint32_t> order(t.extents.size());
  std::iota(order.begin(), order.end(), 0u);
  const size_t w = 2 * t.shape.size();
  const int64_t* b = t.boxes.data();
  std::sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
    return std::lexicographical_compare(b + w * x, b + w * (x + 1), b + w * y, b + w * (y + 1));
  });
  return order;
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
    for (uint64_t k = 0; k < t.shards; ++k) {  // back from the records (written by Lay)
      const std::string_view b = std::string_view(p.records_).substr(t.record_at + k * size, size);
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
    const std::string_view records =
        std::string_view(p.records_)
            .substr(t.record_at, t.shards * format::ShardRecordBytes(t.shape.size()));
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

crypto::Sha256 PlanKey(const std::vector<std::string>& plans, bool* any_digest) {
  *any_digest = false;
  WireWriter w;
  w.U64(plans.size());
  for (const std::string& plan : plans) {
    bool digest = false;
    const crypto::Sha256 d = PlanDigest(plan, &digest);
    *any_digest = *any_digest || digest;
    w.Raw({reinterpret_cast<const char*>(d.data()), d.size()});
  }
  return crypto::Sha256Of(std::as_bytes(std::span(w.bytes())));
}

}  // namespace savepoint::dist
