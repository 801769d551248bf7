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

}  // namespace savepoint

#endif  // SAVEPOINT_UTIL_CRC32C_H_
