// One writer's part of a failure dump (dump_write.h).
#include "failover/rpc/dump_write.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "failover/rpc/common.h"
#include "savepoint/sparse.h"

namespace savepoint::failover {
namespace {

// Marks a dump's state so that CheckpointManager indexes it and a user sees where it came from.
Status AddDumpRecord(State* share, int64_t step, int64_t epoch, int64_t step_in_epoch, int rank) {
  SP_RETURN_IF_ERROR(share->PutValue("failover.step", step));
  SP_RETURN_IF_ERROR(share->PutValue("failover.source_rank", int64_t{rank}));
  Json& meta = share->metadata();
  if (!meta.is_object()) meta = Json::object();
  meta["savepoint.manager"] = {{"step", step},
                               {"epoch", epoch},
                               {"step_in_epoch", step_in_epoch},
                               {"metrics", Json::object()},
                               {"breakpoint", false},
                               {"epoch_end", false},
                               {"failover", true}};
  meta["step"] = step;
  return Status::OK();
}

// What a writer puts in each .ckpt file of a DumpNaming::kMindSporeCkpt dump: its whole state,
// which must lie in the groups it was assigned (each rank's state in one group), with the dump
// record and MindSpore's "epoch_num" / "step_num" (unless the state has values of those names).
Result<State> CkptShare(const DumpSource& src, const rpc::Dump& d, int rank, int world) {
  const std::vector<ReplicaGroup> assigned = GroupsFromProto(d.groups());
  SP_ASSIGN_OR_RETURN(std::vector<ReplicaGroup> mine,
                      ReplicaGroupsOf(src.state, src.layout, rank, world));
  for (const ReplicaGroup& g : mine) {
    if (std::find(assigned.begin(), assigned.end(), g) == assigned.end()) {
      return FailedPreconditionError(fmt::format(
          "rank {} holds state of replica group {}, which it does not write: the MindSpore .ckpt "
          "dump layout needs each rank's whole state in one group; use the native layout",
          rank, fmt::join(g, ",")));
    }
  }
  if (!src.state.tables().empty()) {
    return FailedPreconditionError(fmt::format(
        "rank {} holds sparse table {:?}: the MindSpore .ckpt dump layout has no place for "
        "tables; use the native layout",
        rank, src.state.tables().begin()->first));
  }
  ShardLayout unused;
  SP_ASSIGN_OR_RETURN(State share,
                      DumpShare(src.state, src.layout, rank, world, assigned, d.writer(), &unused));
  SP_RETURN_IF_ERROR(AddDumpRecord(&share, d.step(), d.epoch(), d.step_in_epoch(), rank));
  if (!share.FindValue("epoch_num")) SP_RETURN_IF_ERROR(share.PutValue("epoch_num", d.epoch()));
  if (!share.FindValue("step_num")) SP_RETURN_IF_ERROR(share.PutValue("step_num", d.step()));
  return share;
}

// Writes a DumpNaming::kMindSporeCkpt dump: the files of every rank of the assigned groups.
Status DumpCkpt(const rpc::Dump& d, const DumpSource& src, int rank, int world, Communicator& comm,
                const IoOptions& io) {
  Result<State> share = CkptShare(src, d, rank, world);
  if (!share.ok()) {
    comm.Abort(share.status());  // the other writers fail now rather than at their timeout
    return share.status();
  }
  std::vector<int> ranks;
  for (const ReplicaGroup& g : GroupsFromProto(d.groups())) {
    ranks.insert(ranks.end(), g.begin(), g.end());
  }
  return SaveMindSporeDump(comm, *share, ranks, d.path(), d.epoch(), d.step_in_epoch(),
                           std::chrono::milliseconds(d.timeout_ms()), io);
}

}  // namespace

Status WriteDumpPart(const rpc::Dump& d, const DumpSource& src, int rank, int world,
                     const StepInfo& at, Communicator& comm, const SaveOptions& save,
                     const IoOptions& io) {
  if (d.mindspore_ckpt()) return DumpCkpt(d, src, rank, world, comm, io);
  const std::vector<ReplicaGroup> assigned = GroupsFromProto(d.groups());
  if (!src.state.tables().empty() &&
      std::find(assigned.begin(), assigned.end(), ReplicaGroup{rank}) == assigned.end()) {
    const Status s = FailedPreconditionError(fmt::format(
        "rank {} holds sparse table {:?} but writes no group {{{}}}: a rank's tables are its own "
        "rows, so its replica groups must include {{{}}} (ReplicaGroupsOf gives them); the dump "
        "would lack them",
        rank, src.state.tables().begin()->first, rank, rank));
    comm.Abort(s);
    return s;
  }
  ShardLayout layout;
  Result<State> share =
      DumpShare(src.state, src.layout, rank, world, assigned, d.writer(), &layout);
  Status marked = share.ok() ? AddDumpRecord(&*share, d.step(), at.epoch, at.step_in_epoch, rank)
                             : share.status();
  if (!marked.ok()) {
    comm.Abort(marked);
    return marked;
  }
  SparseSaveOptions so;
  so.save = save;
  so.save.overwrite = false;
  so.save.create_parents = true;
  so.timeout = std::chrono::milliseconds(d.timeout_ms());
  // Every writer runs the same protocol: a sparse save when any writer holds tables (then one
  // without fails it on every rank, naming itself, as every rank must hold the same tables).
  SP_ASSIGN_OR_RETURN(std::vector<std::string> holds,
                      comm.AllGather(share->tables().empty() ? "0" : "1", so.timeout));
  if (std::find(holds.begin(), holds.end(), "1") == holds.end()) {
    return SaveDistributed(comm, *share, layout, d.path(), {.save = so.save, .timeout = so.timeout},
                           io);
  }
  // Every rank's tables are its own rows (the group {rank}), so every rank has a writer: this
  // one writes rank `rank`'s slices, as if it were that rank.
  so.shard_id = rank;
  so.shard_num = world;
  return SaveSparseDistributed(comm, *share, layout, d.path(), so, io);
}

Status WriteSnapshotPart(const rpc::Dump& d, const std::string& snapshot_dir, int world,
                         Communicator& comm, const SaveOptions& save, const IoOptions& io) {
  StepInfo at;
  Result<DumpSource> src = ReadSnapshot(snapshot_dir, d.snapshot_rank(), d.step(), &at, io);
  if (!src.ok()) {
    comm.Abort(src.status());
    return src.status();
  }
  return WriteDumpPart(d, *src, d.snapshot_rank(), world, at, comm, save, io);
}

}  // namespace savepoint::failover
