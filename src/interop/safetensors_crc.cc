// MindSpore's crc_num (interop/safetensors_crc.h).
#include "interop/safetensors_crc.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>

#include "interop/byte_layout.h"

namespace savepoint::interop {
namespace {

// The CRC of `n` zero bytes, by doubling (O(log n) combines, however large n is).
CrcPart ZerosCrc(uint64_t n) {
  static constexpr std::array<std::byte, 4096> kZeros{};
  CrcPart out{Crc32Zlib(0, std::span(kZeros).first(n % kZeros.size())), n % kZeros.size()};
  CrcPart power{Crc32Zlib(0, kZeros), kZeros.size()};  // kZeros.size() << k zero bytes
  for (uint64_t q = n / kZeros.size(); q != 0;) {
    if (q & 1) out = AppendCrc(power, out);  // zeros commute with zeros
    q >>= 1;
    if (q != 0) power = AppendCrc(power, power);
  }
  return out;
}

bool IsInteger(DType d) {
  switch (d) {
    case DType::kU8:
    case DType::kI8:
    case DType::kU16:
    case DType::kI16:
    case DType::kU32:
    case DType::kI32:
    case DType::kU64:
    case DType::kI64:
      return true;
    default:
      return false;
  }
}

bool IsSigned(DType d) {
  return d == DType::kI8 || d == DType::kI16 || d == DType::kI32 || d == DType::kI64;
}

}  // namespace

CrcPart AppendCrc(CrcPart a, CrcPart b) {
  return {Crc32ZlibCombine(a.crc, b.crc, b.len), a.len + b.len};
}

std::optional<CrcPart> IndexScalarCrc(DType dtype, const Shape& shape,
                                      std::span<const std::byte> data) {
  const size_t size = DTypeSize(dtype);
  if (!shape.empty() || !IsInteger(dtype) || data.size() != size) return std::nullopt;
  uint64_t v = 0;  // little-endian, sign-extended
  for (size_t i = 0; i < size; ++i) v |= uint64_t(std::to_integer<uint8_t>(data[i])) << (8 * i);
  const bool negative = IsSigned(dtype) && (v >> (8 * size - 1)) != 0;
  // Python: bytes(-1) is "negative count", bytes(2**63) an OverflowError; MindSpore fails on
  // such a scalar, and savepoint hashes its bytes as for any other tensor.
  if (negative || v > uint64_t{INT64_MAX}) return std::nullopt;
  return ZerosCrc(v);
}

uint32_t CrcNum(std::vector<NamedCrc> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const NamedCrc& a, const NamedCrc& b) { return a.name < b.name; });
  CrcPart crc;
  for (const NamedCrc& t : tensors) {
    crc = AppendCrc(crc, {Crc32Zlib(0, std::as_bytes(std::span(t.name))), t.name.size()});
    crc = AppendCrc(crc, t.part);
  }
  return crc.crc;
}

std::string FormatCrcNum(uint32_t crc) { return std::to_string(crc); }

Result<uint32_t> ParseCrcNum(std::string_view text, std::string_view path) {
  uint32_t crc = 0;
  const char* end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, crc);
  if (text.empty() || text.size() > 10 || ec != std::errc() || at != end) {
    return CorruptionError(
        fmt::format("safetensors file {}: __metadata__[\"{}\"] = {:?} is not a CRC-32 in decimal",
                    path, kCrcNumKey, text.substr(0, 32)));
  }
  return crc;
}

Status FillCrcNum(std::string* header, uint32_t crc) {
  const std::string from = fmt::format("\"{}\":\"{}\"", kCrcNumKey, kCrcNumPlaceholder);
  const std::string to = fmt::format("\"{}\":\"{}\"", kCrcNumKey, FormatCrcNum(crc));
  const size_t at = header->find(from);
  if (at == std::string::npos) return InternalError("safetensors header without crc_num");
  std::string fresh = header->substr(0, at) + to + header->substr(at + from.size());
  fresh.append(from.size() - to.size(), ' ');
  std::copy(fresh.begin(), fresh.end(), header->begin());  // in place: the layout points here
  return Status::OK();
}

}  // namespace savepoint::interop
