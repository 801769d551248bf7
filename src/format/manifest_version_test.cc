// Format versions 1 and 2 in the manifest decoder (docs/FORMAT.md §8): version 2 accepts
// uncompressed extents at any multiple of 64 after the header, version 1 only at multiples of
// 4096; both reject overlapping extents, and compressed chunks stay 4096-aligned in both.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "format/endian.h"
#include "format/manifest.h"
#include "testutil/corruption.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::format {
namespace {

using ::savepoint::testing::StatusIs;

constexpr std::string_view kWhere = "/ck/MANIFEST";

ShardRecord Whole(Shape shape, uint64_t offset, uint64_t bytes, uint64_t chunk_bytes) {
  ShardRecord s;
  s.offsets = Shape(shape.size(), 0);
  s.sizes = std::move(shape);
  s.offset = offset;
  s.bytes = bytes;
  s.crc32c.assign(NumChunks(bytes, chunk_bytes), 0x12345678u);
  return s;
}

// Version `version`: "a", "b", "c" (F32 [16], 64 bytes each) packed at 4096, 4160, 4224, "big"
// (F32 [2048], two chunks of 4096) at 8192, "e" (empty) at 4288; the file is 16384 bytes.
Manifest Packed(uint32_t version = 2) {
  Manifest m;
  m.version = version;
  m.checkpoint_id = 0x0123456789abcdefULL;
  m.writer = "test";
  m.chunk_bytes = 4096;
  m.files.push_back({"data-00000-00000.spd", 16384});
  m.tensors.push_back({"a", DType::kF32, {16}, {Whole({16}, 4096, 64, 4096)}});
  m.tensors.push_back({"b", DType::kF32, {16}, {Whole({16}, 4160, 64, 4096)}});
  m.tensors.push_back({"big", DType::kF32, {2048}, {Whole({2048}, 8192, 8192, 4096)}});
  m.tensors.push_back({"c", DType::kF32, {16}, {Whole({16}, 4224, 64, 4096)}});
  m.tensors.push_back({"e", DType::kF32, {0}, {Whole({0}, 4288, 0, 4096)}});
  return m;
}

Result<Manifest> Decode(const Manifest& m) { return DecodeManifest(EncodeManifest(m), kWhere); }

// `m` encoded, then its JSON body edited by `edit` and framed again with correct CRCs.
Result<Manifest> DecodeEdited(const Manifest& m, const std::function<void(Json&)>& edit) {
  Json j = ManifestToJson(m);
  edit(j);
  std::string body = j.dump();
  std::string h = EncodeManifest(m).substr(0, kManifestHeaderBytes);
  PutU64(&h, 16, body.size());
  PutU32(&h, 32, Crc32c(body));
  PutU32(&h, 60, Crc32c(std::string_view(h).substr(0, 60)));
  return DecodeManifest(h + body, kWhere);
}

// Corruption naming `needle` and the file.
::testing::AssertionResult Corrupt(const Result<Manifest>& r, std::string_view needle) {
  return testing::IsCorruption(r.status(), {needle, kWhere});
}

TEST(ManifestVersion, Version2AcceptsPackedExtents) {
  Result<Manifest> m = Decode(Packed());
  SP_ASSERT_OK(m.status());
  EXPECT_EQ(m->version, 2u);
  EXPECT_EQ(m->tensors[1].shards[0].offset, 4160u);  // "b"
  Json j = ManifestToJson(*m);
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["alignment"], 64);
}

TEST(ManifestVersion, Version1KeepsThe4096Rule) {
  Manifest v1 = Packed(1);
  EXPECT_TRUE(Corrupt(Decode(v1), "misaligned (format version 1: a multiple of 4096)"));
  // The same tensors at 4096-aligned offsets, as version 1 writers place them.
  v1.files[0].bytes = 32768;
  v1.tensors[0].shards[0].offset = 4096;
  v1.tensors[1].shards[0].offset = 8192;
  v1.tensors[2].shards[0].offset = 12288;
  v1.tensors[3].shards[0].offset = 20480;
  v1.tensors[4].shards[0].offset = 24576;
  Result<Manifest> m = Decode(v1);
  SP_ASSERT_OK(m.status());
  EXPECT_EQ(m->version, 1u);
  EXPECT_EQ(ManifestToJson(*m)["alignment"], 4096);
}

TEST(ManifestVersion, HostileVersion2Extents) {
  auto with = [](const std::function<void(Manifest&)>& edit) {
    Manifest m = Packed();
    edit(m);
    return Decode(m);
  };
  // Not a multiple of 64.
  EXPECT_TRUE(Corrupt(with([](Manifest& m) { m.tensors[1].shards[0].offset = 4164; }),
                      "misaligned (format version 2: a multiple of 64)"));
  EXPECT_TRUE(
      Corrupt(with([](Manifest& m) { m.tensors[1].shards[0].offset = 4096 + 32; }), "misaligned"));
  // Inside the header, and past the end of the file.
  EXPECT_TRUE(Corrupt(with([](Manifest& m) { m.tensors[0].shards[0].offset = 64; }), "misaligned"));
  EXPECT_TRUE(Corrupt(with([](Manifest& m) { m.tensors[3].shards[0].offset = 16384; }), "outside"));
  // Packed extents aliasing each other: "b" moved onto "a", then onto the middle of "big".
  EXPECT_TRUE(Corrupt(with([](Manifest& m) { m.tensors[1].shards[0].offset = 4096; }), "overlap"));
  EXPECT_TRUE(
      Corrupt(with([](Manifest& m) { m.tensors[1].shards[0].offset = 8192 + 4032; }), "overlap"));
  // "a" grown to 128 bytes, so that it runs into "b" at 4160.
  EXPECT_TRUE(Corrupt(with([](Manifest& m) {
                        m.tensors[0].shape = {32};
                        m.tensors[0].shards[0] = Whole({32}, 4096, 128, 4096);
                      }),
                      "overlap"));
  // Offsets near 2^64: no overflow in offset + bytes.
  EXPECT_TRUE(Corrupt(with([](Manifest& m) { m.tensors[1].shards[0].offset = UINT64_MAX - 63; }),
                      "outside"));
}

TEST(ManifestVersion, CompressedChunksStay4096AlignedInVersion2) {
  Manifest m = Packed();
  ShardRecord& big = m.tensors[2].shards[0];
  big.offset = 0;
  big.codec = codec::Codec::kZstd;
  big.stored = {{8192, 100, true}, {12288, 4096, false}};
  SP_EXPECT_OK(Decode(m).status());  // (the feature is listed by ManifestToJson)
  big.stored[0].offset = 8192 + 64;
  EXPECT_TRUE(Corrupt(Decode(m), "misaligned"));
}

TEST(ManifestVersion, BodyVersionMustMatchTheHeader) {
  EXPECT_TRUE(Corrupt(DecodeEdited(Packed(), [](Json& j) { j["version"] = 1; }),
                      "manifest.version 1 differs from the header's version 2"));
  EXPECT_TRUE(Corrupt(DecodeEdited(Packed(), [](Json& j) { j["version"] = "2"; }), "differs"));
  SP_EXPECT_OK(DecodeEdited(Packed(), [](Json& j) { j.erase("version"); }).status());
  // "alignment" is informational: a reader applies the header version's rule.
  SP_EXPECT_OK(DecodeEdited(Packed(), [](Json& j) { j["alignment"] = 4096; }).status());
}

TEST(ManifestVersion, UnknownVersionsAreUnimplemented) {
  for (uint32_t v : {0u, kMaxFormatVersion + 1, 0xffffffffu}) {
    std::string bytes = EncodeManifest(Packed());
    PutU32(&bytes, 8, v);
    PutU32(&bytes, 60, Crc32c(std::string_view(bytes).substr(0, 60)));
    Result<Manifest> m = DecodeManifest(bytes, kWhere);
    ASSERT_FALSE(m.ok());
    EXPECT_THAT(m, StatusIs(StatusCode::kUnimplemented));
    EXPECT_NE(m.status().message().find(fmt::format("format version {}", v)), std::string::npos)
        << m.status().ToString();
  }
}

// EncodeManifest writes the tensors' JSON text directly (a document of thousands of tensors costs
// more than the rest of such a save); the text must be exactly the documented schema's.
TEST(ManifestVersion, EncodedBodyIsTheJsonDocumentsText) {
  for (uint32_t version : {1u, 2u}) {
    Manifest m = Packed(version);
    m.created_ns = 1795000000000000000;
    m.tensors.push_back({"q\"uote\\ \xc3\xa9 \xf0\x9f\x98\x80",
                         DType::kBF16,
                         {2, 3},
                         {Whole({2, 3}, 4352, 12, 4096)}});
    m.tensors.back().shards.push_back(Whole({0, 3}, 4416, 0, 4096));
    m.tensors.back().shards[1].offsets = {2, 0};
    ShardRecord& big = m.tensors[2].shards[0];
    big.codec = codec::Codec::kLz4;
    big.filter = codec::Filter::kShuffle;
    big.offset = 0;
    big.stored = {{8192, 100, true}, {12288, 4096, false}};
    ASSERT_TRUE(m.values.PutValue("step", int64_t{-3}).ok());
    ASSERT_TRUE(m.values.PutValue("lr", 0.1).ok());
    ASSERT_TRUE(m.values.PutValue("nan", std::nan("")).ok());
    ASSERT_TRUE(m.values.PutValue("s", "t\u00e9xt\n").ok());
    ASSERT_TRUE(m.values.PutValue("raw", Bytes{{0, 255}}).ok());
    m.values.metadata() = Json{{"z", 1}, {"a", {1.5, nullptr, "x"}}};
    const std::string bytes = EncodeManifest(m);
    EXPECT_EQ(bytes.substr(kManifestHeaderBytes),
              ManifestToJson(m).dump(-1, ' ', false, Json::error_handler_t::replace));
    if (version == 1) continue;  // (the packed offsets are valid in version 2 only)
    Result<Manifest> back = DecodeManifest(bytes, kWhere);
    SP_ASSERT_OK(back.status());
    EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  }
}

}  // namespace
}  // namespace savepoint::format
