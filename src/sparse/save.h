// Saving sparse tables: a State with tables flattened into an engine WriteRequest (save.cc).
#ifndef SAVEPOINT_SPARSE_SAVE_H_
#define SAVEPOINT_SPARSE_SAVE_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "savepoint/sparse.h"
#include "sparse/stage.h"
#include "sparse/stored.h"

namespace savepoint::sparse {

// What a save of tables hands to the engine. Holds the flattened state and the memory the
// request points into: it must stay alive, and not move, until the write returns.
struct Flat {
  Flat() = default;
  Flat(const Flat&) = delete;  // `request` points into this object
  Flat& operator=(const Flat&) = delete;
  ~Flat();  // gives `leased` back to `buffers`

  // Set before Flatten by asynchronous saves (api/async.cc): large hash-ordered tables are then
  // staged (sparse/stage.h) into buffers from here, and sorted by request.late's prepare.
  std::shared_ptr<CopyBuffers> buffers;
  std::vector<Tensor> leased;  // the staged copies, from `buffers`
  std::vector<Staged> staged;  // their sorts (request.late)
  engine::LateTensors late;    // the staged tables' tensors and their sorts

  State state;                      // dense tensors, table tensors (views), values, metadata
  ShardLayout layout;               // distributed saves: the boxes of this rank's tensors
  std::vector<SortedTable> sorted;  // keeps sorted copies alive
  std::vector<Tensor> index;        // this rank's row of each table's ranks tensor
  engine::RowGathers gathers;       // slots sorted while they are written (SortedTable)
  Desc desc;
  engine::WriteRequest request;  // for engine::Write or dist::Write
};

// The entries of one table in a save, per kind (Part): where this rank's start in the global
// tensors, how many it has, and the global lengths.
enum Part : int { kRows, kDeleted, kSlices, kDeletedSlices, kParts };
struct Placement {
  int64_t offset[kParts] = {};
  int64_t count[kParts] = {};
  int64_t total[kParts] = {};
};

// Which saving rank of how many this is.
struct Rank {
  int index = 0;
  int size = 1;
};

// One table of a full save's part whose rows are already in storage order (compaction).
struct PartTable {
  std::string name;
  std::vector<std::string> slots;  // slot names, as sorted.slots
  SortedTable sorted;
  Placement place;
};

// Fills `flat` as saving rank `rank` of a full save that is written one part at a time
// (compact.cc): `dense`'s tensors (views, each written whole by this rank), values and metadata,
// and `tables` (name order; every part holds the same tables). Sets flat->state and flat->layout,
// not flat->request.
Status FlattenPart(const State& dense, std::vector<PartTable> tables, Rank rank, Flat* flat);

// Flattens `in` (whose state holds tables) for one process (in.topology.comm null) or for this
// rank of a distributed save (collective: every rank calls it; it all-gathers row counts and
// schemas). A delta save (o.base) reads its base's description. On success flat->request is the
// request to write. A rank that fails after the all-gather aborts the communicator, so the other
// ranks' writes fail naming it.
Status Flatten(const engine::WriteRequest& in, const SparseSaveOptions& o, Flat* flat);

}  // namespace savepoint::sparse

#endif  // SAVEPOINT_SPARSE_SAVE_H_
