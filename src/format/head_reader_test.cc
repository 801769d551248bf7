// The indexed head's fast path (ReadFastHead, head_reader.cc) against the DOM path: a writer's
// head is read fast and decodes as the DOM decodes it; heads of any other form are left to the
// DOM; heads of the writers' form whose checks fail give the DOM's errors.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "format/endian.h"
#include "format/manifest.h"
#include "format/manifest_checks.h"
#include "format/manifest_index.h"

namespace savepoint::format {
namespace {

constexpr std::string_view kWhere = "/ck/MANIFEST";

// "w" (F32 [8, 4] in two row blocks, one per file), "s" (a scalar) and "z" (compressed).
Manifest Sample(uint32_t version) {
  Manifest m;
  m.version = version;
  m.checkpoint_id = 0x1234;
  m.writer = "test";
  m.chunk_bytes = 4096;
  m.files = {{"data-00000-00000.spd", 65536}, {"data-00001-00000.spd", 65536}};
  TensorRecord w{"w", DType::kF32, {8, 4}, {}};
  for (uint32_t f = 0; f < 2; ++f) {
    ShardRecord s;
    s.offsets = {4 * int64_t{f}, 0};
    s.sizes = {4, 4};
    s.offset = 4096;
    s.bytes = 64;
    s.file = f;
    s.crc32c = {7 + f};
    w.shards.push_back(s);
  }
  TensorRecord sc{"s", DType::kI64, {}, {}};
  ShardRecord ss;
  ss.offset = 8192;
  ss.bytes = 8;
  ss.crc32c = {5};
  sc.shards.push_back(ss);
  TensorRecord z{"z", DType::kF32, {2048}, {}};
  ShardRecord zs;
  zs.offsets = {0};
  zs.sizes = {2048};
  zs.bytes = 8192;
  zs.crc32c = {11, 22};
  zs.codec = codec::Codec::kZstd;
  zs.stored = {{16384, 100, true}, {20480, 4096, false}};
  z.shards.push_back(zs);
  m.tensors = {sc, w, z};  // by name
  EXPECT_TRUE(m.values.PutValue("step", int64_t{7}).ok());
  m.values.metadata() = Json{{"k", "v"}};
  return m;
}

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

class HeadReader : public ::testing::TestWithParam<uint32_t> {};
INSTANTIATE_TEST_SUITE_P(Versions, HeadReader,
                         ::testing::Values(kIndexedFormatVersion, kCompactFormatVersion));

TEST_P(HeadReader, AWritersHeadIsReadFastAsTheDomReadsIt) {
  const std::string bytes = EncodeManifest(Sample(GetParam()));
  const std::string head = HeadOf(bytes);
  internal::FastHead f;
  ASSERT_TRUE(internal::ReadFastHead(head, &f));
  ASSERT_EQ(f.files.size(), 2u);
  EXPECT_EQ(f.files[1].name, "data-00001-00000.spd");
  EXPECT_EQ(f.files[1].bytes, 65536u);
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[1].name, "w");
  EXPECT_EQ(f.tensors[1].dtype, "F32");
  EXPECT_EQ(f.tensors[1].shape, (Shape{8, 4}));
  EXPECT_EQ(f.tensors[1].shards, 2u);
  EXPECT_EQ(f.tensors[1].chunks, 2u);
  EXPECT_FALSE(f.tensors[1].stored);
  EXPECT_TRUE(f.tensors[2].stored);
  EXPECT_EQ(f.tensors[0].shape, Shape{});
  EXPECT_FALSE(f.rest.contains("files") || f.rest.contains("tensors"));
  EXPECT_EQ(f.rest["metadata"], (Json{{"k", "v"}}));
  EXPECT_EQ(f.rest["writer"], "test");
  EXPECT_TRUE(ExpectSamePaths(bytes, head, "as written").ok());
}

// Each edit gives a head of another form than the writers': the fast path does not read it, and
// the decode (the DOM's) is the same either way, whether it succeeds or fails.
TEST_P(HeadReader, OtherFormsAreLeftToTheDom) {
  const std::string bytes = EncodeManifest(Sample(GetParam()));
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
      {"a negative dimension", edit([](Json& j) { j["tensors"][1]["shape"][0] = -8; }), false},
      {"a shape of objects", edit([](Json& j) { j["tensors"][1]["shape"] = {Json::object()}; }),
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
TEST_P(HeadReader, FailedChecksGiveTheDomsErrors) {
  const std::string bytes = EncodeManifest(Sample(GetParam()));
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
         h["tensors"][1]["shape"] = {1ll << 40, 1ll << 40};
       }},
      {"a CRC past 32 bits", [](Json& h) { h["tensors"][1]["section_crc32c"] = 1ull << 33; }},
      {"a section too small", [](Json& h) { h["tensors"][1]["section_bytes"] = 3; }},
      {"stored without compression", [](Json& h) { h["required_features"] = Json::array(); }},
      {"a tensor named as a value", [](Json& h) { h["tensors"][0]["name"] = "step"; }},
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
