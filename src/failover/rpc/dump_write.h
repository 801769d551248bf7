// One writer's part of a failure dump: what an agent writes from its live state, and what the
// controller writes from a dead rank's snapshot (docs/FAILOVER.md). Both go through here.
#ifndef SAVEPOINT_FAILOVER_RPC_DUMP_WRITE_H_
#define SAVEPOINT_FAILOVER_RPC_DUMP_WRITE_H_

#include "failover/rpc/failover.pb.h"
#include "failover/rpc/snapshot.h"
#include "savepoint/comm.h"
#include "savepoint/failover_rpc.h"

namespace savepoint::failover {

// Writes the part `d` assigns (its replica groups, writer index, path and step) from `src`, the
// state of `rank` at step `at`, over `comm`, the dump's relayed collectives:
//  - native layouts: this writer's share of one distributed checkpoint (DumpShare, then
//    SaveDistributed with `save`; writer 0 commits it), marked with the dump record
//    ("failover.step", "failover.source_rank", the manager metadata of `at`);
//  - DumpNaming::kMindSporeCkpt (d.mindspore_ckpt()): the .ckpt file of every rank of its groups
//    (SaveMindSporeDump).
// Every writer of the dump calls it and gets the same result; a writer that fails before the
// collectives aborts them, so the others fail at once rather than at their timeout.
Status WriteDumpPart(const rpc::Dump& d, const DumpSource& src, int rank, int world,
                     const StepInfo& at, Communicator& comm, const SaveOptions& save,
                     const IoOptions& io);

// The part `d` assigns from the snapshot of rank d.snapshot_rank() at d.step() in `snapshot_dir`
// (read with its checksums verified), as WriteDumpPart writes a live one. A snapshot that is
// missing or does not verify aborts the dump's collectives: nothing is committed.
Status WriteSnapshotPart(const rpc::Dump& d, const std::string& snapshot_dir, int world,
                         Communicator& comm, const SaveOptions& save, const IoOptions& io);

}  // namespace savepoint::failover

#endif  // SAVEPOINT_FAILOVER_RPC_DUMP_WRITE_H_
