// MindSpore's `crc_num`: the CRC-32 that `mindspore.save_checkpoint(..., format="safetensors",
// crc_check=True)` stores in a safetensors file's `__metadata__` and that its load_checkpoint
// checks (docs/INTEROP.md describes the algorithm and its quirks). The readers and the writer
// compute the CRC-32 of each tensor's bytes piece by piece, in parallel, while they move the
// bytes anyway; this file turns those per-tensor CRCs into crc_num.
#ifndef SAVEPOINT_INTEROP_SAFETENSORS_CRC_H_
#define SAVEPOINT_INTEROP_SAFETENSORS_CRC_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/dtype.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint::interop {

// The `__metadata__` keys of MindSpore's flavour, and the value of "format" it writes.
inline constexpr char kCrcNumKey[] = "crc_num";
inline constexpr char kFormatKey[] = "format";
inline constexpr char kMindSporeFormat[] = "ms";

// A CRC-32 (zlib) of `len` bytes, to be chained with others (Crc32ZlibCombine).
struct CrcPart {
  uint32_t crc = 0;
  uint64_t len = 0;
};

// The CRC of `a` followed by `b`.
CrcPart AppendCrc(CrcPart a, CrcPart b);

// What MindSpore hashes for a tensor is its bytes, except for a 0-d tensor of an integer dtype
// (I8 ... U64) holding a value v with 0 <= v < 2^63: Python's bytes(array) reads such an array as
// the integer v and yields v zero bytes. Returns that part for such a tensor whose bytes are
// `data`, and nothing for every other tensor (whose part is the CRC of its bytes).
std::optional<CrcPart> IndexScalarCrc(DType dtype, const Shape& shape,
                                      std::span<const std::byte> data);

// One tensor's name and part.
struct NamedCrc {
  std::string_view name;
  CrcPart part;
};

// crc_num: the CRC-32 of, for every tensor in name order (bytewise order of the UTF-8 names,
// which is Python's order of the strings), its UTF-8 name followed by its part.
uint32_t CrcNum(std::vector<NamedCrc> tensors);

// crc_num as MindSpore writes it (decimal, no sign, no leading zeros).
std::string FormatCrcNum(uint32_t crc);
// The stored crc_num: 1 to 10 decimal digits with a value below 2^32; Corruption naming the file
// for anything else (MindSpore's int() would take more, but nothing else can match a CRC-32).
Result<uint32_t> ParseCrcNum(std::string_view text, std::string_view path);

// The crc_num value a writer plans the header with (10 digits: as wide as any crc_num), and the
// rewrite of a planned header (length prefix + JSON) with the real value in place of it: the JSON
// after it moves up and the header is padded with spaces at the end, so its size is unchanged.
// The placeholder appears once: the JSON text escapes every quote inside a string.
inline constexpr char kCrcNumPlaceholder[] = "0000000000";
Status FillCrcNum(std::string* header, uint32_t crc);  // Internal without the placeholder

}  // namespace savepoint::interop

#endif  // SAVEPOINT_INTEROP_SAFETENSORS_CRC_H_
