// Versions 3 and 4 of the native format, the indexed manifest (docs/FORMAT.md §15, §17).
//
// MANIFEST = the 64-byte header | the JSON head | one binary section per tensor, in the head's
// order. The head is the version 2 body with each tensor's "shards" array replaced by the size,
// CRC32C and counts of its section; a section holds the tensor's shard records (fixed size in
// version 3, compact in version 4) and then their chunk entries (checksums, stored extents, tags).
// A reader that needs a few tensors reads the header, the head and their sections only: a rank of a
// 16,384-rank job plans its load from a few megabytes of a manifest of hundreds.
//
// DecodeManifest (format/manifest.h) reads whole indexed files like the others; this header is
// for readers that read parts. Input is untrusted, as everywhere in format/.
#ifndef SAVEPOINT_FORMAT_MANIFEST_INDEX_H_
#define SAVEPOINT_FORMAT_MANIFEST_INDEX_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/manifest.h"

namespace savepoint::format {

// Where one tensor's shard records lie in MANIFEST (version 3 or 4).
struct SectionRef {
  uint64_t offset = 0;  // from the start of MANIFEST
  uint64_t bytes = 0;   // section length
  uint32_t crc32c = 0;  // CRC32C of the section's bytes
  uint64_t shards = 0;  // shard records
  uint64_t chunks = 0;  // chunk entries (the shards' chunks, in record order)
  bool stored = false;  // chunk entries carry stored extents (the tensor has compressed shards)
};

// A box of a tensor in global coordinates.
struct Box {
  Shape offsets;
  Shape sizes;
};

// A decoded header and head: `manifest` lists every tensor (name, dtype, shape) with no shards;
// sections[i] locates the shards of manifest.tensors[i] (tensors sorted by name).
struct ManifestHead {
  Manifest manifest;
  std::vector<SectionRef> sections;
};

// Bytes of one version 3 shard record of a tensor of `ndim` dimensions (fixed), the fewest and
// the most of one version 4 record (compact: a varint per field), and of one chunk entry.
// The most shards the sections of one indexed manifest hold in all: version 4's records take a
// few bytes each, and a whole read makes a ShardRecord of each (a version 3 file of 4 GiB holds
// fewer anyway).
inline constexpr uint64_t kMaxIndexedShards = uint64_t{1} << 27;

constexpr uint64_t ShardRecordBytes(size_t ndim) { return 16 * uint64_t{ndim} + 24; }
constexpr uint64_t MinCompactRecordBytes(size_t ndim) { return 2 * uint64_t{ndim} + 4; }
constexpr uint64_t MaxCompactRecordBytes(size_t ndim) { return 20 * uint64_t{ndim} + 31; }
inline uint64_t ChunkEntryBytes(bool stored, bool encrypted) {
  return 4 + (stored ? 20 : 0) + (encrypted ? 16 : 0);
}

// From the first kManifestHeaderBytes of MANIFEST: the length of header + head when the manifest
// is of version 3 or later and not encrypted (then DecodeManifestHead and DecodeTensorSection can
// read it in parts), else 0 (read and decode it whole: versions 1 and 2, an unknown version, which
// DecodeManifest names, and an encrypted manifest, which is authenticated whole). Corruption for a
// damaged header.
Result<uint64_t> IndexedHeadBytes(std::string_view header, std::string_view where);

// Decodes and validates header + head (the first IndexedHeadBytes bytes) of an indexed MANIFEST
// of `file_bytes` bytes: everything but the shards, and the sections' places, which must fill the
// file after the head exactly.
Result<ManifestHead> DecodeManifestHead(std::string_view head, uint64_t file_bytes,
                                        std::string_view where);

// Decodes `section` (the bytes at head->sections[i]) into head->manifest.tensors[i].shards:
// checks its CRC32C and every record (box, extent in its file, chunk entries). With `keep`, only
// shards whose box overlaps one of its boxes are kept, and they are checked not to overlap each
// other (that they cover the boxes is the reader's check); without, every shard is kept and must
// tile the tensor.
Status DecodeTensorSection(std::string_view section, ManifestHead* head, size_t i,
                           const std::vector<Box>* keep, std::string_view where);

// The size of the largest section EncodeManifest writes for `m` (0 below version 3), so that a
// writer can refuse a manifest that readers would (each section <= kMaxManifestBodyBytes).
uint64_t LargestSection(const Manifest& m);

// Encoder side: appends the section of `t` (in the encoding of m.version) to `out` and returns its
// place (offset relative to the start of `out` before the call). Built from the pieces below.
SectionRef AppendSection(const TensorRecord& t, const Manifest& m, std::string* out);

// Encoder pieces, for writers that hold their shards in a form of their own (the distributed
// coordinator keeps boxes flat). A section is the records of its shards, then their chunk entries.
struct RecordFields {
  const int64_t* offsets = nullptr;  // `ndim` values
  const int64_t* sizes = nullptr;    // `ndim` values
  size_t ndim = 0;
  uint64_t offset = 0;  // extent in the data file
  uint64_t bytes = 0;
  uint32_t file = 0;
  codec::Codec codec = codec::Codec::kNone;
  codec::Filter filter = codec::Filter::kNone;  // written as kNone when `codec` is kNone
};
// Writes the shard records of one section, in order, in the encoding of format `version`: fixed
// size (3), or compact (4: each field a varint, the box, `bytes` and `file` as the zigzag-coded
// difference from the previous record's). One encoder per section; not thread-safe.
class RecordEncoder {
 public:
  RecordEncoder(uint32_t version, size_t ndim);
  // The most bytes one record takes.
  uint64_t MaxBytes() const;
  // Writes the record of `r` (r.ndim == ndim) at `out`, at most MaxBytes() bytes; returns its end.
  char* Write(const RecordFields& r, char* out);
  // Appends the record of `r` to `out`.
  void Append(const RecordFields& r, std::string* out);

 private:
  bool compact_;
  size_t ndim_;
  uint64_t prev_[2 * kMaxRank + 2] = {};  // the previous record's offsets, sizes, bytes, file
};
// Appends one chunk entry: the chunk's CRC32C; when the section is `stored`, the chunk's stored
// extent (`chunk`, or zeros when null: a chunk of an uncompressed shard); when the manifest is
// encrypted (`tag` not null), its GCM tag.
void AppendChunkEntry(uint32_t crc32c, bool stored, const StoredChunk* chunk,
                      const crypto::GcmTag* tag, std::string* out);
// The place of the section of `shards` records and `chunks` entries that began at byte `start` of
// `sections` and ends at its end.
SectionRef CloseSection(std::string_view sections, size_t start, uint64_t shards, uint64_t chunks,
                        bool stored);

// A whole indexed MANIFEST (m.version >= kIndexedFormatVersion): the header and head of `m`,
// whose tensors' shards are not looked at, then `sections`, which holds the section of
// m.tensors[i] at refs[i] (back to back, in order). Authenticated with `keys` when encrypted.
// Built in the buffer of `sections` (no copy of them when its capacity has room for the header
// and head). EncodeManifest (format/manifest.h) is this with the sections built from the shards.
std::string EncodeIndexedManifest(const Manifest& m, const std::vector<SectionRef>& refs,
                                  std::string sections, const CheckpointKeys* keys);

// The tiling check of CheckTensorTiling (format/manifest.h) for `count` boxes held flat in
// `boxes`, 2 * shape.size() values each: the offsets, then the sizes. Corruption naming `where`
// and `in` (the tensor) when a box leaves the shape, two overlap or they do not cover it. (It
// sweeps: callers that hold many boxes try GridOrder first.)
Status CheckFlatTiling(const Shape& shape, const int64_t* boxes, size_t count,
                       std::string_view where, const std::string& in);

// Whether `count` flat boxes (as above) are a grid of `shape`: in each dimension their offsets
// cut it into intervals, and each cell of those cuts is exactly one box (so they tile it). Then
// *order holds the boxes by their offsets (the cells in row-major order) and true is returned.
// False says only that the boxes are not such a grid (or that offsets collide in its hash table,
// a hostile layout): CheckFlatTiling decides. O(count * ndim) expected.
bool GridOrder(const Shape& shape, const int64_t* boxes, size_t count,
               std::vector<uint32_t>* order);

}  // namespace savepoint::format

#endif  // SAVEPOINT_FORMAT_MANIFEST_INDEX_H_
