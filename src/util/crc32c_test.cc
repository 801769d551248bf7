#include "util/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace savepoint {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(Crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string_view("")), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
}

TEST(Crc32c, ExtendEqualsWhole) {
  std::string s = "The quick brown fox jumps over the lazy dog";
  auto bytes = std::as_bytes(std::span<const char>(s.data(), s.size()));
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    uint32_t a = Crc32c(bytes.subspan(0, cut));
    EXPECT_EQ(Crc32cExtend(a, bytes.subspan(cut)), Crc32c(bytes)) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace savepoint
