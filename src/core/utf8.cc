#include "core/utf8.h"

#include <cstdint>

namespace savepoint {
namespace {

// Length of the sequence starting with lead byte `c`, and the minimum code point it may encode.
bool LeadInfo(uint8_t c, int* len, uint32_t* cp, uint32_t* min) {
  if (c < 0x80) {
    *len = 1;
    *cp = c;
    *min = 0;
    return true;
  }
  if ((c & 0xE0) == 0xC0) {
    *len = 2;
    *cp = c & 0x1F;
    *min = 0x80;
    return true;
  }
  if ((c & 0xF0) == 0xE0) {
    *len = 3;
    *cp = c & 0x0F;
    *min = 0x800;
    return true;
  }
  if ((c & 0xF8) == 0xF0) {
    *len = 4;
    *cp = c & 0x07;
    *min = 0x10000;
    return true;
  }
  return false;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int len;
    uint32_t cp, min;
    if (!LeadInfo(static_cast<uint8_t>(s[i]), &len, &cp, &min)) return false;
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      uint8_t c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace savepoint
