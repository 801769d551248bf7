// Replica groups of a rank's state and the part of it a rank writes in a failure dump
// (savepoint/failover.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "savepoint/failover.h"
#include "savepoint/sparse.h"

namespace savepoint {
namespace {

// The replica group of tensor `name` of `rank` under `layout`.
Result<ReplicaGroup> GroupOf(const std::string& name, const ShardLayout& layout, int rank,
                             int world) {
  auto it = layout.find(name);
  if (it == layout.end()) return DataParallelGroups(world)[0];
  ReplicaGroup g = it->second.replicas;
  if (g.empty()) g.push_back(rank);
  std::sort(g.begin(), g.end());
  g.erase(std::unique(g.begin(), g.end()), g.end());
  if (g.front() < 0 || g.back() >= world) {
    return InvalidArgumentError(
        fmt::format("tensor {}: replicas {} outside a job of {} ranks", name, g, world));
  }
  if (!std::binary_search(g.begin(), g.end(), rank)) {
    return InvalidArgumentError(
        fmt::format("tensor {}: replicas {} do not include rank {}", name, g, rank));
  }
  return g;
}

// The box of `view` alone: its spec under `layout` (or the whole tensor), written by `writer`.
ShardSpec DumpSpec(const std::string& name, const TensorView& view, const ShardLayout& layout,
                   int writer) {
  auto it = layout.find(name);
  ShardSpec spec;
  if (it != layout.end()) {
    spec = it->second;
  } else {
    spec.global_shape = view.shape();
    spec.offsets.assign(view.shape().size(), 0);
    spec.sizes = view.shape();
  }
  spec.replicas = {writer};
  return spec;
}

}  // namespace

Result<std::vector<ReplicaGroup>> ReplicaGroupsOf(const State& local, const ShardLayout& layout,
                                                  int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgumentError(fmt::format("rank {} of {}", rank, world));
  }
  std::set<ReplicaGroup> groups;
  for (const auto& [name, entry] : local.entries()) {
    if (!entry.is_tensor()) continue;
    SP_ASSIGN_OR_RETURN(ReplicaGroup g, GroupOf(name, layout, rank, world));
    groups.insert(std::move(g));
  }
  if (!local.tables().empty()) groups.insert(ReplicaGroup{rank});  // its own rows
  return std::vector<ReplicaGroup>(groups.begin(), groups.end());
}

Result<State> DumpShare(const State& local, const ShardLayout& layout, int rank, int world,
                        const std::vector<ReplicaGroup>& assigned, int writer,
                        ShardLayout* dump_layout) {
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgumentError(fmt::format("rank {} of {}", rank, world));
  }
  const std::set<ReplicaGroup> mine(assigned.begin(), assigned.end());
  State out;
  dump_layout->clear();
  for (const auto& [name, entry] : local.entries()) {
    if (!entry.is_tensor()) {
      SP_RETURN_IF_ERROR(out.PutValue(name, entry.value()));
      continue;
    }
    SP_ASSIGN_OR_RETURN(ReplicaGroup g, GroupOf(name, layout, rank, world));
    if (mine.count(g) == 0) continue;
    SP_RETURN_IF_ERROR(out.PutView(name, entry.tensor()));
    (*dump_layout)[name] = DumpSpec(name, entry.tensor(), layout, writer);
  }
  if (mine.count(ReplicaGroup{rank}) > 0) {  // the tables: the rank's own rows, borrowed
    for (const auto& [name, t] : local.tables()) {
      SP_ASSIGN_OR_RETURN(SparseTable share, SparseTable::FromViews(t->ids_view(), t->slots()));
      SP_RETURN_IF_ERROR(out.PutTable(name, std::move(share)));
    }
  }
  out.metadata() = local.metadata();
  return out;
}

}  // namespace savepoint
