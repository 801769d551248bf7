// Binary framing of MANIFEST and data-file headers, and the manifest's JSON encoding.
// Decoding and validation of the JSON body live in manifest_decode.cc.
#include "format/manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "format/endian.h"
#include "util/base64.h"
#include "util/crc32c.h"

namespace savepoint::format {
namespace {

Json ValueToJson(const std::string& name, const Value& v) {
  Json j = {{"name", name}, {"kind", ValueKindName(v.kind())}};
  switch (v.kind()) {
    case ValueKind::kInt:
      j["value"] = v.as_int();
      break;
    case ValueKind::kBool:
      j["value"] = v.as_bool();
      break;
    case ValueKind::kString:
      j["value"] = v.as_string();
      break;
    case ValueKind::kBytes:
      j["value"] = Base64Encode(v.as_bytes().data);
      break;
    case ValueKind::kJson:
      j["value"] = v.as_json();
      break;
    case ValueKind::kFloat: {
      double d = v.as_float();
      if (std::isnan(d)) {
        j["value"] = "nan";
      } else if (std::isinf(d)) {
        j["value"] = d > 0 ? "inf" : "-inf";
      } else {
        j["value"] = d;
      }
      break;
    }
  }
  return j;
}

Json ShardToJson(const ShardRecord& s) {
  Json j = {{"offsets", s.offsets}, {"sizes", s.sizes}, {"file", s.file},
            {"offset", s.offset},   {"bytes", s.bytes}, {"crc32c", s.crc32c}};
  if (!s.compressed()) return j;  // uncompressed shards stay exactly as in plain version 1
  Json offsets = Json::array(), sizes = Json::array(), flags = Json::array();
  for (const StoredChunk& c : s.stored) {
    offsets.push_back(c.offset);
    sizes.push_back(c.bytes);
    flags.push_back(c.compressed ? 1 : 0);
  }
  j["codec"] = codec::CodecName(s.codec);
  j["filter"] = codec::FilterName(s.filter);
  j["stored_offsets"] = std::move(offsets);
  j["stored_bytes"] = std::move(sizes);
  j["stored_compressed"] = std::move(flags);
  return j;
}

}  // namespace

Status ValidateFileName(std::string_view name) {
  if (name.empty() || name.size() > kMaxFileNameBytes) {
    return CorruptionError(
        fmt::format("file name of {} bytes (allowed 1..{})", name.size(), kMaxFileNameBytes));
  }
  if (name[0] == '.') return CorruptionError(fmt::format("file name {:?} starts with '.'", name));
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return CorruptionError(fmt::format("file name {:?} has a forbidden character", name));
  }
  return Status::OK();
}

bool UsesCompression(const Manifest& m) {
  for (const auto& t : m.tensors) {
    for (const auto& s : t.shards) {
      if (s.compressed()) return true;
    }
  }
  return false;
}

Json ManifestToJson(const Manifest& m) {
  Json features = Json::array();
  if (UsesCompression(m)) features.push_back(kFeatureCompression);
  Json files = Json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  Json tensors = Json::array();
  for (const auto& t : m.tensors) {
    Json shards = Json::array();
    for (const auto& s : t.shards) shards.push_back(ShardToJson(s));
    tensors.push_back(
        {{"name", t.name}, {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"shards", shards}});
  }
  Json values = Json::array();
  for (const auto& [name, e] : m.values.entries()) {
    if (!e.is_tensor()) values.push_back(ValueToJson(name, e.value()));
  }
  return {{"format", "savepoint"},
          {"version", m.version},
          {"required_features", features},
          {"checkpoint_id", fmt::format("{:016x}", m.checkpoint_id)},
          {"created_ns", std::max<int64_t>(m.created_ns, 0)},
          {"writer", m.writer},
          {"chunk_bytes", m.chunk_bytes},
          {"alignment", kAlignment},
          {"files", files},
          {"tensors", tensors},
          {"values", values},
          {"metadata", m.values.metadata()}};
}

std::string EncodeManifest(const Manifest& m) {
  std::string body = ManifestToJson(m).dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string header(kManifestHeaderBytes, '\0');
  header.replace(0, 8, kManifestMagic);
  PutU32(&header, 8, m.version);
  PutU32(&header, 12, static_cast<uint32_t>(kManifestHeaderBytes));
  PutU64(&header, 16, body.size());
  PutU64(&header, 24, m.checkpoint_id);
  PutU32(&header, 32, Crc32c(body));
  PutU32(&header, 36, 0);  // flags
  PutU32(&header, 60, Crc32c(std::string_view(header).substr(0, 60)));
  return header + body;
}

std::string EncodeDataHeader(uint64_t checkpoint_id, uint32_t file_index) {
  std::string h(kDataHeaderBytes, '\0');
  h.replace(0, 8, kDataMagic);
  PutU32(&h, 8, kFormatVersion);
  PutU32(&h, 12, static_cast<uint32_t>(kDataHeaderBytes));
  PutU64(&h, 16, checkpoint_id);
  PutU32(&h, 24, file_index);
  PutU32(&h, 28, 0);  // flags
  PutU32(&h, kDataHeaderBytes - 4, Crc32c(std::string_view(h).substr(0, kDataHeaderBytes - 4)));
  return h;
}

Status CheckDataHeader(std::string_view h, uint64_t checkpoint_id, uint32_t file_index,
                       std::string_view where) {
  if (h.size() < kDataHeaderBytes) {
    return CorruptionError(fmt::format("{}: truncated data file header", where));
  }
  if (h.substr(0, 8) != kDataMagic) {
    return CorruptionError(fmt::format("{}: not a savepoint data file (bad magic)", where));
  }
  uint32_t stored = GetU32(h, kDataHeaderBytes - 4);
  uint32_t actual = Crc32c(h.substr(0, kDataHeaderBytes - 4));
  if (stored != actual) {
    return CorruptionError(fmt::format("{}: data file header checksum mismatch", where));
  }
  uint32_t version = GetU32(h, 8);
  if (version != kFormatVersion) {
    return UnimplementedError(fmt::format("{}: data file format version {} (this build reads {})",
                                          where, version, kFormatVersion));
  }
  if (GetU64(h, 16) != checkpoint_id || GetU32(h, 24) != file_index) {
    return CorruptionError(fmt::format(
        "{}: data file belongs to another checkpoint or position (id {:016x} index {}, expected "
        "{:016x} index {})",
        where, GetU64(h, 16), GetU32(h, 24), checkpoint_id, file_index));
  }
  return Status::OK();
}

}  // namespace savepoint::format
