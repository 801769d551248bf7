// Unit tests of EncodeManifest / DecodeManifest: a round trip of a hand-built manifest, then a
// table of hostile mutations. Binary mutations (truncation, bit flips) must be caught by the
// framing checks; JSON mutations are re-framed with a correct header and CRCs so that the
// validator, not a checksum, has to catch them.
#include "format/manifest.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "format/endian.h"
#include "format/manifest_checks.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::format {
namespace {

using ::savepoint::testing::StatusIs;

constexpr std::string_view kWhere = "/ck/MANIFEST";
constexpr uint64_t kId = 0x0123456789abcdefULL;
constexpr uint64_t kFileBytes = 28672;

ShardRecord MakeShard(Shape offsets, Shape sizes, uint64_t offset, uint64_t bytes, int chunks) {
  ShardRecord s;
  s.offsets = std::move(offsets);
  s.sizes = std::move(sizes);
  s.file = 0;
  s.offset = offset;
  s.bytes = bytes;
  for (int c = 0; c < chunks; ++c) s.crc32c.push_back(0x1000u * static_cast<uint32_t>(c + 1) + 7);
  return s;
}

// A valid manifest: four tensors in one 28 KiB data file (chunk_bytes 4096), values of every kind
// and metadata. Layout of data-00000-00000.spd:
//   "a" F32 [4, 8] in two shards (rows 0-1 at 4096, rows 2-3 at 8192), 64 bytes each;
//   "b" U8 [10000] at 12288 (3 chunks); "c" F64 scalar at 24576; "d" BF16 [0, 3] (no bytes).
Manifest ValidManifest() {
  Manifest m;
  m.checkpoint_id = kId;
  m.created_ns = 1795000000000000000;
  m.writer = "savepoint test";
  m.chunk_bytes = 4096;
  m.files.push_back({"data-00000-00000.spd", kFileBytes});
  TensorRecord a{"a", DType::kF32, {4, 8}, {}};
  a.shards.push_back(MakeShard({0, 0}, {2, 8}, 4096, 64, 1));
  a.shards.push_back(MakeShard({2, 0}, {2, 8}, 8192, 64, 1));
  m.tensors.push_back(std::move(a));
  m.tensors.push_back({"b", DType::kU8, {10000}, {MakeShard({0}, {10000}, 12288, 10000, 3)}});
  m.tensors.push_back({"c", DType::kF64, {}, {MakeShard({}, {}, 24576, 8, 1)}});
  m.tensors.push_back({"d", DType::kBF16, {0, 3}, {MakeShard({0, 0}, {0, 3}, 4096, 0, 0)}});
  EXPECT_TRUE(m.values.PutValue("step", int64_t{1000}).ok());
  EXPECT_TRUE(m.values.PutValue("lr", 0.0003).ok());
  EXPECT_TRUE(m.values.PutValue("nan", std::numeric_limits<double>::quiet_NaN()).ok());
  EXPECT_TRUE(m.values.PutValue("ninf", -std::numeric_limits<double>::infinity()).ok());
  EXPECT_TRUE(m.values.PutValue("flag", true).ok());
  EXPECT_TRUE(m.values.PutValue("run", "exp-\xc3\xa9").ok());
  EXPECT_TRUE(m.values.PutValue("rng", Bytes{{0, 1, 2, 255}}).ok());
  EXPECT_TRUE(m.values.PutValue("cfg", Value::FromJson(Json{{"layers", 24}})).ok());
  m.values.metadata() = Json{{"user", "x"}, {"deep", {1, {2, {3}}}}};
  return m;
}

// Header + body, framed exactly like EncodeManifest does, with correct CRCs.
std::string Frame(std::string_view body, uint32_t version = kFormatVersion,
                  uint64_t body_len_field = UINT64_MAX, uint32_t header_size = 64) {
  std::string h(kManifestHeaderBytes, '\0');
  h.replace(0, 8, kManifestMagic);
  PutU32(&h, 8, version);
  PutU32(&h, 12, header_size);
  PutU64(&h, 16, body_len_field == UINT64_MAX ? body.size() : body_len_field);
  PutU64(&h, 24, kId);
  PutU32(&h, 32, Crc32c(body));
  PutU32(&h, 36, 0);
  PutU32(&h, 60, Crc32c(std::string_view(h).substr(0, 60)));
  return h + std::string(body);
}

// Recomputes the header CRC of framed bytes (after a header field was edited).
void FixHeaderCrc(std::string* bytes) {
  PutU32(bytes, 60, Crc32c(std::string_view(*bytes).substr(0, 60)));
}

Json BaseJson() { return ManifestToJson(ValidManifest()); }

Result<Manifest> DecodeBody(std::string_view body) { return DecodeManifest(Frame(body), kWhere); }
Result<Manifest> DecodeJson(const Json& j) { return DecodeBody(j.dump()); }

// Asserts that `r` failed with `code` and a message that names the manifest and contains `needle`.
::testing::AssertionResult Rejected(const Result<Manifest>& r, StatusCode code,
                                    std::string_view needle) {
  if (r.ok()) return ::testing::AssertionFailure() << "accepted";
  const Status& s = r.status();
  if (s.code() != code) {
    return ::testing::AssertionFailure() << "wrong code: " << s.ToString();
  }
  if (s.message().find(kWhere) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message does not name " << kWhere << ": " << s.ToString();
  }
  if (s.message().find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": " << s.ToString();
  }
  return ::testing::AssertionSuccess();
}

TEST(Manifest, RoundTrip) {
  Manifest m = ValidManifest();
  std::string bytes = EncodeManifest(m);
  ASSERT_EQ(bytes.substr(0, 8), kManifestMagic);
  EXPECT_EQ(GetU64(bytes, 16), bytes.size() - kManifestHeaderBytes);
  Result<Manifest> back = DecodeManifest(bytes, kWhere);
  SP_ASSERT_OK(back.status());
  EXPECT_EQ(back->version, kFormatVersion);
  EXPECT_EQ(back->checkpoint_id, kId);
  EXPECT_EQ(back->created_ns, m.created_ns);
  EXPECT_EQ(back->writer, m.writer);
  EXPECT_EQ(back->chunk_bytes, m.chunk_bytes);
  ASSERT_EQ(back->files.size(), 1u);
  EXPECT_EQ(back->files[0].name, m.files[0].name);
  EXPECT_EQ(back->files[0].bytes, kFileBytes);
  ASSERT_EQ(back->tensors.size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const TensorRecord& x = m.tensors[i];
    const TensorRecord& y = back->tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    ASSERT_EQ(x.shards.size(), y.shards.size());
    for (size_t k = 0; k < x.shards.size(); ++k) {
      EXPECT_EQ(x.shards[k].offsets, y.shards[k].offsets);
      EXPECT_EQ(x.shards[k].sizes, y.shards[k].sizes);
      EXPECT_EQ(x.shards[k].file, y.shards[k].file);
      EXPECT_EQ(x.shards[k].offset, y.shards[k].offset);
      EXPECT_EQ(x.shards[k].bytes, y.shards[k].bytes);
      EXPECT_EQ(x.shards[k].crc32c, y.shards[k].crc32c);
    }
  }
  EXPECT_TRUE(testing::StatesEqual(m.values, back->values));
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  EXPECT_EQ(EncodeManifest(*back), bytes);  // deterministic
}

TEST(Manifest, TensorsAreSortedByName) {
  Json j = BaseJson();
  std::swap(j["tensors"][0], j["tensors"][3]);
  Result<Manifest> m = DecodeJson(j);
  SP_ASSERT_OK(m.status());
  ASSERT_EQ(m->tensors.size(), 4u);
  EXPECT_EQ(m->tensors[0].name, "a");
  EXPECT_EQ(m->tensors[3].name, "d");
}

TEST(Manifest, UnknownKeysAreIgnored) {
  Json j = BaseJson();
  j["future_optional_field"] = {{"x", 1}};
  j["tensors"][1]["hint"] = "ignored";
  SP_EXPECT_OK(DecodeJson(j).status());
}

TEST(Manifest, TruncatedAtEveryLength) {
  Manifest m;
  m.checkpoint_id = kId;
  m.chunk_bytes = 4096;
  m.files.push_back({"data-00000-00000.spd", 8192});
  m.tensors.push_back({"t", DType::kU8, {3}, {MakeShard({0}, {3}, 4096, 3, 1)}});
  std::string bytes = EncodeManifest(m);
  SP_ASSERT_OK(DecodeManifest(bytes, kWhere).status());
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<Manifest> r = DecodeManifest(std::string_view(bytes).substr(0, n), kWhere);
    EXPECT_TRUE(Rejected(r, StatusCode::kCorruption, "")) << "length " << n;
  }
  // Padded by one byte: also rejected.
  EXPECT_TRUE(Rejected(DecodeManifest(bytes + " ", kWhere), StatusCode::kCorruption, "padded"));
}

TEST(Manifest, EveryHeaderBitFlipIsCaught) {
  std::string bytes = EncodeManifest(ValidManifest());
  for (size_t bit = 0; bit < kManifestHeaderBytes * 8; ++bit) {
    std::string bad = bytes;
    bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    EXPECT_TRUE(Rejected(DecodeManifest(bad, kWhere), StatusCode::kCorruption, ""))
        << "bit " << bit;
  }
}

TEST(Manifest, BodyBitFlipsAreCaught) {
  uint64_t seed = testing::TestSeed("Manifest.BodyBitFlipsAreCaught");
  std::mt19937_64 rng(seed);
  std::string bytes = EncodeManifest(ValidManifest());
  size_t body = bytes.size() - kManifestHeaderBytes;
  for (int i = 0; i < 2000; ++i) {
    size_t bit = kManifestHeaderBytes * 8 + rng() % (body * 8);
    std::string bad = bytes;
    bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    EXPECT_TRUE(
        Rejected(DecodeManifest(bad, kWhere), StatusCode::kCorruption, "body checksum mismatch"))
        << "bit " << bit;
  }
}

TEST(Manifest, HeaderFields) {
  std::string good = EncodeManifest(ValidManifest());
  std::string body = good.substr(kManifestHeaderBytes);

  std::string magic = good;
  magic[0] = 'X';
  EXPECT_TRUE(Rejected(DecodeManifest(magic, kWhere), StatusCode::kCorruption, "bad magic"));
  FixHeaderCrc(&magic);
  EXPECT_TRUE(Rejected(DecodeManifest(magic, kWhere), StatusCode::kCorruption, "bad magic"));

  EXPECT_TRUE(
      Rejected(DecodeManifest(Frame(body, 5), kWhere), StatusCode::kUnimplemented, "version 5"));
  EXPECT_TRUE(
      Rejected(DecodeManifest(Frame(body, 0), kWhere), StatusCode::kUnimplemented, "version 0"));
  EXPECT_TRUE(Rejected(DecodeManifest(Frame(body, 1, uint64_t{1} << 63), kWhere),
                       StatusCode::kCorruption, "exceeds the cap"));
  EXPECT_TRUE(Rejected(DecodeManifest(Frame(body, 1, kMaxManifestBodyBytes + 1), kWhere),
                       StatusCode::kCorruption, "exceeds the cap"));
  EXPECT_TRUE(Rejected(DecodeManifest(Frame(body, 1, body.size() + 1), kWhere),
                       StatusCode::kCorruption, "truncated"));
  EXPECT_TRUE(Rejected(DecodeManifest(Frame(body, 1, body.size() - 1), kWhere),
                       StatusCode::kCorruption, "padded"));
  EXPECT_TRUE(Rejected(DecodeManifest(Frame(body, 1, UINT64_MAX - 1), kWhere),
                       StatusCode::kCorruption, "exceeds the cap"));
  EXPECT_TRUE(Rejected(DecodeManifest(Frame(body, 1, body.size(), 65), kWhere),
                       StatusCode::kCorruption, "header size"));

  std::string body_crc = good;
  PutU32(&body_crc, 32, GetU32(good, 32) ^ 1);
  FixHeaderCrc(&body_crc);
  EXPECT_TRUE(Rejected(DecodeManifest(body_crc, kWhere), StatusCode::kCorruption,
                       "body checksum mismatch"));
}

TEST(Manifest, BodyNotAnObject) {
  for (std::string_view body :
       {"[]", "42", "\"savepoint\"", "null", "", "{", "{\"format\":", "{} {}", "\xef\xbb\xbf{}"}) {
    Result<Manifest> r = DecodeBody(body);
    EXPECT_TRUE(Rejected(r, StatusCode::kCorruption, ""))
        << "body " << ::testing::PrintToString(body);
  }
  EXPECT_TRUE(Rejected(DecodeBody("[]"), StatusCode::kCorruption, "not a JSON object"));
  EXPECT_TRUE(Rejected(DecodeBody("{"), StatusCode::kCorruption, "not valid JSON"));
  EXPECT_TRUE(Rejected(DecodeBody("{}"), StatusCode::kCorruption, "lacks field \"format\""));
}

// The body with `"metadata": <nested>` where nested is `depth` arrays inside each other.
std::string WithDeepMetadata(size_t depth) {
  Json j = BaseJson();
  j["metadata"] = "@@DEEP@@";
  std::string body = j.dump();
  std::string deep = std::string(depth, '[') + std::string(depth, ']');
  body.replace(body.find("\"@@DEEP@@\""), 10, deep);
  return body;
}

TEST(Manifest, JsonDepth) {
  EXPECT_TRUE(
      Rejected(DecodeBody(WithDeepMetadata(10000)), StatusCode::kCorruption, "nested too deeply"));
  EXPECT_TRUE(Rejected(DecodeBody(std::string(1 << 20, '[')), StatusCode::kCorruption,
                       "nested too deeply"));
  // The root object is level 1: 63 more levels are the limit.
  SP_EXPECT_OK(DecodeBody(WithDeepMetadata(kMaxJsonDepth - 1)).status());
  EXPECT_TRUE(Rejected(DecodeBody(WithDeepMetadata(kMaxJsonDepth)), StatusCode::kCorruption,
                       "nested too deeply"));
  // Brackets inside strings (with escaped quotes) do not count.
  Json j = BaseJson();
  j["metadata"] = {{"s", "\\\"" + std::string(10000, '[') + "\"{{{"}};
  Result<Manifest> m = DecodeJson(j);
  SP_ASSERT_OK(m.status());
  EXPECT_EQ(m->values.metadata(), j["metadata"]);
}

// One JSON-level mutation of the valid manifest that the validator must reject.
struct Mutation {
  std::string name;
  std::function<void(Json&)> mutate;
  StatusCode code;
  std::string needle;  // expected in the message
};

Json& TensorAt(Json& j, size_t i) { return j["tensors"][i]; }  // a, b, c, d
Json& ShardAt(Json& j, size_t i, size_t k = 0) { return j["tensors"][i]["shards"][k]; }
Json& ValueAt(Json& j, const std::string& name) {
  for (Json& v : j["values"]) {
    if (v["name"] == name) return v;
  }
  ADD_FAILURE() << "no value " << name;
  return j;
}

constexpr StatusCode kC = StatusCode::kCorruption;
constexpr uint64_t k2p62 = uint64_t{1} << 62;

std::vector<Mutation> Mutations() {
  std::vector<Mutation> v = {
      {"FormatNotSavepoint", [](Json& j) { j["format"] = "safetensors"; }, kC, "format"},
      {"FormatMissing", [](Json& j) { j.erase("format"); }, kC, "lacks field \"format\""},
      {"RequiredFeaturesZstd", [](Json& j) { j["required_features"] = {"zstd"}; },
       StatusCode::kUnimplemented, "zstd"},
      {"RequiredFeaturesNotArray", [](Json& j) { j["required_features"] = "zstd"; }, kC,
       "required_features"},
      {"WriterNotString", [](Json& j) { j["writer"] = 7; }, kC, "writer"},
      {"CreatedNegative", [](Json& j) { j["created_ns"] = -1; }, kC, "created_ns"},
      {"ChunkBytesZero", [](Json& j) { j["chunk_bytes"] = 0; }, kC, "chunk_bytes 0"},
      {"ChunkBytes1000", [](Json& j) { j["chunk_bytes"] = 1000; }, kC, "chunk_bytes 1000"},
      {"ChunkBytes2p40", [](Json& j) { j["chunk_bytes"] = uint64_t{1} << 40; }, kC, "chunk_bytes"},
      {"ChunkBytesFloat", [](Json& j) { j["chunk_bytes"] = 4096.0; }, kC, "chunk_bytes"},
      {"FilesNotArray", [](Json& j) { j["files"] = Json::object(); }, kC, "files"},
      {"FileNameDotDot", [](Json& j) { j["files"][0]["name"] = "../x"; }, kC, "file name"},
      {"FileNameSlash", [](Json& j) { j["files"][0]["name"] = "a/b"; }, kC, "file name"},
      {"FileNameHidden", [](Json& j) { j["files"][0]["name"] = ".hidden"; }, kC, "file name"},
      {"FileNameEmpty", [](Json& j) { j["files"][0]["name"] = ""; }, kC, "file name"},
      {"FileNameNul", [](Json& j) { j["files"][0]["name"] = std::string("a\0b", 3); }, kC,
       "file name"},
      {"FileNameTooLong", [](Json& j) { j["files"][0]["name"] = std::string(256, 'a'); }, kC,
       "file name"},
      {"FileNameDuplicate", [](Json& j) { j["files"].push_back(j["files"][0]); }, kC, "repeats"},
      {"FileNameDuplicateBeforeABadEntry",
       [](Json& j) {
         j["files"].push_back(j["files"][0]);
         j["files"].push_back(Json{{"name", 7}});
       },
       kC, "repeats"},
      {"FileBytesNegative", [](Json& j) { j["files"][0]["bytes"] = -4096; }, kC, "bytes"},
      {"DimHuge", [](Json& j) { TensorAt(j, 1)["shape"] = {k2p62 + 1}; }, kC, "dimension"},
      {"DimNegative", [](Json& j) { TensorAt(j, 1)["shape"] = {-1}; }, kC, "dimension"},
      {"DimFloat", [](Json& j) { TensorAt(j, 1)["shape"] = {10000.0}; }, kC, "dimension"},
      {"Rank65",
       [](Json& j) {
         TensorAt(j, 1)["shape"] = Json(std::vector<int>(65, 1));
         ShardAt(j, 1)["offsets"] = Json(std::vector<int>(65, 0));
         ShardAt(j, 1)["sizes"] = Json(std::vector<int>(65, 1));
       },
       kC, "65 entries"},
      {"ShapeBytesOverflow",
       [](Json& j) {
         TensorAt(j, 0)["shape"] = {uint64_t{1} << 60, 2};
       },
       kC, "shape too large"},
      {"ShapeElementsOverflow",
       [](Json& j) {
         TensorAt(j, 0)["shape"] = {k2p62, k2p62};
       },
       kC, "shape too large"},
      {"DTypeUnknown", [](Json& j) { TensorAt(j, 1)["dtype"] = "F7"; }, kC, "unknown dtype \"F7\""},
      {"DTypeLowerCase", [](Json& j) { TensorAt(j, 1)["dtype"] = "u8"; }, kC, "unknown dtype"},
      {"DTypeWrongSize", [](Json& j) { TensorAt(j, 1)["dtype"] = "U16"; }, kC, "do not match"},
      {"TensorNameNul", [](Json& j) { TensorAt(j, 2)["name"] = std::string("c\0x", 3); }, kC,
       "control character"},
      {"TensorNameEmpty", [](Json& j) { TensorAt(j, 2)["name"] = ""; }, kC, "empty name"},
      {"TensorNameDuplicate", [](Json& j) { TensorAt(j, 2)["name"] = "b"; }, kC, "appears twice"},
      {"TensorMissingShards", [](Json& j) { TensorAt(j, 1).erase("shards"); }, kC, "shards"},
      {"ShardRankMismatch",
       [](Json& j) {
         ShardAt(j, 1)["offsets"] = {0, 0};
       },
       kC, "rank"},
      {"ShardOutOfBounds",
       [](Json& j) {
         ShardAt(j, 0, 1)["offsets"] = {3, 0};
       },
       kC, "exceeds shape"},
      {"ShardOffsetHuge", [](Json& j) { ShardAt(j, 1)["offsets"] = {k2p62}; }, kC, "exceeds shape"},
      {"ShardsOverlap",
       [](Json& j) {
         ShardAt(j, 0, 1)["offsets"] = {1, 0};
       },
       kC, "overlap"},
      {"ShardsGap",
       [](Json& j) {
         ShardAt(j, 0, 1)["sizes"] = {1, 8};
         ShardAt(j, 0, 1)["bytes"] = 32;
       },
       kC, "cover 24 of 32"},
      {"ShardDuplicated", [](Json& j) { TensorAt(j, 2)["shards"].push_back(ShardAt(j, 2)); }, kC,
       "overlap"},
      {"ShardsMissing", [](Json& j) { TensorAt(j, 1)["shards"] = Json::array(); }, kC,
       "cover 0 of 10000"},
      {"ShardBytesMismatch", [](Json& j) { ShardAt(j, 1)["bytes"] = 9999; }, kC, "do not match"},
      {"ExtentsOverlap", [](Json& j) { ShardAt(j, 1)["offset"] = 4096; }, kC, "overlap in file"},
      {"ExtentBeyondFile", [](Json& j) { ShardAt(j, 2)["offset"] = kFileBytes; }, kC,
       "outside file"},
      {"FileShorterThanExtents", [](Json& j) { j["files"][0]["bytes"] = kFileBytes - 4096; }, kC,
       "outside file"},
      {"ExtentMisaligned", [](Json& j) { ShardAt(j, 2)["offset"] = 24577; }, kC, "misaligned"},
      {"ExtentInHeader", [](Json& j) { ShardAt(j, 2)["offset"] = 0; }, kC, "misaligned"},
      {"ExtentOverflowsU64",
       [](Json& j) {
         j["files"][0]["bytes"] = UINT64_MAX;
         ShardAt(j, 1)["offset"] = UINT64_MAX - 4095;  // a multiple of 4096
       },
       kC, "extent"},
      {"FileIndexOutOfRange", [](Json& j) { ShardAt(j, 1)["file"] = 1; }, kC, "file index 1"},
      {"FileIndexHuge", [](Json& j) { ShardAt(j, 1)["file"] = uint64_t{1} << 40; }, kC,
       "out of range"},
      {"ChecksumsTooFew",
       [](Json& j) {
         ShardAt(j, 1)["crc32c"] = {1, 2};
       },
       kC, "2 checksums for 3 chunks"},
      {"ChecksumsTooMany", [](Json& j) { ShardAt(j, 1)["crc32c"].push_back(4); }, kC, "crc32c"},
      {"ChecksumsForEmptyShard", [](Json& j) { ShardAt(j, 3)["crc32c"] = {0}; }, kC, "crc32c"},
      {"ChecksumNotU32", [](Json& j) { ShardAt(j, 2)["crc32c"] = {uint64_t{1} << 32}; }, kC,
       "not a u32"},
      {"ChecksumNegative", [](Json& j) { ShardAt(j, 2)["crc32c"] = {-1}; }, kC, "not a u32"},
      {"BytesValueBadBase64", [](Json& j) { ValueAt(j, "rng")["value"] = "@@@@"; }, kC, "base64"},
      {"BytesValueBadLength", [](Json& j) { ValueAt(j, "rng")["value"] = "AAECAw="; }, kC,
       "base64"},
      {"BytesValueNotString",
       [](Json& j) {
         ValueAt(j, "rng")["value"] = {0, 1};
       },
       kC, "values["},
      {"IntValueU64Max", [](Json& j) { ValueAt(j, "step")["value"] = UINT64_MAX; }, kC,
       "int out of range"},
      {"IntValueFloat", [](Json& j) { ValueAt(j, "step")["value"] = 1.5; }, kC, "wrong type"},
      {"FloatValueBadString", [](Json& j) { ValueAt(j, "lr")["value"] = "NaN"; }, kC, "bad float"},
      {"BoolValueInt", [](Json& j) { ValueAt(j, "flag")["value"] = 1; }, kC, "wrong type"},
      {"UnknownValueKind", [](Json& j) { ValueAt(j, "step")["kind"] = "complex"; }, kC,
       "unknown kind \"complex\""},
      {"ValueMissing", [](Json& j) { ValueAt(j, "step").erase("value"); }, kC, "lacks field"},
      {"ValueNameDuplicate", [](Json& j) { ValueAt(j, "lr")["name"] = "step"; }, kC, "duplicate"},
      {"ValueNameNul", [](Json& j) { ValueAt(j, "lr")["name"] = std::string("l\0r", 3); }, kC,
       "control character"},
      {"NameIsTensorAndValue", [](Json& j) { ValueAt(j, "step")["name"] = "b"; }, kC,
       "both tensor and value"},
  };
  return v;
}

class ManifestMutation : public ::testing::TestWithParam<Mutation> {};

TEST_P(ManifestMutation, IsRejected) {
  const Mutation& mu = GetParam();
  Json j = BaseJson();
  SP_ASSERT_OK(DecodeJson(j).status());
  mu.mutate(j);
  Result<Manifest> r = DecodeJson(j);
  EXPECT_TRUE(Rejected(r, mu.code, mu.needle)) << j.dump();
}

INSTANTIATE_TEST_SUITE_P(Hostile, ManifestMutation, ::testing::ValuesIn(Mutations()),
                         [](const ::testing::TestParamInfo<Mutation>& info) {
                           return info.param.name;
                         });

// Raw-text mutations (bytes that nlohmann::json cannot represent): a placeholder string in the
// dumped body is replaced by `raw`.
Result<Manifest> DecodeWithRawName(bool tensor, std::string_view raw) {
  Json j = BaseJson();
  if (tensor) {
    TensorAt(j, 2)["name"] = "@@NAME@@";
  } else {
    ValueAt(j, "lr")["name"] = "@@NAME@@";
  }
  std::string body = j.dump();
  body.replace(body.find("@@NAME@@"), 8, raw);
  return DecodeBody(body);
}

TEST(Manifest, InvalidUtf8Names) {
  for (std::string_view raw :
       {"\xff", "c\xc0\x80", "\xed\xa0\x80", "\xe4\xb8", "\xf4\x90\x80\x80"}) {
    EXPECT_TRUE(Rejected(DecodeWithRawName(true, raw), kC, "")) << ::testing::PrintToString(raw);
    EXPECT_TRUE(Rejected(DecodeWithRawName(false, raw), kC, "")) << ::testing::PrintToString(raw);
  }
  // The same names, written as JSON escapes of lone surrogates.
  EXPECT_TRUE(Rejected(DecodeWithRawName(true, "\\ud800"), kC, ""));
  // Valid non-ASCII names are fine.
  Result<Manifest> ok = DecodeWithRawName(true, "\xe5\xb1\x82.\xf0\x9f\x99\x82");
  SP_ASSERT_OK(ok.status());
}

TEST(Manifest, ValueKindsDecode) {
  Result<Manifest> m = DecodeJson(BaseJson());
  SP_ASSERT_OK(m.status());
  const State& v = m->values;
  EXPECT_EQ(v.FindValue("step")->as_int(), 1000);
  EXPECT_TRUE(std::isnan(v.FindValue("nan")->as_float()));
  EXPECT_EQ(v.FindValue("ninf")->as_float(), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(v.FindValue("rng")->as_bytes().data, (std::vector<uint8_t>{0, 1, 2, 255}));
  EXPECT_EQ(v.FindValue("cfg")->as_json()["layers"], 24);
  // Extremes that are valid.
  Json j = BaseJson();
  ValueAt(j, "step")["value"] = std::numeric_limits<int64_t>::min();
  ValueAt(j, "lr")["value"] = 3;  // an integer JSON number is a valid float
  ValueAt(j, "rng")["value"] = "";
  m = DecodeJson(j);
  SP_ASSERT_OK(m.status());
  EXPECT_EQ(m->values.FindValue("step")->as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(m->values.FindValue("lr")->as_float(), 3.0);
  EXPECT_TRUE(m->values.FindValue("rng")->as_bytes().data.empty());
}

// A zero-volume shard whose offset + size overflows int64 in one dimension must still be
// rejected as out of bounds (the check must not rely on signed overflow).
TEST(Manifest, EmptyShardBoxOverflowingInt64IsRejected) {
  Json j = BaseJson();
  ShardAt(j, 3)["offsets"] = {k2p62, 0};
  ShardAt(j, 3)["sizes"] = {k2p62, 0};
  EXPECT_TRUE(Rejected(DecodeJson(j), kC, "exceeds shape")) << j.dump();
}

TEST(Manifest, EmptyShardOutOfBoundsIsRejected) {
  Json j = BaseJson();
  ShardAt(j, 3)["offsets"] = {1, 0};
  EXPECT_TRUE(Rejected(DecodeJson(j), kC, "exceeds shape"));
}

// Seconds DecodeManifest takes for a [1, n] (side by side in dimension 1) or [n, 1] (stacked in
// dimension 0) U8 tensor cut into n one-element shards. Both manifests have the same size.
double SecondsToDecodeShards(int n, bool side_by_side) {
  Manifest m;
  m.chunk_bytes = 4096;
  m.files.push_back({"data-00000-00000.spd", uint64_t{4096} * (n + 1)});
  TensorRecord t{"t", DType::kU8, side_by_side ? Shape{1, n} : Shape{n, 1}, {}};
  for (int k = 0; k < n; ++k) {
    Shape offsets = side_by_side ? Shape{0, k} : Shape{k, 0};
    t.shards.push_back(MakeShard(offsets, {1, 1}, uint64_t{4096} * (k + 1), 1, 1));
  }
  m.tensors.push_back(std::move(t));
  std::string bytes = EncodeManifest(m);
  double seconds = 1e9;  // the fastest of 3 (a busy machine slows one run, not the shape's cost)
  for (int run = 0; run < 3; ++run) {
    auto start = std::chrono::steady_clock::now();
    Result<Manifest> r = DecodeManifest(bytes, kWhere);
    seconds = std::min(
        seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
  }
  return seconds;
}

// Validation time must not grow quadratically with the number of shards (the cap allows 2^20 per
// tensor): 2^15 shards side by side in dimension 1 must not take much longer to validate than
// the same number stacked in dimension 0.
// The tiling check's count of distinct offsets: sorted, unsorted, and values that all hash to one
// slot (found by search), which make the hash set fall back to sorting; each count exact.
TEST(Manifest, DistinctCountIsExactWhateverTheValues) {
  std::vector<int64_t> table, sorted = {0, 0, 3, 3, 3, 7, 9};
  EXPECT_EQ(internal::DistinctCount(sorted, table), 4u);
  std::vector<int64_t> shuffled = {9, 3, 0, 7, 3, 0, 3};
  EXPECT_EQ(internal::DistinctCount(shuffled, table), 4u);
  std::vector<int64_t> colliding;  // 65 values -> a table of 256 slots (8 bits)
  for (int64_t v = 1 << 20; colliding.size() < 64; ++v) {
    if ((static_cast<uint64_t>(v) * 0x9e3779b97f4a7c15u) >> 56 == 5) colliding.push_back(v);
  }
  std::reverse(colliding.begin(), colliding.end());
  colliding.push_back(colliding[3]);
  EXPECT_EQ(internal::DistinctCount(colliding, table), 64u);
}

TEST(Manifest, ManyShardsValidateInSubquadraticTime) {
  constexpr int kShards = 1 << 15;
  double stacked = SecondsToDecodeShards(kShards, false);
  double side_by_side = SecondsToDecodeShards(kShards, true);
  EXPECT_LT(side_by_side, 4 * stacked + 0.1)
      << "stacked: " << stacked << " s; CheckTiling compares shards pairwise";
}

TEST(Manifest, DataHeader) {
  std::string h = EncodeDataHeader(kId, 3);
  ASSERT_EQ(h.size(), kDataHeaderBytes);
  SP_EXPECT_OK(CheckDataHeader(h, kId, 3, kFormatVersion, "f"));
  EXPECT_EQ(CheckDataHeader(h, kId + 1, 3, kFormatVersion, "f").code(), kC);
  EXPECT_NE(
      CheckDataHeader(h, kId + 1, 3, kFormatVersion, "f").message().find("another checkpoint"),
      std::string::npos);
  EXPECT_EQ(CheckDataHeader(h, kId, 2, kFormatVersion, "f").code(), kC);
  EXPECT_EQ(CheckDataHeader(h.substr(0, 100), kId, 3, kFormatVersion, "f").code(), kC);
  for (size_t bit = 0; bit < kDataHeaderBytes * 8; bit += 7) {
    std::string bad = h;
    bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    EXPECT_EQ(CheckDataHeader(bad, kId, 3, kFormatVersion, "f").code(), kC) << "bit " << bit;
  }
  // A version this build does not know, and a known one that differs from the manifest's.
  std::string v5 = h;
  PutU32(&v5, 8, kMaxFormatVersion + 1);
  PutU32(&v5, kDataHeaderBytes - 4, Crc32c(std::string_view(v5).substr(0, kDataHeaderBytes - 4)));
  EXPECT_THAT(CheckDataHeader(v5, kId, 3, kFormatVersion, "f"),
              StatusIs(StatusCode::kUnimplemented));
  std::string v1 = EncodeDataHeader(kId, 3, 1);
  SP_EXPECT_OK(CheckDataHeader(v1, kId, 3, 1, "f"));
  Status mixed = CheckDataHeader(v1, kId, 3, 2, "f");
  EXPECT_EQ(mixed.code(), kC);
  EXPECT_NE(mixed.message().find("data file format version 1, the manifest's is 2"),
            std::string::npos)
      << mixed.ToString();
}

TEST(Manifest, ValidateFileName) {
  SP_EXPECT_OK(ValidateFileName("data-00000-00000.spd"));
  SP_EXPECT_OK(ValidateFileName(std::string(255, 'x')));
  for (std::string_view bad :
       {"", ".", "..", "../x", "a/b", ".hidden", "a b", "a\\b", "\xc3\xa9", "MANIFEST\n"}) {
    EXPECT_EQ(ValidateFileName(bad).code(), kC) << ::testing::PrintToString(bad);
  }
  EXPECT_EQ(ValidateFileName(std::string("a\0b", 3)).code(), kC);
}

}  // namespace
}  // namespace savepoint::format
