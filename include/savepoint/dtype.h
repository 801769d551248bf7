// Element types of tensors.
//
// The numeric values of DType are an in-memory convenience only; on disk a dtype is always
// written by its stable name (DTypeName), which matches safetensors' dtype code where one exists.
// Never rename an on-disk name: old checkpoints would stop loading.
#ifndef SAVEPOINT_DTYPE_H_
#define SAVEPOINT_DTYPE_H_

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "savepoint/export.h"

namespace savepoint {

enum class DType : unsigned char {
  kBool,    // "BOOL": one byte, 0 or 1
  kU8,      // "U8"
  kI8,      // "I8"
  kU16,     // "U16"
  kI16,     // "I16"
  kU32,     // "U32"
  kI32,     // "I32"
  kU64,     // "U64"
  kI64,     // "I64"
  kF16,     // "F16": IEEE binary16
  kBF16,    // "BF16": bfloat16
  kF32,     // "F32"
  kF64,     // "F64"
  kF8E4M3,  // "F8_E4M3": float8 e4m3fn (no infinities)
  kF8E5M2,  // "F8_E5M2"
  kC64,     // "C64": complex of two F32
  kC128,    // "C128": complex of two F64 (savepoint name; safetensors has no code)
};

// Every dtype, in enum order.
SAVEPOINT_API std::span<const DType> AllDTypes();

// Bytes per element (1, 2, 4, 8 or 16).
SAVEPOINT_API size_t DTypeSize(DType dtype);

// Stable on-disk name, e.g. "BF16".
SAVEPOINT_API std::string_view DTypeName(DType dtype);

// Inverse of DTypeName; nullopt for an unknown name. Case-sensitive.
SAVEPOINT_API std::optional<DType> DTypeFromName(std::string_view name);

}  // namespace savepoint

#endif  // SAVEPOINT_DTYPE_H_
