// Internal: the manager's index of committed checkpoints (see the file comment of manager.h).
//
// Index files are "savepoint-index-<generation:020>.json" in the checkpoint directory:
//   {"format": "savepoint-manager-index", "version": 1, "generation": G,
//    "checkpoints": [<record>, ...]}          oldest first
// A record is the manager metadata of the checkpoint (RecordMeta) plus "name", "created_ns" and
// "bytes". Writing generation G: write ".savepoint-index-<G>.json.tmp", sync it, rename it to its
// final name (never replacing anything), sync the directory, then remove older generations and
// leftover temporaries. Reading takes the highest generation that parses and validates.
#ifndef SAVEPOINT_MANAGER_INDEX_H_
#define SAVEPOINT_MANAGER_INDEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "manager/store.h"
#include "savepoint/filesystem.h"
#include "savepoint/manager.h"

namespace savepoint::manager {

struct Index {
  uint64_t generation = 0;  // 0: no index file was found
  std::vector<CheckpointRecord> records;
};

// The manager metadata stored in a checkpoint (step, epoch, step_in_epoch, metrics, flags).
Json RecordMeta(const CheckpointRecord& record);
// Fills step, epoch, step_in_epoch, metrics and flags from RecordMeta output. InvalidArgument
// when a field has the wrong type.
Status ApplyRecordMeta(const Json& meta, CheckpointRecord* record);

// Reads the newest valid index generation in `dir` (generation 0 and no records if none).
Result<Index> ReadIndex(FileSystem* fs, const std::string& dir);
// Writes `index` as generation index.generation + 1 (updating it) and removes older ones.
Status WriteIndex(FileSystem* fs, const std::string& dir, Index& index);

// A record for the committed checkpoint at directory entry `entry` of `dir`, from the manager
// metadata it carries; else from an int value "step" (a native checkpoint saved without a
// manager: epoch 1); else from its name "{prefix}-{epoch}_{step}" (a file MindSpore wrote: the
// step is (epoch - 1) * steps_per_epoch + step when steps_per_epoch > 0, else the name's step).
// NotFound/Corruption if it is not a committed checkpoint; FailedPrecondition if it has no step.
Result<CheckpointRecord> RecordFromCheckpoint(Store& store, const std::string& dir,
                                              const std::string& entry, int64_t steps_per_epoch);

// Makes `records` agree with the directory: drops records whose checkpoint is gone, adds
// committed checkpoints of the store's format that have a step but no record, ignores debris and
// other files, and sorts by creation time. Returns whether anything changed.
Result<bool> Reconcile(Store& store, FileSystem* fs, const std::string& dir,
                       std::vector<CheckpointRecord>& records, int64_t steps_per_epoch);

// Orders records oldest first (creation time, then step, then name).
void SortRecords(std::vector<CheckpointRecord>& records);

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_INDEX_H_
