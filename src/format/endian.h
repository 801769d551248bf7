// Little-endian integer encoding for on-disk headers.
#ifndef SAVEPOINT_FORMAT_ENDIAN_H_
#define SAVEPOINT_FORMAT_ENDIAN_H_

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

namespace savepoint::format {

// Tensor bytes are stored as they lie in memory; the format is little-endian only.
static_assert(std::endian::native == std::endian::little, "savepoint supports little-endian hosts");

inline void PutU32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void PutU64(std::string* s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*s)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline uint32_t GetU32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}
inline uint64_t GetU64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

}  // namespace savepoint::format

#endif  // SAVEPOINT_FORMAT_ENDIAN_H_
