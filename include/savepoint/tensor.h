// Shapes, non-owning tensor views and owning, aligned tensors.
//
// All tensors are dense, C-order (row-major), little-endian, as they lie in host memory.
//
// Ownership: TensorView borrows memory; whoever made it keeps that memory alive and unchanged
// while the view is in use. Tensor owns a buffer aligned to kTensorAlignment whose capacity is
// rounded up to a multiple of kTensorAlignment (so direct I/O can fill it without a bounce
// buffer).
//
// Thread safety: const methods may be called concurrently; mutation needs external locking.
#ifndef SAVEPOINT_TENSOR_H_
#define SAVEPOINT_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "savepoint/dtype.h"
#include "savepoint/export.h"
#include "savepoint/status.h"

namespace savepoint {

// Alignment (bytes) of every Tensor buffer and every data extent in a checkpoint file.
inline constexpr size_t kTensorAlignment = 4096;

// Maximum rank of a tensor. Larger ranks are rejected as invalid.
inline constexpr size_t kMaxRank = 64;

// A list of dimension sizes. A 0-d shape ({}) is a scalar with one element.
using Shape = std::vector<int64_t>;

// Number of elements of `shape`, or an error if a dimension is negative, the rank exceeds
// kMaxRank, or the product overflows int64.
SAVEPOINT_API Result<int64_t> NumElements(const Shape& shape);

// NumElements(shape) * DTypeSize(dtype), with overflow checks.
SAVEPOINT_API Result<uint64_t> NumBytes(DType dtype, const Shape& shape);

// "[2, 3]".
SAVEPOINT_API std::string ShapeToString(const Shape& shape);

// A borrowed, dense tensor: pointer + dtype + shape.
class SAVEPOINT_API TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape)
      : data_(static_cast<std::byte*>(data)), dtype_(dtype), shape_(std::move(shape)) {}
  TensorView(const void* data, DType dtype, Shape shape)
      : TensorView(const_cast<void*>(data), dtype, std::move(shape)) {}

  std::byte* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  // Bytes covered; 0 if the shape is invalid (construct through Validate() to catch that).
  uint64_t nbytes() const;
  std::span<std::byte> bytes() const { return {data_, static_cast<size_t>(nbytes())}; }

  // OK when the shape is valid and data is non-null unless the tensor is empty.
  Status Validate() const;

 private:
  std::byte* data_ = nullptr;
  DType dtype_ = DType::kU8;
  Shape shape_;
};

// An owning tensor with a kTensorAlignment-aligned buffer. Move-only.
class SAVEPOINT_API Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage. Fails on an invalid shape or when memory is exhausted.
  static Result<Tensor> Zeros(DType dtype, Shape shape);
  // Allocates storage whose contents are unspecified (cheaper than Zeros when every byte will be
  // overwritten, e.g. by a load).
  static Result<Tensor> Empty(DType dtype, Shape shape);
  // Allocates and copies `src`.
  static Result<Tensor> CopyOf(const TensorView& src);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  std::byte* data() const { return buffer_.get(); }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  uint64_t nbytes() const { return view_.nbytes(); }
  // Allocated bytes: nbytes rounded up to kTensorAlignment (at least kTensorAlignment).
  uint64_t capacity() const { return capacity_; }
  const TensorView& view() const { return view_; }

  // Typed access; T must match the element size (not checked beyond that).
  template <typename T>
  std::span<T> as() const {
    return {reinterpret_cast<T*>(data()), static_cast<size_t>(nbytes() / sizeof(T))};
  }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> buffer_;
  uint64_t capacity_ = 0;
  TensorView view_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_TENSOR_H_
