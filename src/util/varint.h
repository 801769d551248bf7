// Unsigned LEB128 varints, the one encoding of variable-length integers savepoint defines: 7 bits
// a byte, low bits first, the high bit set on every byte but the last, at most 10 bytes. Used by
// the messages of a distributed save (distributed/wire.h) and the compact shard records of
// format version 4 (format/manifest_index.cc). Header-only: both sit on hot paths. Thread-safe.
#ifndef SAVEPOINT_UTIL_VARINT_H_
#define SAVEPOINT_UTIL_VARINT_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace savepoint {

inline constexpr size_t kMaxVarintBytes = 10;

// Writes `v` at `p` (at most kMaxVarintBytes); returns the end.
inline char* PutVarint(uint64_t v, char* p) {
  for (; v >= 0x80; v >>= 7) *p++ = static_cast<char>(v | 0x80);
  *p++ = static_cast<char>(v);
  return p;
}

// Reads the varint at in[*at] into *v and moves *at past it. Untrusted input: false (and *at
// unspecified) when the bytes end inside it, it runs past 10 bytes or its value past 64 bits.
inline bool GetVarint(std::string_view in, size_t* at, uint64_t* v) {
  if (*at < in.size() && static_cast<uint8_t>(in[*at]) < 0x80) {  // (most take one byte)
    *v = static_cast<uint8_t>(in[(*at)++]);
    return true;
  }
  uint64_t x = 0;
  for (int shift = 0; shift < 70 && *at < in.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in[(*at)++]);
    if (shift == 63 && byte > 1) return false;
    x |= uint64_t{byte & 0x7fu} << shift;
    if (byte < 0x80) {
      *v = x;
      return true;
    }
  }
  return false;
}

}  // namespace savepoint

#endif  // SAVEPOINT_UTIL_VARINT_H_
