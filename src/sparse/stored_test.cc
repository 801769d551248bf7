// The sparse description as untrusted input: the "sparse" feature and the description value must
// come together, and every malformed member is Corruption (or Unimplemented for a newer format)
// naming it.
#include "sparse/stored.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>

#include "format/endian.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::sparse {
namespace {

using ::savepoint::testing::StatusIs;

class StoredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<int64_t> ids = {5, -2, 70000};
    std::vector<float> emb(3 * 2, 0.5f);
    State s;
    SP_ASSERT_OK(s.PutTable(
        "emb", SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {3}),
                                      {{"embedding", TensorView(emb.data(), DType::kF32, {3, 2})}})
                   .value()));
    SP_ASSERT_OK(SaveSparse(s, "/ck", {}, {.fs = &mem_}));
    bytes_ = mem_.ReadFile("/ck/MANIFEST", 1 << 26).value();
    m_ = format::DecodeManifest(bytes_, "m").value();
  }

  // The manifest with its JSON body edited by `edit`, framed again with valid CRCs, decoded.
  Result<format::Manifest> Edited(const std::function<void(Json&)>& edit) {
    Json j = format::ManifestToJson(m_);
    edit(j);
    std::string body = j.dump();
    std::string h = bytes_.substr(0, format::kManifestHeaderBytes);
    format::PutU64(&h, 16, body.size());
    format::PutU32(&h, 32, Crc32c(body));
    format::PutU32(&h, 60, Crc32c(std::string_view(h).substr(0, 60)));
    return format::DecodeManifest(h + body, "m");
  }

  // The description of the manifest edited by `edit` (in its "savepoint.sparse" value).
  Result<Desc> EditedDesc(const std::function<void(Json&)>& edit) {
    SP_ASSIGN_OR_RETURN(format::Manifest m, Edited([&](Json& j) {
                          for (Json& v : j["values"]) {
                            if (v["name"] == "savepoint.sparse") edit(v["value"]);
                          }
                        }));
    bool found = false;
    return DecodeDesc(m, "checkpoint /ck", &found);
  }

  MemFileSystem mem_;
  std::string bytes_;
  format::Manifest m_;
};

::testing::AssertionResult Corrupt(const Status& s, std::string_view needle) {
  if (s.code() == StatusCode::kCorruption && s.message().find(needle) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << s.ToString();
}

TEST_F(StoredTest, DecodesWhatWasWritten) {
  bool found = false;
  SP_ASSERT_OK_AND_ASSIGN(Desc d, DecodeDesc(m_, "x", &found));
  EXPECT_TRUE(found);
  ASSERT_EQ(d.tables.size(), 1u);
  EXPECT_EQ(d.tables[0].names.slots[0].second, "savepoint.sparse/0.emb/slot/embedding");
  EXPECT_FALSE(d.delta());
}

TEST_F(StoredTest, FeatureAndValueComeTogether) {
  EXPECT_TRUE(Corrupt(Edited([](Json& j) { j["required_features"] = Json::array(); }).status(),
                      "one without the other"));
  EXPECT_TRUE(Corrupt(Edited([](Json& j) { j["values"] = Json::array(); }).status(),
                      "one without the other"));
  Status other = Edited([](Json& j) { j["required_features"].push_back("sparse2"); }).status();
  EXPECT_THAT(other, StatusIs(StatusCode::kUnimplemented));
}

TEST_F(StoredTest, HostileDescriptionsAreRefused) {
  for (int format : {0, 3}) {
    EXPECT_EQ(EditedDesc([&](Json& d) { d["format"] = format; }).status().code(),
              StatusCode::kUnimplemented);
  }
  EXPECT_TRUE(
      Corrupt(EditedDesc([](Json& d) { d = Json::array(); }).status(), "not a JSON object"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) { d["depth"] = -1; }).status(), "depth"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) { d["depth"] = 1; }).status(), "base must be"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) {
                        d["depth"] = 1;
                        d["base"] = {{"path", "../x/y"}, {"checkpoint_id", "0000000000000001"}};
                      }).status(),
                      "base.path"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) { d["tables"][0]["ids"] = "dense.w"; }).status(),
                      "tables[0].ids: no tensor"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) {
                        d["tables"][0]["ids"] = "savepoint.sparse/0.emb/slot/embedding";
                      }).status(),
                      "is F32 [3, 2]"));
  EXPECT_TRUE(Corrupt(
      EditedDesc([](Json& d) { d["tables"][0]["ranks"] = "savepoint.sparse/0.emb/ids"; }).status(),
      "tables[0].ranks: tensor \"savepoint.sparse/0.emb/ids\" is I64 [3]"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) { d["tables"][0].erase("slices"); }).status(),
                      "tables[0].slices is not a string"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) {
                        d["tables"][0]["slots"][0]["tensor"] = "savepoint.sparse/0.emb/ranks";
                      }).status(),
                      "but the table has 3 ids"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) {
                        d["tables"][0]["slots"].push_back(d["tables"][0]["slots"][0]);
                      }).status(),
                      "appears twice"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) { d["tables"].push_back(d["tables"][0]); }).status(),
                      "table \"emb\" appears twice"));
  EXPECT_TRUE(Corrupt(EditedDesc([](Json& d) {
                        d["tables"][0]["deleted"] = "savepoint.sparse/0.emb/ids";
                      }).status(),
                      "deleted ids in a full checkpoint"));
  EXPECT_TRUE(
      Corrupt(EditedDesc([](Json& d) { d["tables"][0]["name"] = ""; }).status(), "tables[0].name"));
}

// Format 2's index tensors: at most one entry per slice, at least one saving rank, at most 65536,
// three columns in a full checkpoint (six in a delta).
TEST_F(StoredTest, IndexTensorsOfImpossibleShapesAreRefused) {
  auto reshaped = [&](std::string_view tensor, Shape shape) {
    format::Manifest m = format::DecodeManifest(bytes_, "m").value();
    for (format::TensorRecord& t : m.tensors) {
      if (t.name == fmt::format("savepoint.sparse/0.emb/{}", tensor)) t.shape = shape;
    }
    bool found = false;
    return DecodeDesc(m, "checkpoint /ck", &found).status();
  };
  SP_EXPECT_OK(reshaped("slices", {kNumSlices}));
  EXPECT_TRUE(Corrupt(reshaped("slices", {kNumSlices + 1}), "tables[0].slices"));
  SP_EXPECT_OK(reshaped("ranks", {kNumSlices, 3}));
  EXPECT_TRUE(Corrupt(reshaped("ranks", {0, 3}), "no saving rank"));
  EXPECT_TRUE(Corrupt(reshaped("ranks", {kNumSlices + 1, 3}), "tables[0].ranks"));
  EXPECT_TRUE(Corrupt(reshaped("ranks", {1, 6}), "tables[0].ranks"));  // a delta's
  EXPECT_TRUE(Corrupt(reshaped("ranks", {3}), "tables[0].ranks"));
}

TEST(SavingRankOfTest, InvertsGenSlice) {
  for (int n : {1, 2, 3, 7, 1000, 65535, 65536}) {
    for (int r : {0, 1, n / 2, n - 1}) {
      if (r >= n) continue;
      const SliceRange range = GenSlice(r, n).value();
      EXPECT_EQ(SavingRankOf(range.begin, n), r) << n;
      EXPECT_EQ(SavingRankOf(range.end - 1, n), r) << n;
    }
  }
}

// "." and ".." resolve to the delta's own directory and its parent, never to a sibling checkpoint.
TEST_F(StoredTest, BaseSiblingNameDotOrDotDotIsRefused) {
  for (const char* path : {".", ".."}) {
    const Status s = EditedDesc([&](Json& d) {
                       d["depth"] = 1;
                       d["base"] = {{"path", path}, {"checkpoint_id", "0000000000000001"}};
                     }).status();
    EXPECT_TRUE(Corrupt(s, "checkpoint /ck: savepoint.sparse: base.path")) << path;
    EXPECT_TRUE(Corrupt(s, fmt::format("{:?}", path))) << path;
  }
  // A name that merely starts with dots is a sibling's.
  EXPECT_FALSE(Corrupt(EditedDesc([](Json& d) {
                         d["depth"] = 1;
                         d["base"] = {{"path", "..ck"}, {"checkpoint_id", "0000000000000001"}};
                       }).status(),
                       "base.path"));
}

TEST(StoredNamesTest, DistinctForDistinctTablesAndSlots) {
  // Table "a" slot "ids" and table "a/slot" cannot collide: the index prefixes the table.
  StoredNames a = NamesFor(0, "a", {"ids"}, true);
  StoredNames b = NamesFor(1, "a/slot", {}, true);
  EXPECT_NE(a.slots[0].second, b.ids);
  EXPECT_EQ(a.ids, "savepoint.sparse/0.a/ids");
  EXPECT_EQ(a.deleted, "savepoint.sparse/0.a/deleted");
  EXPECT_TRUE(NamesFor(0, "a", {}, false).deleted.empty());
}

}  // namespace
}  // namespace savepoint::sparse
