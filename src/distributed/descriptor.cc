// Encoding of the distributed save's messages and the coordinator's merge (see descriptor.h).
#include "distributed/descriptor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "distributed/wire.h"
#include "engine/paths.h"

namespace savepoint::dist {

void EncodeStatus(const Status& s, std::string* out) {
  WireWriter w;
  w.U64(static_cast<uint64_t>(s.code()));
  w.Str(s.message());
  out->append(w.bytes());
}

namespace {

// Decodes a status into *out; the return value says whether the bytes were well-formed.
Status ReadStatus(WireReader& r, Status* out) {
  SP_ASSIGN_OR_RETURN(uint64_t code, r.U64());
  SP_ASSIGN_OR_RETURN(std::string msg, r.Str());
  if (code > static_cast<uint64_t>(kLastStatusCode)) {
    code = static_cast<uint64_t>(StatusCode::kInternal);
  }
  *out = code == 0 ? Status::OK() : Status(static_cast<StatusCode>(code), std::move(msg));
  return Status::OK();
}

Status Malformed(std::string_view what, int rank, const Status& s) {
  return InternalError(fmt::format("{} of rank {}: {}", what, rank, s.message()));
}

}  // namespace

Status DecodeStatus(std::string_view bytes, std::string_view where) {
  WireReader r(bytes, std::string(where));
  Status s;
  SP_RETURN_IF_ERROR(ReadStatus(r, &s));
  return s;
}

std::string EncodePlan(const Status& status, const format::Manifest& lm, bool encrypted) {
  std::string out;
  EncodeStatus(status, &out);
  WireWriter w;
  bool has = status.ok() && !lm.tensors.empty();
  w.U64(lm.version);
  w.U64(encrypted ? 1 : 0);
  w.U64(has ? lm.files[0].bytes : 0);
  w.U64(has ? lm.tensors.size() : 0);
  for (size_t i = 0; has && i < lm.tensors.size(); ++i) {
    const format::TensorRecord& t = lm.tensors[i];
    const format::ShardRecord& s = t.shards[0];
    w.Str(t.name);
    w.Str(DTypeName(t.dtype));
    w.Dims(t.shape);
    w.Dims(s.offsets);
    w.Dims(s.sizes);
    w.U64(s.offset);
    w.U64(s.bytes);
  }
  return out + w.bytes();
}

std::string EncodeCrcs(const Status& status, const format::Manifest& lm) {
  std::string out;
  EncodeStatus(status, &out);
  WireWriter w;
  const bool encrypted = status.ok() && lm.encryption.enabled;
  w.Str(encrypted ? std::string_view(reinterpret_cast<const char*>(lm.encryption.key_check.data()),
                                     format::kKeyCheckBytes)
                  : std::string_view());
  w.U64(status.ok() ? lm.tensors.size() : 0);
  for (size_t i = 0; status.ok() && i < lm.tensors.size(); ++i) {
    const format::ShardRecord& s = lm.tensors[i].shards[0];
    w.U64(s.crc32c.size());
    for (uint32_t v : s.crc32c) w.U64(v);
    w.U64(encrypted ? s.tags.size() : 0);
    for (size_t k = 0; encrypted && k < s.tags.size(); ++k) {
      w.Str({reinterpret_cast<const char*>(s.tags[k].data()), s.tags[k].size()});
    }
  }
  return out + w.bytes();
}

std::string EncodeVerdict(const Verdict& v) {
  std::string out;
  EncodeStatus(v.status, &out);
  WireWriter w;
  w.Str(v.tmp);
  w.U64(v.checkpoint_id);
  w.U64(v.file_index.size());
  for (int64_t i : v.file_index) w.I64(i);
  w.Str(v.salt);
  return out + w.bytes();
}

Result<Verdict> DecodeVerdict(std::string_view bytes, int world) {
  WireReader r(bytes, "save verdict");
  Verdict v;
  SP_RETURN_IF_ERROR(ReadStatus(r, &v.status));
  SP_ASSIGN_OR_RETURN(v.tmp, r.Str());
  SP_ASSIGN_OR_RETURN(v.checkpoint_id, r.U64());
  SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(8));
  if (n != static_cast<uint64_t>(world) && v.status.ok()) {
    return InternalError(fmt::format("save verdict: {} file indices for {} ranks", n, world));
  }
  v.file_index.resize(n);
  for (auto& i : v.file_index) {
    SP_ASSIGN_OR_RETURN(i, r.I64());
  }
  SP_ASSIGN_OR_RETURN(v.salt, r.Str());
  return v;
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
    SP_ASSIGN_OR_RETURN(ranks_[rank].file_bytes, r.U64());
    SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(64));
    for (uint64_t i = 0; i < n; ++i) {
      format::TensorRecord t;
      format::ShardRecord sh;
      SP_ASSIGN_OR_RETURN(t.name, r.Str());
      SP_ASSIGN_OR_RETURN(std::string dtype, r.Str());
      SP_ASSIGN_OR_RETURN(t.shape, r.Dims());
      SP_ASSIGN_OR_RETURN(sh.offsets, r.Dims());
      SP_ASSIGN_OR_RETURN(sh.sizes, r.Dims());
      SP_ASSIGN_OR_RETURN(sh.offset, r.U64());
      SP_ASSIGN_OR_RETURN(sh.bytes, r.U64());
      std::optional<DType> dt = DTypeFromName(dtype);
      if (!dt) return InternalError(fmt::format("unknown dtype {:?}", dtype));
      t.dtype = *dt;
      auto [it, inserted] = tensors_.try_emplace(t.name);
      format::TensorRecord& rec = it->second;
      if (inserted) rec.name = t.name, rec.dtype = t.dtype, rec.shape = t.shape;
      if (rec.dtype != t.dtype || rec.shape != t.shape) {
        return InvalidArgumentError(
            fmt::format("tensor {:?}: rank {} has {} {} but another rank has {} {}", t.name, rank,
                        DTypeName(t.dtype), ShapeToString(t.shape), DTypeName(rec.dtype),
                        ShapeToString(rec.shape)));
      }
      rec.shards.push_back(std::move(sh));
      ranks_[rank].shards.emplace_back(&rec, rec.shards.size() - 1);
    }
    return r.done() ? Status::OK() : InternalError("trailing bytes");
  }();
  if (s.code() == StatusCode::kInternal) return Malformed("plan", rank, s);
  return s;
}

Result<std::vector<int64_t>> ManifestMerger::Finish() {
  for (const auto& [name, t] : tensors_) {
    for (const auto& s : t.shards) {
      if (s.offsets.size() != t.shape.size() || s.sizes.size() != t.shape.size()) {
        return InvalidArgumentError(fmt::format("tensor {:?}: box rank differs from shape {}", name,
                                                ShapeToString(t.shape)));
      }
    }
    Status s = format::CheckTensorTiling(t, "sharded save");
    if (!s.ok()) return InvalidArgumentError(s.message());
  }
  file_index_.assign(world_, -1);
  for (int r = 0; r < world_; ++r) {
    if (ranks_[r].shards.empty()) continue;
    file_index_[r] = static_cast<int64_t>(files_.size());
    files_.push_back({engine::DataFileName(r, 0), ranks_[r].file_bytes});
    for (auto& [t, i] : ranks_[r].shards) t->shards[i].file = static_cast<uint32_t>(file_index_[r]);
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
  Result<std::string> check = r.Str();
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
    SP_ASSIGN_OR_RETURN(uint64_t n, r.Count(8));
    if (n != ranks_[rank].shards.size()) return InternalError("shard count differs from plan");
    for (auto& [t, i] : ranks_[rank].shards) {
      format::ShardRecord& sh = t->shards[i];
      SP_ASSIGN_OR_RETURN(uint64_t k, r.Count(8));
      if (k != format::NumChunks(sh.bytes, chunk_bytes)) return InternalError("bad chunk count");
      sh.crc32c.resize(k);
      for (auto& c : sh.crc32c) {
        SP_ASSIGN_OR_RETURN(uint64_t v, r.U64());
        c = static_cast<uint32_t>(v);
      }
      SP_ASSIGN_OR_RETURN(uint64_t tags, r.Count(8));
      if (tags != (key_check != nullptr ? k : 0)) return InternalError("bad tag count");
      sh.tags.resize(tags);
      for (auto& t : sh.tags) {
        SP_ASSIGN_OR_RETURN(std::string tag, r.Str());
        if (tag.size() != t.size()) return InternalError("bad tag size");
        std::memcpy(t.data(), tag.data(), t.size());
      }
    }
    return r.done() ? Status::OK() : InternalError("trailing bytes");
  }();
  return s.ok() ? s : Malformed("checksums", rank, s);
}

void ManifestMerger::TakeInto(format::Manifest* m) {
  m->files = std::move(files_);
  m->tensors.clear();
  m->tensors.reserve(tensors_.size());
  for (auto& [name, t] : tensors_) {
    std::sort(t.shards.begin(), t.shards.end(), [](const auto& a, const auto& b) {
      return std::tie(a.offsets, a.sizes) < std::tie(b.offsets, b.sizes);
    });
    m->tensors.push_back(std::move(t));
  }
  tensors_.clear();
  ranks_.clear();
}

}  // namespace savepoint::dist
