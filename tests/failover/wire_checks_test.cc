// What the controller accepts from agents and from snapshot records (failover/rpc/common.h,
// snapshot.h): each malformed form is refused with a message naming the field; what is written
// reads back the same.
#include <gtest/gtest.h>

#include <string>

#include "failover/rpc/common.h"
#include "failover/rpc/snapshot.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;
using ::testing::HasSubstr;

failover::rpc::Hello HelloOf(int rank, int world, std::vector<std::vector<int>> groups) {
  failover::rpc::Hello h;
  h.set_rank(rank);
  h.set_world(world);
  for (const auto& g : groups) h.add_groups()->mutable_ranks()->Add(g.begin(), g.end());
  return h;
}

TEST(WireChecksTest, HelloGroupsMustNameRanksOfTheJobIncludingTheSender) {
  SP_EXPECT_OK(failover::CheckHello(HelloOf(1, 4, {{0, 1}, {1, 3}}), 4));
  SP_EXPECT_OK(failover::CheckHello(HelloOf(0, 1, {}), 1));
  const std::vector<std::pair<failover::rpc::Hello, const char*>> bad = {
      {HelloOf(0, 4, {{0, 9}}), "replica group [0, 9]"},  // indexed reports past the job before
      {HelloOf(1, 4, {{-1, 1}}), "replica group [-1, 1]"}, {HelloOf(2, 4, {{0, 1}}), "including 2"},
      {HelloOf(3, 4, {{}}), "replica group []"},           {HelloOf(1, 4, {{1, 1}}), "distinct"},
      {HelloOf(4, 4, {}), "hello of rank 4 of 4"},         {HelloOf(0, 8, {}), "in a job of 4"},
  };
  failover::rpc::Hello negative = HelloOf(0, 4, {});
  negative.set_generation(-1);
  EXPECT_THAT(failover::CheckHello(negative, 4).message(), HasSubstr("generation -1"));
  for (const auto& [hello, why] : bad) {
    SCOPED_TRACE(why);
    Status s = failover::CheckHello(hello, 4);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(s.message(), HasSubstr(why));
  }
}

TEST(WireChecksTest, StepStatesHoldNoNegativeStepsAndFewSnapshots) {
  failover::rpc::AgentMessage m;
  m.mutable_heartbeat()->set_step(-1);  // before the first step
  SP_EXPECT_OK(failover::CheckAgentMessage(m));
  m.mutable_heartbeat()->set_step(-2);
  EXPECT_THAT(failover::CheckAgentMessage(m), StatusIs(StatusCode::kInvalidArgument));
  m.mutable_paused()->set_step(3);
  m.mutable_paused()->add_snapshots()->set_step(-3);
  EXPECT_THAT(failover::CheckAgentMessage(m).message(), HasSubstr("a snapshot of step -3"));
  m.mutable_paused()->clear_snapshots();
  for (int i = 0; i <= failover::kMaxReportedSnapshots; ++i) m.mutable_paused()->add_snapshots();
  EXPECT_THAT(failover::CheckAgentMessage(m).message(), HasSubstr("snapshots (at most"));
  failover::rpc::AgentMessage again;
  *again.mutable_hello() = HelloOf(0, 1, {});
  EXPECT_THAT(failover::CheckAgentMessage(again).message(), HasSubstr("a second hello"));
}

TEST(WireChecksTest, CollectivesNameAWriterOfTheDumpAndABoundedTimeout) {
  failover::rpc::CollectiveRequest r;
  r.set_writer(1);
  r.set_timeout_ms(30000);
  SP_EXPECT_OK(failover::CheckCollective(r, 2));
  EXPECT_THAT(failover::CheckCollective(r, 1).message(), HasSubstr("writer 1 of a dump of 1"));
  r.set_timeout_ms(INT64_MAX);  // its deadline in nanoseconds overflowed
  EXPECT_THAT(failover::CheckCollective(r, 2).message(), HasSubstr("timeout"));
  r.set_timeout_ms(-1);
  EXPECT_THAT(failover::CheckCollective(r, 2), StatusIs(StatusCode::kInvalidArgument));
}

TEST(WireChecksTest, CatchUpWhenAUsableRankIsBehindAndEveryGroupHasOne) {
  std::vector<RankReport> reports = {{0, true, 3}, {1, true, 4}, {2, false, 4}};
  EXPECT_EQ(failover::CatchUpStep(reports, {{0, 1}, {1, 2}}), 4);
  EXPECT_EQ(failover::CatchUpStep(reports, {{2}}), std::nullopt);  // a group with no usable member
  reports[0].step = 4;
  EXPECT_EQ(failover::CatchUpStep(reports, {{0, 1}}), std::nullopt);  // nobody behind
}

TEST(WireChecksTest, SnapshotRecordsRoundTripAndRefuseOddForms) {
  failover::SnapshotRecord r{1, 2, {}};
  r.layout["w"] = {{8, 4}, {4, 0}, {4, 4}, {1}, "v"};
  const Json once = failover::SnapshotRecordToJson(r);
  SP_ASSERT_OK_AND_ASSIGN(failover::SnapshotRecord back, failover::ParseSnapshotRecord(once, "s"));
  EXPECT_EQ(failover::SnapshotRecordToJson(back).dump(), once.dump());
  auto with = [&](const char* key, Json v) {
    Json j = once;
    j["layout"]["w"][key] = std::move(v);
    return j;
  };
  const std::vector<std::pair<Json, const char*>> bad = {
      {with("offsets", {1.5, 0}), "offsets holds 1.5"},
      {with("offsets", {"4", 0}), "not an integer"},
      {with("offsets", {uint64_t{1} << 63, 0}), "not an integer"},
      {with("sizes", {5, 4}), "outside the global shape"},
      {with("global_shape", {0, INT64_MAX}), "outside the global shape"},  // box [4,0)+4 > 0
      {with("replicas", {2}), "replica 2 of a world of 2"},
      {with("tensor", 5), "tensor is not a string"},
      {{{"rank", 2}, {"world", 2}, {"layout", Json::object()}}, "\"rank\" is not an integer"},
      {{{"rank", 0}, {"world", 0}, {"layout", Json::object()}}, "\"world\" is not an integer"},
      {{{"rank", 0}, {"world", 1}, {"layout", "rows"}}, "\"layout\" is not an object"},
  };
  for (const auto& [j, why] : bad) {
    SCOPED_TRACE(why);
    Result<failover::SnapshotRecord> got = failover::ParseSnapshotRecord(j, "snapshot /x");
    EXPECT_THAT(got, StatusIs(StatusCode::kCorruption));
    EXPECT_THAT(got.status().message(), HasSubstr(why));
    EXPECT_THAT(got.status().message(), HasSubstr("snapshot /x"));
  }
  // A zero-element box of an INT64_MAX-long dimension is a valid record.
  Json zero = with("global_shape", {0, INT64_MAX});
  zero["layout"]["w"]["offsets"] = {0, INT64_MAX};
  zero["layout"]["w"]["sizes"] = {0, 0};
  SP_EXPECT_OK(failover::ParseSnapshotRecord(zero, "s").status());
}

TEST(WireChecksTest, SnapshotNamesAreExactlyWhatTheWriterWrites) {
  failover::StepInfo at;
  ASSERT_TRUE(failover::ParseSnapshotName("step_12_1_12", &at));
  EXPECT_EQ(at.step, 12);
  for (const char* name : {"step_+1_1_1", "step_-1_1_1", "step_1_1_1x", "step_1_1", "step_",
                           "step_99999999999999999999_1_1", "Step_1_1_1", "step_007_1_0"}) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(failover::ParseSnapshotName(name, &at));
  }
}

}  // namespace
}  // namespace savepoint
