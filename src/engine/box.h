// Copying a C-order box (a sub-block) into a C-order global tensor.
#ifndef SAVEPOINT_ENGINE_BOX_H_
#define SAVEPOINT_ENGINE_BOX_H_

#include <cstddef>

#include "savepoint/tensor.h"

namespace savepoint::engine {

// Copies `src`, a dense C-order block of shape `sizes`, into the region starting at `offsets` of
// `dst`, a dense C-order tensor of shape `shape`. Preconditions (checked by the manifest
// decoder): equal ranks and offsets[d] + sizes[d] <= shape[d].
void CopyBoxIntoTensor(const std::byte* src, const Shape& offsets, const Shape& sizes,
                       std::byte* dst, const Shape& shape, size_t elem_size);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_BOX_H_
