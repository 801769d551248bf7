// Snapshot: phase 1 of an asynchronous save. Copies every chunk of a planned save into staging
// slabs laid out as the data file will be, computing each chunk's CRC32C in the same pass over
// memory: by default Crc32cCopy (each 256 KiB slice checksummed, then streamed to the slab from
// cache); with a custom copier, each slice is copied and then checksummed on the staged bytes.
//
// Layout: slab k covers file bytes [4096 + k * S, 4096 + (k + 1) * S). One walker (the caller's
// thread) goes through the chunks in file order, acquires slabs, zero-fills alignment padding and
// hands each chunk's copy to a crew of `threads` copiers (the walker included: it copies too when
// it is ahead). A slab goes to the sink once the walker has moved past it and every copy into it
// has finished, so slabs may reach the sink out of file order. Compressed saves stage each
// compressed chunk in a slab of its own instead, handed to the sink with the raw bytes' CRC (their
// uncompressed chunks, the packed small tensors, come first and are laid out in slabs as above).
// Encrypted saves (ChunkTask::seal) encrypt each uncompressed chunk into its slab(s) instead of
// copying it, one GCM message across the slabs it straddles, and checksum the ciphertext.
//
// Memory stays within the pool: the walker blocks in StagingPool::Acquire while every slab is
// staged or being written (first calling SnapshotSink::StartPersist, so held-back writers drain),
// and the copiers keep finishing the slabs already acquired.
//
// Thread safety: one Snapshot runs at a time per sink; the sink and copier must be thread-safe
// when threads > 1.
#ifndef SAVEPOINT_ENGINE_SNAPSHOT_H_
#define SAVEPOINT_ENGINE_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/staging_pool.h"
#include "engine/writer.h"
#include "savepoint/async.h"
#include "savepoint/status.h"

namespace savepoint::engine {

// A staged piece of the data file at `offset` (raw layout), or one whole chunk `task` (compressed
// saves; `crc` is the CRC32C of its raw bytes).
struct StagedSlab {
  std::byte* data = nullptr;
  uint64_t offset = 0;
  uint64_t len = 0;
  const ChunkTask* task = nullptr;
  uint32_t crc = 0;
};

// Where the snapshot sends its slabs, and how it learns that the save has failed.
class SnapshotSink {
 public:
  virtual ~SnapshotSink() = default;
  // Takes a filled slab (the sink returns it to the pool when written).
  virtual void Push(const StagedSlab& slab) = 0;
  // Records the first error of the save.
  virtual void Fail(Status s) = 0;
  // True once the save has failed (the snapshot then stops early).
  virtual bool failed() const = 0;
  // Called when the pool has run out of slabs, before the snapshot waits for one: the sink must
  // start writing (and so releasing) the slabs it holds if it has been holding them back.
  virtual void StartPersist() = 0;
};

struct SnapshotPlan {
  const std::vector<ChunkTask>* tasks = nullptr;
  uint64_t data_file_bytes = 0;  // end of the planned layout (of the last slab), a multiple of 4096
  StagingPool* pool = nullptr;
  SnapshotCopier* copier = nullptr;  // nullptr: Crc32cCopy
  int threads = 1;                   // copiers, the caller's thread included (>= 1)
};

// Stages every task of `plan` (writing each task's *crc) and returns once the caller's tensors
// are no longer read. Errors (a failed copy, no memory for a slab) go to `sink` (the first one
// fails the save).
void RunSnapshot(const SnapshotPlan& plan, SnapshotSink* sink);

// The default number of snapshot threads: the hardware threads, at most 4; at most 8 with a
// custom copier (a device copier's threads wait for DMA between their checksums).
int DefaultSnapshotThreads(const SnapshotCopier* copier);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_SNAPSHOT_H_
