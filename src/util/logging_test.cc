#include "savepoint/logging.h"

#include <gtest/gtest.h>

#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

TEST(Logging, ParsesEveryLevelAndRejectsOthers) {
  EXPECT_EQ(ParseLogLevel("debug").value(), LogLevel::kDebug);
  EXPECT_EQ(ParseLogLevel("off").value(), LogLevel::kOff);
  EXPECT_EQ(ParseLogLevel("trace").value(), LogLevel::kTrace);
  Result<LogLevel> bad = ParseLogLevel("verbose");
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "verbose"));
  SetLogLevel(LogLevel::kError);
  SetLogLevel(LogLevel::kWarn);
}

}  // namespace
}  // namespace savepoint
