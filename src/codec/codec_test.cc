// Tests of the per-chunk codecs (codec/codec.h): names, shuffle, round trips of every codec and
// filter, compression ratios, argument checks, and hostile input to DecompressChunk. Also run
// under ASan/UBSan and TSan.
#include "codec/codec.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "testutil/testutil.h"

namespace savepoint::codec {
namespace {

using ::savepoint::testing::StatusIs;

using Bytes = std::vector<std::byte>;

constexpr Codec kCodecs[] = {Codec::kNone, Codec::kZstd, Codec::kLz4};
constexpr Filter kFilters[] = {Filter::kNone, Filter::kShuffle};
constexpr size_t kElemSizes[] = {1, 2, 4, 8};
constexpr size_t kSizes[] = {0, 1, 7, 4096, (size_t{1} << 20) + 3};

std::string Describe(const CodecOptions& o, size_t elem_size, size_t size) {
  return fmt::format("codec={} filter={} level={} elem_size={} size={}", CodecName(o.codec),
                     FilterName(o.filter), o.level, elem_size, size);
}

Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

// Little-endian elements whose low byte is one of 16 values and whose other bytes come from a
// tiny alphabet, with every other 64-byte block a repeat of an earlier one: compressible by both
// codecs, with or without the shuffle filter.
Bytes StructuredBytes(size_t n, size_t elem_size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) {
    const bool low_byte = i % elem_size == 0;
    b[i] = static_cast<std::byte>(low_byte ? rng() % 16 : 0x3C + rng() % 3);
  }
  constexpr size_t kBlock = 64;
  for (size_t block = 2; block < n / kBlock; block += 2) {
    const size_t from = (rng() % (block / 2)) * 2 * kBlock;
    std::memcpy(b.data() + block * kBlock, b.data() + from, kBlock);
  }
  return b;
}

// f32 values from N(0, 0.02), like freshly initialised weights.
Bytes NormalF32(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  Bytes b(count * 4);
  for (size_t i = 0; i < count; ++i) {
    float v = dist(rng);
    std::memcpy(b.data() + 4 * i, &v, 4);
  }
  return b;
}

// Compresses `raw`; returns what is stored (the raw bytes when compressed=false).
struct Stored {
  Bytes bytes;
  bool compressed = false;
};

Stored Compress(const CodecOptions& o, size_t elem_size, const Bytes& raw) {
  Bytes out(MaxCompressedSize(o, raw.size()));
  Bytes scratch(raw.size());
  Result<CompressedChunk> r = CompressChunk(o, elem_size, raw, out, scratch);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok() || !r->compressed) return Stored{raw, false};
  out.resize(r->stored_bytes);
  return Stored{std::move(out), true};
}

// Decompresses into a buffer with guard bytes on both sides and checks the guards.
Status Decompress(const CodecOptions& o, size_t elem_size, const Bytes& stored, size_t raw_size,
                  Bytes* raw) {
  constexpr size_t kGuard = 64;
  constexpr std::byte kCanary{0xA5};
  Bytes buf(raw_size + 2 * kGuard, kCanary);
  Bytes scratch(raw_size + 2 * kGuard, kCanary);
  std::span<std::byte> out = std::span(buf).subspan(kGuard, raw_size);
  std::span<std::byte> tmp = std::span(scratch).subspan(kGuard, raw_size);
  Status s = DecompressChunk(o, elem_size, stored, out, tmp);
  for (size_t i = 0; i < kGuard; ++i) {
    EXPECT_EQ(buf[i], kCanary) << "write before raw_out";
    EXPECT_EQ(buf[kGuard + raw_size + i], kCanary) << "write past raw_out";
    EXPECT_EQ(scratch[i], kCanary) << "write before scratch";
    EXPECT_EQ(scratch[kGuard + raw_size + i], kCanary) << "write past scratch";
  }
  if (raw != nullptr) raw->assign(out.begin(), out.end());
  return s;
}

// Round-trips `raw` the way the pipeline does: a compressed=false chunk loads with CodecOptions{}.
void ExpectRoundTrip(const CodecOptions& o, size_t elem_size, const Bytes& raw) {
  const std::string what = Describe(o, elem_size, raw.size());
  Stored stored = Compress(o, elem_size, raw);
  if (stored.compressed) {
    EXPECT_LT(stored.bytes.size(), raw.size()) << what;
  } else {
    EXPECT_EQ(stored.bytes.size(), raw.size()) << what;
  }
  Bytes back;
  Status s = Decompress(stored.compressed ? o : CodecOptions{}, elem_size, stored.bytes, raw.size(),
                        &back);
  ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
  ASSERT_TRUE(back == raw) << what << ": round trip changed the bytes";
}

TEST(CodecNames, RoundTripAndUnknown) {
  for (Codec c : kCodecs) {
    EXPECT_EQ(CodecFromName(CodecName(c)), c);
  }
  for (Filter f : kFilters) {
    EXPECT_EQ(FilterFromName(FilterName(f)), f);
  }
  EXPECT_EQ(CodecName(Codec::kNone), "none");
  EXPECT_EQ(CodecName(Codec::kZstd), "zstd");
  EXPECT_EQ(CodecName(Codec::kLz4), "lz4");
  EXPECT_EQ(FilterName(Filter::kNone), "none");
  EXPECT_EQ(FilterName(Filter::kShuffle), "shuffle");
  for (std::string_view bad : {"", "ZSTD", "Lz4", "gzip", "zstd ", "shuffle"}) {
    EXPECT_FALSE(CodecFromName(bad).has_value()) << bad;
  }
  for (std::string_view bad : {"", "Shuffle", "bitshuffle", "zstd"}) {
    EXPECT_FALSE(FilterFromName(bad).has_value()) << bad;
  }
}

TEST(Shuffle, MatchesDefinitionAndUnshuffleInverts) {
  const uint64_t seed = testing::TestSeed("Shuffle.MatchesDefinitionAndUnshuffleInverts");
  for (size_t es = 1; es <= 17; ++es) {
    for (size_t size : {size_t{0}, size_t{1}, es - 1, es, 15 * es + 3, 16 * es, 16 * es + 1,
                        33 * es + es / 2, 1000 * es + 5}) {
      const Bytes in = RandomBytes(size, seed + es * 1000003 + size);
      Bytes out(size);
      Shuffle(es, in, out);
      const size_t n = size / es;
      Bytes expected(size);
      for (size_t i = 0; i < n; ++i) {
        for (size_t b = 0; b < es; ++b) expected[b * n + i] = in[i * es + b];
      }
      for (size_t t = n * es; t < size; ++t) expected[t] = in[t];
      ASSERT_TRUE(out == expected) << "elem_size " << es << " size " << size;
      Bytes back(size);
      Unshuffle(es, out, back);
      ASSERT_TRUE(back == in) << "elem_size " << es << " size " << size;
    }
  }
}

TEST(Shuffle, ElemSizeZeroIsACopyAndSizesAreClamped) {
  const Bytes in = RandomBytes(100, 7);
  Bytes out(100);
  Shuffle(0, in, out);
  EXPECT_TRUE(out == in);
  // A shorter `out` is never written past.
  Bytes small(51, std::byte{0});
  Shuffle(4, in, std::span(small).first(50));
  EXPECT_EQ(small[50], std::byte{0});
  Unshuffle(4, in, std::span(small).first(50));
  EXPECT_EQ(small[50], std::byte{0});
}

TEST(CodecRoundTrip, EveryCodecFilterElemSizeAndSize) {
  const uint64_t seed = testing::TestSeed("CodecRoundTrip.EveryCodecFilterElemSizeAndSize");
  for (Codec c : kCodecs) {
    for (Filter f : kFilters) {
      for (size_t es : kElemSizes) {
        for (size_t size : kSizes) {
          const CodecOptions o{c, f, 1};
          const Bytes raw = StructuredBytes(size, es, seed + size + es);
          ExpectRoundTrip(o, es, raw);
          if (c != Codec::kNone && size >= 4096) {
            // Structured data of this size always shrinks.
            EXPECT_TRUE(Compress(o, es, raw).compressed) << Describe(o, es, size);
          }
        }
      }
    }
  }
}

TEST(CodecRoundTrip, ZstdLevels) {
  const Bytes raw = NormalF32(50000, 1);
  for (int level : {-5, 0, 1, 3, 9, 19}) {
    ExpectRoundTrip({Codec::kZstd, Filter::kShuffle, level}, 4, raw);
    ExpectRoundTrip({Codec::kZstd, Filter::kNone, level}, 4, raw);
  }
}

TEST(CodecRoundTrip, NoneCodecNeverCompresses) {
  const Bytes raw(4096, std::byte{0});
  for (Filter f : kFilters) {
    Bytes out(4096), scratch(4096);
    Result<CompressedChunk> r = CompressChunk({Codec::kNone, f, 1}, 4, raw, out, scratch);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->compressed);
    EXPECT_EQ(r->stored_bytes, raw.size());
  }
}

TEST(CodecRoundTrip, IncompressibleDataIsStoredRawOrRoundTrips) {
  const uint64_t seed =
      testing::TestSeed("CodecRoundTrip.IncompressibleDataIsStoredRawOrRoundTrips");
  for (Codec c : {Codec::kZstd, Codec::kLz4}) {
    for (Filter f : kFilters) {
      for (size_t size : {size_t{1}, size_t{100}, size_t{65536}, size_t{1} << 20}) {
        const CodecOptions o{c, f, 3};
        const Bytes raw = RandomBytes(size, seed + size);
        Stored stored = Compress(o, 4, raw);
        EXPECT_FALSE(stored.compressed) << Describe(o, 4, size);
        ExpectRoundTrip(o, 4, raw);
      }
    }
  }
}

TEST(CodecRoundTrip, MostlyZeroDataCompressesTenfold) {
  const uint64_t seed = testing::TestSeed("CodecRoundTrip.MostlyZeroDataCompressesTenfold");
  std::mt19937_64 rng(seed);
  Bytes raw(1 << 20, std::byte{0});
  for (size_t i = 0; i < raw.size(); i += 4) {
    if (rng() % 100 == 0) raw[i + 3] = static_cast<std::byte>(rng());  // ~1% non-zero f32
  }
  for (Codec c : {Codec::kZstd, Codec::kLz4}) {
    for (Filter f : kFilters) {
      const CodecOptions o{c, f, 1};
      Stored stored = Compress(o, 4, raw);
      ASSERT_TRUE(stored.compressed) << Describe(o, 4, raw.size());
      EXPECT_GT(raw.size(), 10 * stored.bytes.size())
          << Describe(o, 4, raw.size()) << " stored " << stored.bytes.size();
      ExpectRoundTrip(o, 4, raw);
    }
  }
}

TEST(CodecRoundTrip, ShuffleHelpsFloatWeights) {
  const Bytes raw = NormalF32(1 << 18, 42);  // 1 MiB of f32
  for (Codec c : {Codec::kZstd, Codec::kLz4}) {
    const size_t plain = Compress({c, Filter::kNone, 1}, 4, raw).bytes.size();
    const size_t shuffled = Compress({c, Filter::kShuffle, 1}, 4, raw).bytes.size();
    EXPECT_LT(shuffled, plain) << CodecName(c);
  }
}

TEST(CodecRoundTrip, SmallOutBufferMeansStoreRaw) {
  const Bytes raw = StructuredBytes(4096, 4, 3);
  for (Codec c : {Codec::kZstd, Codec::kLz4}) {
    Bytes out(8), scratch(4096);
    Result<CompressedChunk> r = CompressChunk({c, Filter::kShuffle, 1}, 4, raw, out, scratch);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->compressed);
    EXPECT_EQ(r->stored_bytes, raw.size());
  }
}

TEST(CodecArguments, BadOptionsAreInvalidArgument) {
  const Bytes raw = StructuredBytes(4096, 4, 5);
  Bytes out(MaxCompressedSize({Codec::kZstd}, raw.size())), scratch(raw.size()), small(100);
  auto code = [&](const CodecOptions& o, size_t es, std::span<std::byte> s) {
    return CompressChunk(o, es, raw, out, s).status().code();
  };
  EXPECT_EQ(code({Codec::kZstd, Filter::kNone, ZSTD_maxCLevel() + 1}, 4, scratch),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code({Codec::kZstd, Filter::kNone, ZSTD_minCLevel() - 1}, 4, scratch),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code({Codec::kLz4, Filter::kShuffle, 1}, 0, scratch), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({Codec::kLz4, Filter::kShuffle, 1}, 4, small), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({static_cast<Codec>(9), Filter::kNone, 1}, 4, scratch),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code({Codec::kZstd, static_cast<Filter>(9), 1}, 4, scratch),
            StatusCode::kInvalidArgument);
  // Scratch is not needed without the filter or with 1-byte elements.
  EXPECT_EQ(code({Codec::kZstd, Filter::kNone, 1}, 4, {}), StatusCode::kOk);
  EXPECT_EQ(code({Codec::kZstd, Filter::kShuffle, 1}, 1, {}), StatusCode::kOk);

  Stored stored = Compress({Codec::kZstd, Filter::kShuffle, 1}, 4, raw);
  ASSERT_TRUE(stored.compressed);
  Bytes back(raw.size());
  EXPECT_EQ(
      DecompressChunk({Codec::kZstd, Filter::kShuffle, 1}, 4, stored.bytes, back, small).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      DecompressChunk({Codec::kZstd, Filter::kShuffle, 1}, 0, stored.bytes, back, scratch).code(),
      StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Hostile input to DecompressChunk.

// Every (codec, filter) pair that stores compressed data.
std::vector<CodecOptions> CompressingOptions() {
  std::vector<CodecOptions> all;
  for (Codec c : {Codec::kZstd, Codec::kLz4}) {
    for (Filter f : kFilters) all.push_back({c, f, 1});
  }
  return all;
}

TEST(CodecHostile, NoneCodecSizeMismatchIsCorruption) {
  const Bytes stored(100, std::byte{1});
  for (size_t size : {size_t{0}, size_t{99}, size_t{101}}) {
    EXPECT_THAT(Decompress({}, 4, stored, size, nullptr), StatusIs(StatusCode::kCorruption))
        << size;
  }
}

TEST(CodecHostile, RandomBytes) {
  const uint64_t seed = testing::TestSeed("CodecHostile.RandomBytes");
  for (const CodecOptions& o : CompressingOptions()) {
    int corrupt = 0;
    int trials = 0;
    for (size_t stored_size : {size_t{0}, size_t{1}, size_t{5}, size_t{64}, size_t{4096}}) {
      for (size_t raw_size : {size_t{0}, size_t{1}, size_t{100}, size_t{4096}}) {
        for (uint64_t k = 0; k < 4; ++k) {
          const Bytes stored = RandomBytes(stored_size, seed + k + stored_size * 31 + raw_size);
          Status s = Decompress(o, 4, stored, raw_size, nullptr);
          ++trials;
          if (!s.ok()) {
            EXPECT_THAT(s, StatusIs(StatusCode::kCorruption));
            ++corrupt;
          }
          if (o.codec == Codec::kZstd) {
            // Random bytes never carry the zstd magic number: always rejected.
            EXPECT_THAT(s, StatusIs(StatusCode::kCorruption)) << Describe(o, 4, raw_size);
          }
        }
      }
    }
    EXPECT_GT(corrupt, trials / 2) << CodecName(o.codec);
  }
}

TEST(CodecHostile, TruncatedFramesAreCorruption) {
  const Bytes raw = StructuredBytes(4096, 4, 11);
  for (const CodecOptions& o : CompressingOptions()) {
    Stored stored = Compress(o, 4, raw);
    ASSERT_TRUE(stored.compressed);
    for (size_t len = 0; len < stored.bytes.size(); ++len) {
      const Bytes prefix(stored.bytes.begin(), stored.bytes.begin() + len);
      Status s = Decompress(o, 4, prefix, raw.size(), nullptr);
      EXPECT_THAT(s, StatusIs(StatusCode::kCorruption))
          << Describe(o, 4, raw.size()) << " prefix " << len << ": " << s.ToString();
    }
  }
}

TEST(CodecHostile, TrailingBytesAreCorruption) {
  const Bytes raw = StructuredBytes(4096, 4, 12);
  for (const CodecOptions& o : CompressingOptions()) {
    Stored stored = Compress(o, 4, raw);
    ASSERT_TRUE(stored.compressed);
    Bytes extended = stored.bytes;
    extended.push_back(std::byte{0});
    EXPECT_THAT(Decompress(o, 4, extended, raw.size(), nullptr), StatusIs(StatusCode::kCorruption))
        << Describe(o, 4, raw.size());
    Bytes twice = stored.bytes;
    twice.insert(twice.end(), stored.bytes.begin(), stored.bytes.end());
    EXPECT_THAT(Decompress(o, 4, twice, raw.size(), nullptr), StatusIs(StatusCode::kCorruption))
        << Describe(o, 4, raw.size());
    EXPECT_THAT(Decompress(o, 4, twice, 2 * raw.size(), nullptr), StatusIs(StatusCode::kCorruption))
        << Describe(o, 4, raw.size());
  }
}

TEST(CodecHostile, ValidFrameOfAnotherLengthIsCorruption) {
  const Bytes raw = StructuredBytes(4096, 4, 13);
  for (const CodecOptions& o : CompressingOptions()) {
    Stored stored = Compress(o, 4, raw);
    ASSERT_TRUE(stored.compressed);
    for (size_t size : {size_t{0}, size_t{1}, size_t{2048}, size_t{4092}, size_t{4095},
                        size_t{4097}, size_t{4100}, size_t{8192}, size_t{1} << 20}) {
      Status s = Decompress(o, 4, stored.bytes, size, nullptr);
      EXPECT_THAT(s, StatusIs(StatusCode::kCorruption))
          << Describe(o, 4, raw.size()) << " into " << size << ": " << s.ToString();
    }
  }
}

// A zstd frame without a content size is accepted only if it decodes to exactly raw_out.size().
TEST(CodecHostile, ZstdFrameWithoutContentSize) {
  const Bytes raw = StructuredBytes(4096, 1, 14);
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ASSERT_NE(cctx, nullptr);
  ASSERT_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
  Bytes frame(ZSTD_compressBound(raw.size()));
  const size_t n = ZSTD_compress2(cctx, frame.data(), frame.size(), raw.data(), raw.size());
  ZSTD_freeCCtx(cctx);
  ASSERT_FALSE(ZSTD_isError(n));
  frame.resize(n);
  ASSERT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  const CodecOptions o{Codec::kZstd, Filter::kNone, 1};
  Bytes back;
  SP_EXPECT_OK(Decompress(o, 1, frame, raw.size(), &back));
  EXPECT_TRUE(back == raw);
  for (size_t size : {size_t{0}, size_t{4095}, size_t{4097}, size_t{100000}}) {
    EXPECT_THAT(Decompress(o, 1, frame, size, nullptr), StatusIs(StatusCode::kCorruption)) << size;
  }
}

// A frame header that declares a huge content size is rejected before anything is decoded.
TEST(CodecHostile, ZstdHugeDeclaredContentSize) {
  // Magic, then a frame header descriptor: 8-byte content size field (bits 7-6 = 3), single
  // segment (bit 5), then the content size 2^60, then a last raw block of 3 bytes.
  Bytes frame = {std::byte{0x28}, std::byte{0xB5}, std::byte{0x2F}, std::byte{0xFD},
                 std::byte{0xE0}};
  const uint64_t huge = uint64_t{1} << 60;
  for (int i = 0; i < 8; ++i) frame.push_back(static_cast<std::byte>(huge >> (8 * i)));
  const uint32_t block_header = 1 | (0 << 1) | (3 << 3);  // last, raw, size 3
  for (int i = 0; i < 3; ++i) frame.push_back(static_cast<std::byte>(block_header >> (8 * i)));
  for (int i = 0; i < 3; ++i) frame.push_back(std::byte{'x'});
  ASSERT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), huge);
  for (size_t size : {size_t{0}, size_t{3}, size_t{4096}}) {
    Status s = Decompress({Codec::kZstd, Filter::kShuffle, 1}, 2, frame, size, nullptr);
    EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "declares"));
  }
}

// Every single-byte corruption of a small compressed chunk: an error is Corruption, nothing is
// written outside the buffers, and nothing crashes. The codecs carry no checksum, so a corruption
// that still decodes to the right length (e.g. in a literal) may go unnoticed here; the chunk's
// CRC32C catches those.
TEST(CodecHostile, EverySingleByteCorruption) {
  const Bytes raw = StructuredBytes(4096, 4, 15);
  for (const CodecOptions& o : CompressingOptions()) {
    Stored stored = Compress(o, 4, raw);
    ASSERT_TRUE(stored.compressed);
    int detected = 0;
    int trials = 0;
    for (size_t pos = 0; pos < stored.bytes.size(); ++pos) {
      for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x10}, uint8_t{0x80}, uint8_t{0xFF}}) {
        Bytes bad = stored.bytes;
        bad[pos] ^= static_cast<std::byte>(flip);
        Status s = Decompress(o, 4, bad, raw.size(), nullptr);
        ++trials;
        if (!s.ok()) {
          ++detected;
          ASSERT_THAT(s, StatusIs(StatusCode::kCorruption))
              << Describe(o, 4, raw.size()) << " pos " << pos << ": " << s.ToString();
        }
      }
    }
    EXPECT_GT(detected, 0) << Describe(o, 4, raw.size()) << " trials " << trials;
  }
}

// Round trips from several threads at once (thread_local zstd contexts; run under TSan).
TEST(CodecThreads, ConcurrentRoundTrips) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 8; ++i) {
        for (const CodecOptions& o : CompressingOptions()) {
          ExpectRoundTrip(o, 2, StructuredBytes(65536 + 2 * i + 1, 2, t * 100 + i));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace
}  // namespace savepoint::codec
