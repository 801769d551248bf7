// Box copies and byte runs of boxes in C-order arrays.
//
// Both walk the box as "runs": the innermost dimensions that the box covers whole (in every array
// involved) merge with the first partial one into one contiguous run; the outer dimensions are
// iterated with an odometer.
#include "engine/box.h"

#include <cstring>
#include <vector>

namespace savepoint::engine {
namespace {

// Element strides of a C-order array.
std::vector<uint64_t> Strides(const Shape& shape) {
  std::vector<uint64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// The first dimension of the contiguous run: dims after it are whole in every `shapes` entry.
size_t RunDim(const Shape& sizes, const std::vector<const Shape*>& shapes) {
  size_t j = sizes.size() - 1;
  while (j > 0) {
    bool whole = true;
    for (const Shape* s : shapes) whole = whole && (*s)[j] == sizes[j];
    if (!whole) break;
    --j;
  }
  return j;
}

// Calls f(src_element_offset, dst_element_offset) for the start of every run, in order.
template <typename F>
void ForEachRun(const Shape& sizes, size_t j, const Shape& a_shape, const Shape& a_off,
                const Shape& b_shape, const Shape& b_off, F&& f) {
  std::vector<uint64_t> as = Strides(a_shape), bs = Strides(b_shape);
  std::vector<int64_t> idx(j, 0);
  while (true) {
    uint64_t a = 0, b = 0;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t i = d < j ? idx[d] : 0;
      a += (a_off[d] + i) * as[d];
      b += (b_off[d] + i) * bs[d];
    }
    f(a, b);
    size_t d = j;
    while (d > 0 && ++idx[d - 1] == sizes[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace

void CopyRegion(const RegionSide& src, const RegionSide& dst, const Shape& sizes, size_t elem) {
  for (int64_t n : sizes) {
    if (n == 0) return;
  }
  if (sizes.empty()) {
    std::memcpy(dst.data - dst.base, src.data - src.base, elem);
    return;
  }
  size_t j = RunDim(sizes, {&src.shape, &dst.shape});
  uint64_t run = elem;
  for (size_t d = j; d < sizes.size(); ++d) run *= sizes[d];
  ForEachRun(sizes, j, src.shape, src.offsets, dst.shape, dst.offsets, [&](uint64_t a, uint64_t b) {
    std::memcpy(dst.data + (b * elem - dst.base), src.data + (a * elem - src.base), run);
  });
}

std::vector<std::pair<uint64_t, uint64_t>> BoxByteRuns(const Shape& shape, const Shape& offsets,
                                                       const Shape& sizes, size_t elem,
                                                       size_t max_runs) {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (int64_t n : sizes) {
    if (n == 0) return runs;
  }
  if (sizes.empty()) return {{0, elem}};
  size_t j = RunDim(sizes, {&shape});
  uint64_t run = elem, count = 1;
  for (size_t d = j; d < sizes.size(); ++d) run *= sizes[d];
  for (size_t d = 0; d < j; ++d) count *= sizes[d];
  if (count > max_runs) {  // first and last run only
    uint64_t first = 0, last = 0;
    std::vector<uint64_t> st = Strides(shape);
    for (size_t d = 0; d < sizes.size(); ++d) {
      first += offsets[d] * st[d];
      last += (offsets[d] + (d < j ? sizes[d] - 1 : 0)) * st[d];
    }
    return {{first * elem, last * elem + run}};
  }
  ForEachRun(sizes, j, shape, offsets, shape, offsets, [&](uint64_t a, uint64_t) {
    uint64_t b = a * elem;
    if (!runs.empty() && runs.back().second == b) {
      runs.back().second = b + run;
    } else {
      runs.emplace_back(b, b + run);
    }
  });
  return runs;
}

}  // namespace savepoint::engine
