#include "util/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace savepoint {

uint32_t Crc32cExtend(uint32_t crc, std::span<const std::byte> data) {
  // ISA-L works on the raw register: pre- and post-invert around it. Its length is an int, so
  // feed at most 1 GiB per call.
  uint32_t reg = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t left = data.size();
  while (left > 0) {
    int n = static_cast<int>(std::min<size_t>(left, size_t{1} << 30));
    reg = crc32_iscsi(const_cast<unsigned char*>(p), n, reg);
    p += n;
    left -= static_cast<size_t>(n);
  }
  return ~reg;
}

uint32_t Crc32c(std::span<const std::byte> data) { return Crc32cExtend(0, data); }

}  // namespace savepoint
