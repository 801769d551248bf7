// Fuzz target for what the failover controller takes from agents (src/failover/rpc/): serialized
// AgentMessage protos, each framed by a 2-byte little-endian length, from the ranks of a job of
// 1 + (first byte % 8) ranks (message i comes from rank i % world). The controller's own checks
// (CheckHello for a rank's first message, CheckAgentMessage for the rest) decide what is
// absorbed; from what was absorbed the controller's decision runs as on a failure: reports as
// the ranks parked, their replica groups, DecideDump and CatchUpStep.
// Properties (std::abort on violation): no crash or sanitizer report on any bytes; a decided plan
// is one the reports allow: one source per group, a member of it, either live at the plan's step
// or holding a snapshot of it; dumpers and snapshot dumpers sorted and distinct.
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <vector>

#include "failover/rpc/common.h"
#include "failover/rpc/failover.pb.h"

namespace {

using namespace savepoint;
using failover::rpc::AgentMessage;

struct Rank {
  bool registered = false;
  bool healthy = true;
  bool paused = false;
  bool finished = false;
  std::vector<ReplicaGroup> groups;
  failover::rpc::StepState state;
};

// What the controller's Session and Absorb keep of message `m` from `rank`.
void Absorb(Rank& r, int rank, int world, const AgentMessage& m) {
  if (!r.registered) {
    if (m.has_hello() && m.hello().rank() == rank && failover::CheckHello(m.hello(), world).ok()) {
      r.registered = true;
      r.groups = failover::GroupsFromProto(m.hello().groups());
      r.state.set_step(-1);
    }
    return;
  }
  if (!r.healthy) return;
  if (!failover::CheckAgentMessage(m).ok()) {
    r.healthy = false;  // declared dead
    return;
  }
  if (m.has_heartbeat()) r.state = m.heartbeat();
  if (m.has_paused()) r.state = m.paused(), r.paused = true;
  if (m.has_finished()) r.finished = true;
}

bool Has(const std::vector<int64_t>& steps, int64_t step) {
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

void CheckPlan(const DumpPlan& plan, const std::vector<RankReport>& reports,
               const std::vector<ReplicaGroup>& groups) {
  if (plan.source_of_group.size() < groups.size() ||
      plan.from_snapshot.size() != plan.source_of_group.size() ||
      !std::is_sorted(plan.dumpers.begin(), plan.dumpers.end()) ||
      !std::is_sorted(plan.snapshot_dumpers.begin(), plan.snapshot_dumpers.end()) ||
      std::adjacent_find(plan.dumpers.begin(), plan.dumpers.end()) != plan.dumpers.end()) {
    std::abort();
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const int src = plan.source_of_group[g];
    if (std::find(groups[g].begin(), groups[g].end(), src) == groups[g].end()) std::abort();
    const RankReport& rep = reports[src];
    const bool live = rep.healthy && !rep.updating && rep.step == plan.step;
    if (plan.from_snapshot[g] ? !Has(rep.snapshots, plan.step) : !live) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Strings that are not UTF-8 fail to parse, as they should; protobuf's log line about each
  // would only slow the run.
  [[maybe_unused]] static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  if (size < 1) return 0;
  const int world = 1 + data[0] % 8;
  std::vector<Rank> ranks(world);
  size_t at = 1;
  for (int i = 0; at + 2 <= size && i < 256; ++i) {
    const size_t len = std::min<size_t>(data[at] | (data[at + 1] << 8), size - at - 2);
    AgentMessage m;
    if (m.ParseFromArray(data + at + 2, static_cast<int>(len)))
      Absorb(ranks[i % world], i % world, world, m);
    at += 2 + len;
  }
  // The failure: reports as ParkSurvivors makes them (a rank that did not park may be mid-update).
  std::vector<RankReport> reports;
  std::set<ReplicaGroup> all;
  for (int r = 0; r < world; ++r) {
    const Rank& k = ranks[r];
    RankReport rep{r, k.registered && k.healthy && !k.finished, k.state.step(),
                   k.state.updating() || !k.paused};
    for (const auto& p : k.state.snapshots()) rep.snapshots.push_back(p.step());
    reports.push_back(std::move(rep));
    all.insert(k.groups.begin(), k.groups.end());
  }
  std::vector<ReplicaGroup> groups(all.begin(), all.end());
  if (groups.empty()) groups = DataParallelGroups(world);
  Result<DumpPlan> plan = DecideDump(reports, groups);
  if (plan.ok()) CheckPlan(*plan, reports, groups);
  failover::CatchUpStep(reports, groups);
  return 0;
}
