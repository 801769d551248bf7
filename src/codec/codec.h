// Per-chunk compression: an optional byte-shuffle filter followed by a general-purpose codec
// (zstd or lz4), and the checked inverse used when loading.
//
// A chunk is compressed on its own, with no state shared between chunks, so chunks can be
// compressed and decompressed in any order on any thread. The save pipeline calls CompressChunk on
// each chunk and, when it reports `compressed == false`, stores the raw bytes as they are (no
// filter, no codec) and records that per chunk; the load pipeline calls DecompressChunk for the
// chunks stored compressed and copies the others.
//
// On-disk names: the codec and filter of a chunk are recorded by their stable names (CodecName,
// FilterName), never by their numeric enum values. Never rename one: old checkpoints would stop
// loading.
//
// Ownership: no function keeps a pointer to any span it is given; every buffer belongs to the
// caller.
//
// Thread safety: every function is reentrant and may be called concurrently from any number of
// threads. Each thread lazily creates and keeps one zstd compression context and one zstd
// decompression context (thread_local), freed when the thread exits.
#ifndef SAVEPOINT_CODEC_CODEC_H_
#define SAVEPOINT_CODEC_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "savepoint/status.h"

namespace savepoint::codec {

// The general-purpose compressor applied to a chunk (after the filter).
enum class Codec : uint8_t {
  kNone,  // "none": stored as is
  kZstd,  // "zstd": one zstd frame that records its content size
  kLz4,   // "lz4": one LZ4 block (raw block format, no frame header)
};

// Stable on-disk name: "none", "zstd" or "lz4".
std::string_view CodecName(Codec codec);

// Inverse of CodecName; nullopt for an unknown name. Case-sensitive.
std::optional<Codec> CodecFromName(std::string_view name);

// A reversible transform applied to the chunk before the codec.
enum class Filter : uint8_t {
  kNone,     // "none"
  kShuffle,  // "shuffle": byte planes of elem_size-byte elements (see Shuffle)
};

// Stable on-disk name: "none" or "shuffle".
std::string_view FilterName(Filter filter);

// Inverse of FilterName; nullopt for an unknown name. Case-sensitive.
std::optional<Filter> FilterFromName(std::string_view name);

struct CodecOptions {
  Codec codec = Codec::kNone;
  Filter filter = Filter::kNone;
  // zstd compression level, in [ZSTD_minCLevel(), ZSTD_maxCLevel()]; 1 is fast. Ignored by lz4 and
  // by decompression.
  int level = 1;
};

// What CompressChunk produced.
struct CompressedChunk {
  // Bytes to store: the compressed size when `compressed`, else the raw size.
  size_t stored_bytes = 0;
  // true: `out` holds `stored_bytes` bytes of filtered + compressed data. false: compression did
  // not make the chunk smaller (or the codec is kNone); store the raw bytes as they are,
  // unfiltered and uncompressed. `out` then holds nothing useful.
  bool compressed = false;
};

// The `out` size that CompressChunk needs so that no compressible chunk of `raw_bytes` bytes is
// reported incompressible for lack of room.
size_t MaxCompressedSize(const CodecOptions& options, size_t raw_bytes);

// Filters `raw` (into `scratch`) and compresses the result into `out`.
//
// `elem_size` is the element size in bytes that the shuffle filter uses (ignored without it; must
// be >= 1 with it). `scratch` needs raw.size() bytes when the filter is kShuffle and elem_size > 1,
// and may be empty otherwise. `out` should hold MaxCompressedSize(options, raw.size()) bytes; a
// smaller `out` is allowed and output that does not fit counts as "did not shrink".
//
// Returns compressed=false when the stored form would not be smaller than raw.size() (always for
// Codec::kNone and for an empty chunk). Errors: InvalidArgument for bad options or short
// buffers (level out of range, elem_size 0 with the shuffle filter, scratch too small, a chunk too
// large for lz4); ResourceExhausted if a zstd context cannot be allocated; Internal if the codec
// fails otherwise.
Result<CompressedChunk> CompressChunk(const CodecOptions& options, size_t elem_size,
                                      std::span<const std::byte> raw, std::span<std::byte> out,
                                      std::span<std::byte> scratch);

// Reverses CompressChunk for a chunk it reported `compressed == true`: decompresses `stored` and
// undoes the filter, producing exactly raw_out.size() bytes into `raw_out`. `options` and
// `elem_size` must be those given to CompressChunk. `scratch` needs raw_out.size() bytes when the
// filter is kShuffle and elem_size > 1, and may be empty otherwise.
//
// With Codec::kNone, `stored` is copied to `raw_out` as is (no filter), so a chunk stored with
// compressed=false can also be loaded by passing CodecOptions{}.
//
// `stored` is untrusted: a decompressor error, output of any size other than raw_out.size(),
// trailing bytes after the compressed data, or any other malformed input returns Corruption (the
// caller adds tensor and chunk context). Never writes outside `raw_out` and `scratch`; on error
// their contents are unspecified. The codecs carry no checksum of their own: a corruption that
// still decodes to raw_out.size() bytes (e.g. a flipped literal byte) is not detected here, which
// is what the chunk's CRC32C is for. Errors for bad arguments: InvalidArgument (as for
// CompressChunk); ResourceExhausted if a zstd context cannot be allocated.
Status DecompressChunk(const CodecOptions& options, size_t elem_size,
                       std::span<const std::byte> stored, std::span<std::byte> raw_out,
                       std::span<std::byte> scratch);

// Byte-shuffle: views `in` as n = in.size() / elem_size elements of elem_size bytes and writes
// their byte planes to `out`: byte 0 of every element, then byte 1 of every element, and so on,
// i.e. out[b * n + i] = in[i * elem_size + b]. The in.size() % elem_size tail bytes are copied
// unchanged to the end of `out`. `in` and `out` must not overlap and should be the same size
// (otherwise only the first min(in.size(), out.size()) bytes are transformed); elem_size 0 is
// treated as 1 (a plain copy). elem_size 2, 4, 8 and 16 have SIMD (SSE2) fast paths.
void Shuffle(size_t elem_size, std::span<const std::byte> in, std::span<std::byte> out);

// Inverse of Shuffle, with the same requirements: Unshuffle(e, Shuffle(e, x)) == x.
void Unshuffle(size_t elem_size, std::span<const std::byte> in, std::span<std::byte> out);

}  // namespace savepoint::codec

#endif  // SAVEPOINT_CODEC_CODEC_H_
