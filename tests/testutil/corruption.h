// A check for the decoders' errors: Corruption whose message names what is wrong and where.
#ifndef SAVEPOINT_TESTUTIL_CORRUPTION_H_
#define SAVEPOINT_TESTUTIL_CORRUPTION_H_

#include <gtest/gtest.h>

#include <initializer_list>
#include <string_view>

#include "savepoint/status.h"

namespace savepoint::testing {

// Success when `s` is Corruption and its message contains every one of `needles`.
inline ::testing::AssertionResult IsCorruption(const Status& s,
                                               std::initializer_list<std::string_view> needles) {
  if (s.ok()) return ::testing::AssertionFailure() << "accepted";
  bool named = s.code() == StatusCode::kCorruption;
  for (std::string_view n : needles) named = named && s.message().find(n) != std::string::npos;
  if (!named) return ::testing::AssertionFailure() << s.ToString();
  return ::testing::AssertionSuccess();
}

}  // namespace savepoint::testing

#endif  // SAVEPOINT_TESTUTIL_CORRUPTION_H_
