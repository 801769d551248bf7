#include "engine/box.h"

#include <cstring>
#include <vector>

namespace savepoint::engine {

void CopyBoxIntoTensor(const std::byte* src, const Shape& offsets, const Shape& sizes,
                       std::byte* dst, const Shape& shape, size_t elem_size) {
  size_t rank = shape.size();
  for (int64_t s : sizes) {
    if (s == 0) return;
  }
  if (rank == 0) {
    std::memcpy(dst, src, elem_size);
    return;
  }
  // Row strides (in bytes) of the destination; the innermost dimension is contiguous.
  std::vector<uint64_t> stride(rank);
  stride[rank - 1] = elem_size;
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  uint64_t row = sizes[rank - 1] * elem_size;
  std::vector<int64_t> idx(rank, 0);  // index of the current row within the box (last dim unused)
  for (;;) {
    uint64_t off = 0;
    for (size_t d = 0; d < rank; ++d) off += (offsets[d] + (d + 1 < rank ? idx[d] : 0)) * stride[d];
    std::memcpy(dst + off, src, row);
    src += row;
    size_t d = rank - 1;
    while (d > 0 && ++idx[d - 1] == sizes[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace savepoint::engine
