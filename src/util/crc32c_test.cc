#include "util/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// Crc32cCopy == memcpy + Crc32cExtend for every misalignment of source and destination, lengths
// around the 64-byte streaming block and the 256 KiB slice, and a non-zero starting CRC.
TEST(Crc32c, CopyEqualsMemcpyThenExtend) {
  constexpr size_t kMax = (256 << 10) * 2 + 300;
  std::vector<std::byte> src(kMax + 64), dst(kMax + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte((i * 131 + 7) & 0xff);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{63}, size_t{64}, size_t{65},
                   size_t{1000}, size_t{256 << 10}, size_t{(256 << 10) + 1}, kMax}) {
    for (size_t src_off : {0, 1, 5, 16}) {
      for (size_t dst_off : {0, 3, 8, 17}) {
        std::fill(dst.begin(), dst.end(), std::byte{0xEE});
        const std::byte* s = src.data() + src_off;
        const uint32_t got = Crc32cCopy(0x1234u, s, dst.data() + dst_off, n);
        EXPECT_EQ(got, Crc32cExtend(0x1234u, {s, n}))
            << "n=" << n << " src+" << src_off << " dst+" << dst_off;
        EXPECT_TRUE(std::equal(s, s + n, dst.data() + dst_off)) << "n=" << n;
        EXPECT_EQ(dst[dst_off + n], std::byte{0xEE}) << "wrote past the end, n=" << n;
        if (dst_off > 0) {
          EXPECT_EQ(dst[dst_off - 1], std::byte{0xEE}) << "wrote before, n=" << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace savepoint
