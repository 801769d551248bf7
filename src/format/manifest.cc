// Binary framing of MANIFEST and data-file headers, and the manifest's JSON encoding.
// Decoding and validation of the JSON body live in manifest_decode.cc.
#include "format/manifest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/endian.h"
#include "format/manifest_index.h"
#include "util/base64.h"
#include "util/crc32c.h"

namespace savepoint::format {

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

namespace {

// The "tags" array of an encrypted shard: one hex string per chunk.
Json TagsToJson(const ShardRecord& s) {
  Json tags = Json::array();
  for (const crypto::GcmTag& t : s.tags) tags.push_back(crypto::Hex(t));
  return tags;
}

Json ShardToJson(const ShardRecord& s, bool encrypted) {
  Json j = {{"offsets", s.offsets}, {"sizes", s.sizes}, {"file", s.file},
            {"offset", s.offset},   {"bytes", s.bytes}, {"crc32c", s.crc32c}};
  if (encrypted) j["tags"] = TagsToJson(s);
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

Status CheckDimensions(std::string_view name, const Shape& shape) {
  for (int64_t d : shape) {
    if (d > kMaxDimension) {
      return InvalidArgumentError(
          fmt::format("tensor {:?} of shape {}: a checkpoint holds dimensions of at most 2^62",
                      name, ShapeToString(shape)));
    }
  }
  return Status::OK();
}

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

namespace {

// The manifest's "required_features", "files" and "values" arrays.
Json FeaturesToJson(const Manifest& m) {
  Json features = Json::array();
  if (UsesCompression(m)) features.push_back(kFeatureCompression);
  if (m.encryption.enabled) features.push_back(kFeatureEncryption);
  if (m.values.FindValue(kSparseValueName) != nullptr) features.push_back(kFeatureSparse);
  return features;
}

// The manifest's "encryption" object (only in encrypted manifests).
Json EncryptionToJson(const Manifest& m) {
  return {{"cipher", kCipherName},
          {"kdf", kKdfName},
          {"salt", crypto::Hex(m.encryption.salt)},
          {"key_check", crypto::Hex(m.encryption.key_check)}};
}

Json FilesToJson(const Manifest& m) {
  Json files = Json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  return files;
}

Json ValuesToJson(const Manifest& m) {
  Json values = Json::array();
  for (const auto& [name, e] : m.values.entries()) {
    if (!e.is_tensor()) values.push_back(ValueToJson(name, e.value()));
  }
  return values;
}

}  // namespace

Json ManifestToJson(const Manifest& m) {
  Json tensors = Json::array();
  for (const auto& t : m.tensors) {
    Json shards = Json::array();
    for (const auto& s : t.shards) shards.push_back(ShardToJson(s, m.encryption.enabled));
    tensors.push_back(
        {{"name", t.name}, {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"shards", shards}});
  }
  Json j = {{"format", "savepoint"},
            {"version", m.version},
            {"required_features", FeaturesToJson(m)},
            {"checkpoint_id", fmt::format("{:016x}", m.checkpoint_id)},
            {"created_ns", std::max<int64_t>(m.created_ns, 0)},
            {"writer", m.writer},
            {"chunk_bytes", m.chunk_bytes},
            {"alignment", ExtentAlignment(m.version)},
            {"files", FilesToJson(m)},
            {"tensors", tensors},
            {"values", ValuesToJson(m)},
            {"metadata", m.values.metadata()}};
  if (m.encryption.enabled) j["encryption"] = EncryptionToJson(m);
  return j;
}

namespace {

// Compact JSON text of `j`, as EncodeManifest writes it (invalid UTF-8 replaced by U+FFFD).
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

template <typename T>
void AppendNumbers(std::string* out, const T& values) {
  out->push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out->push_back(',');
    fmt::format_to(std::back_inserter(*out), "{}", values[i]);
  }
  out->push_back(']');
}

// The text of Dump(ShardToJson(s, encrypted)), written directly: the keys in nlohmann's (sorted)
// order.
void AppendShard(std::string* out, const ShardRecord& s, bool encrypted) {
  auto put = std::back_inserter(*out);
  fmt::format_to(put, "{{\"bytes\":{}", s.bytes);
  if (s.compressed()) fmt::format_to(put, ",\"codec\":\"{}\"", codec::CodecName(s.codec));
  *out += ",\"crc32c\":";
  AppendNumbers(out, s.crc32c);
  fmt::format_to(put, ",\"file\":{}", s.file);
  if (s.compressed()) fmt::format_to(put, ",\"filter\":\"{}\"", codec::FilterName(s.filter));
  fmt::format_to(put, ",\"offset\":{},\"offsets\":", s.offset);
  AppendNumbers(out, s.offsets);
  *out += ",\"sizes\":";
  AppendNumbers(out, s.sizes);
  if (s.compressed()) {
    std::vector<uint64_t> offsets, sizes, flags;
    for (const StoredChunk& c : s.stored) {
      offsets.push_back(c.offset);
      sizes.push_back(c.bytes);
      flags.push_back(c.compressed ? 1 : 0);
    }
    *out += ",\"stored_bytes\":";
    AppendNumbers(out, sizes);
    *out += ",\"stored_compressed\":";
    AppendNumbers(out, flags);
    *out += ",\"stored_offsets\":";
    AppendNumbers(out, offsets);
  }
  if (encrypted) {
    *out += ",\"tags\":[";
    for (size_t i = 0; i < s.tags.size(); ++i) {
      if (i > 0) out->push_back(',');
      out->push_back('"');
      *out += crypto::Hex(s.tags[i]);
      out->push_back('"');
    }
    out->push_back(']');
  }
  out->push_back('}');
}

// The text of the manifest's "tensors" array, written directly: building it as a JSON document
// first costs more than everything else a save of thousands of small tensors does.
void AppendTensors(std::string* out, const std::vector<TensorRecord>& tensors, bool encrypted) {
  out->push_back('[');
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRecord& t = tensors[i];
    if (i > 0) out->push_back(',');
    fmt::format_to(std::back_inserter(*out), "{{\"dtype\":\"{}\",\"name\":", DTypeName(t.dtype));
    *out += Dump(Json(t.name));
    *out += ",\"shape\":";
    AppendNumbers(out, t.shape);
    *out += ",\"shards\":[";
    for (size_t k = 0; k < t.shards.size(); ++k) {
      if (k > 0) out->push_back(',');
      AppendShard(out, t.shards[k], encrypted);
    }
    *out += "]}";
  }
  out->push_back(']');
}

// Version 3: the head's "tensors" array; refs[i] locates the section of m.tensors[i].
void AppendTensorHeads(std::string* out, const Manifest& m, const std::vector<SectionRef>& refs) {
  out->push_back('[');
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const TensorRecord& t = m.tensors[i];
    const SectionRef& r = refs[i];
    if (i > 0) out->push_back(',');
    fmt::format_to(std::back_inserter(*out), "{{\"chunks\":{},\"dtype\":\"{}\",\"name\":", r.chunks,
                   DTypeName(t.dtype));
    *out += Dump(Json(t.name));
    fmt::format_to(std::back_inserter(*out),
                   ",\"section_bytes\":{},\"section_crc32c\":{},\"shape\":", r.bytes, r.crc32c);
    AppendNumbers(out, t.shape);
    fmt::format_to(std::back_inserter(*out), ",\"shards\":{},\"stored\":{}}}", r.shards,
                   r.stored ? "true" : "false");
  }
  out->push_back(']');
}

// Dump(ManifestToJson(m)), byte for byte (manifest_version_test checks), with the tensors written
// directly and only the small parts built as JSON documents. Version 3: the head, whose tensors
// locate their sections by `refs`.
std::string EncodeBody(const Manifest& m, const std::vector<SectionRef>* refs) {
  std::string body;
  body.reserve(256 + 160 * m.tensors.size());
  fmt::format_to(std::back_inserter(body),
                 "{{\"alignment\":{},\"checkpoint_id\":\"{:016x}\",\"chunk_bytes\":{},"
                 "\"created_ns\":{},{}\"files\":{},\"format\":\"savepoint\",\"metadata\":{},"
                 "\"required_features\":{},\"tensors\":",
                 ExtentAlignment(m.version), m.checkpoint_id, m.chunk_bytes,
                 std::max<int64_t>(m.created_ns, 0),
                 m.encryption.enabled ? "\"encryption\":" + Dump(EncryptionToJson(m)) + "," : "",
                 Dump(FilesToJson(m)), Dump(m.values.metadata()), Dump(FeaturesToJson(m)));
  if (refs != nullptr) {
    AppendTensorHeads(&body, m, *refs);
  } else {
    AppendTensors(&body, m.tensors, m.encryption.enabled);
  }
  fmt::format_to(std::back_inserter(body), ",\"values\":{},\"version\":{},\"writer\":{}}}",
                 Dump(ValuesToJson(m)), m.version, Dump(Json(m.writer)));
  return body;
}

// Header | body | sections (version 3; else empty). The header's body size and CRC are the body's;
// the MAC of an encrypted manifest covers everything after the header. Header and body go in front
// of the sections in their own buffer (no copy of them when it has room).
std::string Frame(const Manifest& m, std::string_view body, std::string sections,
                  const CheckpointKeys* keys) {
  std::string front(kManifestHeaderBytes, '\0');
  front.replace(0, 8, kManifestMagic);
  PutU32(&front, 8, m.version);
  PutU32(&front, 12, static_cast<uint32_t>(kManifestHeaderBytes));
  PutU64(&front, 16, body.size());
  PutU64(&front, 24, m.checkpoint_id);
  PutU32(&front, 32, Crc32c(body));
  PutU32(&front, 36, m.encryption.enabled ? kManifestFlagEncrypted : 0);  // flags
  front.append(body);
  std::string out = std::move(sections);
  out.insert(0, front);
  if (m.encryption.enabled && keys != nullptr) {
    const ManifestMac mac = keys->Mac(std::string_view(out).substr(0, kManifestMacOffset),
                                      std::string_view(out).substr(kManifestHeaderBytes));
    std::memcpy(out.data() + kManifestMacOffset, mac.data(), mac.size());
  }
  PutU32(&out, 60, Crc32c(std::string_view(out).substr(0, 60)));
  return out;
}

}  // namespace

std::string EncodeManifest(const Manifest& m, const CheckpointKeys* keys) {
  if (m.version < kIndexedFormatVersion) return Frame(m, EncodeBody(m, nullptr), {}, keys);
  std::string sections;  // docs/FORMAT.md §15
  std::vector<SectionRef> refs;
  refs.reserve(m.tensors.size());
  for (const TensorRecord& t : m.tensors) refs.push_back(AppendSection(t, m, &sections));
  return EncodeIndexedManifest(m, refs, std::move(sections), keys);
}

std::string EncodeIndexedManifest(const Manifest& m, const std::vector<SectionRef>& refs,
                                  std::string sections, const CheckpointKeys* keys) {
  return Frame(m, EncodeBody(m, &refs), std::move(sections), keys);
}

std::string EncodeDataHeader(uint64_t checkpoint_id, uint32_t file_index, uint32_t version) {
  std::string h(kDataHeaderBytes, '\0');
  h.replace(0, 8, kDataMagic);
  PutU32(&h, 8, version);
  PutU32(&h, 12, static_cast<uint32_t>(kDataHeaderBytes));
  PutU64(&h, 16, checkpoint_id);
  PutU32(&h, 24, file_index);
  PutU32(&h, 28, 0);  // flags
  PutU32(&h, kDataHeaderBytes - 4, Crc32c(std::string_view(h).substr(0, kDataHeaderBytes - 4)));
  return h;
}

Status CheckDataHeader(std::string_view h, uint64_t checkpoint_id, uint32_t file_index,
                       uint32_t version, std::string_view where) {
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
  const uint32_t stored_version = GetU32(h, 8);
  if (stored_version < kMinFormatVersion || stored_version > kMaxFormatVersion) {
    return UnimplementedError(
        fmt::format("{}: data file format version {} (this build reads versions {} to {})", where,
                    stored_version, kMinFormatVersion, kMaxFormatVersion));
  }
  if (stored_version != version) {
    return CorruptionError(fmt::format("{}: data file format version {}, the manifest's is {}",
                                       where, stored_version, version));
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
