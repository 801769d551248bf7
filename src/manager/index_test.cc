// The manager's index files (manager/index.h): round trips, generations, a damaged newest
// generation (members of the wrong type included), power loss after a write, which temporaries a
// write removes, and record metadata of the wrong type.
#include "manager/index.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

CheckpointRecord Record(const std::string& name, int64_t step) {
  CheckpointRecord r;
  r.name = name;
  r.step = step;
  r.epoch = 1 + step / 100;
  r.step_in_epoch = step % 100;
  r.created_ns = 1'700'000'000'000'000'000 + step;
  r.bytes = 4096 * static_cast<uint64_t>(step);
  r.breakpoint = step % 2 == 1;
  r.epoch_end = step % 3 == 0;
  r.metrics = {{"loss", 1.0 / static_cast<double>(step)}};
  return r;
}

void ExpectSame(const std::vector<CheckpointRecord>& a, const std::vector<CheckpointRecord>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].name);
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].step, b[i].step);
    EXPECT_EQ(a[i].epoch, b[i].epoch);
    EXPECT_EQ(a[i].step_in_epoch, b[i].step_in_epoch);
    EXPECT_EQ(a[i].created_ns, b[i].created_ns);
    EXPECT_EQ(a[i].bytes, b[i].bytes);
    EXPECT_EQ(a[i].breakpoint, b[i].breakpoint);
    EXPECT_EQ(a[i].epoch_end, b[i].epoch_end);
    EXPECT_EQ(a[i].metrics, b[i].metrics);
  }
}

std::string IndexFile(uint64_t generation) {
  return fmt::format("/ck/savepoint-index-{:020}.json", generation);
}

class IndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SP_ASSERT_OK(fs_.CreateDirs("/ck"));
    SP_ASSERT_OK(fs_.SyncDir("/"));  // the directory itself survives power loss
  }
  MemFileSystem fs_;
};

TEST_F(IndexTest, NoIndexIsGenerationZero) {
  SP_ASSERT_OK_AND_ASSIGN(manager::Index index, manager::ReadIndex(&fs_, "/ck"));
  EXPECT_EQ(index.generation, 0u);
  EXPECT_TRUE(index.records.empty());
}

TEST_F(IndexTest, RoundTripAndOlderGenerationsRemoved) {
  manager::Index index;
  index.records = {Record("ckpt-1_10", 10), Record("ckpt-1_21", 21)};
  SP_ASSERT_OK(manager::WriteIndex(&fs_, "/ck", index));
  EXPECT_EQ(index.generation, 1u);
  index.records.push_back(Record("ckpt-2_30", 130));
  SP_ASSERT_OK(manager::WriteIndex(&fs_, "/ck", index));
  EXPECT_EQ(index.generation, 2u);
  EXPECT_FALSE(fs_.Exists(IndexFile(1)));
  SP_ASSERT_OK_AND_ASSIGN(manager::Index back, manager::ReadIndex(&fs_, "/ck"));
  EXPECT_EQ(back.generation, 2u);
  ExpectSame(back.records, index.records);
}

TEST_F(IndexTest, DamagedNewestGenerationFallsBackToTheLastValidOne) {
  manager::Index index;
  index.records = {Record("ckpt-1_10", 10)};
  SP_ASSERT_OK(manager::WriteIndex(&fs_, "/ck", index));
  for (const char* damage : {"", "{", "[1, 2]", R"({"format": "something-else", "version": 1})",
                             R"({"format": "savepoint-manager-index", "version": 99})"}) {
    SCOPED_TRACE(damage);
    SP_ASSERT_OK(fs_.WriteFileSynced(IndexFile(7), damage));
    SP_ASSERT_OK_AND_ASSIGN(manager::Index back, manager::ReadIndex(&fs_, "/ck"));
    EXPECT_EQ(back.generation, 1u);
    ExpectSame(back.records, index.records);
  }
}

// Members of the wrong type threw nlohmann's type_error out of ReadIndex (the manager could not
// open; RuntimeError in Python): such a generation is invalid, and skipped.
TEST_F(IndexTest, WronglyTypedMembersAreAnInvalidGeneration) {
  manager::Index index;
  index.records = {Record("ckpt-1_10", 10)};
  SP_ASSERT_OK(manager::WriteIndex(&fs_, "/ck", index));
  for (const char* damage :
       {R"({"format": 1})", R"({"format": ["savepoint-manager-index"], "checkpoints": []})",
        R"({"format": "savepoint-manager-index", "checkpoints": {}})",
        R"({"format": "savepoint-manager-index", "checkpoints": [{"name": 7}]})"}) {
    SCOPED_TRACE(damage);
    SP_ASSERT_OK(fs_.WriteFileSynced(IndexFile(7), damage));
    SP_ASSERT_OK_AND_ASSIGN(manager::Index back, manager::ReadIndex(&fs_, "/ck"));
    EXPECT_EQ(back.generation, 1u);
    ExpectSame(back.records, index.records);
  }
}

// A write removes the temporaries of index writes (its own names, exactly) and nothing else.
TEST_F(IndexTest, OnlyExactIndexTemporariesAreRemoved) {
  const std::string index_name = "savepoint-index-00000000000000000003.json";
  const std::vector<std::string> temporaries = {
      "." + index_name + ".savepoint-tmp.4242.0123456789abcdef", "." + index_name + ".tmp"};
  const std::vector<std::string> others = {
      ".savepoint-index-notes.tmp",
      ".savepoint-index-3.json.tmp",  // not the 20-digit name
      "." + index_name + ".savepoint-tmp.4242.0123456789ABCDEF",
      "." + index_name + ".savepoint-tmp.x.0123456789abcdef",
      "." + index_name + ".savepoint-tmp.4242.0123456789abcdef.keep",
      ".savepoint-index-00000000000000000003.json.bak.tmp",
      "savepoint-index-00000000000000000003.json.tmp",
      ".savepoint-index-mine.savepoint-tmp.1.0123456789abcdef"};
  for (const std::string& name : temporaries) SP_ASSERT_OK(fs_.WriteFileSynced("/ck/" + name, ""));
  for (const std::string& name : others) SP_ASSERT_OK(fs_.WriteFileSynced("/ck/" + name, "x"));
  manager::Index index;
  index.records = {Record("ckpt-1_10", 10)};
  SP_ASSERT_OK(manager::WriteIndex(&fs_, "/ck", index));
  for (const std::string& name : temporaries) EXPECT_FALSE(fs_.Exists("/ck/" + name)) << name;
  for (const std::string& name : others) EXPECT_TRUE(fs_.Exists("/ck/" + name)) << name;
}

TEST_F(IndexTest, AWrittenIndexSurvivesPowerLoss) {
  manager::Index index;
  index.records = {Record("ckpt-1_10", 10), Record("ckpt-1_20", 20)};
  SP_ASSERT_OK(manager::WriteIndex(&fs_, "/ck", index));
  fs_.SimulatePowerLoss();
  SP_ASSERT_OK_AND_ASSIGN(manager::Index back, manager::ReadIndex(&fs_, "/ck"));
  EXPECT_EQ(back.generation, 1u);
  ExpectSame(back.records, index.records);
}

TEST(RecordMeta, RoundTripAndWrongTypes) {
  const CheckpointRecord r = Record("ckpt-3_5", 205);
  CheckpointRecord back;
  SP_ASSERT_OK(manager::ApplyRecordMeta(manager::RecordMeta(r), &back));
  EXPECT_EQ(back.step, r.step);
  EXPECT_EQ(back.epoch, r.epoch);
  EXPECT_EQ(back.step_in_epoch, r.step_in_epoch);
  EXPECT_EQ(back.metrics, r.metrics);
  EXPECT_EQ(back.breakpoint, r.breakpoint);
  for (const char* field : {"step", "epoch", "step_in_epoch", "metrics"}) {
    SCOPED_TRACE(field);
    Json meta = manager::RecordMeta(r);
    meta[field] = "not a number";
    EXPECT_THAT(manager::ApplyRecordMeta(meta, &back), StatusIs(StatusCode::kInvalidArgument));
  }
}

}  // namespace
}  // namespace savepoint
