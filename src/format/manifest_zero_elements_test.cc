// Zero-element tensors with huge and near-overflow dimensions in a MANIFEST (issue 37: all
// arithmetic on numbers read from a file is checked). docs/FORMAT.md caps every dimension at 2^62
// and requires element and byte counts to fit in int64, so [0, 2^62] and [2^62, 0] decode as the
// zero-element tensors they are, while [0, 2^63-1], [2^62, 2^62, 0] and negative dims are
// Corruption naming the manifest and the tensor. Shards whose element counts add up past INT64_MAX
// (the same 2^62-element box twice) are an overlap, found without signed overflow.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "format/endian.h"
#include "format/manifest.h"
#include "io/mem_fs.h"
#include "savepoint/checkpoint.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::format {
namespace {

using ::savepoint::testing::StatusIs;

constexpr std::string_view kWhere = "/zero/MANIFEST";
constexpr uint64_t kId = 0x2a;
constexpr uint64_t k2p62 = uint64_t{1} << 62;
constexpr uint64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// A manifest body of one tensor "t" (`dtype`, `shape`) stored as `shards` in one data file of
// `file_bytes` bytes.
Json Body(const std::string& dtype, const Json& shape, const std::vector<Json>& shards,
          uint64_t file_bytes = 8192) {
  return {
      {"format", "savepoint"},
      {"version", kFormatVersion},
      {"required_features", Json::array()},
      {"checkpoint_id", "000000000000002a"},
      {"writer", "zero-elements test"},
      {"created_ns", 0},
      {"chunk_bytes", 4096},
      {"files", {{{"name", "data-00000-00000.spd"}, {"bytes", file_bytes}}}},
      {"tensors", {{{"name", "t"}, {"dtype", dtype}, {"shape", shape}, {"shards", Json(shards)}}}},
      {"values", Json::array()}};
}

// One uncompressed shard: the box (offsets, sizes) stored as `bytes` bytes at `offset`, with a
// checksum per chunk of 4096 bytes (at most 16: a huge extent is refused before they are counted).
Json Shard(const Json& offsets, const Json& sizes, uint64_t offset = 4096, uint64_t bytes = 0) {
  Json crcs = Json::array();
  for (uint64_t c = 0; c < std::min<uint64_t>(NumChunks(bytes, 4096), 16); ++c) crcs.push_back(0);
  return {{"offsets", offsets}, {"sizes", sizes}, {"file", 0},
          {"offset", offset},   {"bytes", bytes}, {"crc32c", crcs}};
}

// The body framed as a whole MANIFEST with valid checksums.
Result<Manifest> Decode(const Json& body) {
  const std::string text = body.dump();
  std::string h(kManifestHeaderBytes, '\0');
  h.replace(0, 8, kManifestMagic);
  PutU32(&h, 8, kFormatVersion);
  PutU32(&h, 12, static_cast<uint32_t>(kManifestHeaderBytes));
  PutU64(&h, 16, text.size());
  PutU64(&h, 24, kId);
  PutU32(&h, 32, Crc32c(text));
  PutU32(&h, 60, Crc32c(std::string_view(h).substr(0, 60)));
  return DecodeManifest(h + text, kWhere);
}

// Decodes a body of one zero-element tensor of `shape` (one empty shard covering it) and expects
// it back with that shape.
void ExpectZeroElements(const std::string& dtype, const Shape& shape) {
  const Json zeros(Shape(shape.size(), 0));
  SP_ASSERT_OK_AND_ASSIGN(Manifest m, Decode(Body(dtype, shape, {Shard(zeros, shape)})));
  ASSERT_EQ(m.tensors.size(), 1u);
  EXPECT_EQ(m.tensors[0].shape, shape);
  EXPECT_EQ(NumBytes(m.tensors[0].dtype, m.tensors[0].shape).value(), 0u);
}

TEST(ManifestHostileTest, ZeroElementsWithLargestDimension) {
  const int64_t big = static_cast<int64_t>(k2p62);
  ExpectZeroElements("F32", {0, big});
  ExpectZeroElements("F64", {big, 0});
  ExpectZeroElements("U8", {0, big, big});
  ExpectZeroElements("BF16", {big, 1, 0});
}

TEST(ManifestHostileTest, ZeroElementsWithInt64MaxDimensionIsCorruption) {
  for (const Json& shape : {Json{0, kI64Max}, Json{kI64Max, 0}, Json{kU64Max, 0},
                            Json{0, k2p62 + 1}, Json{-1, 0}, Json{0, INT64_MIN}}) {
    SCOPED_TRACE(shape.dump());
    const Json zeros = Json(Shape(shape.size(), 0));
    EXPECT_THAT(Decode(Body("F32", shape, {Shard(zeros, zeros)})),
                StatusIs(StatusCode::kCorruption, "tensor \"t\".shape holds a negative, huge"));
  }
}

TEST(ManifestHostileTest, ElementCountOverflowBeforeTheZeroDimensionIsCorruption) {
  for (const Json& shape : {Json{k2p62, k2p62, 0}, Json{k2p62, 2, 0}, Json{2, k2p62, 0}}) {
    SCOPED_TRACE(shape.dump());
    EXPECT_THAT(Decode(Body("U8", shape, {Shard({0, 0, 0}, {0, 0, 0})})),
                StatusIs(StatusCode::kCorruption, "tensor \"t\": shape too large"));
  }
}

// A tensor of `shape` in the given pieces (offsets, sizes), for CheckTensorTiling.
TensorRecord Pieces(const Shape& shape, const std::vector<std::pair<Shape, Shape>>& boxes) {
  TensorRecord t{"t", DType::kU8, shape, {}};
  for (const auto& [offsets, sizes] : boxes) {
    t.shards.emplace_back();
    t.shards.back().offsets = offsets;
    t.shards.back().sizes = sizes;
  }
  return t;
}

// Pieces whose element counts add up past INT64_MAX: the same 2^62-element box two and three
// times. A manifest cannot list them (a 2^62-byte extent needs 2^32 checksums or more), but the
// DCP import checks its chunks with CheckTensorTiling, which must find the overlap without signed
// overflow. Boxes outside the shape, which DecodeManifest refuses before, are Corruption too.
TEST(ManifestHostileTest, ShardElementsSummingPastInt64MaxAreCorruption) {
  const int64_t big = static_cast<int64_t>(k2p62);
  for (size_t copies : {2u, 3u}) {
    const std::vector<std::pair<Shape, Shape>> boxes(copies, {{0}, {big}});
    EXPECT_THAT(CheckTensorTiling(Pieces({big}, boxes), kWhere),
                StatusIs(StatusCode::kCorruption, "tensor \"t\": shards overlap"))
        << copies;
  }
  EXPECT_THAT(
      CheckTensorTiling(Pieces({big, 1}, {{{0, 0}, {big, 1}}, {{big / 2, 0}, {big, 1}}}), kWhere),
      StatusIs(StatusCode::kCorruption, "exceeds shape"));
  for (const Shape& sizes : {Shape{-1, 0}, Shape{INT64_MAX, 2}, Shape{INT64_MIN, 0}}) {
    EXPECT_THAT(CheckTensorTiling(Pieces({0, 0}, {{{0, 0}, sizes}}), kWhere),
                StatusIs(StatusCode::kCorruption, "exceeds shape"))
        << ShapeToString(sizes);
  }
  EXPECT_THAT(CheckTensorTiling(Pieces({INT64_MAX, 0}, {{{0, 0}, {INT64_MAX, 0}}}), kWhere),
              StatusIs(StatusCode::kOk));
  EXPECT_THAT(CheckTensorTiling(Pieces({-1}, {}), kWhere),
              StatusIs(StatusCode::kCorruption, "tensor \"t\": shape [-1]"));
  EXPECT_THAT(Decode(Body("U8", {k2p62, 0}, {Shard({k2p62, 0}, {k2p62, 0})})),
              StatusIs(StatusCode::kCorruption, "exceeds shape"));
  EXPECT_THAT(Decode(Body("U8", {0, k2p62}, {Shard({0, k2p62}, {0, 1})})),
              StatusIs(StatusCode::kCorruption, "exceeds shape"));
  // Zero-element pieces at the far end of a dimension are part of an exact tiling.
  SP_EXPECT_OK(Decode(Body("U8", {k2p62, 0},
                           {Shard({0, 0}, {k2p62 / 2, 0}), Shard({k2p62 / 2, 0}, {k2p62 / 2, 0}),
                            Shard({k2p62, 0}, {0, 0})}))
                   .status());
}

TEST(ManifestHostileTest, ExtentOffsetsNearU64MaxAreCorruption) {
  // An empty extent at the last aligned offset of a file that claims 2^64 - 1 bytes is fine; past
  // the file, or with bytes that wrap, it is not.
  SP_EXPECT_OK(
      Decode(Body("U8", {0, kI64Max / 2}, {Shard({0, 0}, {0, 0}, kU64Max - 4095)}, kU64Max))
          .status());
  EXPECT_THAT(Decode(Body("U8", {0}, {Shard({0}, {0}, kU64Max - 4095)})),
              StatusIs(StatusCode::kCorruption, "outside file"));
  EXPECT_THAT(Decode(Body("U8", {k2p62}, {Shard({0}, {k2p62}, kU64Max - 4095, k2p62)}, kU64Max)),
              StatusIs(StatusCode::kCorruption, "outside file"));
}

// What Save writes, Load reads: a zero-element tensor with a 2^62 dimension makes the round trip,
// and one that the format cannot describe (a dimension over 2^62) is refused by Save, before
// anything is committed, instead of leaving a checkpoint no reader accepts.
TEST(ManifestHostileTest, SaveAndLoadAgreeOnHugeZeroElementShapes) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  const int64_t big = static_cast<int64_t>(k2p62);
  State s;
  SP_ASSERT_OK(s.Put("a", Tensor::Empty(DType::kF32, {0, big}).value()));
  SP_ASSERT_OK(s.Put("b", Tensor::Empty(DType::kI64, {big, 0}).value()));
  SP_ASSERT_OK(Save(s, "/ok", {}, io));
  SP_ASSERT_OK_AND_ASSIGN(State back, Load("/ok", {}, io));
  EXPECT_TRUE(testing::StatesEqual(s, back));

  State huge;
  SP_ASSERT_OK(huge.Put("w", Tensor::Empty(DType::kF32, {0, INT64_MAX}).value()));
  EXPECT_THAT(Save(huge, "/huge", {}, io), StatusIs(StatusCode::kInvalidArgument, "\"w\""));
  EXPECT_FALSE(fs.Exists("/huge/MANIFEST"));
}

}  // namespace
}  // namespace savepoint::format
