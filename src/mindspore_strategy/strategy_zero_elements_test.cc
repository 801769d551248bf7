// Huge numbers in MindSpore strategy files and zero-element tensors with INT64_MAX-sized and
// near-overflow dims under their layouts (issue 37: all arithmetic on numbers read from a file is
// checked). The numbers a strategy file holds are dev_matrix axes, tensor_map entries (32-bit
// axis numbers, -1 for none), param_split_shape sizes and indices_offset starts: out-of-range ones
// are Corruption (parse) or InvalidArgument (ResolveMindSporeStrategy) naming the file and the
// parameter. A global shape is a rank's slice times the split counts: one over 2^62 in a dim, or
// whose element count overflows int64, is InvalidArgument naming the parameter, never a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "interop/mindspore_ckpt.pb.h"
#include "io/mem_fs.h"
#include "mindspore_strategy/strategy_testutil.h"
#include "savepoint/mindspore.h"
#include "savepoint/mindspore_strategy.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::Layout;
using ::savepoint::testing::StatusIs;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k2p62 = int64_t{1} << 62;
constexpr char kFile[] = "s.json";

// A JSON strategy file of one parameter "w" whose layout is the JSON object text `layout`,
// parsed and resolved.
Result<MindSporeLayoutMap> Resolve(const std::string& layout) {
  const std::string text = R"({"parallel_layout_item": {"w": )" + layout + "}}";
  SP_ASSIGN_OR_RETURN(MindSporeStrategy s, ParseMindSporeStrategy(text, kFile));
  return ResolveMindSporeStrategy(s, kFile);
}

TEST(StrategyHostileTest, HugeNumbersInAStrategyFile) {
  const struct {
    std::string layout;
    StatusCode code;
    std::string message;
  } cases[] = {
      {R"({"dev_matrix": [9223372036854775807], "tensor_map": [0]})", StatusCode::kCorruption,
       "dev_matrix [9223372036854775807] holds 9223372036854775807, not a device count"},
      {R"({"dev_matrix": [4294967295, 4294967295], "tensor_map": [0, 1]})",
       StatusCode::kInvalidArgument, "axes must be >= 1 with a product of at most 1048576"},
      {R"({"dev_matrix": [1048576, 1048576], "tensor_map": [0, 1]})", StatusCode::kInvalidArgument,
       "a product of at most 1048576"},
      {R"({"dev_matrix": [-9223372036854775808], "tensor_map": [0]})", StatusCode::kCorruption,
       "not a device count"},
      {R"({"dev_matrix": [9223372036854775808], "tensor_map": [0]})", StatusCode::kCorruption,
       "dev_matrix holds something other than an integer"},
      // An axis number beyond int64 once read as -1 ("not split"): it is no 32-bit integer.
      {R"({"dev_matrix": [2], "tensor_map": [18446744073709551615]})", StatusCode::kCorruption,
       "tensor_map entries must be 32-bit integers"},
      {R"({"dev_matrix": [2], "tensor_map": [[18446744073709551615, 0]]})", StatusCode::kCorruption,
       "tensor_map entries must be 32-bit integers"},
      {R"({"dev_matrix": [2], "tensor_map": [9223372036854775807]})", StatusCode::kCorruption,
       "tensor_map entries must be 32-bit integers"},
      {R"({"dev_matrix": [2], "tensor_map": [-2147483649]})", StatusCode::kCorruption,
       "tensor_map entries must be 32-bit integers"},
      {R"({"dev_matrix": [2], "tensor_map": [2147483647]})", StatusCode::kInvalidArgument,
       "entry 2147483647 names no device axis"},
      {R"({"dev_matrix": [2], "tensor_map": [0], "param_split_shape": [9223372036854775807, 1]})",
       StatusCode::kInvalidArgument, "bad param_split_shape"},
      {R"({"dev_matrix": [2], "tensor_map": [0], "param_split_shape": [4611686018427387904, 1]})",
       StatusCode::kInvalidArgument, "bad param_split_shape"},
      {R"({"dev_matrix": [2], "tensor_map": [0], "param_split_shape": [-1, 2]})",
       StatusCode::kInvalidArgument, "bad param_split_shape"},
      {R"({"dev_matrix": [2], "tensor_map": [0], "param_split_shape": [0, 4611686018427387904],)"
       R"( "indices_offset": [0, 9223372036854775807]})",
       StatusCode::kInvalidArgument, "without gaps or overlaps"},
      {R"({"dev_matrix": [2], "tensor_map": [0], "opt_weight_shard_size": 9223372036854775807})",
       StatusCode::kCorruption, "opt_weight_shard_size = 9223372036854775807 is out of range"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.layout);
    const Status s = Resolve(c.layout).status();
    EXPECT_THAT(s, StatusIs(c.code, c.message));
    EXPECT_THAT(s, StatusIs(c.code, "strategy file s.json: parameter \"w\": "));
  }
}

// A zero-element parameter of 2^62 rows split unevenly by hand over two ranks, with a second dim:
// the layout checks must not multiply out a made-up shape of the split's sum times the devices.
TEST(StrategyHostileTest, ManualSplitOf2To62Rows) {
  for (const std::string map : {"[0]", "[0, -1]", "[0, -1, -1]"}) {
    SCOPED_TRACE(map);
    SP_ASSERT_OK_AND_ASSIGN(MindSporeLayoutMap m,
                            Resolve(R"({"dev_matrix": [2], "tensor_map": )" + map +
                                    R"(, "param_split_shape": [0, 4611686018427387904]})"));
    const MindSporeParamLayout& l = m.params.at("w").layout;
    Shape slice(l.tensor_map.size(), 0);
    slice[0] = k2p62;
    SP_ASSERT_OK_AND_ASSIGN(Shape global, MindSporeGlobalShape(l, slice));
    EXPECT_EQ(global, slice);
    SP_ASSERT_OK_AND_ASSIGN(ShardSpec one, MindSporeShard(l, global, 1, "w"));
    EXPECT_EQ(one.sizes, slice);
    SP_ASSERT_OK_AND_ASSIGN(ShardSpec zero, MindSporeShard(l, global, 0, "w"));
    EXPECT_EQ(zero.sizes[0], 0);
  }
}

TEST(StrategyHostileTest, GlobalShapesOfZeroElementSlices) {
  const MindSporeParamLayout rows = Layout({1 << 20}, {{0}, {-1}});  // dim 0 over 2^20 ranks
  const MindSporeParamLayout whole = Layout({2}, {{-1}, {-1}, {-1}});
  // Within 2^62 per dim, with a valid element count: a global shape, and every rank's box.
  SP_ASSERT_OK_AND_ASSIGN(Shape g, MindSporeGlobalShape(rows, {int64_t{1} << 42, 0}));
  EXPECT_EQ(g, (Shape{k2p62, 0}));
  SP_ASSERT_OK_AND_ASSIGN(ShardSpec last, MindSporeShard(rows, g, (1 << 20) - 1, "w"));
  EXPECT_EQ(last.offsets, (Shape{k2p62 - (int64_t{1} << 42), 0}));
  SP_ASSERT_OK_AND_ASSIGN(g, MindSporeGlobalShape(whole, {0, k2p62, k2p62}));
  EXPECT_EQ(g, (Shape{0, k2p62, k2p62}));
  // Past 2^62 in a dim, or an element count past INT64_MAX before the zero dim.
  for (const auto& [layout, slice] : std::vector<std::pair<MindSporeParamLayout, Shape>>{
           {rows, {int64_t{1} << 43, 0}},
           {rows, {kMax, 0}},
           {whole, {kMax, 0, 0}},
           {whole, {k2p62, 2, 0}},
           {whole, {-1, 0, 0}},
           {Layout({2}, {{-1}, {0}, {-1}}), {k2p62, k2p62 / 2, 0}}}) {
    SCOPED_TRACE(ShapeToString(slice));
    EXPECT_THAT(
        MindSporeGlobalShape(layout, slice),
        StatusIs(StatusCode::kInvalidArgument, "global shape of slice " + ShapeToString(slice)));
  }
}

// A layout built by hand (not through ResolveMindSporeStrategy's caps) whose dev_matrix products
// overflow int64: split counts saturate, and the global shape is refused, never wrapped.
TEST(StrategyHostileTest, DevMatrixProductsPastInt64Saturate) {
  const int64_t big = int64_t{1} << 40;
  const MindSporeParamLayout l = Layout({big, big, 3}, {{0, 1, 2}, {-1}});
  EXPECT_EQ(MindSporeSplitCounts(l), (std::vector<int64_t>{kMax, 1}));
  EXPECT_THAT(MindSporeGlobalShape(l, {1, 1}),
              StatusIs(StatusCode::kInvalidArgument, "global shape of slice [1, 1]"));
  const MindSporeParamLayout negative = Layout({-big, big, 3}, {{0, 1, 2}, {-1}});
  EXPECT_EQ(MindSporeSplitCounts(negative)[0], INT64_MIN);
  EXPECT_THAT(MindSporeGlobalShape(negative, {1, 1}), StatusIs(StatusCode::kInvalidArgument));
  // Optimizer sharding's default size divides the devices by the split: both saturated.
  EXPECT_THAT(MindSporeGlobalShape(Layout({big, big, 3}, {{0}, {-1}}, -1, 1), {1, 1}),
              StatusIs(StatusCode::kInvalidArgument));
}

// A .ckpt file of one entry "w" of `dims` without content, and an int32 scalar "step".
std::string CkptFile(const std::vector<int64_t>& dims) {
  mindspore::Checkpoint c;
  auto* w = c.add_value();
  w->set_tag("w");
  for (int64_t d : dims) w->mutable_tensor()->add_dims(d);
  w->mutable_tensor()->set_tensor_type("Float32");
  w->mutable_tensor()->set_tensor_content("");
  auto* step = c.add_value();
  step->set_tag("step");
  step->mutable_tensor()->set_tensor_type("Int32");
  step->mutable_tensor()->set_tensor_content(std::string(4, '\0'));
  return c.SerializeAsString();
}

// Transforms of a source whose "w" has zero elements: split by rows over two destination ranks
// it lands on both as [0, 2^63-1]; a source entry whose dims overflow before their zero is
// Corruption naming the file and the entry (it once reached NumBytes(...).value()).
TEST(StrategyHostileTest, TransformOfZeroElementTensors) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(WriteMindSporeStrategy({0, {{"op", 0, {{1}}}}, {{"w", Layout({2}, {{0}, {-1}})}}},
                                      "/dst.ckpt", MindSporeStrategyFormat::kProtobuf, io));
  SP_ASSERT_OK(fs.CreateDirs("/src/rank_0"));
  SP_ASSERT_OK(fs.WriteFileSynced("/src/rank_0/m.ckpt", CkptFile({0, kMax})));
  const MindSporeTransformOptions o{.dst_strategy_file = "/dst.ckpt"};
  SP_ASSERT_OK(MindSporeTransformCheckpoints("/src", "/dst", "d", o, io));
  for (const char* out : {"/dst/rank_0/d0.ckpt", "/dst/rank_1/d1.ckpt"}) {
    SP_ASSERT_OK_AND_ASSIGN(State s, LoadMindSporeCheckpoint(out, {}, io));
    ASSERT_NE(s.FindTensor("w"), nullptr) << out;
    EXPECT_EQ(s.FindTensor("w")->shape(), (Shape{0, kMax})) << out;
  }
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{kMax, 2, 0}, {kMax, kMax, 0}}) {
    SP_ASSERT_OK(fs.WriteFileSynced("/src/rank_0/m.ckpt", CkptFile(dims)));
    EXPECT_THAT(MindSporeTransformCheckpoints("/src", "/dst2", "d", o, io),
                StatusIs(StatusCode::kCorruption, "entry \"w\": dims are negative or overflow"));
  }
}

}  // namespace
}  // namespace savepoint
