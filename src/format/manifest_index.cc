// Version 3 of the native format: the binary sections of the indexed manifest (docs/FORMAT.md
// §15), and reading a manifest in parts. The JSON head is decoded by manifest_decode.cc.
#include "format/manifest_index.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "format/endian.h"
#include "format/manifest_checks.h"
#include "util/crc32c.h"
#include "util/varint.h"

namespace savepoint::format {
namespace {

using internal::Ctx;

// Little-endian stores (format/endian.h: savepoint's hosts are little-endian).
void PutLe32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutLe64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }

// Bit 0 of a stored chunk entry's flags: the chunk is compressed.
constexpr uint32_t kChunkCompressed = 1;

// A shard record as stored, before its values are checked.
struct RawRecord {
  uint64_t offsets[kMaxRank];
  uint64_t sizes[kMaxRank];
  uint64_t offset = 0, bytes = 0, file = 0;
  uint8_t codec = 0, filter = 0;
  bool reserved_zero = true;  // version 3's reserved bytes (version 4 has none)
};

uint64_t ZigZag(uint64_t delta) {
  return (delta << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(delta) >> 63);
}
uint64_t UnZigZag(uint64_t z) { return (z >> 1) ^ (0 - (z & 1)); }

// Reads the records of one section in order (version 3: fixed size; 4: compact). Each Next
// consumes one record; false when the bytes end inside it or a varint is malformed.
class RecordDecoder {
 public:
  RecordDecoder(uint32_t version, size_t ndim, std::string_view records)
      : compact_(version >= kCompactFormatVersion), nd_(ndim), b_(records) {}

  bool Next(RawRecord* r) { return compact_ ? NextCompact(r) : NextFixed(r); }
  // The bytes not consumed.
  size_t left() const { return b_.size() - at_; }

 private:
  bool NextFixed(RawRecord* r) {
    const uint64_t size = ShardRecordBytes(nd_);
    if (left() < size) return false;
    const std::string_view b = b_.substr(at_, size);
    at_ += size;
    for (size_t d = 0; d < nd_; ++d) {
      r->offsets[d] = GetU64(b, 8 * d);
      r->sizes[d] = GetU64(b, 8 * (nd_ + d));
    }
    const size_t at = 16 * nd_;
    r->offset = GetU64(b, at);
    r->bytes = GetU64(b, at + 8);
    r->file = GetU32(b, at + 16);
    r->codec = static_cast<uint8_t>(b[at + 20]);
    r->filter = static_cast<uint8_t>(b[at + 21]);
    r->reserved_zero = b[at + 22] == 0 && b[at + 23] == 0;
    return true;
  }

  bool NextCompact(RawRecord* r) {
    for (size_t d = 0; d < nd_; ++d) {
      if (!Delta(&r->offsets[d], &prev_[d])) return false;
    }
    for (size_t d = 0; d < nd_; ++d) {
      if (!Delta(&r->sizes[d], &prev_[nd_ + d])) return false;
    }
    if (!Varint(&r->offset) || !Delta(&r->bytes, &prev_[2 * nd_]) ||
        !Delta(&r->file, &prev_[2 * nd_ + 1]) || left() < 1) {
      return false;
    }
    const auto c = static_cast<uint8_t>(b_[at_++]);
    r->codec = c & 0xf;
    r->filter = c >> 4;
    return true;
  }

  bool Varint(uint64_t* v) { return GetVarint(b_, &at_, v); }

  // A zigzag-coded difference from *prev (wrapping), which becomes the new *prev.
  bool Delta(uint64_t* v, uint64_t* prev) {
    uint64_t z = 0;
    if (!Varint(&z)) return false;
    *v = *prev = *prev + UnZigZag(z);
    return true;
  }

  bool compact_;
  size_t nd_;
  std::string_view b_;
  size_t at_ = 0;
  uint64_t prev_[2 * kMaxRank + 2] = {};
};

// Whether the box of record `r` (ndim `nd`) overlaps `box`. A box that is not one (another rank,
// a value outside [0, 2^62]) overlaps everything: the reader's own checks name what is wrong.
bool Overlaps(const RawRecord& r, size_t nd, const Box& box) {
  if (box.offsets.size() != nd || box.sizes.size() != nd) return true;
  bool overlap = true;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t bo = box.offsets[d], bs = box.sizes[d];
    if (bo < 0 || bs < 0 || bo > kMaxDimension || bs > kMaxDimension) return true;
    const uint64_t off = r.offsets[d], size = r.sizes[d];
    if (off > uint64_t{kMaxDimension} || size > uint64_t{kMaxDimension}) return true;
    const uint64_t lo = static_cast<uint64_t>(bo), hi = lo + static_cast<uint64_t>(bs);
    overlap = overlap && off < hi && lo < off + size;
  }
  return overlap;
}

// Whether record `r` is to be decoded: always without `keep`; with it, when its box overlaps one
// of keep's. A rank that loads a few boxes skips most records.
bool Wanted(const RawRecord& r, size_t nd, const std::vector<Box>* keep) {
  if (keep == nullptr) return true;
  for (const Box& box : *keep) {
    if (Overlaps(r, nd, box)) return true;
  }
  return false;
}

// Record `r` (ndim `nd`) into `s`, checked; chunk entries are read later.
Status ReadRecord(const RawRecord& r, size_t nd, const Ctx& ctx, const std::string& in,
                  ShardRecord* s) {
  s->offsets.resize(nd);
  s->sizes.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    const uint64_t off = r.offsets[d], size = r.sizes[d];
    if (off > uint64_t{kMaxDimension} || size > uint64_t{kMaxDimension}) {
      return ctx.Bad(fmt::format("{}: offsets or sizes hold a negative or huge value", in));
    }
    s->offsets[d] = static_cast<int64_t>(off);
    s->sizes[d] = static_cast<int64_t>(size);
  }
  if (r.file > UINT32_MAX) return ctx.Bad(fmt::format("{}: file {} is not a u32", in, r.file));
  s->offset = r.offset;
  s->bytes = r.bytes;
  s->file = static_cast<uint32_t>(r.file);
  const uint8_t codec = r.codec, filter = r.filter;
  if (codec > static_cast<uint8_t>(codec::Codec::kLz4) ||
      filter > static_cast<uint8_t>(codec::Filter::kShuffle) || !r.reserved_zero ||
      (codec == 0 && filter != 0)) {
    return ctx.Bad(
        fmt::format("{}: codec {}, filter {} or reserved bytes are invalid", in, codec, filter));
  }
  s->codec = static_cast<codec::Codec>(codec);
  s->filter = static_cast<codec::Filter>(filter);
  return Status::OK();
}

// Chunk entries [first, first + n) of `entries` into `s`.
Status ReadChunkEntries(std::string_view entries, uint64_t first, uint64_t n, const SectionRef& r,
                        bool encrypted, const Ctx& ctx, const std::string& in, ShardRecord* s) {
  const uint64_t size = ChunkEntryBytes(r.stored, encrypted);
  s->crc32c.resize(n);
  if (s->compressed()) s->stored.resize(n);
  if (encrypted) s->tags.resize(n);
  for (uint64_t c = 0; c < n; ++c) {
    const std::string_view e = entries.substr((first + c) * size, size);
    s->crc32c[c] = GetU32(e, 0);
    if (r.stored) {
      const uint32_t flags = GetU32(e, 4);
      const uint64_t offset = GetU64(e, 8), bytes = GetU64(e, 16);
      if ((flags & ~kChunkCompressed) != 0 ||
          (!s->compressed() && (flags != 0 || offset != 0 || bytes != 0))) {
        return ctx.Bad(fmt::format("{} chunk {}: invalid stored entry", in, c));
      }
      if (s->compressed()) s->stored[c] = {offset, bytes, (flags & kChunkCompressed) != 0};
    }
    if (encrypted) std::memcpy(s->tags[c].data(), e.data() + (r.stored ? 24 : 4), 16);
  }
  return Status::OK();
}

// The fields of a record of `s` (whose offsets and sizes have one value per dimension).
RecordFields Fields(const ShardRecord& s) {
  return {s.offsets.data(), s.sizes.data(), s.offsets.size(), s.offset,
          s.bytes,          s.file,         s.codec,          s.filter};
}

}  // namespace

RecordEncoder::RecordEncoder(uint32_t version, size_t ndim)
    : compact_(version >= kCompactFormatVersion), ndim_(ndim) {}

uint64_t RecordEncoder::MaxBytes() const {
  return compact_ ? MaxCompactRecordBytes(ndim_) : ShardRecordBytes(ndim_);
}

char* RecordEncoder::Write(const RecordFields& r, char* out) {
  const char filter =
      static_cast<char>(r.codec != codec::Codec::kNone ? r.filter : codec::Filter::kNone);
  char* p = out;
  if (compact_) {
    auto delta = [&](uint64_t v, uint64_t* prev) {
      p = PutVarint(ZigZag(v - *prev), p);
      *prev = v;
    };
    for (size_t d = 0; d < ndim_; ++d) delta(static_cast<uint64_t>(r.offsets[d]), &prev_[d]);
    for (size_t d = 0; d < ndim_; ++d) delta(static_cast<uint64_t>(r.sizes[d]), &prev_[ndim_ + d]);
    p = PutVarint(r.offset, p);
    delta(r.bytes, &prev_[2 * ndim_]);
    delta(r.file, &prev_[2 * ndim_ + 1]);
    *p++ = static_cast<char>(static_cast<char>(r.codec) | static_cast<char>(filter << 4));
    return p;
  }
  for (size_t d = 0; d < ndim_; ++d, p += 8) PutLe64(p, static_cast<uint64_t>(r.offsets[d]));
  for (size_t d = 0; d < ndim_; ++d, p += 8) PutLe64(p, static_cast<uint64_t>(r.sizes[d]));
  PutLe64(p, r.offset);
  PutLe64(p + 8, r.bytes);
  PutLe32(p + 16, r.file);
  p[20] = static_cast<char>(r.codec);
  p[21] = filter;
  p[22] = p[23] = 0;
  return p + 24;
}

void RecordEncoder::Append(const RecordFields& r, std::string* out) {
  char b[MaxCompactRecordBytes(kMaxRank)];  // built here and appended once: a save has millions
  out->append(b, static_cast<size_t>(Write(r, b) - b));
}

void AppendChunkEntry(uint32_t crc32c, bool stored, const StoredChunk* chunk,
                      const crypto::GcmTag* tag, std::string* out) {
  char b[40];
  char* p = b;
  PutLe32(p, crc32c);
  p += 4;
  if (stored) {
    const StoredChunk none;
    const StoredChunk& sc = chunk != nullptr ? *chunk : none;
    PutLe32(p, sc.compressed ? kChunkCompressed : 0);
    PutLe64(p + 4, sc.offset);
    PutLe64(p + 12, sc.bytes);
    p += 20;
  }
  if (tag != nullptr) {
    std::memcpy(p, tag->data(), tag->size());
    p += tag->size();
  }
  out->append(b, static_cast<size_t>(p - b));
}

SectionRef CloseSection(std::string_view sections, size_t start, uint64_t shards, uint64_t chunks,
                        bool stored) {
  SectionRef r;
  r.offset = start;
  r.bytes = sections.size() - start;
  r.crc32c = Crc32c(sections.substr(start));
  r.shards = shards;
  r.chunks = chunks;
  r.stored = stored;
  return r;
}

SectionRef AppendSection(const TensorRecord& t, const Manifest& m, std::string* out) {
  const size_t start = out->size();
  bool stored = false;
  for (const ShardRecord& s : t.shards) stored = stored || s.compressed();
  RecordEncoder records(m.version, t.shape.size());
  for (const ShardRecord& s : t.shards) records.Append(Fields(s), out);
  uint64_t chunks = 0;
  const crypto::GcmTag zero{};  // (an encrypted manifest has one tag per chunk: DecodeTags)
  for (const ShardRecord& s : t.shards) {
    for (size_t c = 0; c < s.crc32c.size(); ++c) {
      const crypto::GcmTag* tag = !m.encryption.enabled ? nullptr
                                  : c < s.tags.size()   ? &s.tags[c]
                                                        : &zero;
      AppendChunkEntry(s.crc32c[c], stored, s.compressed() ? &s.stored[c] : nullptr, tag, out);
    }
    chunks += s.crc32c.size();
  }
  return CloseSection(*out, start, t.shards.size(), chunks, stored);
}

uint64_t LargestSection(const Manifest& m) {
  if (m.version < kIndexedFormatVersion) return 0;
  unsigned __int128 largest = 0;
  for (const TensorRecord& t : m.tensors) {
    bool stored = false;
    unsigned __int128 chunks = 0;
    for (const ShardRecord& s : t.shards) {
      stored = stored || s.compressed();
      chunks += s.crc32c.size();
    }
    unsigned __int128 bytes = chunks * ChunkEntryBytes(stored, m.encryption.enabled);
    RecordEncoder records(m.version, t.shape.size());
    char b[MaxCompactRecordBytes(kMaxRank)];
    for (const ShardRecord& s : t.shards) bytes += records.Write(Fields(s), b) - b;
    largest = std::max(largest, bytes);
  }
  return largest > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(largest);
}

Status internal::PlaceSections(uint64_t head_end, uint64_t file_bytes, const Ctx& ctx,
                               std::vector<SectionRef>* sections) {
  uint64_t at = head_end;  // (each section <= 2^28 bytes, at most 2^24 of them: no overflow)
  for (SectionRef& r : *sections) {
    r.offset = at;
    at += r.bytes;
  }
  if (at != file_bytes) {
    return ctx.Bad(fmt::format("the sections end at byte {}, the file has {} (truncated or padded)",
                               at, file_bytes));
  }
  return Status::OK();
}

Status DecodeTensorSection(std::string_view section, ManifestHead* head, size_t i,
                           const std::vector<Box>* keep, std::string_view where) {
  const Ctx ctx{where};
  const Manifest& m = head->manifest;
  TensorRecord& t = head->manifest.tensors[i];
  const SectionRef& r = head->sections[i];
  const std::string in = fmt::format("tensor {:?}", t.name);
  if (section.size() != r.bytes) {
    return ctx.Bad(
        fmt::format("{}: section of {} bytes, the head says {}", in, section.size(), r.bytes));
  }
  if (Crc32c(section) != r.crc32c) return ctx.Bad(fmt::format("{}: section checksum mismatch", in));
  const size_t nd = t.shape.size();
  const uint64_t entry = ChunkEntryBytes(r.stored, m.encryption.enabled);
  if (r.chunks > section.size() / entry) {  // (the head's check; this function is public)
    return ctx.Bad(fmt::format("{}: {} chunk entries exceed its section", in, r.chunks));
  }
  const uint64_t entries_bytes = r.chunks * entry;
  const std::string_view entries = section.substr(section.size() - entries_bytes);
  RecordDecoder records(m.version, nd, section.substr(0, section.size() - entries_bytes));
  t.shards.clear();
  uint64_t chunk = 0;  // the first chunk entry of shard k
  RawRecord raw;
  for (uint64_t k = 0; k < r.shards; ++k) {
    if (!records.Next(&raw)) {
      return ctx.Bad(fmt::format("{} shard {}: its record is truncated or malformed", in, k));
    }
    const uint64_t n =
        raw.bytes <= m.chunk_bytes  // (most shards: no division)
            ? uint64_t{raw.bytes != 0}
            : NumChunks(std::min<uint64_t>(raw.bytes, uint64_t{1} << 62), m.chunk_bytes);
    if (n > r.chunks - chunk) {
      return ctx.Bad(
          fmt::format("{} shard {}: more chunks than the section's {}", in, k, r.chunks));
    }
    if (Wanted(raw, nd, keep)) {
      const std::string sin = fmt::format("{} shard {}", in, k);
      ShardRecord s;
      SP_RETURN_IF_ERROR(ReadRecord(raw, nd, ctx, sin, &s));
      if (s.compressed() && !r.stored) {
        return ctx.Bad(fmt::format("{}: compressed, but the section has no stored entries", sin));
      }
      SP_RETURN_IF_ERROR(
          ReadChunkEntries(entries, chunk, n, r, m.encryption.enabled, ctx, sin, &s));
      SP_RETURN_IF_ERROR(internal::CheckShardRange(t, s, m, ctx, sin));
      t.shards.push_back(std::move(s));
    }
    chunk += n;
  }
  if (records.left() != 0) {
    return ctx.Bad(fmt::format("{}: {} bytes after its last record", in, records.left()));
  }
  if (chunk != r.chunks) {
    return ctx.Bad(
        fmt::format("{}: its shards have {} chunks, the section {}", in, chunk, r.chunks));
  }
  return internal::CheckTiling(t, ctx, in, /*cover=*/keep == nullptr);
}

Result<uint64_t> IndexedHeadBytes(std::string_view header, std::string_view where) {
  const Ctx ctx{where};
  if (header.size() < kManifestHeaderBytes) {
    return ctx.Bad(
        fmt::format("truncated: {} bytes, header needs {}", header.size(), kManifestHeaderBytes));
  }
  if (header.substr(0, 8) != kManifestMagic) return ctx.Bad("not a savepoint manifest (bad magic)");
  if (GetU32(header, 60) != Crc32c(header.substr(0, 60))) {
    return ctx.Bad("header checksum mismatch");
  }
  const uint32_t version = GetU32(header, 8);
  if (version < kIndexedFormatVersion || version > kMaxFormatVersion ||
      (GetU32(header, 36) & kManifestFlagEncrypted) != 0 ||
      GetU64(header, 16) > kMaxManifestBodyBytes) {
    return uint64_t{0};  // read it whole: DecodeManifest reports what is wrong, if anything
  }
  return kManifestHeaderBytes + GetU64(header, 16);
}

Result<ManifestHead> DecodeManifestHead(std::string_view head, uint64_t file_bytes,
                                        std::string_view where) {
  const Ctx ctx{where};
  ManifestHead h;
  SP_RETURN_IF_ERROR(internal::CheckHeader(head, ctx, &h.manifest));
  if (h.manifest.version < kIndexedFormatVersion) {
    return ctx.Bad(fmt::format("format version {} has no head", h.manifest.version));
  }
  // Exactly header and head (all that the CRC covers), and not encrypted (read whole: the MAC).
  if (GetU64(head, 16) != head.size() - kManifestHeaderBytes || h.manifest.encryption.enabled) {
    return ctx.Bad("not the head of an unencrypted indexed manifest");
  }
  if (file_bytes > kMaxManifestFileBytes) {
    return ctx.Bad(
        fmt::format("file of {} bytes exceeds the cap of {}", file_bytes, kMaxManifestFileBytes));
  }
  SP_RETURN_IF_ERROR(
      internal::DecodeHeadBody(head.substr(kManifestHeaderBytes), ctx, &h.manifest, &h.sections));
  SP_RETURN_IF_ERROR(internal::PlaceSections(head.size(), file_bytes, ctx, &h.sections));
  return h;
}

}  // namespace savepoint::format
