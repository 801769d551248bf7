// Shared-memory snapshots of failure-time checkpoints (docs/FAILOVER.md, "Snapshots").
//
// A rank whose agent was given a snapshot directory (by the controller's Welcome) keeps, after
// every snapshot_every-th step, a copy of its whole state there: `{dir}/rank_{r}/` holds
//   step_{n}_{epoch}_{step_in_epoch}/   a native checkpoint (docs/FORMAT.md), committed by Save's
//                                       atomic rename, whose metadata "failover.snapshot" records
//                                       {rank, world, layout} (the ShardLayout of its tensors).
// The directory is on a memory-backed file system (/dev/shm), so a snapshot costs a memory copy
// and survives the process: when a rank dies, the controller writes its part of a dump from its
// newest snapshot. A snapshot torn by a crash is a hidden temporary, never listed.
//
// Thread safety: the functions are reentrant; one writer per rank directory.
#ifndef SAVEPOINT_FAILOVER_RPC_SNAPSHOT_H_
#define SAVEPOINT_FAILOVER_RPC_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/failover_rpc.h"
#include "savepoint/value.h"

namespace savepoint::failover {

// The step a snapshot (or a dump) is of.
struct StepInfo {
  int64_t step = -1;
  int64_t epoch = 1;
  int64_t step_in_epoch = 0;
};

// Creates `dir` (and missing parents) readable by this user only (mode 0700). OK if it exists.
Status MakePrivateDir(const std::string& dir);

// `{dir}/rank_{rank}`.
std::string SnapshotRankDir(const std::string& dir, int rank);

// The committed snapshots of `rank` under `dir`, oldest first; none when the directory is absent.
// Entries that are not committed snapshot directories (temporaries, strays) are ignored.
std::vector<StepInfo> ListSnapshots(const std::string& dir, int rank, FileSystem* fs);

// Writes one rank's snapshots. Before writing step n it removes the rank's snapshots older than
// its newest, so at most two copies exist: the newest committed one and the one being written. A
// rank that dies while writing n still leaves n - 1 (and the survivors, kept in step, hold n - 1
// too). The removed snapshot's data files are kept as spares (`rank_{r}/.spare/`) and the next
// snapshot's data files reuse them, written in place: tmpfs pages are reused rather than freed,
// faulted in and zeroed again; data files are written through shared mappings (memcpy, in
// parallel), so a snapshot costs about a memory copy.
// Thread safety: one thread at a time.
class SnapshotWriter {
 public:
  // `save`: the snapshots' options (compression...; overwrite, create_parents, stats and progress
  // are set here). `io`: the I/O threads; the snapshots always go through the POSIX file system
  // (io.fs is not used: `dir` is local shared memory), without direct I/O.
  SnapshotWriter(std::string dir, int rank, int world, SaveOptions save, IoOptions io);
  ~SnapshotWriter();
  // Writes the snapshot of `at` from `src` (its tensors are read while this runs: the caller keeps
  // them unchanged). Creates the rank directory when missing, but never `dir` itself (a removed
  // run directory means: no more snapshots).
  Status Write(const DumpSource& src, const StepInfo& at);
  // The committed snapshots after the last successful Write, oldest first (no listing).
  const std::vector<StepInfo>& committed() const { return committed_; }

 private:
  class RecyclingFs;
  std::string dir_, rank_dir_;
  int rank_, world_;
  SaveOptions save_;
  IoOptions io_;
  std::unique_ptr<RecyclingFs> fs_;
  std::vector<StepInfo> committed_;
};

// The record a snapshot keeps in its metadata under "failover.snapshot": the rank that wrote it,
// the job's world size and the ShardLayout of its tensors.
struct SnapshotRecord {
  int rank = 0;
  int world = 1;
  ShardLayout layout;
};
Json SnapshotRecordToJson(const SnapshotRecord& record);
// Decodes a record read from a snapshot (untrusted: another process of the host wrote it):
// Corruption naming `where` and the field unless it is an object with integer rank and world
// (0 <= rank < world <= 2^20) and a layout whose boxes lie inside their global shapes, with
// replicas in [0, world) and integer arrays only. Unknown keys are ignored.
Result<SnapshotRecord> ParseSnapshotRecord(const Json& record, std::string_view where);

// Parses a snapshot directory's name "step_{n}_{epoch}_{step_in_epoch}" (non-negative decimals
// without sign or leading zeros, as the writer prints them); false for any other name.
bool ParseSnapshotName(std::string_view name, StepInfo* at);

// Reads `rank`'s committed snapshot of `step` (checksums verified; through the POSIX file system,
// with io's threads) as the DumpSource it was
// written from, with its StepInfo. NotFound when there is none; Corruption when it does not verify
// or its record is malformed.
Result<DumpSource> ReadSnapshot(const std::string& dir, int rank, int64_t step, StepInfo* at,
                                const IoOptions& io);

}  // namespace savepoint::failover

#endif  // SAVEPOINT_FAILOVER_RPC_SNAPSHOT_H_
