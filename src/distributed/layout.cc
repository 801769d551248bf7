// Shard layouts: "split dim d into n parts", MindSpore device-matrix layouts, checks of boxes and
// replica groups, and the deterministic assignment of replicated shards to writers.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "distributed/shard.h"
#include "format/manifest.h"

namespace savepoint {
namespace {

constexpr int64_t kMaxWorld = int64_t{1} << 20;

// [i * S / n, (i + 1) * S / n) without overflow (S <= 2^62, n <= 2^20).
std::pair<int64_t, int64_t> SplitRange(int64_t s, int64_t n, int64_t i) {
  auto at = [&](int64_t k) { return static_cast<int64_t>(static_cast<__int128>(k) * s / n); };
  return {at(i), at(i + 1) - at(i)};
}

// Row-major coordinates of `rank` in `dev` (last axis fastest).
std::vector<int64_t> Coordinates(const std::vector<int64_t>& dev, int64_t rank) {
  std::vector<int64_t> c(dev.size());
  for (size_t i = dev.size(); i-- > 0;) c[i] = rank % dev[i], rank /= dev[i];
  return c;
}

Result<int64_t> CheckLayout(const Shape& shape, const MindSporeLayout& l) {
  int64_t world = 1;
  for (int64_t d : l.dev_matrix) {
    if (d < 1 || d > kMaxWorld || world * d > kMaxWorld) {
      return InvalidArgumentError(
          fmt::format("dev_matrix [{}]: axes must be >= 1 with a product "
                      "of at most {}",
                      fmt::join(l.dev_matrix, ", "), kMaxWorld));
    }
    world *= d;
  }
  if (l.tensor_map.size() != shape.size()) {
    return InvalidArgumentError(fmt::format("tensor_map [{}] has {} entries for shape {}",
                                            fmt::join(l.tensor_map, ", "), l.tensor_map.size(),
                                            ShapeToString(shape)));
  }
  std::vector<bool> used(l.dev_matrix.size());
  for (int32_t k : l.tensor_map) {
    if (k < -1 || k >= static_cast<int32_t>(l.dev_matrix.size()) || (k >= 0 && used[k])) {
      return InvalidArgumentError(
          fmt::format("tensor_map [{}]: entry {} is not -1 or an unused "
                      "device axis of {}",
                      fmt::join(l.tensor_map, ", "), k, l.dev_matrix.size()));
    }
    if (k >= 0) used[k] = true;
  }
  return world;
}

// Applies optimizer sharding: splits dim 0 of `spec` among its replica group.
Status ApplyOptimizerShard(const MindSporeLayout& l, int rank, ShardSpec* spec) {
  const std::vector<int>& g = spec->replicas;
  int k = l.opt_shard_size == -1 ? static_cast<int>(g.size()) : l.opt_shard_size;
  if (k == 0 || (k == 1 && l.opt_shard_size != -1)) return Status::OK();
  if (k < 0 || l.opt_shard_step < 1 || spec->sizes.empty()) {
    return InvalidArgumentError(fmt::format(
        "opt_shard_size {} / opt_shard_step {}: need size >= -1, step >= 1 and a tensor of rank "
        ">= 1",
        l.opt_shard_size, l.opt_shard_step));
  }
  auto piece_of = [&](size_t pos) { return static_cast<int>((pos / l.opt_shard_step) % k); };
  std::vector<int> members;
  std::vector<bool> seen(k);
  int mine = piece_of(std::find(g.begin(), g.end(), rank) - g.begin());
  for (size_t p = 0; p < g.size(); ++p) {
    seen[piece_of(p)] = true;
    if (piece_of(p) == mine) members.push_back(g[p]);
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
    return InvalidArgumentError(
        fmt::format("opt_shard_size {} with step {}: replica group [{}] cannot hold every piece", k,
                    l.opt_shard_step, fmt::join(g, ", ")));
  }
  auto [off, len] = SplitRange(spec->sizes[0], k, mine);
  spec->offsets[0] += off;
  spec->sizes[0] = len;
  spec->replicas = std::move(members);
  return Status::OK();
}

Status CheckReplicas(std::string_view name, std::vector<int>* replicas, int rank, int size) {
  if (replicas->empty()) replicas->push_back(rank);
  std::sort(replicas->begin(), replicas->end());
  bool bad = std::adjacent_find(replicas->begin(), replicas->end()) != replicas->end() ||
             replicas->front() < 0 || replicas->back() >= size ||
             !std::binary_search(replicas->begin(), replicas->end(), rank);
  if (!bad) return Status::OK();
  return InvalidArgumentError(
      fmt::format("tensor {:?}: replica group [{}] must hold distinct ranks in [0, {}) including "
                  "this rank {}",
                  name, fmt::join(*replicas, ", "), size, rank));
}

}  // namespace

Result<ShardSpec> SplitDim(const Shape& global_shape, int dim, int parts, int index,
                           std::vector<int> replicas) {
  SP_RETURN_IF_ERROR(NumElements(global_shape).status());
  if (dim < 0 || static_cast<size_t>(dim) >= global_shape.size() || parts < 1 ||
      parts > kMaxWorld || index < 0 || index >= parts) {
    return InvalidArgumentError(
        fmt::format("SplitDim(shape {}, dim {}, parts {}, index {}): out "
                    "of range",
                    ShapeToString(global_shape), dim, parts, index));
  }
  ShardSpec s{global_shape, Shape(global_shape.size(), 0), global_shape, std::move(replicas)};
  std::tie(s.offsets[dim], s.sizes[dim]) = SplitRange(global_shape[dim], parts, index);
  return s;
}

Result<ShardSpec> ShardFromLayout(const Shape& global_shape, const MindSporeLayout& l, int rank) {
  SP_RETURN_IF_ERROR(NumElements(global_shape).status());
  SP_ASSIGN_OR_RETURN(int64_t world, CheckLayout(global_shape, l));
  if (rank < 0 || rank >= world) {
    return InvalidArgumentError(fmt::format("rank {} outside the device matrix [{}] ({} ranks)",
                                            rank, fmt::join(l.dev_matrix, ", "), world));
  }
  const size_t n = l.dev_matrix.size();
  std::vector<int64_t> me = Coordinates(l.dev_matrix, rank);
  ShardSpec s{global_shape, Shape(global_shape.size(), 0), global_shape, {}};
  std::vector<bool> axis_used(n);
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (l.tensor_map[d] < 0) continue;
    size_t axis = n - 1 - l.tensor_map[d];
    axis_used[axis] = true;
    std::tie(s.offsets[d], s.sizes[d]) = SplitRange(global_shape[d], l.dev_matrix[axis], me[axis]);
  }
  for (int64_t r = 0; r < world; ++r) {
    std::vector<int64_t> c = Coordinates(l.dev_matrix, r);
    bool same = true;
    for (size_t a = 0; a < n; ++a) same = same && (!axis_used[a] || c[a] == me[a]);
    if (same) s.replicas.push_back(static_cast<int>(r));
  }
  SP_RETURN_IF_ERROR(ApplyOptimizerShard(l, rank, &s));
  return s;
}

Status ValidateLayouts(const std::vector<ShardLayout>& per_rank) {
  const int size = static_cast<int>(per_rank.size());
  std::map<std::string, format::TensorRecord, std::less<>> tensors;
  for (int r = 0; r < size; ++r) {
    for (const auto& [name, spec0] : per_rank[r]) {
      ShardSpec spec = spec0;
      SP_RETURN_IF_ERROR(dist::CheckBox(name, spec.global_shape, spec.offsets, spec.sizes));
      SP_RETURN_IF_ERROR(CheckReplicas(name, &spec.replicas, r, size));
      format::TensorRecord& t = tensors[name];
      if (t.name.empty()) t.name = name, t.shape = spec.global_shape;
      if (t.shape != spec.global_shape) {
        return InvalidArgumentError(
            fmt::format("tensor {:?}: rank {} says global shape {}, "
                        "another rank {}",
                        name, r, ShapeToString(spec.global_shape), ShapeToString(t.shape)));
      }
      for (int peer : spec.replicas) {
        auto it = per_rank[peer].find(name);
        if (it == per_rank[peer].end() || it->second.offsets != spec.offsets ||
            it->second.sizes != spec.sizes) {
          return InvalidArgumentError(
              fmt::format("tensor {:?}: rank {} names rank {} as a replica, but its box differs",
                          name, r, peer));
        }
      }
      if (spec.replicas.front() == r) t.shards.push_back({spec.offsets, spec.sizes, 0, 0, 0, {}});
    }
  }
  for (const auto& [name, t] : tensors) {
    Status s = format::CheckTensorTiling(t, "layout");
    if (!s.ok()) return InvalidArgumentError(s.message());
  }
  return Status::OK();
}

}  // namespace savepoint

namespace savepoint::dist {

Status CheckBox(std::string_view name, const Shape& global, const Shape& offsets,
                const Shape& sizes) {
  Status s = NumElements(global).status();
  bool ok = s.ok() && offsets.size() == global.size() && sizes.size() == global.size();
  for (size_t d = 0; ok && d < global.size(); ++d) {
    ok = offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] <= global[d] &&
         sizes[d] <= global[d] - offsets[d];
  }
  if (ok) return Status::OK();
  return InvalidArgumentError(
      fmt::format("tensor {:?}: box offsets {} sizes {} is outside the "
                  "global shape {}",
                  name, ShapeToString(offsets), ShapeToString(sizes), ShapeToString(global)));
}

Result<std::vector<LocalShard>> ResolveLocalShards(const State& local, const ShardLayout& layout,
                                                   int rank, int size) {
  std::vector<LocalShard> out;
  for (const auto& [name, e] : local.entries()) {
    if (!e.is_tensor()) continue;
    const TensorView& v = e.tensor();
    auto it = layout.find(name);
    ShardSpec spec;
    if (it == layout.end()) {
      spec = {v.shape(), Shape(v.shape().size(), 0), v.shape(), std::vector<int>(size)};
      std::iota(spec.replicas.begin(), spec.replicas.end(), 0);
    } else {
      spec = it->second;
    }
    SP_RETURN_IF_ERROR(CheckBox(name, spec.global_shape, spec.offsets, spec.sizes));
    if (spec.sizes != v.shape()) {
      return InvalidArgumentError(
          fmt::format("tensor {:?}: local shape {} differs from the "
                      "layout's box sizes {}",
                      name, ShapeToString(v.shape()), ShapeToString(spec.sizes)));
    }
    SP_RETURN_IF_ERROR(CheckReplicas(name, &spec.replicas, rank, size));
    out.push_back({name, v, std::move(spec)});
  }
  for (const auto& [name, spec] : layout) {
    if (local.FindTensor(name) == nullptr) {
      return InvalidArgumentError(
          fmt::format("layout names tensor {:?}, which is not in the local "
                      "state of rank {}",
                      name, rank));
    }
  }
  return out;
}

std::vector<size_t> AssignWrites(const std::vector<LocalShard>& shards, int rank) {
  std::map<std::vector<int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < shards.size(); ++i) groups[shards[i].spec.replicas].push_back(i);
  std::vector<size_t> mine;
  for (auto& [members, idx] : groups) {
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return shards[a].view.nbytes() > shards[b].view.nbytes();  // names already sorted
    });
    std::vector<uint64_t> load(members.size());
    for (size_t i : idx) {
      size_t m = std::min_element(load.begin(), load.end()) - load.begin();
      load[m] += std::max<uint64_t>(shards[i].view.nbytes(), 1);
      if (members[m] == rank) mine.push_back(i);
    }
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

bool IntersectBoxes(const Shape& a_off, const Shape& a_size, const Shape& b_off,
                    const Shape& b_size, Shape* off, Shape* size) {
  off->resize(a_off.size());
  size->resize(a_off.size());
  for (size_t d = 0; d < a_off.size(); ++d) {
    int64_t lo = std::max(a_off[d], b_off[d]);
    int64_t hi = std::min(a_off[d] + a_size[d], b_off[d] + b_size[d]);
    if (hi <= lo) return false;
    (*off)[d] = lo, (*size)[d] = hi - lo;
  }
  return true;
}

}  // namespace savepoint::dist
