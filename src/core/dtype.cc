#include "savepoint/dtype.h"

#include <array>

namespace savepoint {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // on-disk name: never change
  size_t size;
};

// Indexed by the enum value.
constexpr std::array<DTypeInfo, 17> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},
    {DType::kI16, "I16", 2},
    {DType::kU32, "U32", 4},
    {DType::kI32, "I32", 4},
    {DType::kU64, "U64", 8},
    {DType::kI64, "I64", 8},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kC64, "C64", 8},
    {DType::kC128, "C128", 16},
}};

constexpr std::array<DType, kDTypes.size()> MakeAll() {
  std::array<DType, kDTypes.size()> all{};
  for (size_t i = 0; i < kDTypes.size(); ++i) all[i] = kDTypes[i].dtype;
  return all;
}
constexpr std::array<DType, kDTypes.size()> kAll = MakeAll();

const DTypeInfo& Info(DType d) { return kDTypes[static_cast<size_t>(d)]; }

}  // namespace

std::span<const DType> AllDTypes() { return kAll; }
size_t DTypeSize(DType dtype) { return Info(dtype).size; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace savepoint
