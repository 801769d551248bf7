// Reading sparse tables from a delta chain (load.cc): one table's rows of a slice range with the
// chain applied. Used by LoadSparse, the batched load (LoadSparseBatches) and the streaming
// compaction (compact.cc), which read a table one slice range at a time.
#ifndef SAVEPOINT_SPARSE_LOAD_H_
#define SAVEPOINT_SPARSE_LOAD_H_

#include <string>
#include <vector>

#include "sparse/chain.h"

namespace savepoint::sparse {

// One table's rows in storage order (owned).
struct Rows {
  Tensor ids;
  std::vector<Tensor> slots;  // the selected slots, in the base's order
};

// InvalidArgument unless `o` is valid for a sparse load (LoadOptions fields left at their
// defaults, the shard).
Status CheckLoadOptions(const SparseLoadOptions& o);

// The chain's schema (its full checkpoint's) after checking every delta against it (Corruption
// naming the link otherwise).
Result<Schema> ChainSchema(const std::vector<Link>& chain);

// Table `name` with slots `slots` (names; none: the ids only) for the slices of `range`, the chain
// (newest first, as OpenChain gives it) applied: reads only the chunks that hold those rows.
Result<Rows> LoadTable(std::vector<Link>& chain, const std::string& name,
                       const std::vector<std::string>& slots, SliceRange range,
                       const LoadOptions& load, const IoOptions& io);

// An upper bound of the bytes LoadTable holds for table `name` over every slice (its ids and
// `slots` in every link of the chain), from the manifests alone.
uint64_t ChainTableBytes(const std::vector<Link>& chain, const std::string& name,
                         const std::vector<std::string>& slots);

// The dense tensors (whole), values and metadata of the chain's newest checkpoint into `into`.
Status LoadDense(engine::Reader& r, const LoadOptions& load, State& into);
// The values and metadata alone (the tables' description left out).
Status CopyUserValues(const engine::Reader& r, State& into);

}  // namespace savepoint::sparse

#endif  // SAVEPOINT_SPARSE_LOAD_H_
