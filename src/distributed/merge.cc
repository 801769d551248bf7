// The coordinator's merge of per-rank descriptors into one global manifest (see descriptor.h).
//
// At 16,384 ranks a save has millions of shards, so they are held compactly: per tensor its boxes
// flat and its extents in one array, every checksum (and tag) in one array. The version 3 sections
// are written straight from them; versions 1 and 2 build the manifest's shard records.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "distributed/descriptor.h"
#include "distributed/wire.h"
#include "engine/paths.h"
#include "format/manifest_index.h"

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
  WireReader r(bytes, fmt::format("plan of rank {}", rank));
  Status st;
  Status wf = ReadStatus(r, &st);
  if (!wf.ok()) return Malformed("plan", rank, wf);
  if (!st.ok()) return st.WithContext(fmt::format("rank {}", rank));
  Status s = [&]() -> Status {
    SP_ASSIGN_OR_RETURN(uint64_t version, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t encrypted, r.U64());
    if (version_ == 0) version_ = version, version_rank_ = rank, encrypted_ = encrypted != 0;
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
    RankInfo& info = ranks_[rank];
    SP_ASSIGN_OR_RETURN(info.file_bytes, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(7));  // (a shard takes 7 bytes or more)
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
      const uint32_t k = static_cast<uint32_t>(t->extents.size());
      t->boxes.insert(t->boxes.end(), box, box + 2 * nd);
      t->extents.push_back(e);
      info.shards.emplace_back(static_cast<uint32_t>(t - tensors_.data()), k);
    }
    return r.done() ? Status::OK() : InternalError("trailing bytes");
  }();
  if (s.code() == StatusCode::kInternal) return Malformed("plan", rank, s);
  return s;
}

Result<std::vector<int64_t>> ManifestMerger::Finish() {
  for (const Merged& t : tensors_) {
    Status s = format::CheckFlatTiling(t.shape, t.boxes.data(), t.extents.size(), "sharded save",
                                       fmt::format("tensor {:?}", t.name));
    if (!s.ok()) return InvalidArgumentError(s.message());
  }
  file_index_.assign(world_, -1);
  for (int r = 0; r < world_; ++r) {
    if (ranks_[r].shards.empty()) continue;
    file_index_[r] = static_cast<int64_t>(files_.size());
    files_.push_back({engine::DataFileName(r, 0), ranks_[r].file_bytes});
  }
  return file_index_;
}

Status ManifestMerger::AddCrcs(int rank, std::string_view bytes, uint64_t chunk_bytes,
                               const format::KeyCheck* key_check) {
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
  Status s = [&]() -> Status {
    SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(2));  // (a shard takes 2 bytes or more)
    if (n != ranks_[rank].shards.size()) return InternalError("shard count differs from plan");
    for (auto [t, i] : ranks_[rank].shards) {
      Extent& e = tensors_[t].extents[i];
      SP_ASSIGN_OR_RETURN(uint64_t k, r.VCount(4));
      if (k != format::NumChunks(e.bytes, chunk_bytes) || k > UINT32_MAX) {
        return InternalError("bad chunk count");
      }
      e.crc_at = crcs_.size();
      e.chunks = static_cast<uint32_t>(k);
      crcs_.resize(crcs_.size() + k);
      for (uint64_t c = 0; c < k; ++c) {
        if (!r.Next32(&crcs_[e.crc_at + c])) return r.Truncated();
      }
      SP_ASSIGN_OR_RETURN(uint64_t tags, r.VCount(16));
      if (tags != (key_check != nullptr ? k : 0)) return InternalError("bad tag count");
      for (uint64_t c = 0; c < tags; ++c) {
        crypto::GcmTag& to = tags_.emplace_back();
        SP_ASSIGN_OR_RETURN(std::string_view tag, r.Raw(to.size()));
        std::memcpy(to.data(), tag.data(), to.size());
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

std::vector<uint32_t> ManifestMerger::NameOrder() const {
  std::vector<uint32_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t x, uint32_t y) { return tensors_[x].name < tensors_[y].name; });
  return order;
}

void ManifestMerger::TakeInto(format::Manifest* m) {
  m->files = std::move(files_);
  m->tensors.clear();
  m->tensors.reserve(tensors_.size());
  for (uint32_t ti : NameOrder()) {
    Merged& t = tensors_[ti];
    format::TensorRecord& rec = m->tensors.emplace_back();
    rec.name = std::move(t.name);
    rec.dtype = t.dtype;
    const size_t nd = t.shape.size();
    rec.shards.reserve(t.extents.size());
    for (uint32_t k : BoxOrder(t)) {
      const Extent& e = t.extents[k];
      const int64_t* b = t.boxes.data() + 2 * nd * k;
      format::ShardRecord& s = rec.shards.emplace_back();
      s.offsets.assign(b, b + nd);
      s.sizes.assign(b + nd, b + 2 * nd);
      s.file = static_cast<uint32_t>(file_index_[e.rank]);
      s.offset = e.offset;
      s.bytes = e.bytes;
      s.crc32c.assign(crcs_.begin() + e.crc_at, crcs_.begin() + e.crc_at + e.chunks);
      if (!tags_.empty()) {
        s.tags.assign(tags_.begin() + e.crc_at, tags_.begin() + e.crc_at + e.chunks);
      }
    }
    rec.shape = std::move(t.shape);
  }
  *this = ManifestMerger(0);
}

std::string ManifestMerger::EncodeIndexed(format::Manifest* m, const format::CheckpointKeys* keys,
                                          uint64_t* largest_section) {
  const bool encrypted = m->encryption.enabled;  // (then AddCrcs took one tag per checksum)
  const crypto::GcmTag none{};
  const std::vector<uint32_t> names = NameOrder();
  uint64_t total = 0;
  for (const Merged& t : tensors_) {
    total += t.extents.size() * format::ShardRecordBytes(t.shape.size());
  }
  total += crcs_.size() * format::ChunkEntryBytes(false, encrypted);
  uint64_t head = 1 << 20;  // room for header and head in front (EncodeIndexedManifest)
  for (const Merged& t : tensors_) head += 256 + t.name.size() + 24 * t.shape.size();
  std::string sections;
  sections.reserve(total + head);
  std::vector<format::SectionRef> refs;
  refs.reserve(tensors_.size());
  m->files = std::move(files_);
  m->tensors.clear();
  m->tensors.reserve(tensors_.size());
  *largest_section = 0;
  for (uint32_t ti : names) {
    Merged& t = tensors_[ti];
    const size_t nd = t.shape.size(), start = sections.size();
    const std::vector<uint32_t> order = BoxOrder(t);
    for (uint32_t k : order) {
      const Extent& e = t.extents[k];
      const int64_t* b = t.boxes.data() + 2 * nd * k;
      format::AppendShardRecord(
          {b, b + nd, nd, e.offset, e.bytes, static_cast<uint32_t>(file_index_[e.rank])},
          &sections);
    }
    uint64_t chunks = 0;
    for (uint32_t k : order) {
      const Extent& e = t.extents[k];
      for (uint64_t c = e.crc_at; c < e.crc_at + e.chunks; ++c) {
        const crypto::GcmTag* tag = !encrypted ? nullptr : c < tags_.size() ? &tags_[c] : &none;
        format::AppendChunkEntry(crcs_[c], false, nullptr, tag, &sections);
      }
      chunks += e.chunks;
    }
    refs.push_back(format::CloseSection(sections, start, order.size(), chunks, false));
    *largest_section = std::max(*largest_section, refs.back().bytes);
    format::TensorRecord& rec = m->tensors.emplace_back();
    rec.name = std::move(t.name);
    rec.dtype = t.dtype;
    rec.shape = std::move(t.shape);
    t = Merged();  // frees the tensor's shards as its section is written
  }
  *this = ManifestMerger(0);
  return format::EncodeIndexedManifest(*m, refs, std::move(sections), keys);
}

}  // namespace savepoint::dist
