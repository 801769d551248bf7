// The native on-disk format (versions 1 to 4, with the optional features compression and
// encryption): constants, the manifest model, and its encoder and validating decoder.
// docs/FORMAT.md is the specification; this file implements it.
//
// Everything here treats input as hostile: every size is capped, every offset is checked with
// overflow-safe arithmetic, every name is validated, and errors are Corruption (bad bytes) or
// Unimplemented (a newer format) with a message naming what and where.
#ifndef SAVEPOINT_FORMAT_MANIFEST_H_
#define SAVEPOINT_FORMAT_MANIFEST_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "codec/codec.h"
#include "format/encryption.h"
#include "savepoint/state.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint::format {

inline constexpr std::string_view kManifestMagic = "SVPTMNFT";  // 8 bytes
inline constexpr std::string_view kDataMagic = "SVPTDATA";      // 8 bytes
// The version this build writes by default, the oldest and the newest it reads. Version 2
// (docs/FORMAT.md §8) differs from version 1 only in the alignment of uncompressed extents: 64
// bytes instead of 4096, so that small tensors can be packed back to back. Version 3 (§15, the
// indexed manifest: format/manifest_index.h) stores each tensor's shard records as a binary section
// after the JSON head, so that a reader can read the head and then only the tensors it needs.
// Version 4 (§17) is version 3 with compact shard records: varints, most of them differences from
// the previous record's fields, about a quarter of version 3's bytes.
inline constexpr uint32_t kFormatVersion = 2;
inline constexpr uint32_t kMinFormatVersion = 1;
inline constexpr uint32_t kMaxFormatVersion = 4;
inline constexpr uint32_t kIndexedFormatVersion = 3;
inline constexpr uint32_t kCompactFormatVersion = 4;
inline constexpr std::string_view kManifestFileName = "MANIFEST";

inline constexpr uint64_t kManifestHeaderBytes = 64;
inline constexpr uint64_t kDataHeaderBytes = 4096;
inline constexpr uint64_t kAlignment = 4096;
// Version 2: every uncompressed extent starts at a multiple of this (enough for any dtype and
// SIMD).
inline constexpr uint64_t kPackAlignment = 64;
// Writer policy of version 2 (not format rules; readers accept any valid layout): extents smaller
// than kPackBelowBytes are packed back to back at kPackAlignment in one region after the header;
// none crosses a boundary of kPackSpanBytes from the region's start, so each span of the region is
// written with one aligned write of its own. Larger extents stay 4096-aligned.
inline constexpr uint64_t kPackBelowBytes = uint64_t{64} << 10;
inline constexpr uint64_t kPackSpanBytes = uint64_t{1} << 20;

// Caps (a file exceeding one is rejected as corrupt or hostile).
// The JSON body (version 3: the head; each binary section has the same cap).
inline constexpr uint64_t kMaxManifestBodyBytes = uint64_t{256} << 20;
// A whole MANIFEST file of version 3 (head and sections).
inline constexpr uint64_t kMaxManifestFileBytes = uint64_t{4} << 30;
inline constexpr uint64_t kMinChunkBytes = 4096;
inline constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;
inline constexpr size_t kMaxFiles = size_t{1} << 20;
inline constexpr size_t kMaxTensors = size_t{1} << 24;
inline constexpr size_t kMaxShardsPerTensor = size_t{1} << 20;
inline constexpr size_t kMaxBytesValue = size_t{64} << 20;
inline constexpr size_t kMaxJsonDepth = 64;
inline constexpr size_t kMaxFileNameBytes = 255;
// The largest dimension of a tensor or box (docs/FORMAT.md: each dimension <= 2^62).
inline constexpr int64_t kMaxDimension = int64_t{1} << 62;

// Names a reader must know to read a checkpoint that lists them in `required_features`.
inline constexpr std::string_view kFeatureCompression = "compression";
// Sparse embedding tables (docs/FORMAT.md §11): listed exactly when the manifest's values hold the
// JSON value kSparseValueName, which describes the tables stored as tensors of the checkpoint.
inline constexpr std::string_view kFeatureSparse = "sparse";
inline constexpr std::string_view kSparseValueName = "savepoint.sparse";

struct FileRecord {
  std::string name;  // plain file name inside the checkpoint directory
  uint64_t bytes = 0;
};

// Where and how one chunk of a compressed shard is stored (docs/FORMAT.md, "Compressed shards").
struct StoredChunk {
  uint64_t offset = 0;      // in the shard's file; a multiple of 4096, >= 4096
  uint64_t bytes = 0;       // stored size: the compressed size, or the raw chunk size
  bool compressed = false;  // false: the raw chunk bytes, unfiltered
};

// One stored box of a tensor: the region [offsets, offsets + sizes) of the global tensor (`bytes`
// bytes, C-order). Without compression (codec kNone) it is stored contiguously at
// [offset, offset + bytes) of files[file]. With a codec, `offset` is 0 and chunk c is stored on its
// own at [stored[c].offset, + stored[c].bytes) of files[file], compressed with codec and filter
// when stored[c].compressed.
struct ShardRecord {
  Shape offsets;
  Shape sizes;
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::vector<uint32_t> crc32c;  // one per chunk of `chunk_bytes` (last may be shorter); with a
                                 // codec, the CRC32C of the chunk's stored bytes
  codec::Codec codec = codec::Codec::kNone;
  codec::Filter filter = codec::Filter::kNone;
  std::vector<StoredChunk> stored = {};  // one per chunk when codec != kNone, else empty
  // Encrypted checkpoints (docs/FORMAT.md §10): the AES-GCM tag of each chunk; empty otherwise.
  std::vector<crypto::GcmTag> tags = {};

  bool compressed() const { return codec != codec::Codec::kNone; }
};

struct TensorRecord {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  std::vector<ShardRecord> shards;
};

struct Manifest {
  uint32_t version = kFormatVersion;
  uint64_t checkpoint_id = 0;  // random; also stamped in every data file header
  int64_t created_ns = 0;
  std::string writer;
  uint64_t chunk_bytes = uint64_t{8} << 20;
  std::vector<FileRecord> files;
  std::vector<TensorRecord> tensors;  // sorted by name
  State values;                       // values and metadata only (no tensors)
  // Encryption (docs/FORMAT.md §10): disabled unless the chunks are encrypted.
  EncryptionRecord encryption = {};
};

// Number of chunks of a shard of `bytes` bytes.
inline uint64_t NumChunks(uint64_t bytes, uint64_t chunk_bytes) {
  return bytes == 0 ? 0 : (bytes - 1) / chunk_bytes + 1;
}
inline uint64_t AlignUp(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
inline uint64_t AlignDown(uint64_t n) { return n / kAlignment * kAlignment; }
// The alignment of uncompressed extents in a checkpoint of format `version`.
inline uint64_t ExtentAlignment(uint32_t version) {
  return version >= 2 ? kPackAlignment : kAlignment;
}
// Raw size of chunk `chunk` of a shard of `bytes` bytes.
inline uint64_t ChunkLen(uint64_t bytes, uint64_t chunk, uint64_t chunk_bytes) {
  return std::min(chunk_bytes, bytes - chunk * chunk_bytes);
}
// File offset and stored size of chunk `chunk` of `s` (compressed or not).
inline uint64_t ChunkOffset(const ShardRecord& s, uint64_t chunk, uint64_t chunk_bytes) {
  return s.compressed() ? s.stored[chunk].offset : s.offset + chunk * chunk_bytes;
}
inline uint64_t ChunkStoredLen(const ShardRecord& s, uint64_t chunk, uint64_t chunk_bytes) {
  return s.compressed() ? s.stored[chunk].bytes : ChunkLen(s.bytes, chunk, chunk_bytes);
}
// Bytes of `s` as stored in its file, without padding (its `bytes` when uncompressed).
inline uint64_t StoredBytes(const ShardRecord& s) {
  if (!s.compressed()) return s.bytes;
  uint64_t n = 0;
  for (const StoredChunk& c : s.stored) n += c.bytes;
  return n;
}
// Whether any shard of `m` is compressed (then "compression" is a required feature).
bool UsesCompression(const Manifest& m);

// InvalidArgument naming tensor `name` when a dimension of `shape` is over kMaxDimension: a
// manifest cannot record it (DecodeManifest refuses it), so writers refuse it before writing.
Status CheckDimensions(std::string_view name, const Shape& shape);

// OK if `name` may be a file name inside a checkpoint: 1..255 bytes of [A-Za-z0-9._-], not
// starting with '.', so never "..", never a path.
Status ValidateFileName(std::string_view name);

// Rejects JSON text nested deeper than `max_depth` arrays/objects (Corruption "<where>: JSON nested
// too deeply"), cheaply, before it is handed to a parser.
Status CheckJsonDepth(std::string_view body, size_t max_depth, std::string_view where);

// One non-tensor value as an entry of the manifest's "values" array: {"name", "kind", "value"}
// (bytes in base64, non-finite floats as "nan", "inf", "-inf").
Json ValueToJson(const std::string& name, const Value& v);

// Decodes an array of such entries into `out` (values only). Errors are Corruption
// "<where>: values[i]: ...".
Status ValuesFromJson(const Json& values, std::string_view where, State* out);

// The manifest body as JSON (the documented, stable schema).
Json ManifestToJson(const Manifest& m);

// Header + body, ready to be written to MANIFEST. An encrypted manifest (m.encryption.enabled) is
// authenticated with `keys` (its MAC goes into the header); without keys its MAC is zero, which no
// reader accepts (tests use that to forge manifests).
std::string EncodeManifest(const Manifest& m, const CheckpointKeys* keys = nullptr);

// Parses and fully validates MANIFEST bytes. `where` names the file in error messages. An encrypted
// manifest is decoded (m.encryption holds its salt, key check and MAC) but not authenticated: that
// needs the key (AuthenticateManifest, format/encryption.h).
Result<Manifest> DecodeManifest(std::string_view bytes, std::string_view where);

// Corruption ("<where>: tensor "T": shards overlap" / "shards cover N of M elements") unless the
// shards of `t` tile its shape exactly; also for an invalid shape or a shard box outside it, so
// that untrusted boxes may be passed (the DCP import does). Used by DecodeManifest, the DCP import
// and the multi-rank save before it writes.
Status CheckTensorTiling(const TensorRecord& t, std::string_view where);

// The 4096-byte header of data file `file_index` of a checkpoint of format `version`.
std::string EncodeDataHeader(uint64_t checkpoint_id, uint32_t file_index,
                             uint32_t version = kFormatVersion);

// Checks a data file header against the manifest: magic, CRC, the manifest's format `version`
// (Unimplemented for a version this build cannot read), checkpoint id and file index.
Status CheckDataHeader(std::string_view header, uint64_t checkpoint_id, uint32_t file_index,
                       uint32_t version, std::string_view where);

}  // namespace savepoint::format

#endif  // SAVEPOINT_FORMAT_MANIFEST_H_
