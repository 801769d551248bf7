// Unit tests of compressed shards in the manifest (docs/FORMAT.md, "Compressed shards"): encoding,
// the "compression" required feature, and hostile stored sizes, offsets, flags and codec names,
// which the decoder must reject as Corruption before any data is read.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "format/endian.h"
#include "format/manifest.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::format {
namespace {

using ::savepoint::testing::StatusIs;

constexpr std::string_view kWhere = "/ck/MANIFEST";

// A manifest with tensor "a" (U8 [10000], chunks of 4096: raw sizes 4096, 4096, 1808) stored
// compressed: chunk 0 compressed to 100 bytes at 4096, chunk 1 raw at 8192, chunk 2 compressed to
// 50 bytes at 12288; plus an uncompressed tensor "b" (U8 [10]) at 16384 and an empty "c".
Manifest CompressedManifest() {
  Manifest m;
  m.checkpoint_id = 0xfeedULL;
  m.chunk_bytes = 4096;
  m.files.push_back({"data-00000-00000.spd", 20480});
  ShardRecord z;
  z.offsets = {0};
  z.sizes = {10000};
  z.bytes = 10000;
  z.crc32c = {1, 2, 3};
  z.codec = codec::Codec::kZstd;
  z.filter = codec::Filter::kShuffle;
  z.stored = {{4096, 100, true}, {8192, 4096, false}, {12288, 50, true}};
  m.tensors.push_back({"a", DType::kU8, {10000}, {z}});
  ShardRecord r;
  r.offsets = {0};
  r.sizes = {10};
  r.offset = 16384;
  r.bytes = 10;
  r.crc32c = {9};
  m.tensors.push_back({"b", DType::kU8, {10}, {r}});
  ShardRecord e;
  e.offsets = {0};
  e.sizes = {0};
  e.offset = 4096;
  m.tensors.push_back({"c", DType::kU8, {0}, {e}});
  return m;
}

// MANIFEST bytes with `body` as the body and every length and CRC field correct.
std::string Reframe(const Manifest& m, const std::string& body) {
  std::string bytes = EncodeManifest(m).substr(0, kManifestHeaderBytes) + body;
  PutU64(&bytes, 16, body.size());
  PutU32(&bytes, 32, Crc32c(body));
  PutU32(&bytes, 60, Crc32c(std::string_view(bytes).substr(0, 60)));
  return bytes;
}

// Decodes the manifest after `edit` changed its JSON body.
Result<Manifest> DecodeEdited(const std::function<void(Json&)>& edit) {
  Manifest m = CompressedManifest();
  Json j = ManifestToJson(m);
  edit(j);
  return DecodeManifest(Reframe(m, j.dump()), kWhere);
}

// Decodes the manifest after `edit` changed its model (encoded as the writer would).
Result<Manifest> DecodeModel(const std::function<void(Manifest&)>& edit) {
  Manifest m = CompressedManifest();
  edit(m);
  return DecodeManifest(EncodeManifest(m), kWhere);
}

::testing::AssertionResult Corrupt(const Result<Manifest>& r, std::string_view needle) {
  if (r.ok()) return ::testing::AssertionFailure() << "accepted";
  const Status& s = r.status();
  if (s.code() != StatusCode::kCorruption) {
    return ::testing::AssertionFailure() << "wrong code: " << s.ToString();
  }
  if (s.message().find(kWhere) == std::string::npos ||
      s.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": " << s.ToString();
  }
  return ::testing::AssertionSuccess();
}

TEST(ManifestCompression, RoundTripAndRequiredFeature) {
  Manifest m = CompressedManifest();
  Json j = ManifestToJson(m);
  EXPECT_EQ(j["required_features"], Json::array({"compression"}));
  EXPECT_EQ(j["tensors"][0]["shards"][0]["codec"], "zstd");
  EXPECT_EQ(j["tensors"][0]["shards"][0]["filter"], "shuffle");
  EXPECT_FALSE(j["tensors"][1]["shards"][0].contains("codec"));  // "b" is uncompressed
  std::string bytes = EncodeManifest(m);
  Result<Manifest> back = DecodeManifest(bytes, kWhere);
  SP_ASSERT_OK(back.status());
  const ShardRecord& z = back->tensors[0].shards[0];
  ASSERT_EQ(back->tensors[0].name, "a");
  EXPECT_EQ(z.codec, codec::Codec::kZstd);
  EXPECT_EQ(z.filter, codec::Filter::kShuffle);
  ASSERT_EQ(z.stored.size(), 3u);
  EXPECT_EQ(z.stored[1].offset, 8192u);
  EXPECT_EQ(z.stored[1].bytes, 4096u);
  EXPECT_FALSE(z.stored[1].compressed);
  EXPECT_TRUE(z.stored[2].compressed);
  EXPECT_EQ(StoredBytes(z), 100u + 4096u + 50u);
  EXPECT_EQ(EncodeManifest(*back), bytes);
}

TEST(ManifestCompression, UncompressedManifestHasNoFeature) {
  Manifest m = CompressedManifest();
  m.tensors.erase(m.tensors.begin());  // drop "a"
  Json j = ManifestToJson(m);
  EXPECT_EQ(j["required_features"], Json::array());
  EXPECT_FALSE(UsesCompression(m));
}

TEST(ManifestCompression, UnknownFeatureIsUnimplemented) {
  // ("sparse" was the example here until sparse tables became a feature, docs/FORMAT.md §11.)
  Result<Manifest> r = DecodeEdited([](Json& j) { j["required_features"].push_back("hologram"); });
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r, StatusIs(StatusCode::kUnimplemented, "hologram"));
}

TEST(ManifestCompression, CompressedShardWithoutFeatureIsRejected) {
  EXPECT_TRUE(Corrupt(DecodeEdited([](Json& j) { j["required_features"] = Json::array(); }),
                      "required_features"));
}

TEST(ManifestCompression, HostileCodecFields) {
  auto shard = [](Json& j) -> Json& { return j["tensors"][0]["shards"][0]; };
  EXPECT_TRUE(
      Corrupt(DecodeEdited([&](Json& j) { shard(j)["codec"] = "brotli"; }), "unknown codec"));
  EXPECT_TRUE(Corrupt(DecodeEdited([&](Json& j) { shard(j)["codec"] = "none"; }), "codec"));
  EXPECT_TRUE(Corrupt(DecodeEdited([&](Json& j) { shard(j)["codec"] = 7; }), "codec"));
  EXPECT_TRUE(
      Corrupt(DecodeEdited([&](Json& j) { shard(j)["filter"] = "delta"; }), "unknown filter"));
  EXPECT_TRUE(Corrupt(DecodeEdited([&](Json& j) { shard(j).erase("filter"); }), "filter"));
  EXPECT_TRUE(
      Corrupt(DecodeEdited([&](Json& j) { shard(j).erase("stored_bytes"); }), "stored_bytes"));
  EXPECT_TRUE(Corrupt(DecodeEdited([&](Json& j) { shard(j)["stored_bytes"].erase(0); }), "differ"));
  EXPECT_TRUE(Corrupt(DecodeEdited([&](Json& j) { shard(j)["stored_compressed"][0] = 2; }),
                      "stored_compressed"));
  EXPECT_TRUE(
      Corrupt(DecodeEdited([&](Json& j) { shard(j)["stored_offsets"][0] = -4096; }), "stored"));
  EXPECT_TRUE(Corrupt(DecodeEdited([&](Json& j) { shard(j)["offset"] = 4096; }), "offset"));
  // More stored entries than the shard has chunks (and than the cap allows).
  EXPECT_TRUE(
      Corrupt(DecodeEdited([&](Json& j) {
                for (const char* k : {"stored_offsets", "stored_bytes", "stored_compressed"})
                  shard(j)[k].push_back(0);
              }),
              "stored"));
}

TEST(ManifestCompression, HostileStoredSizesAndOffsets) {
  auto chunk = [](Manifest& m, int c) -> StoredChunk& { return m.tensors[0].shards[0].stored[c]; };
  // Compressed larger than the raw chunk, empty, and a raw chunk of the wrong size.
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 0).bytes = 4097; }), "stored size"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 2).bytes = 1809; }), "stored size"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 0).bytes = 0; }), "stored size"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 1).bytes = 4000; }), "stored size"));
  // Offsets: misaligned, inside the header, past the file, overflowing.
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 0).offset = 4097; }), "misaligned"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 0).offset = 0; }), "misaligned"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 1).offset = 20480; }), "outside"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 2).offset = uint64_t{1} << 62; }),
                      "outside"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { m.files[0].bytes = 16000; }), "outside"));
  // Overlaps: two chunks at one offset; a chunk over the uncompressed tensor's extent.
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 2).offset = 4096; }), "overlap"));
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { chunk(m, 2).offset = 16384; }), "overlap"));
  // A stored list that does not match the chunk count.
  EXPECT_TRUE(Corrupt(DecodeModel([&](Manifest& m) { m.tensors[0].shards[0].stored.pop_back(); }),
                      "stored chunks"));
}

}  // namespace
}  // namespace savepoint::format
