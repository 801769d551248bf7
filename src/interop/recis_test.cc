// Tests of the RecIS checkpoint import (savepoint/recis.h): a directory in RecIS's layout (two
// writer shards, a table with two slots, a dense tensor) built in memory is read back row for
// row, and hostile directories are refused naming the file and block. The Python suite
// (tests/python/test_recis_import.py) builds directories with the real safetensors package.
#include "savepoint/recis.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <map>
#include <string>

#include "interop/recis_layout.h"
#include "io/mem_fs.h"
#include "savepoint/safetensors.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr char kDir[] = "/r";

Tensor Ids(std::vector<int64_t> ids) {
  Tensor t = Tensor::Empty(DType::kI64, {static_cast<int64_t>(ids.size())}).value();
  std::copy(ids.begin(), ids.end(), t.as<int64_t>().begin());
  return t;
}

// Slot rows: row r of shard `shard` is {shard * 100 + r, ...} (dim columns).
Tensor Rows(int shard, int64_t rows, int64_t dim) {
  Tensor t = Tensor::Empty(DType::kF32, {rows, dim}).value();
  for (int64_t i = 0; i < rows * dim; ++i) t.as<float>()[i] = static_cast<float>(shard * 100 + i);
  return t;
}

class RecisImportTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(fs_.CreateDirs(kDir)); }
  IoOptions Io() { return {.fs = &fs_, .io_threads = 2}; }

  void WriteFile(const std::string& name, std::string_view text) {
    SP_ASSERT_OK(fs_.WriteFileSynced(JoinPath(kDir, name), text));
  }
  void WriteData(const std::string& name, const State& s) {
    SP_ASSERT_OK(SaveSafetensors(s, JoinPath(kDir, name), {.overwrite = true}, Io()));
  }

  // Two shards of table "emb" (slots embedding [.,4], exp_avg [.,4]) and dense "step",
  // with ids_of[shard] as each shard's ids; one data file per shard.
  void Build(const std::vector<std::vector<int64_t>>& ids_of) {
    std::map<std::string, std::string> keys;
    std::string blocks;
    for (size_t s = 0; s < ids_of.size(); ++s) {
      State st;
      const std::string part = fmt::format("/part_{}_{}", s, ids_of.size());
      const int64_t rows = static_cast<int64_t>(ids_of[s].size());
      SP_ASSERT_OK(st.Put("emb.id" + part, Ids(ids_of[s])));
      SP_ASSERT_OK(st.Put("emb.embedding" + part, Rows(static_cast<int>(s), rows, 4)));
      SP_ASSERT_OK(st.Put("emb.exp_avg" + part, Rows(static_cast<int>(s) + 50, rows, 4)));
      if (s == 0) SP_ASSERT_OK(st.Put("step^ ", Ids({7})));
      const std::string file = fmt::format("model-{:06}-of-{:06}.safetensors", s, ids_of.size());
      WriteData(file, st);
      for (const auto& [name, e] : st.entries()) {
        blocks += fmt::format("{}\"{}\":{}", blocks.empty() ? "" : ",", name, s);
      }
      files_ += fmt::format("{}\"{}\":{}", files_.empty() ? "" : ",", file, s);
    }
    WriteFile("index",
              fmt::format(R"({{"file_index":{{{}}},"block_index":{{{}}}}})", files_, blocks));
  }

  Status LoadStatus() { return LoadRecisCheckpoint(kDir, {}, Io()).status(); }

  MemFileSystem fs_;
  std::string files_;
};

TEST_F(RecisImportTest, ReadsEveryRowOfEveryShard) {
  Build({{1, 5, -3}, {65536 + 9, 2}});
  WriteFile("model.pt", "pickle");
  SP_ASSERT_OK_AND_ASSIGN(RecisCheckpoint c, LoadRecisCheckpoint(kDir, {}, Io()));
  EXPECT_EQ(c.shard_num, 2);
  EXPECT_EQ(c.files, 2);
  const SparseTable* t = c.state.FindTable("emb");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->num_rows(), 5);
  const std::vector<int64_t> want_ids = {1, 5, -3, 65536 + 9, 2};
  EXPECT_EQ(std::vector<int64_t>(t->ids().begin(), t->ids().end()), want_ids);
  const TensorView* emb = t->FindSlot("embedding");
  ASSERT_NE(emb, nullptr);
  // Row 3 is shard 1's row 0: {100, 101, 102, 103}.
  EXPECT_EQ(reinterpret_cast<const float*>(emb->data())[3 * 4 + 2], 102.0f);
  ASSERT_NE(t->FindSlot("exp_avg"), nullptr);
  ASSERT_NE(c.state.Find("step"), nullptr);
  ASSERT_EQ(c.skipped.size(), 1u);
  EXPECT_TRUE(c.skipped[0].starts_with("model.pt: torch pickle")) << c.skipped[0];
  EXPECT_EQ(c.state.metadata()["recis"]["shard_num"], 2);
}

TEST_F(RecisImportTest, ImportWritesANativeCheckpoint) {
  Build({{1, 2}, {3}});
  SP_ASSERT_OK(ImportRecis(kDir, "/out", {}, Io()).status());
  SP_ASSERT_OK_AND_ASSIGN(State all, LoadSparse("/out", {}, Io()));
  ASSERT_NE(all.FindTable("emb"), nullptr);
  EXPECT_EQ(all.FindTable("emb")->num_rows(), 3);
  ASSERT_NE(all.Find("step"), nullptr);
  // Ids 1, 2, 3 are in slices 1, 2, 3: all in shard 0 of 2 (slices [0, 32768)).
  SP_ASSERT_OK_AND_ASSIGN(State one, LoadSparse("/out", {.shard_id = 1, .shard_num = 2}, Io()));
  EXPECT_EQ(one.FindTable("emb")->num_rows(), 0);
}

TEST_F(RecisImportTest, FollowsTheCheckpointList) {
  SP_ASSERT_OK(fs_.CreateDirs("/out_dir"));
  SP_ASSERT_OK(fs_.WriteFileSynced("/out_dir/checkpoint", "old\n../r\n"));
  Status s = LoadRecisCheckpoint("/out_dir", {}, Io()).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "\"../r\""));
}

TEST_F(RecisImportTest, RefusesDuplicateIdsAcrossShards) {
  Build({{1, 5}, {5}});
  Status s = LoadStatus();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption));
  EXPECT_NE(s.message().find("id 5 is in block \"emb.id/part_0_2\""), std::string::npos)
      << s.ToString();
}

TEST_F(RecisImportTest, RefusesPathTraversalInTheIndex) {
  WriteFile("index", R"({"file_index":{"../x.safetensors":0},"block_index":{"w^ ":0}})");
  Status s = LoadStatus();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "../x.safetensors"));
}

TEST_F(RecisImportTest, RefusesAMissingBlockAndFile) {
  Build({{1}, {2}});
  WriteFile("index", fmt::format(R"({{"file_index":{{{}}},"block_index":{{"w^ ":0}}}})", files_));
  Status s = LoadStatus();
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound, "block \"w^ \""));
  WriteFile("index", R"({"file_index":{"model-000009-of-000009.safetensors":0},)"
                     R"("block_index":{"w^ ":0}})");
  s = LoadStatus();
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(s.message().find("model-000009-of-000009.safetensors"), std::string::npos)
      << s.ToString();
}

TEST_F(RecisImportTest, RefusesRowsThatDisagreeWithTheIdBlock) {
  State st;
  SP_ASSERT_OK(st.Put("emb.id/part_0_1", Ids({1, 2, 3})));
  SP_ASSERT_OK(st.Put("emb.embedding/part_0_1", Rows(0, 2, 4)));
  WriteData("model-000000-of-000001.safetensors", st);
  WriteFile("index", R"({"file_index":{"model-000000-of-000001.safetensors":0},"block_index":)"
                     R"({"emb.id/part_0_1":0,"emb.embedding/part_0_1":0}})");
  Status s = LoadStatus();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "has 3 rows"));
}

TEST_F(RecisImportTest, RefusesAMissingShard) {
  Build({{1}, {2}, {3}});
  WriteFile("index", fmt::format(R"({{"file_index":{{{}}},"block_index":{{)"
                                 R"("emb.id/part_0_3":0,"emb.embedding/part_0_3":0}}}})",
                                 files_));
  Status s = LoadStatus();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "shard 1 of 3 has no id block"));
}

TEST(RecisLayoutTest, SliceStrings) {
  SP_ASSERT_OK_AND_ASSIGN(interop::RecisSlice s,
                          interop::ParseRecisSlice("00000@32768@65536", "x"));
  EXPECT_EQ(s.begin, 0);
  EXPECT_EQ(s.end, 32768);
  EXPECT_EQ(s.size, 65536);
  for (const char* bad : {"", "1@2", "2@1@9", "1@2@x", "-1@2@3", "1@2@3@4", "0@10@9"}) {
    EXPECT_THAT(interop::ParseRecisSlice(bad, "x"), StatusIs(StatusCode::kCorruption)) << bad;
  }
}

TEST(RecisLayoutTest, TensorKeysGiveExactNamesAndSlices) {
  const std::map<std::string, std::string> keys = {
      {"a.b.embedding/part_1_2", "a.b@embedding^32768@65536@65536"},
      {"a.b.id/part_1_2", "a.b@id^32768@65536@65536"},
      {"a.b.id/part_0_2", "a.b@id^00000@32768@65536"},
      {"a.b.embedding/part_0_2", "a.b@embedding^00000@32768@65536"}};
  const std::string index =
      R"({"file_index":{"f":0},"block_index":{"a.b.id/part_0_2":0,"a.b.embedding/part_0_2":0,)"
      R"("a.b.id/part_1_2":0,"a.b.embedding/part_1_2":0,"dense.w^ ":0}})";
  SP_ASSERT_OK_AND_ASSIGN(interop::RecisPlan p, interop::PlanRecis(index, "index", keys, {}));
  ASSERT_EQ(p.tables.count("a.b"), 1u);
  EXPECT_EQ(p.shard_num, 2);
  EXPECT_EQ(p.tables["a.b"].shards[1].slice.begin, 32768);
  EXPECT_EQ(p.dense.count("dense.w"), 1u);
  auto bad = keys;
  bad["a.b.id/part_1_2"] = "a.b@id^32768@65536";
  EXPECT_THAT(interop::PlanRecis(index, "index", bad, {}), StatusIs(StatusCode::kCorruption));
  bad["a.b.id/part_1_2"] = "other@id^32768@65536@65536";
  EXPECT_THAT(interop::PlanRecis(index, "index", bad, {}), StatusIs(StatusCode::kCorruption));
}

// 412 tables of one block each, of 65536 shards: a 10 KB index made 65536 shard records per table
// (3.9 GB) before finding shard 1 missing. Records are made only for shards an id block names.
TEST(RecisLayoutTest, ShardCountsAreCheckedBeforeShardRecordsAreMade) {
  std::string blocks;
  for (int t = 0; t < 412; ++t) {
    blocks += fmt::format(R"({}"T{}.id/part_0_65536":0)", t > 0 ? "," : "", t);
  }
  const std::string index =
      fmt::format(R"({{"file_index":{{"f":0}},"block_index":{{{}}}}})", blocks);
  rusage before{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &before), 0);
  EXPECT_THAT(interop::PlanRecis(index, "/r/index", {}, {}),
              StatusIs(StatusCode::kCorruption,
                       "/r/index: table \"T0\": shard 1 of 65536 has no id block"));
  rusage after{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &after), 0);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 << 10);  // KiB: under 256 MiB more at peak
  // A table whose slot blocks name a shard that has no id block is refused the same way.
  EXPECT_THAT(interop::PlanRecis(R"({"file_index":{"f":0},"block_index":{"e.id/part_0_2":0,)"
                                 R"("e.w/part_0_2":0,"e.w/part_1_2":0}})",
                                 "/r/index", {}, {}),
              StatusIs(StatusCode::kCorruption, "table \"e\": shard 1 of 2 has no id block"));
}

}  // namespace
}  // namespace savepoint
