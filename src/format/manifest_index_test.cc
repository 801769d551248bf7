// Format versions 3 and 4, the indexed manifest (docs/FORMAT.md §15, §17): whole round trips
// (sharded, compressed, encrypted, scalar and empty tensors), reading in parts (head, then the
// sections of some tensors with only the shards overlapping a box), hostile heads and sections
// (version 3's fixed records and version 4's compact ones), and the head's SAX fast path against
// the DOM.
#include "format/manifest_index.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "format/endian.h"
#include "format/manifest.h"
#include "format/manifest_checks.h"
#include "testutil/corruption.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::format {
namespace {

using ::savepoint::testing::StatusIs;

constexpr std::string_view kWhere = "/ck/MANIFEST";

ShardRecord Box2(int64_t row, int64_t col, int64_t rows, int64_t cols, uint64_t offset) {
  ShardRecord s;
  s.offsets = {row, col};
  s.sizes = {rows, cols};
  s.offset = offset;
  s.bytes = static_cast<uint64_t>(rows * cols) * 4;
  s.crc32c.assign(NumChunks(s.bytes, 4096), static_cast<uint32_t>(offset * 7 + 1));
  return s;
}

// "w" (F32 [64, 32]) in 4 row blocks x 2 column blocks of 16 x 16 (1024 bytes each, in file 0 or
// 1), "z" (F32 [2048], one compressed shard of two chunks), "s" (a scalar) and "e" (empty).
Manifest Sharded(uint32_t version = kIndexedFormatVersion) {
  Manifest m;
  m.version = version;
  m.checkpoint_id = 0xfeedfacecafebeefULL;
  m.writer = "test";
  m.chunk_bytes = 4096;
  m.files = {{"data-00000-00000.spd", 65536}, {"data-00001-00000.spd", 65536}};
  TensorRecord w{"w", DType::kF32, {64, 32}, {}};
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 2; ++c) {
      w.shards.push_back(Box2(16 * r, 16 * c, 16, 16, 4096 + 1024 * (2 * r + c)));
      w.shards.back().file = static_cast<uint32_t>(c);
    }
  }
  TensorRecord z{"z", DType::kF32, {2048}, {}};
  ShardRecord zs;
  zs.offsets = {0};
  zs.sizes = {2048};
  zs.bytes = 8192;
  zs.crc32c = {11, 22};
  zs.codec = codec::Codec::kZstd;
  zs.filter = codec::Filter::kShuffle;
  zs.stored = {{16384, 100, true}, {20480, 4096, false}};
  z.shards.push_back(zs);
  TensorRecord s{"s", DType::kI64, {}, {}};
  ShardRecord ss;
  ss.offset = 32768;
  ss.bytes = 8;
  ss.crc32c = {5};
  s.shards.push_back(ss);
  TensorRecord e{"e", DType::kBF16, {0, 4}, {Box2(0, 0, 0, 4, 32832)}};
  m.tensors = {e, s, w, z};  // by name
  EXPECT_TRUE(m.values.PutValue("step", int64_t{7}).ok());
  m.values.metadata() = Json{{"k", "v"}};
  return m;
}

// Corruption naming `needle` and the file.
::testing::AssertionResult Corrupt(const Result<Manifest>& r, std::string_view needle) {
  return testing::IsCorruption(r.status(), {needle, kWhere});
}

// Each test runs on both indexed versions.
class ManifestIndex : public ::testing::TestWithParam<uint32_t> {
 protected:
  Manifest Sharded() const { return format::Sharded(GetParam()); }
};

INSTANTIATE_TEST_SUITE_P(Versions, ManifestIndex,
                         ::testing::Values(kIndexedFormatVersion, kCompactFormatVersion));

TEST_P(ManifestIndex, WholeRoundTrip) {
  const Manifest m = Sharded();
  const std::string bytes = EncodeManifest(m);
  EXPECT_EQ(GetU32(bytes, 8), GetParam());
  // The shards are not in the JSON head.
  const uint64_t head = GetU64(bytes, 16);
  EXPECT_EQ(bytes.substr(kManifestHeaderBytes, head).find("offsets"), std::string::npos);
  EXPECT_LT(kManifestHeaderBytes + head, bytes.size());
  Result<Manifest> back = DecodeManifest(bytes, kWhere);
  SP_ASSERT_OK(back.status());
  EXPECT_EQ(back->version, GetParam());
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
}

TEST_P(ManifestIndex, EncryptedRoundTripKeepsTags) {
  Manifest m = Sharded();
  m.encryption.enabled = true;
  m.encryption.salt.fill(std::byte{3});
  m.encryption.key_check.fill(std::byte{4});
  uint8_t n = 0;
  for (TensorRecord& t : m.tensors) {
    for (ShardRecord& s : t.shards) {
      s.tags.resize(s.crc32c.size());
      for (crypto::GcmTag& tag : s.tags) tag.fill(std::byte{++n});
    }
  }
  const std::string bytes = EncodeManifest(m);
  Result<Manifest> back = DecodeManifest(bytes, kWhere);
  SP_ASSERT_OK(back.status());
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  // Encrypted manifests are authenticated whole: never read in parts.
  Result<uint64_t> head = IndexedHeadBytes(bytes, kWhere);
  SP_ASSERT_OK(head.status());
  EXPECT_EQ(*head, 0u);
}

TEST(ManifestIndexOlder, OlderVersionsAreReadWhole) {
  Manifest m = Sharded();
  m.version = 2;
  m.tensors.pop_back();  // (z's stored chunks at 4096 multiples would do; keep it simple)
  const std::string bytes = EncodeManifest(m);
  Result<uint64_t> head = IndexedHeadBytes(bytes, kWhere);
  SP_ASSERT_OK(head.status());
  EXPECT_EQ(*head, 0u);
  SP_EXPECT_OK(DecodeManifest(bytes, kWhere).status());
}

// Reads header and head, then only the section of "w" with the shards overlapping one box.
TEST_P(ManifestIndex, PartsKeepOnlyOverlappingShards) {
  const std::string bytes = EncodeManifest(Sharded());
  Result<uint64_t> head_bytes = IndexedHeadBytes(bytes.substr(0, kManifestHeaderBytes), kWhere);
  SP_ASSERT_OK(head_bytes.status());
  ASSERT_GT(*head_bytes, kManifestHeaderBytes);
  Result<ManifestHead> h = DecodeManifestHead(bytes.substr(0, *head_bytes), bytes.size(), kWhere);
  SP_ASSERT_OK(h.status());
  ASSERT_EQ(h->manifest.tensors.size(), 4u);
  EXPECT_EQ(h->manifest.tensors[2].name, "w");
  EXPECT_EQ(h->sections[2].shards, 8u);
  for (const TensorRecord& t : h->manifest.tensors) EXPECT_TRUE(t.shards.empty());
  EXPECT_EQ(h->manifest.values.FindValue("step")->as_int(), 7);
  // Rows [8, 24) of columns [10, 20): row blocks 0 and 1, both column blocks.
  const std::vector<Box> keep = {{{8, 10}, {16, 10}}};
  const SectionRef& r = h->sections[2];
  SP_ASSERT_OK(DecodeTensorSection(bytes.substr(r.offset, r.bytes), &*h, 2, &keep, kWhere));
  const auto& shards = h->manifest.tensors[2].shards;
  ASSERT_EQ(shards.size(), 4u);
  for (const ShardRecord& s : shards) {
    EXPECT_LT(s.offsets[0], 32);
    EXPECT_EQ(s.file, s.offsets[1] == 0 ? 0u : 1u);
    EXPECT_EQ(s.crc32c, std::vector<uint32_t>{static_cast<uint32_t>(s.offset * 7 + 1)});
  }
  // Without a box: every shard, and they must tile the tensor.
  SP_ASSERT_OK(DecodeTensorSection(bytes.substr(r.offset, r.bytes), &*h, 2, nullptr, kWhere));
  EXPECT_EQ(h->manifest.tensors[2].shards.size(), 8u);
}

// MANIFEST `bytes` with its JSON head edited by `edit`, framed again with correct CRCs.
std::string EditHeadOf(const std::string& bytes, const std::function<void(Json&)>& edit) {
  const uint64_t head = GetU64(bytes, 16);
  Json j = Json::parse(bytes.substr(kManifestHeaderBytes, head));
  edit(j);
  const std::string body = j.dump();
  std::string h = bytes.substr(0, kManifestHeaderBytes);
  PutU64(&h, 16, body.size());
  PutU32(&h, 32, Crc32c(body));
  PutU32(&h, 60, Crc32c(std::string_view(h).substr(0, 60)));
  return h + body + bytes.substr(kManifestHeaderBytes + head);
}

std::string EditHead(const Manifest& m, const std::function<void(Json&)>& edit) {
  return EditHeadOf(EncodeManifest(m), edit);
}

// `m` encoded, with section `i` edited by `edit` and its CRC and size in the head fixed.
std::string EditSection(const Manifest& m, size_t i,
                        const std::function<void(std::string&)>& edit) {
  std::string bytes = EncodeManifest(m);
  Result<ManifestHead> h = DecodeManifestHead(
      bytes.substr(0, kManifestHeaderBytes + GetU64(bytes, 16)), bytes.size(), kWhere);
  EXPECT_TRUE(h.ok());
  std::string section = bytes.substr(h->sections[i].offset, h->sections[i].bytes);
  edit(section);
  bytes.replace(h->sections[i].offset, h->sections[i].bytes, section);
  const uint32_t crc = Crc32c(section);
  return EditHeadOf(bytes, [&](Json& j) {
    j["tensors"][i]["section_crc32c"] = crc;
    j["tensors"][i]["section_bytes"] = section.size();
  });
}

TEST_P(ManifestIndex, HostileHeadsAreCorruption) {
  const Manifest m = Sharded();
  EXPECT_TRUE(Corrupt(
      DecodeManifest(EditHead(m, [](Json& j) { j["tensors"][2]["section_bytes"] = 1u << 20; }),
                     kWhere),
      "cannot hold"));
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditHead(m, [](Json& j) { j["tensors"][2]["shards"] = 90; }), kWhere),
              "cannot hold"));
  EXPECT_TRUE(Corrupt(
      DecodeManifest(EditHead(m, [](Json& j) { std::swap(j["tensors"][0], j["tensors"][1]); }),
                     kWhere),
      "out of order"));
  EXPECT_TRUE(Corrupt(
      DecodeManifest(EditHead(m, [](Json& j) { j["required_features"] = Json::array(); }), kWhere),
      "without \"compression\""));
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditHead(m, [](Json& j) { j["tensors"][1]["stored"] = 1; }), kWhere),
              "stored is not a boolean"));
  const std::string bytes = EncodeManifest(m);
  EXPECT_TRUE(Corrupt(DecodeManifest(bytes + "x", kWhere), "sections end at"));
  // Every truncation is refused.
  for (size_t n = 0; n < bytes.size(); n += 7) {
    Result<Manifest> r = DecodeManifest(bytes.substr(0, n), kWhere);
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << n;
  }
}

TEST(ManifestIndexFixed, HostileSectionsAreCorruption) {
  const Manifest m = Sharded(kIndexedFormatVersion);
  std::string flipped = EncodeManifest(m);
  flipped.back() ^= 1;
  EXPECT_TRUE(Corrupt(DecodeManifest(flipped, kWhere), "section checksum mismatch"));
  // Shard 1 of "w" (ndim 2: 56-byte records) moved onto shard 0: they overlap.
  EXPECT_TRUE(Corrupt(DecodeManifest(EditSection(m, 2,
                                                 [](std::string& s) {
                                                   for (int b = 0; b < 16; ++b) s[56 + b] = s[b];
                                                 }),
                                     kWhere),
                      "shards overlap"));
  // A negative offset, an unknown codec, a nonzero reserved byte, a file out of range.
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[7] = char(0x80); }), kWhere),
              "negative or huge"));
  EXPECT_TRUE(Corrupt(
      DecodeManifest(EditSection(m, 2, [](std::string& s) { s[32 + 20] = 9; }), kWhere), "codec"));
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[32 + 23] = 1; }), kWhere),
              "reserved"));
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[32 + 16] = 2; }), kWhere),
              "file index 2 out of range"));
  // Bytes that do not match the box; an extent outside its file.
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[32 + 9] = 0; }), kWhere),
              "do not match its box"));
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[32 + 6] = 1; }), kWhere),
              "outside file"));
  // An uncompressed shard's stored entry must be empty (z is compressed; its entries are real).
  Manifest mixed = Sharded(kIndexedFormatVersion);
  mixed.tensors[3].shards.push_back(mixed.tensors[3].shards[0]);
  mixed.tensors[3].shape = {4096};
  ShardRecord& plain = mixed.tensors[3].shards[1];
  plain.offsets = {2048};
  plain.codec = codec::Codec::kNone;
  plain.filter = codec::Filter::kNone;
  plain.stored.clear();
  plain.offset = 24576;
  SP_ASSERT_OK(DecodeManifest(EncodeManifest(mixed), kWhere).status());
  // (records: 2 x 40 bytes; entries of 24: z's two, then plain's two; plain's first flags at 132)
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(mixed, 3, [](std::string& s) { s[132] = 1; }), kWhere),
              "invalid stored entry"));
}

// A head is exactly header + head (what the CRC covers) of an unencrypted manifest.
TEST_P(ManifestIndex, HeadMustBeExactlyAnUnencryptedHead) {
  Manifest m = Sharded();
  std::string bytes = EncodeManifest(m);
  const uint64_t head = kManifestHeaderBytes + GetU64(bytes, 16);
  SP_EXPECT_OK(DecodeManifestHead(bytes.substr(0, head), bytes.size(), kWhere).status());
  EXPECT_THAT(DecodeManifestHead(bytes.substr(0, head + 8), bytes.size(), kWhere),
              StatusIs(StatusCode::kCorruption));
  m.encryption.enabled = true;
  for (TensorRecord& t : m.tensors) {
    for (ShardRecord& s : t.shards) s.tags.resize(s.crc32c.size());
  }
  bytes = EncodeManifest(m);
  EXPECT_THAT(DecodeManifestHead(bytes.substr(0, kManifestHeaderBytes + GetU64(bytes, 16)),
                                 bytes.size(), kWhere),
              StatusIs(StatusCode::kCorruption));
}

TEST_P(ManifestIndex, UnknownVersionsStayUnimplemented) {
  std::string bytes = EncodeManifest(Sharded());
  PutU32(&bytes, 8, kMaxFormatVersion + 1);
  PutU32(&bytes, 60, Crc32c(std::string_view(bytes).substr(0, 60)));
  EXPECT_THAT(DecodeManifest(bytes, kWhere), StatusIs(StatusCode::kUnimplemented));
  Result<uint64_t> head = IndexedHeadBytes(bytes, kWhere);
  SP_ASSERT_OK(head.status());
  EXPECT_EQ(*head, 0u);  // read whole, where DecodeManifest names the version
}

TEST_P(ManifestIndex, LargestSectionIsWhatIsWritten) {
  const Manifest m = Sharded();
  const std::string bytes = EncodeManifest(m);
  Result<ManifestHead> h = DecodeManifestHead(
      bytes.substr(0, kManifestHeaderBytes + GetU64(bytes, 16)), bytes.size(), kWhere);
  SP_ASSERT_OK(h.status());
  uint64_t largest = 0;
  for (const SectionRef& r : h->sections) largest = std::max(largest, r.bytes);
  EXPECT_EQ(LargestSection(m), largest);
  Manifest v2 = Sharded();
  v2.version = 2;
  EXPECT_EQ(LargestSection(v2), 0u);
}

// A head whose sections would hold more than kMaxIndexedShards in all is refused before any
// section is read (129 tensors of 2^20 one-byte shards, with no section bytes behind them).
TEST(ManifestIndexCompact, HeadOfTooManyShardsInAllIsCorruption) {
  const std::string bytes = EditHead(Sharded(kCompactFormatVersion), [](Json& j) {
    Json tensors = Json::array();
    const uint64_t n = kMaxShardsPerTensor;
    for (int i = 0; i < 129; ++i) {
      tensors.push_back({{"name", fmt::format("t{:03}", i)},
                         {"dtype", "U8"},
                         {"shape", {n}},
                         {"shards", n},
                         {"chunks", n},
                         {"stored", false},
                         {"section_bytes", n * MinCompactRecordBytes(1) + n * 4},
                         {"section_crc32c", 0}});
    }
    j["tensors"] = tensors;
  });
  EXPECT_TRUE(Corrupt(DecodeManifest(bytes, kWhere), "over 134217728 shards in all"));
}

// Version 4's records: a quarter of version 3's here, and every malformed one refused.
TEST(ManifestIndexCompact, RecordsAreCompactAndHostileOnesAreCorruption) {
  const Manifest m = Sharded(kCompactFormatVersion);
  EXPECT_LT(EncodeManifest(m).size(), EncodeManifest(Sharded(kIndexedFormatVersion)).size());
  // "w": 8 records of 2 dims. Record 0 is its deltas from zeros: offsets 0, 0 (1 byte each),
  // sizes 16, 16 (zigzag 32: 1 byte each), offset 4096 (2 bytes), bytes 1024 (zigzag 2048: 2
  // bytes), file 0, codec 0: 10 bytes.
  const std::string bytes = EncodeManifest(m);
  Result<ManifestHead> h = DecodeManifestHead(
      bytes.substr(0, kManifestHeaderBytes + GetU64(bytes, 16)), bytes.size(), kWhere);
  SP_ASSERT_OK(h.status());
  const SectionRef& w = h->sections[2];
  EXPECT_LT(w.bytes, 8 * ShardRecordBytes(2) / 3 + 8 * 4);
  const std::string section = bytes.substr(w.offset, w.bytes);
  EXPECT_EQ(section.substr(0, 4), std::string("\0\0\x20\x20", 4));
  // Record 0's first offset made -1 (zigzag 1), then 2^62 (out of range): negative or huge.
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[0] = 1; }), kWhere), "huge"));
  // A varint that never ends, and one of 11 bytes: malformed.
  auto endless = [](std::string& s) {
    for (size_t i = 0; i + 32 < s.size(); ++i) s[i] = static_cast<char>(0x80);
  };
  EXPECT_TRUE(Corrupt(DecodeManifest(EditSection(m, 2, endless), kWhere), "malformed"));
  // An unknown codec or filter in record 0's last byte.
  EXPECT_TRUE(Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[9] = 3; }), kWhere),
                      "codec 3"));
  EXPECT_TRUE(Corrupt(
      DecodeManifest(EditSection(m, 2, [](std::string& s) { s[9] = 0x10; }), kWhere), "filter 1"));
  // Bytes that do not match the box (record 0's size 16 -> 17: zigzag 34).
  EXPECT_TRUE(
      Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[2] = 34; }), kWhere), "box"));
  // A file delta of -1 (to 2^64 - 1): not a u32.
  EXPECT_TRUE(Corrupt(DecodeManifest(EditSection(m, 2, [](std::string& s) { s[8] = 1; }), kWhere),
                      "not a u32"));
  // Records that end early leave bytes; a head that claims a byte more is refused.
  EXPECT_TRUE(Corrupt(
      DecodeManifest(EditSection(m, 2, [](std::string& s) { s.insert(s.size() - 32, 1, '\0'); }),
                     kWhere),
      "after its last record"));
}

// The indexed head's fast path (ReadFastHead, head_reader.cc) against the DOM path: a writer's
// head is read fast and decodes as the DOM decodes it; heads of any other form are left to the
// DOM; heads of the writers' form whose checks fail give the DOM's errors.
struct Decoded {
  Status status;
  Json manifest;
  std::vector<SectionRef> sections;
};

// `head` (a JSON head) decoded as the head of `bytes` (whose header is read), fast or not.
Decoded DecodeHead(const std::string& bytes, const std::string& head, bool fast) {
  const internal::Ctx ctx{kWhere};
  Manifest m;
  EXPECT_TRUE(internal::CheckHeader(bytes, ctx, &m).ok());
  Decoded d;
  d.status = internal::DecodeHeadBody(head, ctx, &m, &d.sections, fast);
  if (d.status.ok()) d.manifest = ManifestToJson(m);
  return d;
}

// Both paths give the same status, manifest and sections; the status is returned.
Status ExpectSamePaths(const std::string& bytes, const std::string& head, const char* what) {
  const Decoded fast = DecodeHead(bytes, head, true), dom = DecodeHead(bytes, head, false);
  EXPECT_EQ(fast.status.ToString(), dom.status.ToString()) << what;
  EXPECT_EQ(fast.manifest, dom.manifest) << what;
  EXPECT_EQ(fast.sections.size(), dom.sections.size()) << what;
  for (size_t i = 0; i < std::min(fast.sections.size(), dom.sections.size()); ++i) {
    const SectionRef &a = fast.sections[i], &b = dom.sections[i];
    EXPECT_TRUE(a.bytes == b.bytes && a.crc32c == b.crc32c && a.shards == b.shards &&
                a.chunks == b.chunks && a.stored == b.stored)
        << what << ": section " << i;
  }
  return dom.status;
}

std::string HeadOf(const std::string& bytes) {
  return bytes.substr(kManifestHeaderBytes, GetU64(bytes, 16));
}

TEST_P(ManifestIndex, AWritersHeadIsReadFastAsTheDomReadsIt) {
  const std::string bytes = EncodeManifest(Sharded());
  const std::string head = HeadOf(bytes);
  internal::FastHead f;
  ASSERT_TRUE(internal::ReadFastHead(head, &f));
  ASSERT_EQ(f.files.size(), 2u);
  EXPECT_EQ(f.files[1].name, "data-00001-00000.spd");
  EXPECT_EQ(f.files[1].bytes, 65536u);
  ASSERT_EQ(f.tensors.size(), 4u);
  EXPECT_EQ(f.tensors[2].name, "w");
  EXPECT_EQ(f.tensors[2].dtype, "F32");
  EXPECT_EQ(f.tensors[2].shape, (Shape{64, 32}));
  EXPECT_EQ(f.tensors[2].shards, 8u);
  EXPECT_EQ(f.tensors[2].chunks, 8u);
  EXPECT_FALSE(f.tensors[2].stored);
  EXPECT_TRUE(f.tensors[3].stored);
  EXPECT_EQ(f.tensors[1].shape, Shape{});
  EXPECT_FALSE(f.rest.contains("files") || f.rest.contains("tensors"));
  EXPECT_EQ(f.rest["metadata"], (Json{{"k", "v"}}));
  EXPECT_EQ(f.rest["writer"], "test");
  EXPECT_TRUE(ExpectSamePaths(bytes, head, "as written").ok());
}

// Each edit gives a head of another form than the writers': the fast path does not read it, and
// the decode (the DOM's) is the same either way, whether it succeeds or fails.
TEST_P(ManifestIndex, HeadsOfOtherFormsAreLeftToTheDom) {
  const std::string bytes = EncodeManifest(Sharded());
  const std::string head = HeadOf(bytes);
  auto edit = [&](const std::function<void(Json&)>& f) {
    Json j = Json::parse(head);
    f(j);
    return j.dump();
  };
  auto replaced = [&](std::string_view from, std::string_view to) {
    std::string s = head;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  struct Case {
    const char* what;
    std::string head;
    bool decodes;
  };
  const std::vector<Case> cases = {
      {"a file entry with another key", edit([](Json& j) { j["files"][0]["x"] = 1; }), true},
      {"a tensor entry with another key", edit([](Json& j) { j["tensors"][1]["x"] = {1}; }), true},
      {"a key twice in a file entry", replaced("{\"bytes\":", "{\"name\":\"zz\",\"bytes\":"), true},
      {"files twice", replaced("\"files\":[", "\"files\":[],\"files\":["), true},
      {"tensors twice", replaced("\"tensors\":[", "\"tensors\":7,\"tensors\":["), true},
      {"a float count", edit([](Json& j) { j["tensors"][1]["chunks"] = 2.0; }), false},
      {"a negative dimension", edit([](Json& j) { j["tensors"][2]["shape"][0] = -8; }), false},
      {"a shape of objects", edit([](Json& j) { j["tensors"][2]["shape"] = {Json::object()}; }),
       false},
      {"stored as a number", edit([](Json& j) { j["tensors"][1]["stored"] = 0; }), false},
      {"a file without bytes", edit([](Json& j) { j["files"][1].erase("bytes"); }), false},
      {"a tensor without shards", edit([](Json& j) { j["tensors"][0].erase("shards"); }), false},
      {"files not an array", edit([](Json& j) { j["files"] = Json::object(); }), false},
      {"no tensors", edit([](Json& j) { j.erase("tensors"); }), false},
      {"a null entry", edit([](Json& j) { j["tensors"][1] = nullptr; }), false},
      {"an array, not an object", "[" + head + "]", false},
      {"not JSON", head + "x", false},
  };
  for (const Case& c : cases) {
    internal::FastHead f;
    EXPECT_FALSE(internal::ReadFastHead(c.head, &f)) << c.what;
    EXPECT_EQ(ExpectSamePaths(bytes, c.head, c.what).ok(), c.decodes) << c.what;
  }
}

// Heads of the writers' form whose checks fail: read fast, then decoded again from the DOM, whose
// error is the one reported.
TEST_P(ManifestIndex, HeadsReadFastThatFailACheckGiveTheDomsErrors) {
  const std::string bytes = EncodeManifest(Sharded());
  const Json j = Json::parse(HeadOf(bytes));
  const std::vector<std::pair<const char*, std::function<void(Json&)>>> cases = {
      {"tensors out of order", [](Json& h) { std::swap(h["tensors"][0], h["tensors"][1]); }},
      {"a tensor twice", [](Json& h) { h["tensors"][1] = h["tensors"][0]; }},
      {"a file name that leaves the directory", [](Json& h) { h["files"][1]["name"] = "../x"; }},
      {"a file twice", [](Json& h) { h["files"][1] = h["files"][0]; }},
      {"an unknown dtype", [](Json& h) { h["tensors"][1]["dtype"] = "Q7"; }},
      {"a bad tensor name", [](Json& h) { h["tensors"][2]["name"] = ""; }},
      {"a shape too large",
       [](Json& h) {
         h["tensors"][2]["shape"] = {1ll << 40, 1ll << 40};
       }},
      {"a CRC past 32 bits", [](Json& h) { h["tensors"][1]["section_crc32c"] = 1ull << 33; }},
      {"a section too small", [](Json& h) { h["tensors"][2]["section_bytes"] = 3; }},
      {"stored without compression", [](Json& h) { h["required_features"] = Json::array(); }},
      {"a tensor named as a value", [](Json& h) { h["tensors"][2]["name"] = "step"; }},
      {"a bad checkpoint id", [](Json& h) { h["checkpoint_id"] = "0"; }},
  };
  for (const auto& [what, change] : cases) {
    Json h = j;
    change(h);
    const std::string head = h.dump();
    internal::FastHead f;
    EXPECT_TRUE(internal::ReadFastHead(head, &f)) << what;
    EXPECT_FALSE(ExpectSamePaths(bytes, head, what).ok()) << what;
  }
}

}  // namespace
}  // namespace savepoint::format
