// CRC32C (Castagnoli), the checksum of every chunk savepoint writes.
//
// Backed by ISA-L's crc32_iscsi (SSE4.2 / PCLMUL / AVX-512 dispatch at run time). Standard CRC32C
// parameters: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF, so
// Crc32c("123456789") == 0xE3069283.
#ifndef SAVEPOINT_UTIL_CRC32C_H_
#define SAVEPOINT_UTIL_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace savepoint {

// CRC32C of `data`.
uint32_t Crc32c(std::span<const std::byte> data);
inline uint32_t Crc32c(std::string_view s) {
  return Crc32c(std::as_bytes(std::span<const char>(s.data(), s.size())));
}

// Continues a CRC: Crc32cExtend(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, std::span<const std::byte> data);

// Granularity of copy-and-checksum loops (Crc32cCopy and its callers' fallbacks): small enough that
// a slice just copied or checksummed is still in L2 for the second pass, large enough to amortise
// per-slice overhead.
inline constexpr size_t kCrc32cSlice = size_t{256} << 10;

// Copies `n` bytes from `src` to `dst` (not overlapping) and returns Crc32cExtend(crc, the bytes).
// One pass over memory: each 256 KiB slice is checksummed (which brings it into cache) and then
// copied from cache with non-temporal stores on x86-64, so the destination is not read for
// ownership; this beats memcpy followed by a checksum pass and even plain memcpy for large
// copies. The stores are fenced before returning, so handing `dst` to another thread afterwards
// needs only the usual synchronisation. Elsewhere: memcpy and checksum per slice.
uint32_t Crc32cCopy(uint32_t crc, const std::byte* src, std::byte* dst, size_t n);

}  // namespace savepoint

#endif  // SAVEPOINT_UTIL_CRC32C_H_
