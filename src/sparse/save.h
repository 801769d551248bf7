// Saving sparse tables: a State with tables flattened into an engine WriteRequest (save.cc).
#ifndef SAVEPOINT_SPARSE_SAVE_H_
#define SAVEPOINT_SPARSE_SAVE_H_

#include <vector>

#include "engine/request.h"
#include "savepoint/sparse.h"
#include "sparse/stored.h"

namespace savepoint::sparse {

// What a save of tables hands to the engine. Holds the flattened state and the memory the
// request points into: it must stay alive, and not move, until the write returns.
struct Flat {
  Flat() = default;
  Flat(const Flat&) = delete;  // `request` points into this object
  Flat& operator=(const Flat&) = delete;

  State state;                      // dense tensors, table tensors (views), values, metadata
  ShardLayout layout;               // distributed saves: the boxes of this rank's tensors
  std::vector<SortedTable> sorted;  // keeps sorted copies alive
  std::vector<Tensor> index;        // this rank's row of each table's ranks tensor
  engine::RowGathers gathers;       // slots sorted while they are written (SortedTable)
  Desc desc;
  engine::WriteRequest request;  // for engine::Write or dist::Write
};

// Flattens `in` (whose state holds tables) for one process (in.topology.comm null) or for this
// rank of a distributed save (collective: every rank calls it; it all-gathers row counts and
// schemas). A delta save (o.base) reads its base's description. On success flat->request is the
// request to write. A rank that fails after the all-gather aborts the communicator, so the other
// ranks' writes fail naming it.
Status Flatten(const engine::WriteRequest& in, const SparseSaveOptions& o, Flat* flat);

}  // namespace savepoint::sparse

#endif  // SAVEPOINT_SPARSE_SAVE_H_
