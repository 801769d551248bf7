// Strategy files: protobuf and JSON round trips, hostile input, layout resolution and checks,
// nested maps, uneven manual splits, optimizer sharding, the redundancy rule, merge and rank lists.
#include <gtest/gtest.h>

#include <string>

#include "io/mem_fs.h"
#include "mindspore_strategy/strategy.pb.h"
#include "mindspore_strategy/strategy_testutil.h"
#include "savepoint/mindspore_strategy.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::Layout;

MindSporeStrategy Strategy(std::vector<std::pair<std::string, MindSporeParamLayout>> layouts,
                           uint32_t stage = 0) {
  return {stage, {{"op", stage, {{1, 2}}}}, std::move(layouts)};
}

void ExpectSame(const MindSporeStrategy& a, const MindSporeStrategy& b) {
  EXPECT_EQ(EncodeMindSporeStrategy(a, MindSporeStrategyFormat::kProtobuf),
            EncodeMindSporeStrategy(b, MindSporeStrategyFormat::kProtobuf));
}

TEST(StrategyTest, ProtobufAndJsonRoundTrip) {
  MindSporeParamLayout nested = Layout({2, 2, 2}, {{2, 1}, {-1}}, 2, 1);
  MindSporeParamLayout manual = Layout({4}, {{0}, {-1}});
  manual.param_split_shape = {3, 5, 4, 4};
  manual.indices_offset = {0, 3, 8, 12};
  manual.field = 7;
  const MindSporeStrategy s = Strategy({{"w", nested}, {"emb", manual}}, 1);
  for (auto f : {MindSporeStrategyFormat::kProtobuf, MindSporeStrategyFormat::kJson}) {
    SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy back,
                            ParseMindSporeStrategy(EncodeMindSporeStrategy(s, f), "s"));
    ExpectSame(s, back);
    EXPECT_TRUE(back.layouts[0].second.nested_tensor_map);
    EXPECT_EQ(back.layouts[1].second.field, 7);
  }
}

TEST(StrategyTest, JsonOptionalFieldsDefaultAndNestedMaps) {
  SP_ASSERT_OK_AND_ASSIGN(
      MindSporeStrategy s,
      ParseMindSporeStrategy(R"( {"parallel_layout_item": {"a-b": {"dev_matrix": [2, 2],
                               "tensor_map": [[1, 0], -1]}}} )",
                             "x.json"));
  ASSERT_EQ(s.layouts.size(), 1u);
  const MindSporeParamLayout& l = s.layouts[0].second;
  EXPECT_EQ(l.opt_weight_shard_size, 0);
  EXPECT_EQ(l.tensor_map, (std::vector<std::vector<int32_t>>{{1, 0}, {-1}}));
  SP_ASSERT_OK_AND_ASSIGN(MindSporeLayoutMap m, ResolveMindSporeStrategy(s, "x.json"));
  EXPECT_EQ(m.params.count("a-b"), 1u);  // a '-' name in a file that is not merged
}

TEST(StrategyTest, HostileInputIsCorruptionNamingTheFile) {
  for (std::string bad : {std::string("{"), std::string("\x1a\xff\xff\xff\x0f", 5),
                          std::string("{\"parallel_layout_item\": {\"w\": 3}}"),
                          std::string(100, '[') + "{", std::string()}) {
    Result<MindSporeStrategy> r = ParseMindSporeStrategy(bad, "evil.ckpt");
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r, StatusIs(StatusCode::kCorruption, "evil.ckpt"));
  }
}

TEST(StrategyTest, NestedMapFirstAxisMostSignificant) {
  // dev [2, 2, 2] (axes: k=2 slowest .. k=0 fastest); dim 0 over k=2 then k=1: 4 row blocks.
  const MindSporeParamLayout l = Layout({2, 2, 2}, {{2, 1}, {-1}});
  for (int r = 0; r < 8; ++r) {
    SP_ASSERT_OK_AND_ASSIGN(ShardSpec s, MindSporeShard(l, {8, 2}, r));
    EXPECT_EQ(s.offsets[0], 2 * (r / 2)) << r;
    EXPECT_EQ(s.sizes[0], 2);
    EXPECT_EQ(s.replicas.size(), 2u);
  }
}

TEST(StrategyTest, ManualSplitAndGlobalShape) {
  MindSporeParamLayout l = Layout({2}, {{0}, {-1}});
  l.param_split_shape = {3, 7};
  SP_ASSERT_OK_AND_ASSIGN(ShardSpec s, MindSporeShard(l, {10, 4}, 1));
  EXPECT_EQ(s.offsets, (Shape{3, 0}));
  EXPECT_EQ(s.sizes, (Shape{7, 4}));
  SP_ASSERT_OK_AND_ASSIGN(Shape g, MindSporeGlobalShape(l, {7, 4}));
  EXPECT_EQ(g, (Shape{10, 4}));
  l.param_split_shape = {3, 3};
  EXPECT_THAT(MindSporeShard(l, {10, 4}, 0, "emb"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(StrategyTest, OptimizerShardFollowsTheGroupsFastestAxes) {
  // dev [2, 4], dim 0 over the 4-axis; the 2-axis (rank stride 4) holds the optimizer pieces.
  const MindSporeParamLayout l = Layout({2, 4}, {{0}, {-1}}, 2, 4);
  const int64_t want[8] = {0, 4, 8, 12, 2, 6, 10, 14};
  for (int r = 0; r < 8; ++r) {
    SP_ASSERT_OK_AND_ASSIGN(ShardSpec s, MindSporeShard(l, {16, 2}, r));
    EXPECT_EQ(s.offsets[0], want[r]) << r;
    EXPECT_EQ(s.sizes[0], 2);
    EXPECT_EQ(s.replicas, (std::vector<int>{r}));
  }
  SP_ASSERT_OK_AND_ASSIGN(Shape g, MindSporeGlobalShape(l, {2, 2}));
  EXPECT_EQ(g, (Shape{16, 2}));
  EXPECT_FALSE(MindSporeShard(Layout({2, 4}, {{0}, {-1}}, 3, 4), {24, 2}, 0).ok());
}

TEST(StrategyTest, ResolveChecksNameFileAndParameter) {
  auto fails = [](MindSporeStrategy s, std::string_view word) {
    Result<MindSporeLayoutMap> r = ResolveMindSporeStrategy(s, "f.ckpt");
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "f.ckpt"));
    EXPECT_NE(r.status().message().find(word), std::string::npos) << r.status().ToString();
  };
  fails(Strategy({{"w", Layout({4}, {{1}, {-1}})}}), "\"w\"");                       // no axis 1
  fails(Strategy({{"w", Layout({4}, {{0}})}, {"v", Layout({8}, {{0}})}}), "\"v\"");  // 4 vs 8
  fails(Strategy({{"0-w", Layout({4}, {{0}})}, {"1-w", Layout({4}, {{-1}})}}), "different");
  fails(Strategy({{"0-w", Layout({4}, {{0}})}, {"2-v", Layout({4}, {{0}})}}), "stages");
  SP_ASSERT_OK_AND_ASSIGN(MindSporeLayoutMap m,
                          ResolveMindSporeStrategy(Strategy({{"0-w", Layout({4}, {{0}})},
                                                             {"1-w", Layout({4}, {{0}})},
                                                             {"1-v", Layout({4}, {{-1}})}}),
                                                   "f.ckpt"));
  EXPECT_EQ(m.stages, 2u);
  EXPECT_EQ(m.stage_devices, 4);
  EXPECT_EQ(m.params.at("w").stages, (std::vector<uint32_t>{0, 1}));
}

TEST(StrategyTest, RedundancyRoundRobinsParametersOverEachGroup) {
  // dp 2 x mp 2: every slice is held by 2 ranks; sorted names a, b, c go to members 0, 1, 0.
  SP_ASSERT_OK_AND_ASSIGN(MindSporeLayoutMap m,
                          ResolveMindSporeStrategy(Strategy({{"a", Layout({2, 2}, {{0}})},
                                                             {"b", Layout({2, 2}, {{0}})},
                                                             {"c", Layout({2, 2}, {{0}})}}),
                                                   "f"));
  const std::map<std::string, Shape, std::less<>> shapes = {
      {"a", {4}}, {"b", {4}}, {"c", {4}}, {"step", {1}}};
  SP_ASSERT_OK_AND_ASSIGN(auto r0, MindSporeRedundancyFreeParams(m, shapes, 0));
  SP_ASSERT_OK_AND_ASSIGN(auto r2, MindSporeRedundancyFreeParams(m, shapes, 2));
  EXPECT_EQ(r0, (std::vector<std::string>{"a", "c", "step"}));
  EXPECT_EQ(r2, (std::vector<std::string>{"b", "step"}));
}

TEST(StrategyTest, MergeAndRankList) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(fs.CreateDir("/s"));
  SP_ASSERT_OK(WriteMindSporeStrategy(Strategy({{"w", Layout({4}, {{0}, {-1}})}}, 0), "/s/a.ckpt",
                                      MindSporeStrategyFormat::kProtobuf, io));
  SP_ASSERT_OK(WriteMindSporeStrategy(Strategy({{"v", Layout({4}, {{-1}})}}, 1), "/s/b.ckpt",
                                      MindSporeStrategyFormat::kProtobuf, io));
  SP_ASSERT_OK(MergeMindSporeStrategies("/s", "/m.ckpt", io));
  SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy m, ReadMindSporeStrategy("/m.ckpt", &fs));
  EXPECT_EQ(m.current_stage, 1u);
  ASSERT_EQ(m.layouts.size(), 2u);
  EXPECT_EQ(m.layouts[0].first, "0-w");
  EXPECT_EQ(m.layouts[1].first, "1-v");
  // 2 x 4 pipeline -> not split: rank 0 reads every stage-0 slice of w and stage 1's home file.
  SP_ASSERT_OK_AND_ASSIGN(std::vector<int64_t> ranks,
                          MindSporeRankListForTransform(0, {.src_strategy_file = "/m.ckpt"}, io));
  EXPECT_EQ(ranks, (std::vector<int64_t>{4, 3, 2, 1, 0}));
}

}  // namespace
}  // namespace savepoint
