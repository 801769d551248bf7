#include "savepoint/logging.h"

#include <gtest/gtest.h>

namespace savepoint {
namespace {

TEST(Logging, ParsesEveryLevelAndRejectsOthers) {
  EXPECT_EQ(ParseLogLevel("debug").value(), LogLevel::kDebug);
  EXPECT_EQ(ParseLogLevel("off").value(), LogLevel::kOff);
  EXPECT_EQ(ParseLogLevel("trace").value(), LogLevel::kTrace);
  Result<LogLevel> bad = ParseLogLevel("verbose");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("verbose"), std::string::npos);
  SetLogLevel(LogLevel::kError);
  SetLogLevel(LogLevel::kWarn);
}

}  // namespace
}  // namespace savepoint
