#include "codec/codec.h"

#include <lz4.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace savepoint::codec {

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kZstd:
      return "zstd";
    case Codec::kLz4:
      return "lz4";
  }
  return "unknown";
}

std::optional<Codec> CodecFromName(std::string_view name) {
  for (Codec c : {Codec::kNone, Codec::kZstd, Codec::kLz4}) {
    if (CodecName(c) == name) return c;
  }
  return std::nullopt;
}

std::string_view FilterName(Filter filter) {
  switch (filter) {
    case Filter::kNone:
      return "none";
    case Filter::kShuffle:
      return "shuffle";
  }
  return "unknown";
}

std::optional<Filter> FilterFromName(std::string_view name) {
  for (Filter f : {Filter::kNone, Filter::kShuffle}) {
    if (FilterName(f) == name) return f;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Shuffle / Unshuffle.

namespace {

// Scalar byte-plane transpose of elements [first, n) of kElem bytes (kElem 0: run-time
// elem_size), one plane at a time: sequential writes, strided reads.
template <size_t kElem>
void ShuffleScalar(size_t elem_size, const std::byte* in, std::byte* out, size_t first, size_t n) {
  const size_t es = kElem != 0 ? kElem : elem_size;
  for (size_t b = 0; b < es; ++b) {
    for (size_t i = first; i < n; ++i) out[b * n + i] = in[i * es + b];
  }
}

template <size_t kElem>
void UnshuffleScalar(size_t elem_size, const std::byte* in, std::byte* out, size_t first,
                     size_t n) {
  const size_t es = kElem != 0 ? kElem : elem_size;
  for (size_t b = 0; b < es; ++b) {
    for (size_t i = first; i < n; ++i) out[i * es + b] = in[b * n + i];
  }
}

#if defined(__SSE2__)

// SSE2 (every x86-64 CPU): blocks of 16 elements of kElem (2, 4, 8 or 16) bytes, i.e. kElem
// registers in, one 16-byte register per byte plane out. The loops over kElem are unrolled
// completely so that v and w stay in registers (without the pragmas GCC -O2 spills them).
constexpr size_t kBlock = 16;

inline __m128i Load(const std::byte* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline void Store(std::byte* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

// The even-indexed bytes of a then b (a de-interleave by 2), and the odd-indexed bytes.
inline __m128i EvenBytes(__m128i a, __m128i b) {
  const __m128i mask = _mm_set1_epi16(0x00FF);
  return _mm_packus_epi16(_mm_and_si128(a, mask), _mm_and_si128(b, mask));
}
inline __m128i OddBytes(__m128i a, __m128i b) {
  return _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
}

// Plane b of a block ends up in register BitReverse(b) of ShuffleBlock's rounds.
template <size_t kElem>
constexpr size_t BitReverse(size_t k) {
  size_t r = 0;
  for (size_t bit = 1, rbit = kElem / 2; bit < kElem; bit *= 2, rbit /= 2) {
    if (k & bit) r |= rbit;
  }
  return r;
}

// Each round splits every stream of registers into its even and odd bytes, separating one bit of
// the byte index, lowest first.
template <size_t kElem>
void ShuffleBlock(const std::byte* in, std::byte* out, size_t n) {
  __m128i v[kElem];
  __m128i w[kElem];
#pragma GCC unroll 16
  for (size_t k = 0; k < kElem; ++k) v[k] = Load(in + 16 * k);
#pragma GCC unroll 4
  for (size_t width = kElem; width > 1; width /= 2) {
    // v holds kElem / width streams of `width` registers; stream s becomes 2s and 2s + 1.
#pragma GCC unroll 8
    for (size_t j = 0; j < kElem / 2; ++j) {
      const size_t s = j / (width / 2);
      const size_t r = j % (width / 2);
      const __m128i a = v[s * width + 2 * r];
      const __m128i b = v[s * width + 2 * r + 1];
      w[2 * s * (width / 2) + r] = EvenBytes(a, b);
      w[(2 * s + 1) * (width / 2) + r] = OddBytes(a, b);
    }
#pragma GCC unroll 16
    for (size_t k = 0; k < kElem; ++k) v[k] = w[k];
  }
#pragma GCC unroll 16
  for (size_t k = 0; k < kElem; ++k) Store(out + BitReverse<kElem>(k) * n, v[k]);
}

// Interleaves units of `bytes` bytes (1, 2, 4 or 8) of a and b.
inline __m128i UnpackLo(__m128i a, __m128i b, size_t bytes) {
  if (bytes == 1) return _mm_unpacklo_epi8(a, b);
  if (bytes == 2) return _mm_unpacklo_epi16(a, b);
  if (bytes == 4) return _mm_unpacklo_epi32(a, b);
  return _mm_unpacklo_epi64(a, b);
}
inline __m128i UnpackHi(__m128i a, __m128i b, size_t bytes) {
  if (bytes == 1) return _mm_unpackhi_epi8(a, b);
  if (bytes == 2) return _mm_unpackhi_epi16(a, b);
  if (bytes == 4) return _mm_unpackhi_epi32(a, b);
  return _mm_unpackhi_epi64(a, b);
}

// Inverse of ShuffleBlock. Before a round, v[g * blocks + e] holds units of `bytes` bytes (plane
// group g of the elements of block e); the round interleaves groups 2h and 2h + 1, which doubles
// the unit and splits each element block in two.
template <size_t kElem>
void UnshuffleBlock(const std::byte* in, std::byte* out, size_t n) {
  __m128i v[kElem];
  __m128i w[kElem];
#pragma GCC unroll 16
  for (size_t b = 0; b < kElem; ++b) v[b] = Load(in + b * n);
#pragma GCC unroll 4
  for (size_t bytes = 1, blocks = 1; bytes < kElem; bytes *= 2, blocks *= 2) {
#pragma GCC unroll 8
    for (size_t j = 0; j < kElem / 2; ++j) {
      const size_t h = j / blocks;
      const size_t e = j % blocks;
      const __m128i first = v[2 * h * blocks + e];
      const __m128i second = v[(2 * h + 1) * blocks + e];
      w[2 * h * blocks + 2 * e] = UnpackLo(first, second, bytes);
      w[2 * h * blocks + 2 * e + 1] = UnpackHi(first, second, bytes);
    }
#pragma GCC unroll 16
    for (size_t k = 0; k < kElem; ++k) v[k] = w[k];
  }
#pragma GCC unroll 16
  for (size_t k = 0; k < kElem; ++k) Store(out + 16 * k, v[k]);
}

template <size_t kElem>
void ShuffleFixed(const std::byte* in, std::byte* out, size_t n) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) ShuffleBlock<kElem>(in + i * kElem, out + i, n);
  ShuffleScalar<kElem>(kElem, in, out, i, n);
}

template <size_t kElem>
void UnshuffleFixed(const std::byte* in, std::byte* out, size_t n) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) UnshuffleBlock<kElem>(in + i, out + i * kElem, n);
  UnshuffleScalar<kElem>(kElem, in, out, i, n);
}

#else  // !__SSE2__

template <size_t kElem>
void ShuffleFixed(const std::byte* in, std::byte* out, size_t n) {
  ShuffleScalar<kElem>(kElem, in, out, 0, n);
}

template <size_t kElem>
void UnshuffleFixed(const std::byte* in, std::byte* out, size_t n) {
  UnshuffleScalar<kElem>(kElem, in, out, 0, n);
}

#endif  // __SSE2__

void CopyBytes(const std::byte* in, std::byte* out, size_t size) {
  if (size > 0) std::memcpy(out, in, size);
}

}  // namespace

namespace {

// Shared dispatch of Shuffle and Unshuffle: fixed-width fast paths for common element sizes, a
// scalar loop otherwise; trailing bytes that do not form a whole element are copied as they are.
template <bool kForward>
void Reorder(size_t elem_size, std::span<const std::byte> in, std::span<std::byte> out) {
  const size_t size = std::min(in.size(), out.size());
  const size_t es = std::max<size_t>(elem_size, 1);
  const size_t n = size / es;
  auto fixed = [&](auto width) {
    if constexpr (kForward) {
      ShuffleFixed<decltype(width)::value>(in.data(), out.data(), n);
    } else {
      UnshuffleFixed<decltype(width)::value>(in.data(), out.data(), n);
    }
  };
  switch (es) {
    case 1:
      return CopyBytes(in.data(), out.data(), size);
    case 2:
      fixed(std::integral_constant<size_t, 2>{});
      break;
    case 4:
      fixed(std::integral_constant<size_t, 4>{});
      break;
    case 8:
      fixed(std::integral_constant<size_t, 8>{});
      break;
    case 16:
      fixed(std::integral_constant<size_t, 16>{});
      break;
    default:
      if constexpr (kForward) {
        ShuffleScalar<0>(es, in.data(), out.data(), 0, n);
      } else {
        UnshuffleScalar<0>(es, in.data(), out.data(), 0, n);
      }
  }
  CopyBytes(in.data() + n * es, out.data() + n * es, size - n * es);
}

}  // namespace

void Shuffle(size_t elem_size, std::span<const std::byte> in, std::span<std::byte> out) {
  Reorder<true>(elem_size, in, out);
}

void Unshuffle(size_t elem_size, std::span<const std::byte> in, std::span<std::byte> out) {
  Reorder<false>(elem_size, in, out);
}

// ---------------------------------------------------------------------------------------------
// Codecs.

namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* ctx) const { ZSTD_freeCCtx(ctx); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* ctx) const { ZSTD_freeDCtx(ctx); }
};

// This thread's zstd contexts, created on first use; nullptr if allocation failed.
ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

std::string Num(size_t n) { return std::to_string(n); }

bool UsesShuffle(const CodecOptions& options, size_t elem_size) {
  return options.filter == Filter::kShuffle && elem_size > 1;
}

// Checks what both directions need: known enums, a usable elem_size and enough scratch.
Status CheckCommon(const CodecOptions& options, size_t elem_size, size_t raw_bytes,
                   size_t scratch_bytes) {
  if (options.codec != Codec::kNone && options.codec != Codec::kZstd &&
      options.codec != Codec::kLz4) {
    return InvalidArgumentError("unknown codec " + Num(static_cast<size_t>(options.codec)));
  }
  if (options.filter != Filter::kNone && options.filter != Filter::kShuffle) {
    return InvalidArgumentError("unknown filter " + Num(static_cast<size_t>(options.filter)));
  }
  if (options.filter == Filter::kShuffle && elem_size == 0) {
    return InvalidArgumentError("shuffle filter needs an element size of at least 1 byte");
  }
  if (options.codec != Codec::kNone && UsesShuffle(options, elem_size) &&
      scratch_bytes < raw_bytes) {
    return InvalidArgumentError("codec scratch buffer too small: " + Num(scratch_bytes) +
                                " bytes for a chunk of " + Num(raw_bytes) + " bytes");
  }
  if (options.codec == Codec::kLz4 && raw_bytes > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) {
    return InvalidArgumentError("chunk of " + Num(raw_bytes) + " bytes is too large for lz4 (max " +
                                Num(LZ4_MAX_INPUT_SIZE) + ")");
  }
  return Status::OK();
}

// Compresses `in` into `out`; 0 when the result does not fit in `out`.
Result<size_t> ZstdCompress(int level, std::span<const std::byte> in, std::span<std::byte> out) {
  ZSTD_CCtx* cctx = ThreadCCtx();
  if (cctx == nullptr) return ResourceExhaustedError("cannot allocate a zstd compression context");
  size_t n = ZSTD_compressCCtx(cctx, out.data(), out.size(), in.data(), in.size(), level);
  if (ZSTD_isError(n)) {
    if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall) return size_t{0};
    return InternalError(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
  return n;
}

size_t Lz4Compress(std::span<const std::byte> in, std::span<std::byte> out) {
  const int capacity = static_cast<int>(std::min<size_t>(out.size(), INT_MAX));
  const int n = LZ4_compress_default(reinterpret_cast<const char*>(in.data()),
                                     reinterpret_cast<char*>(out.data()),
                                     static_cast<int>(in.size()), capacity);
  return n > 0 ? static_cast<size_t>(n) : 0;
}

// Decompresses one zstd frame that must fill `out` exactly.
Status ZstdDecompress(std::span<const std::byte> in, std::span<std::byte> out) {
  const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR) return CorruptionError("not a valid zstd frame header");
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != out.size()) {
    return CorruptionError("zstd frame declares " + std::to_string(declared) +
                           " content bytes, expected " + Num(out.size()));
  }
  const size_t frame = ZSTD_findFrameCompressedSize(in.data(), in.size());
  if (ZSTD_isError(frame)) {
    return CorruptionError(std::string("malformed zstd frame: ") + ZSTD_getErrorName(frame));
  }
  if (frame != in.size()) {
    return CorruptionError("zstd frame is " + Num(frame) + " bytes but the stored chunk is " +
                           Num(in.size()) + " bytes");
  }
  ZSTD_DCtx* dctx = ThreadDCtx();
  if (dctx == nullptr) {
    return ResourceExhaustedError("cannot allocate a zstd decompression context");
  }
  const size_t n = ZSTD_decompressDCtx(dctx, out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(n)) {
    return CorruptionError(std::string("zstd decompression failed: ") + ZSTD_getErrorName(n));
  }
  if (n != out.size()) {
    return CorruptionError("zstd frame decoded to " + Num(n) + " bytes, expected " +
                           Num(out.size()));
  }
  return Status::OK();
}

// Decompresses one LZ4 block that must fill `out` exactly.
Status Lz4Decompress(std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() > static_cast<size_t>(INT_MAX)) {
    return CorruptionError("lz4 block of " + Num(in.size()) + " bytes is too large");
  }
  const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()),
                                    reinterpret_cast<char*>(out.data()),
                                    static_cast<int>(in.size()), static_cast<int>(out.size()));
  if (n < 0) {
    return CorruptionError(
        "lz4 decompression failed: malformed block, or it decodes to more than " + Num(out.size()) +
        " bytes");
  }
  if (static_cast<size_t>(n) != out.size()) {
    return CorruptionError("lz4 block decoded to " + Num(static_cast<size_t>(n)) +
                           " bytes, expected " + Num(out.size()));
  }
  return Status::OK();
}

}  // namespace

size_t MaxCompressedSize(const CodecOptions& options, size_t raw_bytes) {
  switch (options.codec) {
    case Codec::kNone:
      return raw_bytes;
    case Codec::kZstd:
      return ZSTD_compressBound(raw_bytes);
    case Codec::kLz4:
      // LZ4_COMPRESSBOUND's formula, without its int limit (larger chunks are rejected anyway).
      return raw_bytes + raw_bytes / 255 + 16;
  }
  return raw_bytes;
}

Result<CompressedChunk> CompressChunk(const CodecOptions& options, size_t elem_size,
                                      std::span<const std::byte> raw, std::span<std::byte> out,
                                      std::span<std::byte> scratch) {
  SP_RETURN_IF_ERROR(CheckCommon(options, elem_size, raw.size(), scratch.size()));
  if (options.codec == Codec::kZstd &&
      (options.level < ZSTD_minCLevel() || options.level > ZSTD_maxCLevel())) {
    return InvalidArgumentError("zstd level " + std::to_string(options.level) +
                                " is out of range [" + std::to_string(ZSTD_minCLevel()) + ", " +
                                std::to_string(ZSTD_maxCLevel()) + "]");
  }
  const CompressedChunk as_raw{raw.size(), false};
  if (options.codec == Codec::kNone || raw.empty()) return as_raw;
  std::span<const std::byte> input = raw;
  if (UsesShuffle(options, elem_size)) {
    Shuffle(elem_size, raw, scratch.first(raw.size()));
    input = scratch.first(raw.size());
  }
  size_t stored = 0;
  if (options.codec == Codec::kZstd) {
    SP_ASSIGN_OR_RETURN(stored, ZstdCompress(options.level, input, out));
  } else {
    stored = Lz4Compress(input, out);
  }
  if (stored == 0 || stored >= raw.size()) return as_raw;
  return CompressedChunk{stored, true};
}

Status DecompressChunk(const CodecOptions& options, size_t elem_size,
                       std::span<const std::byte> stored, std::span<std::byte> raw_out,
                       std::span<std::byte> scratch) {
  SP_RETURN_IF_ERROR(CheckCommon(options, elem_size, raw_out.size(), scratch.size()));
  if (options.codec == Codec::kNone) {
    if (stored.size() != raw_out.size()) {
      return CorruptionError("uncompressed chunk is " + Num(stored.size()) + " bytes, expected " +
                             Num(raw_out.size()));
    }
    CopyBytes(stored.data(), raw_out.data(), raw_out.size());
    return Status::OK();
  }
  const bool shuffled = UsesShuffle(options, elem_size);
  std::span<std::byte> target = shuffled ? scratch.first(raw_out.size()) : raw_out;
  if (options.codec == Codec::kZstd) {
    SP_RETURN_IF_ERROR(ZstdDecompress(stored, target));
  } else {
    SP_RETURN_IF_ERROR(Lz4Decompress(stored, target));
  }
  if (shuffled) Unshuffle(elem_size, target, raw_out);
  return Status::OK();
}

}  // namespace savepoint::codec
