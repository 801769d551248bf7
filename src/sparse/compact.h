// The streaming compaction of a delta chain (compact.cc), behind CompactSparse (src/api).
#ifndef SAVEPOINT_SPARSE_COMPACT_H_
#define SAVEPOINT_SPARSE_COMPACT_H_

#include <cstdint>
#include <string>

#include "savepoint/sparse.h"

namespace savepoint::sparse {

// The most parts a compaction is cut into (each is a data file and a shard of every table tensor
// in the manifest); beyond 4096 x batch_bytes the parts grow instead.
inline constexpr int kMaxCompactionParts = 4096;

// CompactSparse of an uncompressed destination (`o` without compression, o.base empty): the
// chain ending at `src` written to `dst` in parts of about `batch_bytes` (0: one part).
Status CompactInParts(const std::string& src, const std::string& dst, const SparseSaveOptions& o,
                      const LoadOptions& load, const IoOptions& io, uint64_t batch_bytes);

}  // namespace savepoint::sparse

#endif  // SAVEPOINT_SPARSE_COMPACT_H_
