// Copying a box (a sub-block) between C-order arrays, and the byte runs a box covers: how a
// stored shard lands in a whole tensor (Load) and how target slices are assembled from stored
// shards (LoadDistributed).
#ifndef SAVEPOINT_ENGINE_BOX_H_
#define SAVEPOINT_ENGINE_BOX_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "savepoint/tensor.h"

namespace savepoint::engine {

// One side of a copy: a C-order array of shape `shape` whose byte `base` lies at `data` (so a
// buffer may hold just a byte range of the array), and the box's first element `offsets` in it.
struct RegionSide {
  std::byte* data;
  const Shape& shape;
  const Shape& offsets;
  uint64_t base = 0;
};

// Copies the box of shape `sizes` from `src` to `dst` (elements of `elem` bytes). Preconditions:
// equal ranks, boxes within their shapes, and every touched source byte within the buffer.
void CopyRegion(const RegionSide& src, const RegionSide& dst, const Shape& sizes, size_t elem);

// Byte ranges [begin, end) of the box (offsets, sizes) inside a C-order array of `shape`, in
// increasing order, merged where adjacent. At most `max_runs` ranges: beyond that, the single
// range from the first to the last byte is returned.
std::vector<std::pair<uint64_t, uint64_t>> BoxByteRuns(const Shape& shape, const Shape& offsets,
                                                       const Shape& sizes, size_t elem,
                                                       size_t max_runs);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_BOX_H_
