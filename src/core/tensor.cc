#include "savepoint/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace savepoint {

Result<int64_t> NumElements(const Shape& shape) {
  if (shape.size() > kMaxRank) {
    return InvalidArgumentError(
        fmt::format("rank {} exceeds the maximum {}", shape.size(), kMaxRank));
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return InvalidArgumentError(
          fmt::format("negative dimension in shape {}", ShapeToString(shape)));
    if (__builtin_mul_overflow(n, d, &n)) {
      return InvalidArgumentError(
          fmt::format("shape {} overflows int64 elements", ShapeToString(shape)));
    }
  }
  return n;
}

Result<uint64_t> NumBytes(DType dtype, const Shape& shape) {
  SP_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(DTypeSize(dtype)), &bytes)) {
    return InvalidArgumentError(fmt::format("shape {} of {} overflows int64 bytes",
                                            ShapeToString(shape), DTypeName(dtype)));
  }
  return static_cast<uint64_t>(bytes);
}

std::string ShapeToString(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

uint64_t TensorView::nbytes() const {
  Result<uint64_t> n = NumBytes(dtype_, shape_);
  return n.ok() ? *n : 0;
}

Status TensorView::Validate() const {
  SP_ASSIGN_OR_RETURN(uint64_t n, NumBytes(dtype_, shape_));
  if (n > 0 && data_ == nullptr) return InvalidArgumentError("tensor view with null data");
  return Status::OK();
}

void Tensor::Free::operator()(std::byte* p) const { std::free(p); }

Result<Tensor> Tensor::Empty(DType dtype, Shape shape) {
  SP_ASSIGN_OR_RETURN(uint64_t n, NumBytes(dtype, shape));
  uint64_t cap = (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (cap == 0) cap = kTensorAlignment;
  // No machine addresses more than 2^48 bytes of user memory: refuse before asking the allocator
  // (which may abort instead of failing, e.g. under AddressSanitizer).
  constexpr uint64_t kMaxAllocation = uint64_t{1} << 48;
  if (cap < n || cap > kMaxAllocation) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {} bytes for a {} tensor of shape {}: over the {}-byte limit",
                    n, DTypeName(dtype), ShapeToString(shape), kMaxAllocation));
  }
  void* p = std::aligned_alloc(kTensorAlignment, cap);
  if (p == nullptr) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {} bytes for a {} tensor of shape {}", cap, DTypeName(dtype),
                    ShapeToString(shape)));
  }
  Tensor t;
  t.buffer_.reset(static_cast<std::byte*>(p));
  t.capacity_ = cap;
  t.view_ = TensorView(p, dtype, std::move(shape));
  return t;
}

Result<Tensor> Tensor::Zeros(DType dtype, Shape shape) {
  SP_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, std::move(shape)));
  std::memset(t.data(), 0, t.capacity());
  return t;
}

Result<Tensor> Tensor::CopyOf(const TensorView& src) {
  SP_RETURN_IF_ERROR(src.Validate());
  SP_ASSIGN_OR_RETURN(Tensor t, Empty(src.dtype(), src.shape()));
  if (src.nbytes() > 0) std::memcpy(t.data(), src.data(), src.nbytes());
  return t;
}

}  // namespace savepoint
