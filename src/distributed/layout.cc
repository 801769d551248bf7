// Shard layouts: "split dim d into n parts", checks of boxes and replica groups, and the
// deterministic assignment of replicated shards to writers. (MindSpore device-matrix layouts:
// src/mindspore_strategy/layout.cc.)
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "distributed/shard.h"
#include "format/manifest.h"

namespace savepoint {
namespace {

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
      parts > dist::kMaxWorld || index < 0 || index >= parts) {
    return InvalidArgumentError(
        fmt::format("SplitDim(shape {}, dim {}, parts {}, index {}): out "
                    "of range",
                    ShapeToString(global_shape), dim, parts, index));
  }
  ShardSpec s{global_shape, Shape(global_shape.size(), 0), global_shape, std::move(replicas)};
  std::tie(s.offsets[dim], s.sizes[dim]) = dist::SplitRange(global_shape[dim], parts, index);
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
      const std::string& stored = dist::StoredName(name, spec);
      format::TensorRecord& t = tensors[stored];
      if (t.name.empty()) t.name = stored, t.shape = spec.global_shape;
      if (t.shape != spec.global_shape) {
        return InvalidArgumentError(
            fmt::format("tensor {:?}: rank {} says global shape {}, "
                        "another rank {}",
                        stored, r, ShapeToString(spec.global_shape), ShapeToString(t.shape)));
      }
      for (int peer : spec.replicas) {
        auto it = per_rank[peer].find(name);
        if (it == per_rank[peer].end() || it->second.offsets != spec.offsets ||
            it->second.sizes != spec.sizes || it->second.tensor != spec.tensor) {
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
    SP_RETURN_IF_ERROR(format::CheckDimensions(name, spec.global_shape));
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
