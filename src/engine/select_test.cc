// The one name-pattern rule (engine::MatchesName) on the shared case table that the Python tests
// check too (tests/testutil/name_patterns.tsv), plus CopyValues.
#include "engine/select.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "savepoint/checkpoint.h"
#include "testutil/testutil.h"

namespace savepoint::engine {
namespace {

using ::savepoint::testing::StatusIs;

TEST(NamePatterns, SharedTable) {
  std::ifstream in(SAVEPOINT_NAME_PATTERNS);
  ASSERT_TRUE(in.good()) << SAVEPOINT_NAME_PATTERNS;
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    std::string pattern, name, match;
    std::getline(row, pattern, '\t');
    std::getline(row, name, '\t');
    std::getline(row, match, '\t');
    EXPECT_EQ(savepoint::MatchesName(pattern, name), match == "1")
        << "pattern " << pattern << " name " << name;
    ++cases;
  }
  EXPECT_GT(cases, 20);
  EXPECT_TRUE(Selected({}, "anything"));
  EXPECT_TRUE(Selected({"x", "model.*"}, "model.w"));
  EXPECT_FALSE(Selected({"x", "model.?"}, "model.ww"));
}

TEST(CopyValues, SelectedValuesAndMetadataOnly) {
  State from;
  ASSERT_TRUE(from.PutValue("step", int64_t{7}).ok());
  ASSERT_TRUE(from.PutValue("lr", 0.5).ok());
  ASSERT_TRUE(from.Put("w", Tensor::Empty(DType::kF32, {2}).value()).ok());
  from.metadata() = Json{{"k", 1}};
  State to;
  ASSERT_TRUE(to.PutValue("step", int64_t{1}).ok());
  ASSERT_TRUE(CopyValues(from, &to, {"st*"}).ok());
  EXPECT_EQ(to.FindValue("step")->as_int(), 7);
  EXPECT_EQ(to.FindValue("lr"), nullptr);
  EXPECT_EQ(to.FindTensor("w"), nullptr);
  EXPECT_EQ(to.metadata()["k"], 1);
  State clash;
  ASSERT_TRUE(clash.Put("lr", Tensor::Empty(DType::kF32, {1}).value()).ok());
  Status s = CopyValues(from, &clash);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "\"lr\""));
}

}  // namespace
}  // namespace savepoint::engine
