// Internal: the manager's index of committed checkpoints (see the file comment of manager.h).
//
// Index files are "savepoint-index-<generation:020>.json" in the checkpoint directory:
//   {"format": "savepoint-manager-index", "version": 1, "generation": G,
//    "checkpoints": [<record>, ...]}          oldest first
// A record is the manager metadata of the checkpoint (RecordMeta) plus "name", "created_ns" and
// "bytes". Writing generation G: write it under the durable commit's temporary name
// (".savepoint-index-<G>.json.savepoint-tmp.<pid>.<hex16>", io/debris.h), sync it, rename it to its
// final name (never replacing anything), sync the directory, then remove older generations and
// leftover temporaries of exactly that form (or ".<index name>.tmp", which older versions wrote).
// Reading takes the highest generation that parses and validates.
#ifndef SAVEPOINT_MANAGER_INDEX_H_
#define SAVEPOINT_MANAGER_INDEX_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "manager/store.h"
#include "savepoint/filesystem.h"
#include "savepoint/manager.h"

namespace savepoint::manager {

struct Index {
  uint64_t generation = 0;  // 0: no index file was found
  std::vector<CheckpointRecord> records;
  std::string version;  // of the index object read (FileSystem::ReadVersioned); "" for none
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

// The index as one object, "savepoint-index.json" in `dir`, for a location in an object store
// that offers compare-and-swap (FileSystem::ReadVersioned): the JSON of an index generation,
// read with one GET (no listing) and replaced only if no other writer changed it meanwhile. The
// remote tier keeps its index this way.
inline constexpr std::string_view kIndexObjectName = "savepoint-index.json";
// NotFound when `dir` has no index object; Unimplemented when `fs` has no compare-and-swap. An
// object that is not a valid index is logged and read as generation 0 without records (a written
// one has generation >= 1), with its version, so that the writer rebuilds it from a listing and
// replaces it.
Result<Index> ReadIndexObject(FileSystem* fs, const std::string& dir);
// Writes `index` as generation index.generation + 1 if the object still has index.version ("":
// if there is none), then updates generation and version. FailedPrecondition when another writer
// changed it.
Status WriteIndexObject(FileSystem* fs, const std::string& dir, Index& index);

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
