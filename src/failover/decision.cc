// The dump decision of failure-time checkpoints (savepoint/failover.h).
//
// DecideDump: for every group, the steps its healthy, idle members hold and its members'
// snapshots; the dump's step is the largest step in all of those sets. Each group then takes a
// live member at that step, else a snapshot of it, preferring a rank already chosen for an earlier
// group (fewer writers), then the lowest rank.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

#include "savepoint/failover.h"

namespace savepoint {
namespace {

Status CheckReports(const std::vector<RankReport>& reports) {
  const int world = static_cast<int>(reports.size());
  std::set<int> seen;
  for (const RankReport& r : reports) {
    if (r.rank < 0 || r.rank >= world) {
      return InvalidArgumentError(fmt::format("report of rank {} in a job of {}", r.rank, world));
    }
    if (!seen.insert(r.rank).second) {
      return InvalidArgumentError(fmt::format("rank {} reported twice", r.rank));
    }
  }
  return Status::OK();
}

// The groups, checked, plus a group of its own for every rank no group names.
Result<std::vector<ReplicaGroup>> CompleteGroups(const std::vector<ReplicaGroup>& groups,
                                                 int world) {
  std::vector<ReplicaGroup> out;
  std::vector<bool> covered(world, false);
  for (ReplicaGroup g : groups) {
    if (g.empty()) return InvalidArgumentError("empty replica group");
    std::sort(g.begin(), g.end());
    g.erase(std::unique(g.begin(), g.end()), g.end());
    for (int r : g) {
      if (r < 0 || r >= world) {
        return InvalidArgumentError(
            fmt::format("replica group {} names rank {} in a job of {}", g, r, world));
      }
      covered[r] = true;
    }
    out.push_back(std::move(g));
  }
  for (int r = 0; r < world; ++r) {
    if (!covered[r]) out.push_back({r});
  }
  return out;
}

bool Live(const RankReport& rep) { return rep.healthy && !rep.updating && rep.step >= 0; }

// The first items of `items` joined by ", ", then how many more: a message about a group of
// thousands of ranks stays one short line.
template <typename T>
std::string Abridged(const std::vector<T>& items) {
  constexpr size_t kShown = 8;
  const size_t shown = std::min(items.size(), kShown);
  std::string s = fmt::format("{}", fmt::join(items.begin(), items.begin() + shown, ", "));
  if (items.size() > shown) s += fmt::format(", ... and {} more", items.size() - shown);
  return s;
}

// Why no member of `g` can be a source at all, or empty when some can.
std::string Unavailable(const ReplicaGroup& g, const std::vector<const RankReport*>& by_rank) {
  std::vector<std::string> why;
  bool any = false;
  for (int r : g) {
    const RankReport& rep = *by_rank[r];
    if (Live(rep) || !rep.snapshots.empty()) {
      any = true;
    } else if (!rep.healthy) {
      why.push_back(fmt::format("rank {} dead", r));
    } else if (rep.updating) {
      why.push_back(fmt::format("rank {} mid-update after step {}", r, rep.step));
    } else {
      why.push_back(fmt::format("rank {} finished no step", r));
    }
  }
  if (any) return {};
  const bool all_dead =
      std::none_of(g.begin(), g.end(), [&](int r) { return by_rank[r]->healthy; });
  return fmt::format(
      "replica group [{}] has no healthy member at a finished step and no snapshot ({}){}",
      Abridged(g), Abridged(why),
      all_dead ? (g.size() == 1 ? ": state incomplete (no replica: data parallel = 1)"
                                : ": state incomplete")
               : "");
}

// The steps some member of `g` can provide: live ones, then snapshots.
std::set<int64_t> StepsOf(const ReplicaGroup& g, const std::vector<const RankReport*>& by_rank) {
  std::set<int64_t> steps;
  for (int r : g) {
    const RankReport& rep = *by_rank[r];
    if (Live(rep)) steps.insert(rep.step);
    steps.insert(rep.snapshots.begin(), rep.snapshots.end());
  }
  return steps;
}

// The largest step in every group's set, or an error listing the sets.
Result<int64_t> CommonStep(const std::vector<ReplicaGroup>& groups,
                           const std::vector<const RankReport*>& by_rank) {
  std::set<int64_t> common = StepsOf(groups[0], by_rank);
  std::vector<std::string> listed;
  for (const ReplicaGroup& g : groups) {
    std::set<int64_t> s = StepsOf(g, by_rank);
    listed.push_back(fmt::format("group {} at steps {}", g, s));
    std::erase_if(common, [&](int64_t step) { return s.count(step) == 0; });
  }
  if (common.empty()) {
    return FailedPreconditionError(fmt::format(
        "no dump: no step is held by a healthy member or a snapshot of every replica group ({})",
        fmt::join(listed, "; ")));
  }
  return *common.rbegin();
}

struct Source {
  int rank = -1;
  bool snapshot = false;
};

// A live member at `step` (one in `chosen` first, then the lowest), else the lowest member with a
// snapshot of `step` (one in `chosen` first).
Source PickSource(const ReplicaGroup& g, int64_t step,
                  const std::vector<const RankReport*>& by_rank, const std::set<int>& chosen) {
  for (bool snapshot : {false, true}) {
    int best = -1;
    for (int r : g) {
      const RankReport& rep = *by_rank[r];
      const bool ok = snapshot ? std::count(rep.snapshots.begin(), rep.snapshots.end(), step) > 0
                               : Live(rep) && rep.step == step;
      if (!ok) continue;
      if (chosen.count(r) > 0) return {r, snapshot};
      if (best < 0) best = r;
    }
    if (best >= 0) return {best, snapshot};
  }
  return {};
}

}  // namespace

Result<DumpPlan> DecideDump(const std::vector<RankReport>& reports,
                            const std::vector<ReplicaGroup>& groups) {
  SP_RETURN_IF_ERROR(CheckReports(reports));
  if (reports.empty()) return InvalidArgumentError("no rank reported");
  const int world = static_cast<int>(reports.size());
  SP_ASSIGN_OR_RETURN(std::vector<ReplicaGroup> all, CompleteGroups(groups, world));
  std::vector<const RankReport*> by_rank(world);
  for (const RankReport& r : reports) by_rank[r.rank] = &r;
  for (const ReplicaGroup& g : all) {
    if (std::string why = Unavailable(g, by_rank); !why.empty()) {
      return FailedPreconditionError("no dump: " + why);
    }
  }
  SP_ASSIGN_OR_RETURN(int64_t step, CommonStep(all, by_rank));
  DumpPlan plan;
  plan.step = step;
  std::set<int> live, snap;
  for (size_t i = 0; i < all.size(); ++i) {
    std::set<int> chosen = live;
    chosen.insert(snap.begin(), snap.end());
    const Source src = PickSource(all[i], step, by_rank, chosen);
    (src.snapshot ? snap : live).insert(src.rank);
    if (i >= groups.size()) continue;  // a rank in no group: its own group, not listed
    plan.source_of_group.push_back(src.rank);
    plan.from_snapshot.push_back(src.snapshot);
  }
  plan.dumpers.assign(live.begin(), live.end());
  plan.snapshot_dumpers.assign(snap.begin(), snap.end());
  return plan;
}

std::vector<ReplicaGroup> DataParallelGroups(int world) {
  ReplicaGroup g(std::max(world, 0));
  for (int r = 0; r < world; ++r) g[r] = r;
  return {g};
}

std::string FailureDumpName(const std::string& prefix, int64_t epoch, int64_t step_in_epoch) {
  return fmt::format("{}-{}_{}_failover", prefix, epoch, step_in_epoch);
}

std::string MindSporeDumpName(int64_t step) {
  return fmt::format("tft_saved_checkpoints-step_{}", step);
}

}  // namespace savepoint
