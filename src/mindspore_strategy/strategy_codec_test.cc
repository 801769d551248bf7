// The strategy codecs agree: whatever parses re-encodes in either format to bytes that parse to
// the same strategy and encode to the same bytes again (nested and flat maps, empty entries,
// one-dim nested maps); what has no exact form is refused with the layout named.
#include <gtest/gtest.h>

#include <string>

#include "io/mem_fs.h"
#include "mindspore_strategy/strategy.pb.h"
#include "savepoint/mindspore_strategy.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr MindSporeStrategyFormat kFormats[] = {MindSporeStrategyFormat::kProtobuf,
                                                MindSporeStrategyFormat::kJson};

std::string JsonWithMap(const std::string& tensor_map) {
  return R"({"parallel_layout_item": {"w": {"dev_matrix": [2, 2, 2], "tensor_map": )" + tensor_map +
         "}}}";
}

// Parses `bytes`, then for each format: encode, parse, encode again; both encodings equal and
// the strategy parsed back equal (by its protobuf bytes) to the first one parsed.
void ExpectExactRoundTrips(const std::string& bytes) {
  SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy first, ParseMindSporeStrategy(bytes, "in"));
  const std::string canonical = EncodeMindSporeStrategy(first, kFormats[0]);
  for (MindSporeStrategyFormat f : kFormats) {
    SP_EXPECT_OK(CheckMindSporeStrategyEncodable(first, f));
    const std::string once = EncodeMindSporeStrategy(first, f);
    SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy back, ParseMindSporeStrategy(once, "once"));
    EXPECT_EQ(EncodeMindSporeStrategy(back, f), once) << once;
    EXPECT_EQ(EncodeMindSporeStrategy(back, kFormats[0]), canonical) << once;
    ASSERT_EQ(back.layouts.size(), first.layouts.size());
    EXPECT_EQ(back.layouts[0].second.tensor_map, first.layouts[0].second.tensor_map) << once;
  }
}

TEST(StrategyCodecTest, NestedFlatAndMixedMapsRoundTripExactly) {
  for (const char* map :
       {"[2, -1]", "[[2, 1], -1]", "[[2], [1]]", "[[1, 0], [2]]", "[-1]", "[[2]]", "[]"}) {
    SCOPED_TRACE(map);
    ExpectExactRoundTrips(JsonWithMap(map));
  }
}

TEST(StrategyCodecTest, EmptyNestedEntryInJsonIsRefusedNamingIt) {
  for (const char* map : {"[[], 5]", "[[1], []]", "[[]]"}) {
    EXPECT_THAT(ParseMindSporeStrategy(JsonWithMap(map), "s.json"),
                StatusIs(StatusCode::kCorruption, "tensor_map entry"))
        << map;
  }
}

TEST(StrategyCodecTest, OneDimNestedMapIsTheFlatMapOfItsAxis) {
  SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy s, ParseMindSporeStrategy(JsonWithMap("[[2]]"), "s"));
  EXPECT_FALSE(s.layouts[0].second.nested_tensor_map);  // as MindSpore reads one TensorMap
  EXPECT_EQ(s.layouts[0].second.tensor_map, (std::vector<std::vector<int32_t>>{{2}}));
}

// The layouts of a new parameter `name` of `m` (stage 0), on a dev_matrix of one dim `devices`.
mindspore_strategy::ParallelLayouts* AddParam(mindspore_strategy::ParallelStrategyMap& m,
                                              const char* name, int64_t devices) {
  m.set_current_stage(0);
  auto* item = m.add_parallel_layout_item();
  item->set_param_name(name);
  auto* p = item->mutable_parallel_layouts();
  p->add_dev_matrix()->add_dim(devices);
  return p;
}

// Empty TensorMap messages among several are dropped, as MindSpore reads them; the result then
// round-trips exactly.
TEST(StrategyCodecTest, EmptyTensorMapMessagesAreDroppedThenStable) {
  mindspore_strategy::ParallelStrategyMap m;
  auto* p = AddParam(m, "w", 2);
  p->add_tensor_map();  // empty
  p->add_tensor_map()->add_dim(0);
  p->add_tensor_map()->add_dim(-1);
  p->add_tensor_map();  // empty
  p->set_field(0);
  p->set_opt_weight_shard_step(0);
  p->set_opt_weight_shard_size(0);
  const std::string bytes = m.SerializeAsString();
  SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy s, ParseMindSporeStrategy(bytes, "s.ckpt"));
  EXPECT_EQ(s.layouts[0].second.tensor_map, (std::vector<std::vector<int32_t>>{{0}, {-1}}));
  ExpectExactRoundTrips(bytes);
}

// Only empty TensorMap messages: the map of a scalar, the same in every encoding (libFuzzer found
// the nested flag kept on the empty map, which then wrote differently the second time).
TEST(StrategyCodecTest, OnlyEmptyTensorMapMessagesAreTheMapOfAScalar) {
  mindspore_strategy::ParallelStrategyMap m;
  auto* p = AddParam(m, "s", 4);
  p->add_tensor_map();
  p->add_tensor_map();
  SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy s,
                          ParseMindSporeStrategy(m.SerializePartialAsString(), "s.ckpt"));
  EXPECT_TRUE(s.layouts[0].second.tensor_map.empty());
  EXPECT_FALSE(s.layouts[0].second.nested_tensor_map);
  const std::string once = EncodeMindSporeStrategy(s, MindSporeStrategyFormat::kProtobuf);
  SP_ASSERT_OK_AND_ASSIGN(MindSporeStrategy back, ParseMindSporeStrategy(once, "once"));
  EXPECT_EQ(EncodeMindSporeStrategy(back, MindSporeStrategyFormat::kProtobuf), once);
}

TEST(StrategyCodecTest, LayoutsWithoutAnExactFormAreRefusedOnWrite) {
  MemFileSystem fs;
  MindSporeParamLayout one_dim_two_axes{.dev_matrix = {2, 2}, .tensor_map = {{0, 1}}};
  one_dim_two_axes.nested_tensor_map = true;
  MindSporeParamLayout empty_entry{.dev_matrix = {2}, .tensor_map = {{0}, {}}};
  empty_entry.nested_tensor_map = true;
  MindSporeParamLayout flat_two_axes{.dev_matrix = {2, 2}, .tensor_map = {{0, 1}, {-1}}};
  const MindSporeStrategy ok{0, {}, {{"w", one_dim_two_axes}}};
  SP_EXPECT_OK(WriteMindSporeStrategy(ok, "/s.json", MindSporeStrategyFormat::kJson, {.fs = &fs}));
  EXPECT_THAT(
      WriteMindSporeStrategy(ok, "/s.ckpt", MindSporeStrategyFormat::kProtobuf, {.fs = &fs}),
      StatusIs(StatusCode::kInvalidArgument, "\"w\""));
  EXPECT_FALSE(fs.Exists("/s.ckpt"));
  for (const MindSporeParamLayout& bad : {empty_entry, flat_two_axes}) {
    for (MindSporeStrategyFormat f : kFormats) {
      EXPECT_THAT(CheckMindSporeStrategyEncodable({0, {}, {{"e", bad}}}, f),
                  StatusIs(StatusCode::kInvalidArgument, "tensor_map entry"));
    }
  }
}

// A dev_matrix entry that the protobuf form (uint32) cannot hold exactly (it was truncated on
// write) is refused on read in both formats and on write.
TEST(StrategyCodecTest, DevMatrixEntriesOutsideUint32AreRefused) {
  for (const char* dev : {"[-2, 2]", "[4294967296]", "[9223372036854775807]"}) {
    SCOPED_TRACE(dev);
    const std::string json = std::string(R"({"parallel_layout_item": {"w": {"dev_matrix": )") +
                             dev + R"(, "tensor_map": [-1]}}})";
    EXPECT_THAT(ParseMindSporeStrategy(json, "s.json"),
                StatusIs(StatusCode::kCorruption, "dev_matrix"));
  }
  const MindSporeParamLayout huge{.dev_matrix = {int64_t{1} << 32}, .tensor_map = {{-1}}};
  for (MindSporeStrategyFormat f : kFormats) {
    EXPECT_THAT(CheckMindSporeStrategyEncodable({0, {}, {{"w", huge}}}, f),
                StatusIs(StatusCode::kInvalidArgument, "dev_matrix"));
  }
}

// Protobuf strings may hold any bytes; JSON cannot: a name that is not UTF-8 has no JSON form,
// so it is refused on read, naming the field (libFuzzer found one).
TEST(StrategyCodecTest, NamesThatAreNotUtf8AreRefused) {
  for (bool node : {true, false}) {
    mindspore_strategy::ParallelStrategyMap m;
    if (node) {
      m.add_parallel_strategy_item()->set_node_name(
          "o\x95"
          "0");
    } else {
      auto* item = m.add_parallel_layout_item();
      item->set_param_name("w\xff");
      item->mutable_parallel_layouts()->add_dev_matrix()->mutable_dim()->Add(2);
    }
    EXPECT_THAT(ParseMindSporeStrategy(m.SerializePartialAsString(), "s.ckpt"),
                StatusIs(StatusCode::kCorruption, node ? "node name" : "parameter name"));
  }
}

}  // namespace
}  // namespace savepoint
