// The MindSpore .ckpt layout of a failure dump (savepoint/failover.h; docs/FAILOVER.md):
// "tft_saved_checkpoints-step_{n}/rank_{r}/ttp_rank_{r}-{epoch}_{step}.ckpt" for every rank r,
// committed as one directory by the durable-commit protocol (io/commit.h), coordinated over the
// dump writers' communicator.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "engine/paths.h"
#include "io/commit.h"
#include "savepoint/failover.h"
#include "savepoint/mindspore.h"

namespace savepoint {
namespace {

// A Status on the wire of a collective: "<code>:<message>".
std::string EncodeStatus(const Status& s) {
  return fmt::format("{}:{}", static_cast<int>(s.code()), s.message());
}

Status DecodeStatus(const std::string& bytes) {
  const size_t colon = bytes.find(':');
  if (colon == std::string::npos) return InternalError("malformed status from a dump writer");
  const int code = std::atoi(bytes.substr(0, colon).c_str());
  if (code == 0) return Status::OK();
  if (code < 0 || code > static_cast<int>(kLastStatusCode)) {
    return InternalError(bytes.substr(colon + 1));
  }
  return Status(static_cast<StatusCode>(code), bytes.substr(colon + 1));
}

Status WriteRankFiles(const State& state, const std::vector<int>& ranks, const std::string& tmp,
                      int64_t epoch, int64_t step_in_epoch, const IoOptions& io) {
  MindSporeSaveOptions mo;
  mo.create_parents = true;
  mo.crc_check = true;
  for (int r : ranks) {
    const std::string path = JoinPath(tmp, MindSporeRankCheckpointPath(r, epoch, step_in_epoch));
    SP_RETURN_IF_ERROR(SaveMindSporeCheckpoint(state, path, mo, io));
  }
  return Status::OK();
}

// Writer 0: begins the commit; every writer: receives the temporary (or why there is none).
Result<std::string> ShareTemporary(Communicator& comm, FileSystem* fs, const std::string& dir,
                                   Timeout timeout, std::optional<io::DurableCommit>* commit) {
  std::string msg;
  if (comm.rank() == 0) {
    io::CommitOptions co;
    co.overwrite = false;
    co.create_parents = true;
    Result<io::DurableCommit> c =
        io::DurableCommit::Begin(fs, dir, io::DurableCommit::Kind::kDirectory, co);
    if (c.ok()) commit->emplace(*c);
    msg = c.ok() ? "0:" + c->tmp() : EncodeStatus(c.status());
  }
  Status s = comm.Broadcast(&msg, 0, timeout);
  if (!s.ok()) {
    if (*commit) (*commit)->Abandon();
    return s;
  }
  if (msg.rfind("0:", 0) == 0) return msg.substr(2);
  return DecodeStatus(msg).WithContext(fmt::format("begin the dump {}", dir));
}

// Writer 0: commits when every writer succeeded, else abandons. Returns the dump's result.
Status Decide(const std::vector<std::string>& statuses, const io::DurableCommit& commit) {
  for (size_t w = 0; w < statuses.size(); ++w) {
    Status s = DecodeStatus(statuses[w]);
    if (!s.ok()) {
      commit.Abandon();
      return s.WithContext(fmt::format("dump writer {}", w));
    }
  }
  Status s = commit.Commit();
  if (!s.ok()) commit.Abandon();
  return s;
}

}  // namespace

std::string MindSporeRankCheckpointPath(int rank, int64_t epoch, int64_t step_in_epoch) {
  return fmt::format("rank_{0}/ttp_rank_{0}-{1}_{2}.ckpt", rank, epoch, step_in_epoch);
}

Status CheckMindSporeDumpGroups(const std::vector<ReplicaGroup>& groups, int world) {
  for (int r = 0; r < world; ++r) {
    std::vector<ReplicaGroup> of;
    for (const ReplicaGroup& g : groups) {
      if (std::find(g.begin(), g.end(), r) != g.end()) of.push_back(g);
    }
    if (of.size() == 1) continue;
    return FailedPreconditionError(fmt::format(
        "the MindSpore .ckpt dump layout needs each rank's whole state in one replica group, but "
        "rank {} {}: use the native layout (DumpNaming::kManager or kMindSpore)",
        r, of.empty() ? "is in no group" : fmt::format("has state in groups {}", of)));
  }
  return Status::OK();
}

Status SaveMindSporeDump(Communicator& comm, const State& state, const std::vector<int>& ranks,
                         const std::string& dir, int64_t epoch, int64_t step_in_epoch,
                         Timeout timeout, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(std::string path, engine::NormalizeCheckpointPath(dir));
  std::optional<io::DurableCommit> commit;
  SP_ASSIGN_OR_RETURN(std::string tmp,
                      ShareTemporary(comm, FileSystemOf(io), path, timeout, &commit));
  const Status mine = WriteRankFiles(state, ranks, tmp, epoch, step_in_epoch, io);
  Result<std::vector<std::string>> all = comm.Gather(EncodeStatus(mine), 0, timeout);
  if (!all.ok()) {
    if (commit) commit->Abandon();
    return mine.ok() ? all.status() : mine;
  }
  if (comm.rank() == 0) {
    // The commit is the dump's result, even if a writer that is no longer needed died since.
    const Status decided = Decide(*all, *commit);
    std::string result = EncodeStatus(decided);
    comm.Broadcast(&result, 0, timeout).IgnoreError();
    return decided;
  }
  std::string result;
  SP_RETURN_IF_ERROR(comm.Broadcast(&result, 0, timeout));
  return DecodeStatus(result);
}

}  // namespace savepoint
