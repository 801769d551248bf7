#include "util/crc32c.h"

#include <isa-l/crc.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

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

namespace {

// Copies with streaming stores: 16-byte unaligned loads, aligned non-temporal stores once `dst`
// is 16-byte aligned; the unaligned head and the tail go through memcpy.
void StreamCopy(const std::byte* src, std::byte* dst, size_t n) {
#if defined(__SSE2__)
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace

uint32_t Crc32cCopy(uint32_t crc, const std::byte* src, std::byte* dst, size_t n) {
  for (size_t done = 0; done < n;) {
    const size_t len = std::min(n - done, kCrc32cSlice);
    crc = Crc32cExtend(crc, {src + done, len});
    StreamCopy(src + done, dst + done, len);
    done += len;
  }
#if defined(__SSE2__)
  _mm_sfence();  // order the streaming stores before whatever publishes `dst`
#endif
  return crc;
}

}  // namespace savepoint
