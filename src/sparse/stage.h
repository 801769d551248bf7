// Staging for asynchronous saves of hash-ordered tables (docs/SPARSE.md, "Asynchronous saves").
//
// Sorting a table into storage order takes longer than copying it (a counting sort whose scatter
// misses the cache, then a gather that reads rows at random), so an asynchronous save does not
// make its caller wait for either: StageTable copies the ids and slots as they lie, in pieces on
// several threads, counting the rows per slice in the same pass (the slice index needs nothing
// else), and the save's late step (engine::LateTensors) sorts the copied ids in the background
// (SortStaged). The writer then gathers the copied slots into storage order chunk by chunk, as a
// synchronous save gathers the caller's.
//
// The copies go into buffers that a Checkpointer keeps from one save to the next (CopyBuffers), so
// that a training loop's saves copy into memory already faulted in, as its staging slabs are.
#ifndef SAVEPOINT_SPARSE_STAGE_H_
#define SAVEPOINT_SPARSE_STAGE_H_

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "savepoint/sparse.h"
#include "sparse/stored.h"

namespace savepoint::sparse {

// Tables whose ids take at least this many bytes are staged (when not already in storage order);
// smaller ones are sorted while the caller waits (their sort costs little).
inline constexpr uint64_t kStageIdsBytes = kGatherSlotBytes;

// Buffers for staged copies, reused across saves. New buffers get kHeadroom more than asked
// (a table that grew a little between saves reuses its buffers). The free ones are kept up to
// twice the most that one save has staged (so a full save's buffers survive the deltas between
// full saves), the oldest freed first beyond that. Thread-safe.
class CopyBuffers {
 public:
  // New buffers are this much larger than asked (1/8).
  static constexpr uint64_t kHeadroomShift = 3;
  // A buffer of at least `bytes` bytes (U8): the smallest free one of at most twice that size,
  // else a new one with headroom.
  Result<Tensor> Take(uint64_t bytes);
  // Returns buffers taken earlier (when the save that used them has ended).
  void Give(std::vector<Tensor> buffers);
  // Called after a save staged `staged` bytes: frees the oldest free buffers while the free bytes
  // exceed twice the largest such amount seen.
  void Trim(uint64_t staged);
  // Bytes of the free buffers.
  uint64_t free_bytes() const;

 private:
  mutable std::mutex mu_;
  std::vector<Tensor> free_;  // guarded by mu_; oldest first
  uint64_t most_staged_ = 0;  // guarded by mu_
};

// A staged table's work for the late step: sort `ids` (the copy) into `sorted` and `perm`.
struct Staged {
  std::span<const int64_t> ids;
  std::span<int64_t> sorted;
  std::span<int64_t> perm;
  SliceRange range;
};

// True when `t` is large enough to be staged by an asynchronous save (kStageIdsBytes, and every
// slot big enough not to be packed); it is staged when its ids are also not InStorageOrder.
bool Stageable(const SparseTable& t);

// Copies `t`'s ids and slots as they lie into buffers from `buffers` (appended to `leased`) on
// `threads` threads and builds its slice index; sorts its deleted ids (few) at once. Returns the
// table as SortedTable::late describes it, and in `staged` the sort the late step must run.
// InvalidArgument naming the id when an id lies outside `range`.
Result<SortedTable> StageTable(const SparseTable& t, SliceRange range, int threads,
                               CopyBuffers* buffers, std::vector<Tensor>* leased, Staged* staged);

// The late step of one staged table.
Status SortStaged(const Staged& s);

}  // namespace savepoint::sparse

#endif  // SAVEPOINT_SPARSE_STAGE_H_
