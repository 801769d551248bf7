// Failure-time checkpoints: the rules that decide whether, from which step and from which ranks a
// job whose rank died may dump its state (docs/FAILOVER.md).
//
// Every rank reports a step state: the last step whose update it finished, and whether it is in
// the middle of the next update (between BeginUpdate and EndUpdate, the optimizer is changing the
// state, so it matches no step). The ranks' state is split into replica groups: the ranks holding
// identical copies of one part of the state (data-parallel replicas; ShardSpec::replicas). A dump
// writes every group's part from one healthy member that is not mid-update, all at one step n:
// the newest step that every group can provide. When some group cannot, nothing is written (a
// torn state is worse than none) and the reason names the group.
//
// This header is the pure part, in libsavepoint: no threads, and no I/O except SaveMindSporeDump
// (the .ckpt layout's files, over a Communicator). The controller and the agents that carry the
// reports over gRPC are in savepoint/failover_rpc.h (library savepoint_failover).
//
// Thread safety: the functions are pure and reentrant.
#ifndef SAVEPOINT_FAILOVER_H_
#define SAVEPOINT_FAILOVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "savepoint/comm.h"
#include "savepoint/distributed.h"
#include "savepoint/export.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint {

// A replica group: the ranks holding identical copies of one part of the state, sorted, unique.
using ReplicaGroup = std::vector<int>;

// What one rank last reported.
struct SAVEPOINT_API RankReport {
  int rank = 0;
  // False once the rank was declared dead (exited, killed, stopped heartbeating).
  bool healthy = true;
  // The last step whose update the rank finished (EndUpdate); -1 before the first. Default: -1.
  int64_t step = -1;
  // Between BeginUpdate and EndUpdate: the state matches no step. Default: false.
  bool updating = false;
  // Steps of this rank's committed shared-memory snapshots that the dump can read (dead ranks
  // included: a snapshot outlives its process; docs/FAILOVER.md, "Snapshots"). Default: empty.
  std::vector<int64_t> snapshots = {};
};

// Which ranks write a dump, and of which step.
struct SAVEPOINT_API DumpPlan {
  int64_t step = -1;
  // Per group (in the order of the `groups` argument), the member whose state is written.
  std::vector<int> source_of_group;
  // Per group (as source_of_group): its part comes from the source's snapshot of `step` (the
  // source is dead, or its live state is past `step`) rather than from the live rank.
  std::vector<bool> from_snapshot;
  // The distinct live sources, sorted: they write their parts themselves (writer i is rank
  // dumpers[i]).
  std::vector<int> dumpers;
  // The distinct snapshot sources, sorted: their snapshots of `step` are written by the process
  // that can read them (the controller), as writers dumpers.size() + i.
  std::vector<int> snapshot_dumpers;
};

// Chooses the dump: the newest step n such that every group has a member that can provide n: a
// healthy one at n that is not mid-update, or one (dead or alive) with a snapshot of n. For each
// group it takes a live member when there is one (preferring a rank already chosen for another
// group, then the lowest rank), else the lowest member with a snapshot of n. `reports` holds one
// entry per rank of the job (ranks 0..world-1, any order); a rank without a group is a group of its
// own. Errors:
//  - InvalidArgument: a report or group names a rank outside [0, world), or a rank is reported
//    twice, or a group is empty;
//  - FailedPrecondition, saying why no dump is allowed: a group none of whose members is healthy
//    or has a snapshot ("state incomplete"), a group whose members are all mid-update or have
//    finished no step, or no step common to all groups (each group's steps listed).
SAVEPOINT_API Result<DumpPlan> DecideDump(const std::vector<RankReport>& reports,
                                          const std::vector<ReplicaGroup>& groups);

// The replica groups of `rank`'s state in a job of `world` ranks: for each tensor of `local`, its
// ShardSpec's replicas (empty: {rank}); a tensor without an entry in `layout` is replicated on
// every rank; sparse tables (State::PutTable) hold the rank's own rows, in the group {rank}.
// Sorted, unique. InvalidArgument when a replica list names a rank outside
// [0, world) or omits `rank`.
SAVEPOINT_API Result<std::vector<ReplicaGroup>> ReplicaGroupsOf(const State& local,
                                                                const ShardLayout& layout, int rank,
                                                                int world);

// Groups of a pure data-parallel job: one group of every rank.
SAVEPOINT_API std::vector<ReplicaGroup> DataParallelGroups(int world);

// The name of a failure dump inside a CheckpointManager directory:
// "{prefix}-{epoch}_{step_in_epoch}_failover". CheckpointManager indexes it as an ordinary
// checkpoint (from its "savepoint.manager" metadata), so restore() picks it when it is the newest.
SAVEPOINT_API std::string FailureDumpName(const std::string& prefix, int64_t epoch,
                                          int64_t step_in_epoch);

// The MindSpore-style directory of seed 004: "tft_saved_checkpoints-step_{step}".
SAVEPOINT_API std::string MindSporeDumpName(int64_t step);

// The file of `rank` inside a MindSpore-layout dump directory (seed 004):
// "rank_{rank}/ttp_rank_{rank}-{epoch}_{step_in_epoch}.ckpt".
SAVEPOINT_API std::string MindSporeRankCheckpointPath(int rank, int64_t epoch,
                                                      int64_t step_in_epoch);

// OK when every rank of a job of `world` ranks lies in exactly one of `groups` (pure data
// parallel, or groups that partition the ranks), which the MindSpore .ckpt layout needs: there,
// rank r's file holds r's whole state, written by one member of r's group. FailedPrecondition
// naming the first rank whose state spans several groups (or none), telling to use the native
// layout.
SAVEPOINT_API Status CheckMindSporeDumpGroups(const std::vector<ReplicaGroup>& groups, int world);

// Writes a MindSpore-layout dump, all or nothing, from the dump's writers (`comm`; every writer
// calls it): writer 0 begins the durable commit of the directory `dir` (a hidden temporary
// sibling; AlreadyExists if `dir` exists) and broadcasts the temporary; each writer writes
// `state` (its whole state at the dumped step) as a MindSpore .ckpt with the CRC trailer
// (SaveMindSporeCheckpoint, durably) at MindSporeRankCheckpointPath(r, epoch, step_in_epoch) for
// every r of `ranks` (the ranks whose state it holds); writer 0 gathers the writers' statuses and
// renames the temporary to `dir` only when all succeeded (else removes it), then broadcasts the
// result, which every writer returns. A writer that fails or dies breaks the collectives: nothing
// appears at `dir`. Each collective waits at most `timeout`.
SAVEPOINT_API Status SaveMindSporeDump(Communicator& comm, const State& state,
                                       const std::vector<int>& ranks, const std::string& dir,
                                       int64_t epoch, int64_t step_in_epoch, Timeout timeout,
                                       const IoOptions& io = {});

// Reduces a rank's state to what it writes in a dump: the tensors whose replica group (as in
// ReplicaGroupsOf) is one of `assigned`, each as a box written by `writer` alone (its replicas
// become {writer}, the writer's index in the dump's communicator), and its sparse tables when
// {rank} is assigned (their deleted ids left out: a dump is a full save). Values are kept;
// tensors and tables are borrowed from `local`, which must outlive the result. `dump_layout`
// receives the layout.
SAVEPOINT_API Result<State> DumpShare(const State& local, const ShardLayout& layout, int rank,
                                      int world, const std::vector<ReplicaGroup>& assigned,
                                      int writer, ShardLayout* dump_layout);

}  // namespace savepoint

#endif  // SAVEPOINT_FAILOVER_H_
