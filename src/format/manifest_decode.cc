// Validating decoder of MANIFEST (docs/FORMAT.md, "Manifest"). Input is untrusted: every field is
// type-checked, every size capped, every offset range checked without overflow, and shards must
// tile their tensor exactly. nlohmann::json is used without exceptions where possible; any that
// escape are caught at the top and reported as Corruption.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "format/endian.h"
#include "format/manifest.h"
#include "format/manifest_checks.h"
#include "format/manifest_index.h"
#include "util/base64.h"
#include "util/crc32c.h"

namespace savepoint::format {

Status internal::Ctx::Bad(std::string_view what) const {
  return CorruptionError(fmt::format("{}: {}", where, what));
}

namespace {

using internal::CheckHeader;
using internal::CheckShardRange;
using internal::CheckTiling;
using internal::Ctx;

Result<const Json*> Field(const Json& obj, const char* key, const Ctx& ctx, std::string_view in) {
  if (!obj.is_object()) return ctx.Bad(fmt::format("{} is not an object", in));
  auto it = obj.find(key);
  if (it == obj.end()) return ctx.Bad(fmt::format("{} lacks field \"{}\"", in, key));
  return &*it;
}

Result<uint64_t> U64(const Json& obj, const char* key, const Ctx& ctx, std::string_view in) {
  SP_ASSIGN_OR_RETURN(const Json* j, Field(obj, key, ctx, in));
  if (!j->is_number_unsigned()) {
    return ctx.Bad(fmt::format("{}.{} is not a non-negative integer", in, key));
  }
  return j->get<uint64_t>();
}

Result<std::string> Str(const Json& obj, const char* key, const Ctx& ctx, std::string_view in) {
  SP_ASSIGN_OR_RETURN(const Json* j, Field(obj, key, ctx, in));
  if (!j->is_string()) return ctx.Bad(fmt::format("{}.{} is not a string", in, key));
  return j->get<std::string>();
}

Result<const Json*> Array(const Json& obj, const char* key, size_t max, const Ctx& ctx,
                          std::string_view in) {
  SP_ASSIGN_OR_RETURN(const Json* j, Field(obj, key, ctx, in));
  if (!j->is_array()) return ctx.Bad(fmt::format("{}.{} is not an array", in, key));
  if (j->size() > max) {
    return ctx.Bad(fmt::format("{}.{} has {} entries (limit {})", in, key, j->size(), max));
  }
  return j;
}

Result<Shape> Dims(const Json& obj, const char* key, const Ctx& ctx, std::string_view in) {
  SP_ASSIGN_OR_RETURN(const Json* arr, Array(obj, key, kMaxRank, ctx, in));
  Shape out;
  for (const Json& d : *arr) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{kMaxDimension}) {
      return ctx.Bad(fmt::format("{}.{} holds a negative, huge or non-integer dimension", in, key));
    }
    out.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  return out;
}

// Corruption naming the first entry of `files` (in their order) whose name an earlier one has.
// Found by sorting the names; the entries are then scanned in order only when one repeats.
Status CheckRepeats(const std::vector<FileRecord>& files, const Ctx& ctx) {
  std::vector<std::string_view> names(files.size());
  for (size_t i = 0; i < names.size(); ++i) names[i] = files[i].name;
  std::sort(names.begin(), names.end());
  if (std::adjacent_find(names.begin(), names.end()) == names.end()) return Status::OK();
  std::unordered_set<std::string_view> seen;
  for (size_t i = 0;; ++i) {
    if (!seen.insert(files[i].name).second) {
      return ctx.Bad(fmt::format("files[{}] repeats {:?}", i, files[i].name));
    }
  }
}

// One entry of "files" (an object with a string "name" and an integer "bytes", checked
// without building a message unless it is bad: a job of 16,384 ranks has as many).
bool PlainFileEntry(const Json& j, FileRecord* f) {
  if (!j.is_object()) return false;
  auto name = j.find("name"), bytes = j.find("bytes");
  if (name == j.end() || bytes == j.end() || !name->is_string() || !bytes->is_number_unsigned()) {
    return false;
  }
  f->name = name->get_ref<const std::string&>();
  f->bytes = bytes->get<uint64_t>();
  return ValidateFileName(f->name).ok();
}

// prefix + name quoted as fmt's {:?} quotes it (without its cost for plain names).
std::string Quoted(std::string_view prefix, std::string_view name) {
  for (unsigned char c : name) {
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') return fmt::format("{}{:?}", prefix, name);
  }
  std::string out;
  out.reserve(prefix.size() + name.size() + 2);
  out.append(prefix).append(1, '"').append(name).append(1, '"');
  return out;
}

Status DecodeFiles(const Json& root, const Ctx& ctx, Manifest* m) {
  SP_ASSIGN_OR_RETURN(const Json* files, Array(root, "files", kMaxFiles, ctx, "manifest"));
  m->files.reserve(files->size());
  for (size_t i = 0; i < files->size(); ++i) {
    FileRecord f;
    if (!PlainFileEntry((*files)[i], &f)) {             // the first of these fails, saying why
      SP_RETURN_IF_ERROR(CheckRepeats(m->files, ctx));  // (an earlier entry's error first)
      const std::string in = fmt::format("files[{}]", i);
      SP_ASSIGN_OR_RETURN(f.name, Str((*files)[i], "name", ctx, in));
      Status s = ValidateFileName(f.name);
      if (!s.ok()) return s.WithContext(fmt::format("{}: {}", ctx.where, in));
      for (const FileRecord& earlier : m->files) {
        if (earlier.name == f.name) return ctx.Bad(fmt::format("{} repeats {:?}", in, f.name));
      }
      SP_ASSIGN_OR_RETURN(f.bytes, U64((*files)[i], "bytes", ctx, in));
    }
    m->files.push_back(std::move(f));
  }
  return CheckRepeats(m->files, ctx);
}

// A stored extent [offset, offset + bytes) must start 4 KiB-aligned after the header and end inside
// its file.
bool ExtentInFile(uint64_t offset, uint64_t bytes, const FileRecord& f) {
  uint64_t end = 0;
  return offset >= kDataHeaderBytes && offset % kAlignment == 0 &&
         !__builtin_add_overflow(offset, bytes, &end) && end <= f.bytes;
}

// A compressed shard: no contiguous extent (offset 0); each chunk's stored extent is in its file,
// a compressed chunk is 1..raw bytes long and a raw one exactly raw bytes.
Status CheckStoredChunks(const ShardRecord& s, const Manifest& m, const Ctx& ctx,
                         const std::string& in) {
  const uint64_t chunks = NumChunks(s.bytes, m.chunk_bytes);
  if (s.offset != 0) {
    return ctx.Bad(fmt::format("{}: compressed shard has offset {} (must be 0)", in, s.offset));
  }
  if (s.crc32c.size() != chunks || s.stored.size() != chunks) {
    return ctx.Bad(fmt::format("{}: {} checksums and {} stored chunks for {} chunks", in,
                               s.crc32c.size(), s.stored.size(), chunks));
  }
  const FileRecord& f = m.files[s.file];
  for (uint64_t c = 0; c < chunks; ++c) {
    const StoredChunk& sc = s.stored[c];
    const uint64_t raw = ChunkLen(s.bytes, c, m.chunk_bytes);
    if (sc.compressed ? (sc.bytes == 0 || sc.bytes > raw) : sc.bytes != raw) {
      return ctx.Bad(fmt::format("{} chunk {}: stored size {} is impossible for {} {} raw bytes",
                                 in, c, sc.bytes, sc.compressed ? "compressed" : "uncompressed",
                                 raw));
    }
    if (!ExtentInFile(sc.offset, sc.bytes, f)) {
      return ctx.Bad(
          fmt::format("{} chunk {}: stored extent [{}, +{}) is misaligned or outside file {:?} ({} "
                      "bytes)",
                      in, c, sc.offset, sc.bytes, f.name, f.bytes));
    }
  }
  return Status::OK();
}

}  // namespace

Status internal::CheckShardRange(const TensorRecord& t, const ShardRecord& s, const Manifest& m,
                                 const Ctx& ctx, const std::string& in) {
  if (s.offsets.size() != t.shape.size() || s.sizes.size() != t.shape.size()) {
    return ctx.Bad(
        fmt::format("{}: rank of offsets/sizes differs from shape {}", in, ShapeToString(t.shape)));
  }
  for (size_t d = 0; d < t.shape.size(); ++d) {
    // Each value is in [0, 2^62]: the difference cannot overflow, the sum could (2^62 + 2^62).
    if (s.offsets[d] > t.shape[d] || s.sizes[d] > t.shape[d] - s.offsets[d]) {
      return ctx.Bad(
          fmt::format("{}: box exceeds shape {} in dim {}", in, ShapeToString(t.shape), d));
    }
  }
  Result<uint64_t> expect = NumBytes(t.dtype, s.sizes);
  if (!expect.ok() || *expect != s.bytes) {
    return ctx.Bad(fmt::format("{}: bytes {} do not match its box", in, s.bytes));
  }
  if (s.file >= m.files.size())
    return ctx.Bad(fmt::format("{}: file index {} out of range", in, s.file));
  if (s.compressed()) return CheckStoredChunks(s, m, ctx, in);
  // Version 1 extents start at multiples of 4096, version 2 ones at multiples of 64.
  const uint64_t align = ExtentAlignment(m.version);
  uint64_t end = 0;
  if (s.offset < kDataHeaderBytes || s.offset % align != 0 ||
      __builtin_add_overflow(s.offset, s.bytes, &end) || end > m.files[s.file].bytes) {
    return ctx.Bad(fmt::format(
        "{}: extent [{}, +{}) is misaligned (format version {}: a multiple of {}) or outside file "
        "{:?} ({} bytes)",
        in, s.offset, s.bytes, m.version, align, m.files[s.file].name, m.files[s.file].bytes));
  }
  if (s.crc32c.size() != NumChunks(s.bytes, m.chunk_bytes)) {
    return ctx.Bad(fmt::format("{}: {} checksums for {} chunks", in, s.crc32c.size(),
                               NumChunks(s.bytes, m.chunk_bytes)));
  }
  return Status::OK();
}

namespace {

// An array of at most `max` unsigned integers, each at most `limit`.
Result<std::vector<uint64_t>> U64Array(const Json& obj, const char* key, uint64_t max,
                                       uint64_t limit, const Ctx& ctx, const std::string& in) {
  SP_ASSIGN_OR_RETURN(const Json* arr, Array(obj, key, max, ctx, in));
  std::vector<uint64_t> out;
  out.reserve(arr->size());
  for (const Json& v : *arr) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > limit) {
      return ctx.Bad(
          fmt::format("{}: {} holds a value that is not an integer in [0, {}]", in, key, limit));
    }
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

// The compression fields of a shard (present when it has "codec"); sizes are checked later.
Status DecodeStored(const Json& j, uint64_t max_chunks, const Ctx& ctx, const std::string& in,
                    ShardRecord* s) {
  SP_ASSIGN_OR_RETURN(std::string codec, Str(j, "codec", ctx, in));
  std::optional<codec::Codec> c = codec::CodecFromName(codec);
  if (!c || *c == codec::Codec::kNone) {
    return ctx.Bad(fmt::format("{}: unknown codec {:?}", in, codec.substr(0, 32)));
  }
  SP_ASSIGN_OR_RETURN(std::string filter, Str(j, "filter", ctx, in));
  std::optional<codec::Filter> f = codec::FilterFromName(filter);
  if (!f) return ctx.Bad(fmt::format("{}: unknown filter {:?}", in, filter.substr(0, 32)));
  s->codec = *c;
  s->filter = *f;
  constexpr uint64_t kMax = uint64_t{1} << 62;
  SP_ASSIGN_OR_RETURN(auto offsets, U64Array(j, "stored_offsets", max_chunks, kMax, ctx, in));
  SP_ASSIGN_OR_RETURN(auto sizes, U64Array(j, "stored_bytes", max_chunks, kMax, ctx, in));
  SP_ASSIGN_OR_RETURN(auto flags, U64Array(j, "stored_compressed", max_chunks, 1, ctx, in));
  if (offsets.size() != sizes.size() || offsets.size() != flags.size()) {
    return ctx.Bad(
        fmt::format("{}: stored_offsets, stored_bytes, stored_compressed differ in length", in));
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    s->stored.push_back({offsets[i], sizes[i], flags[i] == 1});
  }
  return Status::OK();
}

// The GCM tags of a shard of an encrypted manifest: exactly one per chunk (docs/FORMAT.md §10).
// An unencrypted manifest has none.
Status DecodeTags(const Json& j, const Manifest& m, const Ctx& ctx, const std::string& in,
                  ShardRecord* s) {
  if (!m.encryption.enabled) {
    if (j.contains("tags"))
      return ctx.Bad(fmt::format("{}: tags in an unencrypted checkpoint", in));
    return Status::OK();
  }
  const uint64_t chunks = s->crc32c.size();  // == NumChunks: CheckShardRange checks it
  SP_ASSIGN_OR_RETURN(const Json* tags, Array(j, "tags", chunks, ctx, in));
  if (tags->size() != chunks) {
    return ctx.Bad(fmt::format("{}: {} tags for {} checksums", in, tags->size(), chunks));
  }
  s->tags.resize(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    const Json& t = (*tags)[c];
    if (!t.is_string() || !ParseHex(t.get_ref<const std::string&>(), s->tags[c])) {
      return ctx.Bad(fmt::format("{} chunk {}: tag is not 32 hex digits", in, c));
    }
  }
  return Status::OK();
}

Result<ShardRecord> DecodeShard(const Json& j, const TensorRecord& t, const Manifest& m,
                                const Ctx& ctx, const std::string& in) {
  ShardRecord s;
  SP_ASSIGN_OR_RETURN(s.offsets, Dims(j, "offsets", ctx, in));
  SP_ASSIGN_OR_RETURN(s.sizes, Dims(j, "sizes", ctx, in));
  SP_ASSIGN_OR_RETURN(uint64_t file, U64(j, "file", ctx, in));
  s.file = file > kMaxFiles ? static_cast<uint32_t>(kMaxFiles) : static_cast<uint32_t>(file);
  SP_ASSIGN_OR_RETURN(s.offset, U64(j, "offset", ctx, in));
  SP_ASSIGN_OR_RETURN(s.bytes, U64(j, "bytes", ctx, in));
  uint64_t max_chunks = NumChunks(std::min<uint64_t>(s.bytes, uint64_t{1} << 62), m.chunk_bytes);
  SP_ASSIGN_OR_RETURN(const Json* crcs, Array(j, "crc32c", max_chunks, ctx, in));
  for (const Json& c : *crcs) {
    if (!c.is_number_unsigned() || c.get<uint64_t>() > 0xffffffffu) {
      return ctx.Bad(fmt::format("{}: checksum is not a u32", in));
    }
    s.crc32c.push_back(static_cast<uint32_t>(c.get<uint64_t>()));
  }
  if (j.contains("codec")) SP_RETURN_IF_ERROR(DecodeStored(j, max_chunks, ctx, in, &s));
  SP_RETURN_IF_ERROR(DecodeTags(j, m, ctx, in, &s));
  SP_RETURN_IF_ERROR(CheckShardRange(t, s, m, ctx, in));
  return s;
}

// The name, dtype and shape of tensors[i]; `in` becomes its name in messages.
Status DecodeTensorHead(const Json& j, const Ctx& ctx, size_t i, TensorRecord* t, std::string* in) {
  *in = fmt::format("tensors[{}]", i);
  SP_ASSIGN_OR_RETURN(t->name, Str(j, "name", ctx, *in));
  Status s = ValidateName(t->name);
  if (!s.ok()) return CorruptionError(fmt::format("{}: {}.name: {}", ctx.where, *in, s.message()));
  *in = Quoted("tensor ", t->name);
  SP_ASSIGN_OR_RETURN(std::string dtype, Str(j, "dtype", ctx, *in));
  std::optional<DType> dt = DTypeFromName(dtype);
  if (!dt) return ctx.Bad(fmt::format("{}: unknown dtype {:?}", *in, dtype.substr(0, 32)));
  t->dtype = *dt;
  SP_ASSIGN_OR_RETURN(t->shape, Dims(j, "shape", ctx, *in));
  if (!NumBytes(t->dtype, t->shape).ok()) return ctx.Bad(fmt::format("{}: shape too large", *in));
  return Status::OK();
}

// The checks of a section's place once its fields are read (`crc` the section_crc32c field, put
// into ref->crc32c).
Status CheckSectionRef(uint64_t crc, const TensorRecord& t, const Manifest& m, const Ctx& ctx,
                       const std::string& in, SectionRef* ref) {
  const SectionRef& r = *ref;
  if (crc > 0xffffffffu) return ctx.Bad(fmt::format("{}.section_crc32c is not a u32", in));
  ref->crc32c = static_cast<uint32_t>(crc);
  if (r.shards > kMaxShardsPerTensor || r.bytes > kMaxManifestBodyBytes) {
    return ctx.Bad(fmt::format("{}: section of {} shards and {} bytes exceeds the caps ({}, {})",
                               in, r.shards, r.bytes, kMaxShardsPerTensor, kMaxManifestBodyBytes));
  }
  // Version 3's records have a fixed size; version 4's take from MinCompactRecordBytes to
  // MaxCompactRecordBytes each.
  const size_t nd = t.shape.size();
  const bool compact = m.version >= kCompactFormatVersion;
  const auto shards = static_cast<unsigned __int128>(r.shards);
  const unsigned __int128 entries =
      static_cast<unsigned __int128>(r.chunks) * ChunkEntryBytes(r.stored, m.encryption.enabled);
  const unsigned __int128 least =
      entries + shards * (compact ? MinCompactRecordBytes(nd) : ShardRecordBytes(nd));
  const unsigned __int128 most =
      entries + shards * (compact ? MaxCompactRecordBytes(nd) : ShardRecordBytes(nd));
  if (r.bytes < least || r.bytes > most) {
    return ctx.Bad(fmt::format("{}: section of {} bytes cannot hold {} shards and {} chunks", in,
                               r.bytes, r.shards, r.chunks));
  }
  return Status::OK();
}

// Versions 3 and 4: the place of tensor `t`'s section, as its head entry `j` describes it (offset
// not yet set). Its size must be what its counts need.
Result<SectionRef> DecodeSectionRef(const Json& j, const TensorRecord& t, const Manifest& m,
                                    const Ctx& ctx, const std::string& in) {
  SectionRef r;
  SP_ASSIGN_OR_RETURN(r.shards, U64(j, "shards", ctx, in));
  SP_ASSIGN_OR_RETURN(r.chunks, U64(j, "chunks", ctx, in));
  SP_ASSIGN_OR_RETURN(r.bytes, U64(j, "section_bytes", ctx, in));
  SP_ASSIGN_OR_RETURN(uint64_t crc, U64(j, "section_crc32c", ctx, in));
  SP_ASSIGN_OR_RETURN(const Json* stored, Field(j, "stored", ctx, in));
  if (!stored->is_boolean()) return ctx.Bad(fmt::format("{}.stored is not a boolean", in));
  r.stored = stored->get<bool>();
  SP_RETURN_IF_ERROR(CheckSectionRef(crc, t, m, ctx, in, &r));
  return r;
}

Result<TensorRecord> DecodeTensor(const Json& j, const Manifest& m, const Ctx& ctx, size_t i) {
  TensorRecord t;
  std::string in;
  SP_RETURN_IF_ERROR(DecodeTensorHead(j, ctx, i, &t, &in));
  SP_ASSIGN_OR_RETURN(const Json* shards, Array(j, "shards", kMaxShardsPerTensor, ctx, in));
  for (size_t k = 0; k < shards->size(); ++k) {
    SP_ASSIGN_OR_RETURN(ShardRecord sh,
                        DecodeShard((*shards)[k], t, m, ctx, fmt::format("{} shard {}", in, k)));
    t.shards.push_back(std::move(sh));
  }
  SP_RETURN_IF_ERROR(CheckTiling(t, ctx, in));
  return t;
}

// No two extents (raw shard extents and stored chunks) in one file may overlap (a hostile manifest
// could alias tensors or chunks).
Status CheckExtents(const Manifest& m, const Ctx& ctx) {
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t, const std::string*>> ext;
  for (const auto& t : m.tensors) {
    for (const auto& s : t.shards) {
      if (s.bytes > 0 && !s.compressed()) {
        ext.emplace_back(s.file, s.offset, s.offset + s.bytes, &t.name);
      }
      for (const StoredChunk& c : s.stored) {
        ext.emplace_back(s.file, c.offset, c.offset + c.bytes, &t.name);
      }
    }
  }
  std::sort(ext.begin(), ext.end());
  for (size_t i = 1; i < ext.size(); ++i) {
    auto& [f0, b0, e0, n0] = ext[i - 1];
    auto& [f1, b1, e1, n1] = ext[i];
    if (f0 == f1 && b1 < e0) {
      return ctx.Bad(fmt::format("extents of tensors {:?} and {:?} overlap in file {:?}", *n0, *n1,
                                 m.files[f0].name));
    }
  }
  return Status::OK();
}

Result<Value> DecodeFloat(const Json& v, const Ctx& ctx, const std::string& in) {
  if (v.is_number()) return Value(v.get<double>());
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s == "nan") return Value(std::numeric_limits<double>::quiet_NaN());
    if (s == "inf") return Value(std::numeric_limits<double>::infinity());
    if (s == "-inf") return Value(-std::numeric_limits<double>::infinity());
  }
  return ctx.Bad(fmt::format("{}: bad float", in));
}

Result<Value> DecodeValue(const Json& j, const std::string& kind, const Ctx& ctx,
                          const std::string& in) {
  SP_ASSIGN_OR_RETURN(const Json* v, Field(j, "value", ctx, in));
  if (kind == "int" && v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return ctx.Bad(fmt::format("{}: int out of range", in));
    }
    return Value(v->get<int64_t>());
  }
  if (kind == "float") return DecodeFloat(*v, ctx, in);
  if (kind == "bool" && v->is_boolean()) return Value(v->get<bool>());
  if (kind == "string" && v->is_string()) return Value(v->get<std::string>());
  if (kind == "json") return Value::FromJson(*v);
  if (kind == "bytes" && v->is_string()) {
    const std::string& text = v->get_ref<const std::string&>();
    if (text.size() / 4 * 3 > kMaxBytesValue)
      return ctx.Bad(fmt::format("{}: bytes too large", in));
    Result<std::vector<uint8_t>> data = Base64Decode(text);
    if (!data.ok()) return ctx.Bad(fmt::format("{}: {}", in, data.status().message()));
    return Value(Bytes{std::move(*data)});
  }
  return ctx.Bad(
      fmt::format("{}: unknown kind {:?} or value of the wrong type", in, kind.substr(0, 32)));
}

Status DecodeValueArray(const Json& values, const Ctx& ctx, State* out) {
  for (size_t i = 0; i < values.size(); ++i) {
    std::string in = fmt::format("values[{}]", i);
    SP_ASSIGN_OR_RETURN(std::string name, Str(values[i], "name", ctx, in));
    SP_ASSIGN_OR_RETURN(std::string kind, Str(values[i], "kind", ctx, in));
    SP_ASSIGN_OR_RETURN(Value v, DecodeValue(values[i], kind, ctx, in));
    Status s = out->PutValue(name, std::move(v));
    if (!s.ok()) return ctx.Bad(fmt::format("{}: {}", in, s.message()));
  }
  return Status::OK();
}

Status DecodeValues(const Json& root, const Ctx& ctx, Manifest* m) {
  SP_ASSIGN_OR_RETURN(const Json* values, Array(root, "values", kMaxTensors, ctx, "manifest"));
  SP_RETURN_IF_ERROR(DecodeValueArray(*values, ctx, &m->values));
  auto meta = root.find("metadata");
  if (meta != root.end()) m->values.metadata() = *meta;
  return Status::OK();
}

// A hex field of exactly out.size() bytes of the "encryption" object.
Status HexField(const Json& obj, const char* key, std::span<std::byte> out, const Ctx& ctx) {
  SP_ASSIGN_OR_RETURN(std::string hex, Str(obj, key, ctx, "manifest.encryption"));
  if (!ParseHex(hex, out)) {
    return ctx.Bad(fmt::format("manifest.encryption.{} is not {} hex digits", key, 2 * out.size()));
  }
  return Status::OK();
}

// The "encryption" object (docs/FORMAT.md §10), present exactly when "encryption" is a required
// feature and the header's flag says so.
Status DecodeEncryption(const Json& root, bool required, const Ctx& ctx, Manifest* m) {
  auto it = root.find("encryption");
  if (it == root.end() && !required && !m->encryption.enabled) return Status::OK();
  if (it == root.end() || !required || !m->encryption.enabled) {
    return ctx.Bad(fmt::format(
        "encryption is inconsistent: \"encryption\" object {}, required feature {}, header flag {}",
        it == root.end() ? "absent" : "present", required ? "listed" : "not listed",
        m->encryption.enabled ? "set" : "clear"));
  }
  SP_ASSIGN_OR_RETURN(std::string cipher, Str(*it, "cipher", ctx, "manifest.encryption"));
  SP_ASSIGN_OR_RETURN(std::string kdf, Str(*it, "kdf", ctx, "manifest.encryption"));
  if (cipher != kCipherName || kdf != kKdfName) {
    return UnimplementedError(fmt::format(
        "{}: encrypted with cipher {:?} and key derivation {:?} (this build knows {} with {})",
        ctx.where, cipher.substr(0, 32), kdf.substr(0, 32), kCipherName, kKdfName));
  }
  SP_RETURN_IF_ERROR(HexField(*it, "salt", m->encryption.salt, ctx));
  return HexField(*it, "key_check", m->encryption.key_check, ctx);
}

Status DecodeTop(const Json& root, const Ctx& ctx, Manifest* m, bool* compression, bool* sparse) {
  if (!root.is_object()) return ctx.Bad("manifest body is not a JSON object");
  SP_ASSIGN_OR_RETURN(std::string format, Str(root, "format", ctx, "manifest"));
  if (format != "savepoint") return ctx.Bad("manifest.format is not \"savepoint\"");
  SP_ASSIGN_OR_RETURN(const Json* features, Array(root, "required_features", 64, ctx, "manifest"));
  bool encryption = false;
  for (const Json& f : *features) {
    if (f.is_string() && f.get<std::string>() == kFeatureCompression) {
      *compression = true;
    } else if (f.is_string() && f.get<std::string>() == kFeatureEncryption) {
      encryption = true;
    } else if (f.is_string() && f.get<std::string>() == kFeatureSparse) {
      *sparse = true;
    } else {
      return UnimplementedError(fmt::format("{}: requires features {} unknown to this build",
                                            ctx.where, features->dump()));
    }
  }
  SP_RETURN_IF_ERROR(DecodeEncryption(root, encryption, ctx, m));
  auto version = root.find("version");
  if (version != root.end() &&
      (!version->is_number_unsigned() || version->get<uint64_t>() != m->version)) {
    return ctx.Bad(fmt::format("manifest.version {} differs from the header's version {}",
                               version->dump().substr(0, 32), m->version));
  }
  SP_ASSIGN_OR_RETURN(std::string id, Str(root, "checkpoint_id", ctx, "manifest"));
  if (id != fmt::format("{:016x}", m->checkpoint_id)) {
    return ctx.Bad(fmt::format("body checkpoint_id {:?} differs from the header's {:016x}",
                               id.substr(0, 32), m->checkpoint_id));
  }
  SP_ASSIGN_OR_RETURN(std::string writer, Str(root, "writer", ctx, "manifest"));
  m->writer = writer.substr(0, 256);
  SP_ASSIGN_OR_RETURN(uint64_t created, U64(root, "created_ns", ctx, "manifest"));
  m->created_ns = static_cast<int64_t>(std::min<uint64_t>(created, INT64_MAX));
  SP_ASSIGN_OR_RETURN(m->chunk_bytes, U64(root, "chunk_bytes", ctx, "manifest"));
  if (m->chunk_bytes < kMinChunkBytes || m->chunk_bytes > kMaxChunkBytes ||
      m->chunk_bytes % kAlignment != 0) {
    return ctx.Bad(
        fmt::format("chunk_bytes {} is not a multiple of 4096 in [4 KiB, 1 GiB]", m->chunk_bytes));
  }
  return Status::OK();
}

// The head's tensor `t` with its section `r` after those before it (in name order; *shards
// counts the shards so far).
Status AddTensorHead(TensorRecord t, const SectionRef& r, bool compression, const Ctx& ctx,
                     const std::string& in, uint64_t* shards, Manifest* m,
                     std::vector<SectionRef>* sections) {
  if (r.stored && !compression) {
    return ctx.Bad(
        fmt::format("{}: stored chunk entries without \"compression\" in "
                    "required_features",
                    in));
  }
  if ((*shards += r.shards) > kMaxIndexedShards) {
    return ctx.Bad(
        fmt::format("{}: the sections hold over {} shards in all", in, kMaxIndexedShards));
  }
  if (!m->tensors.empty() && m->tensors.back().name == t.name) {
    return ctx.Bad(fmt::format("tensor {:?} appears twice", t.name));
  }
  if (!m->tensors.empty() && m->tensors.back().name > t.name) {
    return ctx.Bad(
        fmt::format("tensor {:?} is out of order (an indexed head lists them by name)", t.name));
  }
  m->tensors.push_back(std::move(t));
  sections->push_back(r);
  return Status::OK();
}

// Versions 3 and 4: the head's tensor entries (no shards) and their sections, in the head's
// order, which must be by name.
Status DecodeTensorHeads(const Json& tensors, const Ctx& ctx, bool compression, Manifest* m,
                         std::vector<SectionRef>* sections) {
  uint64_t shards = 0;  // (each tensor's at most kMaxShardsPerTensor: no overflow)
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRecord t;
    std::string in;
    SP_RETURN_IF_ERROR(DecodeTensorHead(tensors[i], ctx, i, &t, &in));
    SP_ASSIGN_OR_RETURN(SectionRef r, DecodeSectionRef(tensors[i], t, *m, ctx, in));
    SP_RETURN_IF_ERROR(AddTensorHead(std::move(t), r, compression, ctx, in, &shards, m, sections));
  }
  return Status::OK();
}

// The tensors of a version 1 or 2 body, with their shards, sorted by name.
Status DecodeTensors(const Json& tensors, const Ctx& ctx, bool compression, Manifest* m) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    SP_ASSIGN_OR_RETURN(TensorRecord t, DecodeTensor(tensors[i], *m, ctx, i));
    m->tensors.push_back(std::move(t));
  }
  std::sort(m->tensors.begin(), m->tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (size_t i = 1; i < m->tensors.size(); ++i) {
    if (m->tensors[i].name == m->tensors[i - 1].name) {
      return ctx.Bad(fmt::format("tensor {:?} appears twice", m->tensors[i].name));
    }
  }
  if (!compression && UsesCompression(*m)) {
    return ctx.Bad("compressed shards without \"compression\" in required_features");
  }
  return CheckExtents(*m, ctx);
}

// The files and tensors of an indexed head read by ReadFastHead, with the DOM path's checks
// (DecodeFiles, DecodeTensorHeads; its messages when they fail do not matter: DecodeBody then
// decodes the head again from the DOM).
Status TakeFastHead(internal::FastHead* fast, const Ctx& ctx, bool compression, Manifest* m,
                    std::vector<SectionRef>* sections) {
  for (const FileRecord& f : fast->files) SP_RETURN_IF_ERROR(ValidateFileName(f.name));
  m->files = std::move(fast->files);
  SP_RETURN_IF_ERROR(CheckRepeats(m->files, ctx));
  uint64_t shards = 0;
  for (internal::TensorEntry& e : fast->tensors) {
    TensorRecord t{
        .name = std::move(e.name), .dtype = {}, .shape = std::move(e.shape), .shards = {}};
    SP_RETURN_IF_ERROR(ValidateName(t.name));
    std::optional<DType> dt = DTypeFromName(e.dtype);
    if (!dt) return ctx.Bad("unknown dtype");
    t.dtype = *dt;
    SP_RETURN_IF_ERROR(NumBytes(t.dtype, t.shape).status());
    SectionRef r{
        .bytes = e.section_bytes, .shards = e.shards, .chunks = e.chunks, .stored = e.stored};
    SP_RETURN_IF_ERROR(CheckSectionRef(e.section_crc32c, t, *m, ctx, t.name, &r));
    SP_RETURN_IF_ERROR(AddTensorHead(std::move(t), r, compression, ctx, {}, &shards, m, sections));
  }
  return Status::OK();
}

// The body's parts in order: its top-level fields, files, tensors and values. With `fast` (a head
// read by ReadFastHead, whose rest is `root`), the files and tensors are taken from it.
Status DecodeParts(const Json& root, internal::FastHead* fast, const Ctx& ctx, Manifest* m,
                   std::vector<SectionRef>* sections) {
  bool compression = false, sparse = false;
  SP_RETURN_IF_ERROR(DecodeTop(root, ctx, m, &compression, &sparse));
  if (fast != nullptr) {
    SP_RETURN_IF_ERROR(TakeFastHead(fast, ctx, compression, m, sections));
  } else {
    SP_RETURN_IF_ERROR(DecodeFiles(root, ctx, m));
    SP_ASSIGN_OR_RETURN(const Json* tensors, Array(root, "tensors", kMaxTensors, ctx, "manifest"));
    SP_RETURN_IF_ERROR(sections != nullptr
                           ? DecodeTensorHeads(*tensors, ctx, compression, m, sections)
                           : DecodeTensors(*tensors, ctx, compression, m));
  }
  SP_RETURN_IF_ERROR(DecodeValues(root, ctx, m));
  const Value* tables = m->values.FindValue(kSparseValueName);
  if (sparse != (tables != nullptr && tables->kind() == ValueKind::kJson)) {
    return ctx.Bad(
        fmt::format("\"{}\" in required_features and a JSON value {:?}: one without the other",
                    kFeatureSparse, kSparseValueName));
  }
  for (const auto& t : m->tensors) {
    if (m->values.Contains(t.name))
      return ctx.Bad(fmt::format("name {:?} is both tensor and value", t.name));
  }
  return Status::OK();
}

// The JSON body (versions 3 and 4: the head, with `sections` receiving the tensors' sections).
// With `fast`, a head is first read by ReadFastHead (a quarter of the DOM's time and allocations
// at 16,384 ranks); one it cannot read, or whose checks fail, is decoded from the DOM, which gives
// the errors.
Status DecodeBody(std::string_view body, const Ctx& ctx, Manifest* m,
                  std::vector<SectionRef>* sections, bool fast) {
  SP_RETURN_IF_ERROR(CheckJsonDepth(body, kMaxJsonDepth, ctx.where));
  if (fast && sections != nullptr) {
    internal::FastHead head;
    if (internal::ReadFastHead(body, &head)) {
      if (DecodeParts(head.rest, &head, ctx, m, sections).ok()) return Status::OK();
      m->files.clear();  // (the DOM's decode sets every other field again)
      m->tensors.clear();
      m->values = State();
      sections->clear();
    }
  }
  Json root = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return ctx.Bad("manifest body is not valid JSON");
  return DecodeParts(root, nullptr, ctx, m, sections);
}

}  // namespace

Status internal::CheckHeader(std::string_view bytes, const Ctx& ctx, Manifest* m) {
  if (bytes.size() < kManifestHeaderBytes) {
    return ctx.Bad(
        fmt::format("truncated: {} bytes, header needs {}", bytes.size(), kManifestHeaderBytes));
  }
  if (bytes.substr(0, 8) != kManifestMagic) return ctx.Bad("not a savepoint manifest (bad magic)");
  if (GetU32(bytes, 60) != Crc32c(bytes.substr(0, 60))) return ctx.Bad("header checksum mismatch");
  m->version = GetU32(bytes, 8);
  if (m->version < kMinFormatVersion || m->version > kMaxFormatVersion) {
    return UnimplementedError(
        fmt::format("{}: format version {} (this build reads versions {} to {})", ctx.where,
                    m->version, kMinFormatVersion, kMaxFormatVersion));
  }
  if (GetU32(bytes, 12) != kManifestHeaderBytes) return ctx.Bad("bad header size");
  // Version 3: the body is the JSON head, followed by the sections.
  uint64_t body = GetU64(bytes, 16);
  if (body > kMaxManifestBodyBytes) {
    return ctx.Bad(
        fmt::format("body of {} bytes exceeds the cap of {}", body, kMaxManifestBodyBytes));
  }
  const uint64_t after = bytes.size() - kManifestHeaderBytes;
  if (m->version >= kIndexedFormatVersion ? body > after : body != after) {
    return ctx.Bad(
        fmt::format("body is {} bytes, header says {} (truncated or padded)", after, body));
  }
  m->checkpoint_id = GetU64(bytes, 24);
  if (GetU32(bytes, 32) != Crc32c(bytes.substr(kManifestHeaderBytes, body))) {
    return ctx.Bad("body checksum mismatch");
  }
  // Flags: bit 0 says the manifest is encrypted and its MAC is in bytes [40, 60) (§10). Writers
  // before encryption wrote 0 and nothing in the reserved bytes.
  const uint32_t flags = GetU32(bytes, 36);
  if ((flags & ~kManifestFlagEncrypted) != 0) {
    return UnimplementedError(
        fmt::format("{}: header flags {:#x} unknown to this build", ctx.where, flags));
  }
  m->encryption.enabled = (flags & kManifestFlagEncrypted) != 0;
  if (m->encryption.enabled) {
    std::memcpy(m->encryption.mac.data(), bytes.data() + kManifestMacOffset, kManifestMacBytes);
  }
  return Status::OK();
}

Status CheckJsonDepth(std::string_view body, size_t max_depth, std::string_view where) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return CorruptionError(fmt::format("{}: JSON nested too deeply", where));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return Status::OK();
}

Status ValuesFromJson(const Json& values, std::string_view where, State* out) {
  Ctx ctx{where};
  if (!values.is_array()) return ctx.Bad("values is not an array");
  if (values.size() > kMaxTensors) {
    return ctx.Bad(fmt::format("values has {} entries (limit {})", values.size(), kMaxTensors));
  }
  return DecodeValueArray(values, ctx, out);
}

namespace {

// A whole version 3 MANIFEST: the head, then every section.
Status DecodeIndexed(std::string_view bytes, const Ctx& ctx, Manifest* m) {
  ManifestHead h;
  h.manifest = std::move(*m);  // what CheckHeader read
  const uint64_t head = GetU64(bytes, 16);
  SP_RETURN_IF_ERROR(
      DecodeBody(bytes.substr(kManifestHeaderBytes, head), ctx, &h.manifest, &h.sections, true));
  SP_RETURN_IF_ERROR(
      internal::PlaceSections(kManifestHeaderBytes + head, bytes.size(), ctx, &h.sections));
  for (size_t i = 0; i < h.sections.size(); ++i) {
    const SectionRef& r = h.sections[i];
    SP_RETURN_IF_ERROR(
        DecodeTensorSection(bytes.substr(r.offset, r.bytes), &h, i, nullptr, ctx.where));
  }
  SP_RETURN_IF_ERROR(CheckExtents(h.manifest, ctx));
  *m = std::move(h.manifest);
  return Status::OK();
}

}  // namespace

Status internal::DecodeHeadBody(std::string_view head, const Ctx& ctx, Manifest* m,
                                std::vector<SectionRef>* sections, bool fast) {
  try {
    return DecodeBody(head, ctx, m, sections, fast);
  } catch (const std::exception& e) {
    return ctx.Bad(fmt::format("malformed manifest ({})", e.what()));
  }
}

Result<Manifest> DecodeManifest(std::string_view bytes, std::string_view where) {
  Ctx ctx{where};
  Manifest m;
  try {
    SP_RETURN_IF_ERROR(CheckHeader(bytes, ctx, &m));
    if (m.version >= kIndexedFormatVersion) {
      SP_RETURN_IF_ERROR(DecodeIndexed(bytes, ctx, &m));
    } else {
      SP_RETURN_IF_ERROR(DecodeBody(bytes.substr(kManifestHeaderBytes), ctx, &m, nullptr, false));
    }
  } catch (const std::exception& e) {
    return ctx.Bad(fmt::format("malformed manifest ({})", e.what()));
  }
  return m;
}

}  // namespace savepoint::format
