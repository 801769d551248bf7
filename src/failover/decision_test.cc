// The dump decision, replica groups of a state, and the dump share (savepoint/failover.h).
#include <gtest/gtest.h>

#include "savepoint/failover.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)
#define EXPECT_LACKS(text, part) \
  EXPECT_EQ(std::string(text).find(part), std::string::npos) << (text)

// Reports of `steps.size()` healthy idle ranks at the given steps.
std::vector<RankReport> AtSteps(const std::vector<int64_t>& steps) {
  std::vector<RankReport> out;
  for (size_t r = 0; r < steps.size(); ++r) out.push_back({static_cast<int>(r), true, steps[r]});
  return out;
}

std::string Why(const Result<DumpPlan>& plan) {
  EXPECT_FALSE(plan.ok());
  return plan.ok() ? "" : plan.status().ToString();
}

TEST(DecideDumpTest, DataParallelOneDeadTakesLowestHealthy) {
  auto reports = AtSteps({7, 7, 7, 7});
  reports[0].healthy = false;
  auto plan = DecideDump(reports, DataParallelGroups(4));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->step, 7);
  EXPECT_EQ(plan->dumpers, std::vector<int>{1});
  EXPECT_EQ(plan->source_of_group, std::vector<int>{1});
}

TEST(DecideDumpTest, MidUpdateMemberIsNeverASource) {
  auto reports = AtSteps({7, 7, 7, 7});
  reports[0].healthy = false;
  reports[1].updating = true;
  auto plan = DecideDump(reports, DataParallelGroups(4));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dumpers, std::vector<int>{2});
}

TEST(DecideDumpTest, MixedStepsTakeNewestHeldByEveryGroup) {
  // Groups {0,1} and {2,3}: group A holds 5 and 6, group B only 5 -> step 5.
  auto reports = AtSteps({6, 5, 5, 5});
  auto plan = DecideDump(reports, {{0, 1}, {2, 3}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->step, 5);
  EXPECT_EQ(plan->source_of_group, (std::vector<int>{1, 2}));
  // With group B at 6 too, the newer step wins.
  reports[3].step = 6;
  plan = DecideDump(reports, {{0, 1}, {2, 3}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->step, 6);
  EXPECT_EQ(plan->source_of_group, (std::vector<int>{0, 3}));
}

TEST(DecideDumpTest, NoCommonStepIsRefusedListingSteps) {
  auto reports = AtSteps({6, 6, 5, 5});
  std::string why = Why(DecideDump(reports, {{0, 1}, {2, 3}}));
  EXPECT_HAS(why, "failed precondition");
  EXPECT_HAS(why, "no step is held");
  EXPECT_HAS(why, "[2, 3] at steps {5}");
}

TEST(DecideDumpTest, ReasonAboutAThousandRanksStaysShort) {
  std::vector<int64_t> steps(1000, -1);  // no rank finished a step
  auto reports = AtSteps(steps);
  reports[500].healthy = false;
  ReplicaGroup all(1000);
  for (int r = 0; r < 1000; ++r) all[r] = r;
  std::string why = Why(DecideDump(reports, {all}));
  EXPECT_HAS(why, "replica group [0, 1, 2, 3, 4, 5, 6, 7, ... and 992 more]");
  EXPECT_HAS(why, "rank 7 finished no step, ... and 992 more)");
  EXPECT_LT(why.size(), 400u) << why;
}

TEST(DecideDumpTest, TwoMembersOfOneGroupDead) {
  auto reports = AtSteps({3, 3, 3, 3});
  reports[1].healthy = false;
  reports[3].healthy = false;
  std::string why = Why(DecideDump(reports, {{0, 2}, {1, 3}}));
  EXPECT_HAS(why, "replica group [1, 3]");
  EXPECT_HAS(why, "rank 1 dead, rank 3 dead");
  EXPECT_HAS(why, "state incomplete");
  // One dead in each group is fine.
  reports[3].healthy = true;
  reports[2].healthy = false;
  auto plan = DecideDump(reports, {{0, 2}, {1, 3}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dumpers, (std::vector<int>{0, 3}));
}

TEST(DecideDumpTest, DataParallelOneHasNoReplica) {
  auto reports = AtSteps({4, 4});
  reports[1].healthy = false;
  std::string why = Why(DecideDump(reports, {{0}, {1}}));
  EXPECT_HAS(why, "no replica");
  // Ranks no group names are groups of their own.
  EXPECT_HAS(Why(DecideDump(reports, {})), "replica group [1]");
  reports[1].healthy = true;
  auto plan = DecideDump(reports, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dumpers, (std::vector<int>{0, 1}));
}

TEST(DecideDumpTest, GroupWhoseHealthyMembersAreAllMidUpdate) {
  auto reports = AtSteps({2, 2, 2});
  reports[0].healthy = false;
  reports[1].updating = true;
  reports[2].updating = true;
  std::string why = Why(DecideDump(reports, DataParallelGroups(3)));
  EXPECT_HAS(why, "rank 1 mid-update after step 2");
  EXPECT_LACKS(why, "state incomplete");
}

TEST(DecideDumpTest, NoFinishedStep) {
  auto reports = AtSteps({-1, -1});
  EXPECT_HAS(Why(DecideDump(reports, DataParallelGroups(2))), "finished no step");
}

TEST(DecideDumpTest, PrefersARankAlreadyChosen) {
  // Rank 2 is in both groups: one writer suffices.
  auto reports = AtSteps({1, 1, 1, 1});
  auto plan = DecideDump(reports, {{0, 2}, {2, 3}, {1, 2}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->source_of_group, (std::vector<int>{0, 2, 2}));
  reports[0].healthy = false;
  plan = DecideDump(reports, {{0, 2}, {2, 3}, {1, 2}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dumpers, std::vector<int>{2});
}

TEST(DecideDumpTest, DeadRankWithoutReplicaIsWrittenFromItsSnapshot) {
  // Data parallel = 1 (groups {0} and {1}); rank 1 died after committing snapshots of 3 and 4.
  auto reports = AtSteps({4, 4});
  reports[1].healthy = false;
  reports[1].snapshots = {3, 4};
  auto plan = DecideDump(reports, {{0}, {1}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->step, 4);
  EXPECT_EQ(plan->source_of_group, (std::vector<int>{0, 1}));
  EXPECT_EQ(plan->from_snapshot, (std::vector<bool>{false, true}));
  EXPECT_EQ(plan->dumpers, std::vector<int>{0});
  EXPECT_EQ(plan->snapshot_dumpers, std::vector<int>{1});
  // Its snapshot of 4 was torn (never committed): the survivor's own snapshot of 3 aligns them.
  reports[1].snapshots = {3};
  reports[0].snapshots = {3, 4};
  plan = DecideDump(reports, {{0}, {1}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->step, 3);
  EXPECT_EQ(plan->from_snapshot, (std::vector<bool>{true, true}));
  EXPECT_TRUE(plan->dumpers.empty());
  EXPECT_EQ(plan->snapshot_dumpers, (std::vector<int>{0, 1}));
  // Without snapshots of a common step: refused, listing them.
  reports[0].snapshots = {};
  std::string why = Why(DecideDump(reports, {{0}, {1}}));
  EXPECT_HAS(why, "group [1] at steps {3}");
  reports[1].snapshots = {};
  EXPECT_HAS(Why(DecideDump(reports, {{0}, {1}})), "no snapshot");
}

TEST(DecideDumpTest, LiveReplicaIsPreferredToASnapshot) {
  auto reports = AtSteps({5, 5});
  reports[0].healthy = false;
  reports[0].snapshots = {5};
  reports[1].snapshots = {4, 5};
  auto plan = DecideDump(reports, DataParallelGroups(2));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dumpers, std::vector<int>{1});
  EXPECT_TRUE(plan->snapshot_dumpers.empty());
  EXPECT_EQ(plan->from_snapshot, std::vector<bool>{false});
  // A single rank (world 1) that died: its snapshot is the whole dump.
  std::vector<RankReport> alone = {{0, false, 9, true, {8, 9}}};
  plan = DecideDump(alone, DataParallelGroups(1));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->step, 9);
  EXPECT_EQ(plan->snapshot_dumpers, std::vector<int>{0});
}

TEST(DecideDumpTest, BadInput) {
  EXPECT_THAT(DecideDump({}, {}), StatusIs(StatusCode::kInvalidArgument));
  auto reports = AtSteps({1, 1});
  EXPECT_THAT(DecideDump(reports, {{0, 5}}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(DecideDump(reports, {{}}), StatusIs(StatusCode::kInvalidArgument));
  reports[1].rank = 0;
  EXPECT_THAT(DecideDump(reports, {}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ReplicaGroupsTest, FromLayoutAndDefault) {
  std::vector<float> a(4), b(2);
  State s;
  SP_ASSERT_OK(s.PutView("whole", TensorView(a.data(), DType::kF32, {4})));
  SP_ASSERT_OK(s.PutView("half", TensorView(b.data(), DType::kF32, {2})));
  SP_ASSERT_OK(s.PutValue("step", int64_t{3}));
  ShardLayout layout;
  layout["half"] = SplitDim({4}, 0, 2, 1, {3, 1}).value();
  auto groups = ReplicaGroupsOf(s, layout, 1, 4);
  ASSERT_TRUE(groups.ok());
  EXPECT_EQ(*groups, (std::vector<ReplicaGroup>{{0, 1, 2, 3}, {1, 3}}));
  layout["half"].replicas = {0, 2};
  EXPECT_THAT(ReplicaGroupsOf(s, layout, 1, 4), StatusIs(StatusCode::kInvalidArgument));
  layout["half"].replicas = {};
  groups = ReplicaGroupsOf(s, layout, 1, 4);
  EXPECT_EQ(*groups, (std::vector<ReplicaGroup>{{0, 1, 2, 3}, {1}}));
}

TEST(DumpShareTest, KeepsAssignedGroupsWrittenByTheWriterAlone) {
  std::vector<float> a(4), b(2);
  State s;
  SP_ASSERT_OK(s.PutView("whole", TensorView(a.data(), DType::kF32, {4})));
  SP_ASSERT_OK(s.PutView("half", TensorView(b.data(), DType::kF32, {2})));
  SP_ASSERT_OK(s.PutValue("step", int64_t{3}));
  ShardLayout layout;
  layout["half"] = SplitDim({4}, 0, 2, 1, {1, 3}).value();
  ShardLayout out_layout;
  auto share = DumpShare(s, layout, 1, 4, {{1, 3}}, 0, &out_layout);
  ASSERT_TRUE(share.ok());
  EXPECT_FALSE(share->Contains("whole"));
  EXPECT_TRUE(share->Contains("half"));
  EXPECT_TRUE(share->Contains("step"));
  EXPECT_EQ(out_layout["half"].offsets, (Shape{2}));
  EXPECT_EQ(out_layout["half"].replicas, std::vector<int>{0});
  share = DumpShare(s, layout, 1, 4, {{0, 1, 2, 3}}, 2, &out_layout);
  ASSERT_TRUE(share.ok());
  EXPECT_TRUE(share->Contains("whole"));
  EXPECT_EQ(out_layout["whole"].sizes, (Shape{4}));
  EXPECT_EQ(out_layout["whole"].replicas, std::vector<int>{2});
}

TEST(FailoverNamesTest, Names) {
  EXPECT_EQ(FailureDumpName("ckpt", 2, 17), "ckpt-2_17_failover");
  EXPECT_EQ(MindSporeDumpName(40), "tft_saved_checkpoints-step_40");
}

}  // namespace
}  // namespace savepoint
