// MindSpore device-matrix layouts (savepoint/mindspore_strategy.h): which box and replica group a
// rank holds under a device matrix, a tensor map (flat or nested), an uneven manual split of dim 0
// and optimizer sharding, and the rank-independent checks of a layout that strategy files are
// validated with (strategy_internal.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "distributed/shard.h"
#include "mindspore_strategy/strategy_internal.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint {
namespace {

using dist::kMaxWorld;
using dist::SplitRange;

// Row-major coordinates of `rank` in `dev` (last axis fastest).
std::vector<int64_t> Coordinates(const std::vector<int64_t>& dev, int64_t rank) {
  std::vector<int64_t> c(dev.size());
  for (size_t i = dev.size(); i-- > 0;) c[i] = rank % dev[i], rank /= dev[i];
  return c;
}

// The device axes (indices into dev_matrix) splitting each tensor dim, the most significant first.
using DimAxes = std::vector<std::vector<size_t>>;

Result<int64_t> CheckDevMatrix(const MindSporeLayout& l) {
  int64_t world = 1;
  for (int64_t d : l.dev_matrix) {
    if (d < 1 || d > kMaxWorld || world * d > kMaxWorld) {
      return InvalidArgumentError(
          fmt::format("dev_matrix [{}]: axes must be >= 1 with a product of at most {}",
                      fmt::join(l.dev_matrix, ", "), kMaxWorld));
    }
    world *= d;
  }
  return world;
}

// The map as one list of axes per dim (MindSpore numbering: entry k is axis n - 1 - k).
std::vector<std::vector<int32_t>> MapEntries(const MindSporeLayout& l) {
  if (!l.nested_tensor_map.empty()) return l.nested_tensor_map;
  std::vector<std::vector<int32_t>> out;
  for (int32_t k : l.tensor_map) out.push_back({k});
  return out;
}

Result<DimAxes> CheckTensorMap(const Shape& shape, const MindSporeLayout& l) {
  const std::vector<std::vector<int32_t>> map = MapEntries(l);
  auto bad = [&](std::string why) {
    std::vector<std::string> dims;
    for (const auto& e : map) dims.push_back(fmt::format("{}", fmt::join(e, ", ")));
    return InvalidArgumentError(
        fmt::format("tensor_map [{}] for dev_matrix [{}] and a tensor of {} dims: {}",
                    fmt::join(dims, "; "), fmt::join(l.dev_matrix, ", "), shape.size(), why));
  };
  if (map.size() != shape.size()) return bad("one entry per tensor dim needed");
  const int32_t n = static_cast<int32_t>(l.dev_matrix.size());
  std::vector<bool> used(n);
  DimAxes axes(map.size());
  for (size_t d = 0; d < map.size(); ++d) {
    for (int32_t k : map[d]) {
      if (k == -1 && map[d].size() == 1) continue;
      if (k < 0 || k >= n) return bad(fmt::format("entry {} names no device axis", k));
      if (used[n - 1 - k]) return bad(fmt::format("device axis {} used twice", k));
      used[n - 1 - k] = true;
      axes[d].push_back(static_cast<size_t>(n - 1 - k));
    }
  }
  return axes;
}

// Where dim 0's slice `index` of `count` lies under the manual split (dim0_sizes).
Result<std::pair<int64_t, int64_t>> ManualRange(const MindSporeLayout& l, int64_t dim0,
                                                int64_t count, int64_t index) {
  auto bad = [&](std::string why) {
    return InvalidArgumentError(fmt::format(
        "param_split_shape [{}] / indices_offset [{}] for dim 0 of size {} in {} slices: {}",
        fmt::join(l.dim0_sizes, ", "), fmt::join(l.dim0_offsets, ", "), dim0, count, why));
  };
  if (static_cast<int64_t>(l.dim0_sizes.size()) != count) return bad("one size per slice needed");
  if (!l.dim0_offsets.empty() && l.dim0_offsets.size() != l.dim0_sizes.size()) {
    return bad("one offset per slice needed");
  }
  int64_t at = 0;
  for (size_t i = 0; i < l.dim0_sizes.size(); ++i) {
    const int64_t off = l.dim0_offsets.empty() ? at : l.dim0_offsets[i];
    if (l.dim0_sizes[i] < 0 || off != at || l.dim0_sizes[i] > dim0 - at) {
      return bad("the slices must cover dim 0 in order, without gaps or overlaps");
    }
    at += l.dim0_sizes[i];
  }
  if (at != dim0) return bad("the slices must cover dim 0 in order, without gaps or overlaps");
  return std::pair<int64_t, int64_t>{l.dim0_offsets.empty() ? 0 : l.dim0_offsets[index],
                                     l.dim0_sizes[index]};
}

// The range of slice `index` of `count` along dim d (size s).
Result<std::pair<int64_t, int64_t>> DimRange(const MindSporeLayout& l, size_t d, int64_t s,
                                             int64_t count, int64_t index) {
  if (d == 0 && !l.dim0_sizes.empty()) {
    SP_ASSIGN_OR_RETURN(auto r, ManualRange(l, s, count, index));
    if (l.dim0_offsets.empty()) {
      for (int64_t i = 0; i < index; ++i) r.first += l.dim0_sizes[i];
    }
    return r;
  }
  if (l.even && s % count != 0) {
    return InvalidArgumentError(
        fmt::format("dim {} of size {} cannot be split evenly into {} slices", d, s, count));
  }
  return SplitRange(s, count, index);
}

// The optimizer-shard pieces: k, checked against the group's axes (MindSpore takes the unused
// axes larger than 1 from the fastest, the last one possibly in part).
Result<int> OptimizerPieces(const MindSporeLayout& l, const std::vector<bool>& axis_used,
                            size_t group) {
  const int k = l.opt_shard_size == -1 ? static_cast<int>(group) : l.opt_shard_size;
  int64_t rem = k;
  for (size_t a = l.dev_matrix.size(); a-- > 0 && rem > 1;) {
    const int64_t size = l.dev_matrix[a];
    if (axis_used[a] || size == 1) continue;
    if (rem >= size ? rem % size != 0 : size % rem != 0) break;
    rem = rem >= size ? rem / size : 1;
  }
  if (k >= 1 && rem == 1) return k;
  return InvalidArgumentError(
      fmt::format("opt_shard_size {}: the replica group of {} ranks (dev_matrix [{}]) cannot be "
                  "cut into that many optimizer pieces",
                  l.opt_shard_size, group, fmt::join(l.dev_matrix, ", ")));
}

// Applies optimizer sharding: splits dim 0 of `spec` among its replica group.
Status ApplyOptimizerShard(const MindSporeLayout& l, const std::vector<bool>& axis_used, int rank,
                           ShardSpec* spec) {
  const std::vector<int>& g = spec->replicas;
  if (l.opt_shard_size == 0 || l.opt_shard_size == 1) return Status::OK();
  if (l.opt_shard_size < -1 || spec->sizes.empty()) {
    return InvalidArgumentError(fmt::format(
        "opt_shard_size {}: need a size >= -1 and a tensor of rank >= 1", l.opt_shard_size));
  }
  SP_ASSIGN_OR_RETURN(const int k, OptimizerPieces(l, axis_used, g.size()));
  const int mine = static_cast<int>((std::find(g.begin(), g.end(), rank) - g.begin()) % k);
  std::vector<int> members;
  for (size_t p = 0; p < g.size(); ++p) {
    if (static_cast<int>(p % k) == mine) members.push_back(g[p]);
  }
  if (l.even && spec->sizes[0] % k != 0) {
    return InvalidArgumentError(
        fmt::format("dim 0 of the slice, {}, cannot be split evenly into "
                    "{} optimizer pieces",
                    spec->sizes[0], k));
  }
  auto [off, len] = SplitRange(spec->sizes[0], k, mine);
  spec->offsets[0] += off;
  spec->sizes[0] = len;
  spec->replicas = std::move(members);
  return Status::OK();
}

}  // namespace

Result<ShardSpec> ShardFromLayout(const Shape& global_shape, const MindSporeLayout& l, int rank) {
  SP_RETURN_IF_ERROR(NumElements(global_shape).status());
  SP_ASSIGN_OR_RETURN(int64_t world, CheckDevMatrix(l));
  SP_ASSIGN_OR_RETURN(DimAxes axes, CheckTensorMap(global_shape, l));
  if (rank < 0 || rank >= world) {
    return InvalidArgumentError(fmt::format("rank {} outside the device matrix [{}] ({} ranks)",
                                            rank, fmt::join(l.dev_matrix, ", "), world));
  }
  const size_t n = l.dev_matrix.size();
  std::vector<int64_t> me = Coordinates(l.dev_matrix, rank);
  ShardSpec s{global_shape, Shape(global_shape.size(), 0), global_shape, {}};
  std::vector<bool> axis_used(n);
  for (size_t d = 0; d < global_shape.size(); ++d) {
    int64_t count = 1, index = 0;
    for (size_t a : axes[d]) count *= l.dev_matrix[a], index = index * l.dev_matrix[a] + me[a];
    for (size_t a : axes[d]) axis_used[a] = true;
    if (count == 1 && !(d == 0 && !l.dim0_sizes.empty())) continue;
    SP_ASSIGN_OR_RETURN(std::tie(s.offsets[d], s.sizes[d]),
                        DimRange(l, d, global_shape[d], count, index));
  }
  for (int64_t r = 0; r < world; ++r) {
    std::vector<int64_t> c = Coordinates(l.dev_matrix, r);
    bool same = true;
    for (size_t a = 0; a < n; ++a) same = same && (!axis_used[a] || c[a] == me[a]);
    if (same) s.replicas.push_back(static_cast<int>(r));
  }
  SP_RETURN_IF_ERROR(ApplyOptimizerShard(l, axis_used, rank, &s));
  return s;
}

Status internal::CheckMindSporeLayout(const Shape& global_shape, const MindSporeLayout& l) {
  SP_RETURN_IF_ERROR(NumElements(global_shape).status());
  SP_ASSIGN_OR_RETURN(int64_t world, CheckDevMatrix(l));
  SP_ASSIGN_OR_RETURN(DimAxes axes, CheckTensorMap(global_shape, l));
  std::vector<bool> axis_used(l.dev_matrix.size());
  int64_t group = world;
  for (size_t d = 0; d < axes.size(); ++d) {
    int64_t count = 1;
    for (size_t a : axes[d]) count *= l.dev_matrix[a], axis_used[a] = true;
    group /= count;
    if (count == 1 && !(d == 0 && !l.dim0_sizes.empty())) continue;
    for (int64_t i : {int64_t{0}, count - 1}) {
      SP_RETURN_IF_ERROR(DimRange(l, d, global_shape[d], count, i).status());
    }
  }
  if (l.opt_shard_size == 0 || l.opt_shard_size == 1) return Status::OK();
  if (l.opt_shard_size < -1 || global_shape.empty()) {
    return InvalidArgumentError(fmt::format(
        "opt_shard_size {}: need a size >= -1 and a tensor of rank >= 1", l.opt_shard_size));
  }
  return OptimizerPieces(l, axis_used, static_cast<size_t>(group)).status();
}

}  // namespace savepoint
