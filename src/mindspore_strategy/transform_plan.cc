// Planning a MindSpore transform (transform.h): the parameters of each destination file, the
// source slices that fill each cut one, and the source ranks a destination rank needs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "distributed/shard.h"
#include "mindspore_strategy/strategy_internal.h"
#include "mindspore_strategy/transform.h"

namespace savepoint::transform {

const MindSporeParamPlacement* Side::Find(std::string_view name) const {
  if (!map) return nullptr;
  auto it = map->params.find(name);
  return it == map->params.end() ? nullptr : &it->second;
}

namespace {

std::string SideName(const Side& side, std::string_view role) {
  return side.map ? fmt::format("{} strategy file {}", role, side.map->file)
                  : fmt::format("{} strategy (none: not split)", role);
}

bool HasStage(const MindSporeParamPlacement* p, int64_t stage) {
  return std::find(p->stages.begin(), p->stages.end(), stage) != p->stages.end();
}

// The destination stage of job.rank (0 in the "_part" case, where src_base is set).
int64_t DstStage(const Side& dst, const Job& job) { return job.rank / dst.devices(); }

// MindSpore drops a parameter of another destination stage when the source strategy (if any)
// lists it too.
bool Dropped(const Side& src, const Side& dst, const Job& job, std::string_view name) {
  const MindSporeParamPlacement* d = dst.Find(name);
  return d != nullptr && !HasStage(d, DstStage(dst, job)) && (!src.map || src.Find(name));
}

// Whether the parameter is cut to the destination box (else copied whole).
bool IsCut(const Side& src, const Side& dst, const Job& job, std::string_view name) {
  if (!src.map && !dst.map) return false;
  if (src.map && !src.Find(name)) return false;
  if (!dst.map) return true;
  const MindSporeParamPlacement* d = dst.Find(name);
  return d != nullptr && HasStage(d, DstStage(dst, job));
}

int64_t SrcRank(const Side& src, const Job& job, int64_t stage, int64_t local) {
  return job.src_base + stage * src.devices() + local;
}

int64_t HomeLocal(const Side& src, const Side& dst, const Job& job) {
  return (job.rank % dst.devices()) % src.devices();
}

// Optimizer pieces of a layout (1 when not sharded).
int64_t OptPieces(const MindSporeParamLayout& l) {
  if (l.opt_weight_shard_step == 0 || l.opt_weight_shard_size == 0) return 1;
  if (l.opt_weight_shard_size > 0) return l.opt_weight_shard_size;
  std::vector<int64_t> c = MindSporeSplitCounts(l);
  const int64_t devices =
      std::accumulate(l.dev_matrix.begin(), l.dev_matrix.end(), int64_t{1}, std::multiplies<>());
  return devices / std::accumulate(c.begin(), c.end(), int64_t{1}, std::multiplies<>());
}

// A shape both layouts split evenly (for plans made without the files).
Shape FakeShape(const MindSporeParamLayout* s, const MindSporeParamLayout* d, size_t rank) {
  Shape out(rank, 1);
  for (const MindSporeParamLayout* l : {s, d}) {
    if (l == nullptr) continue;
    std::vector<int64_t> c = MindSporeSplitCounts(*l);
    for (size_t i = 0; i < rank && i < c.size(); ++i) out[i] *= c[i] * (i == 0 ? OptPieces(*l) : 1);
  }
  const MindSporeParamLayout* manual = s != nullptr && !s->param_split_shape.empty()   ? s
                                       : d != nullptr && !d->param_split_shape.empty() ? d
                                                                                       : nullptr;
  if (manual != nullptr && rank > 0) {
    out[0] = std::accumulate(manual->param_split_shape.begin(), manual->param_split_shape.end(),
                             int64_t{0});
  }
  return out;
}

// The destination box of a cut parameter.
Result<ShardSpec> DstBox(const Side& dst, const Job& job, std::string_view name,
                         const Shape& global) {
  const MindSporeParamPlacement* d = dst.Find(name);
  if (d == nullptr) return ShardSpec{global, Shape(global.size(), 0), global, {}};
  Result<ShardSpec> s = MindSporeShard(d->layout, global, job.rank % dst.devices(), name);
  if (!s.ok()) return s.status().WithContext(SideName(dst, "destination"));
  return s;
}

// The source slices (one holder each) that intersect `box`. `pick` chooses a holder among the
// slice's replicas (local ranks): the home rank when it holds it, else the first present one.
Result<std::vector<Copy>> SourceCopies(const Side& src, const Side& dst, const Job& job,
                                       std::string_view name, const Shape& global,
                                       const ShardSpec& box, const Sources* sources) {
  const MindSporeParamPlacement* p = src.Find(name);
  const int64_t stage = p != nullptr ? p->stages.front() : 0;
  const int64_t home = HomeLocal(src, dst, job);
  std::vector<Copy> out;
  std::vector<bool> done(src.devices());
  for (int64_t l = 0; l < src.devices(); ++l) {
    if (done[l]) continue;
    ShardSpec s{global, Shape(global.size(), 0), global, {static_cast<int>(l)}};
    if (p != nullptr) {
      Result<ShardSpec> r = MindSporeShard(p->layout, global, l, name);
      if (!r.ok()) return r.status().WithContext(SideName(src, "source"));
      s = std::move(*r);
    }
    if (s.replicas.empty()) s.replicas = {static_cast<int>(l)};
    std::sort(s.replicas.begin(), s.replicas.end());
    int64_t pick = -1;
    for (int m : s.replicas) {
      done[m] = true;
      const bool present = sources == nullptr || sources->Has(SrcRank(src, job, stage, m));
      if (present && (pick == -1 || m == home)) pick = m;
    }
    Copy c{.src_offsets = s.offsets, .src_sizes = s.sizes};
    if (!dist::IntersectBoxes(s.offsets, s.sizes, box.offsets, box.sizes, &c.offsets, &c.sizes)) {
      continue;
    }
    if (pick == -1) {
      return NotFoundError(fmt::format(
          "parameter {:?}: no source file holds its slice at {} (source ranks [{}] of stage {} "
          "are missing)",
          name, ShapeToString(s.offsets), fmt::join(s.replicas, ", "), stage));
    }
    c.src_rank = SrcRank(src, job, stage, pick);
    out.push_back(std::move(c));
  }
  return out;
}

// The home files' tensor entries: name -> (rank, info), first holder in stage order; and the
// names in that order.
struct Universe {
  std::vector<std::string> names;
  std::map<std::string, std::pair<int64_t, std::optional<SourceParam>>, std::less<>> first;
};

Result<Universe> HomeNames(const Side& src, const Side& dst, const Job& job, const Sources& in) {
  Universe u;
  for (int64_t s = 0; s < static_cast<int64_t>(src.stages()); ++s) {
    const int64_t rank = SrcRank(src, job, s, HomeLocal(src, dst, job));
    const auto* params = in.Params(rank);
    if (params == nullptr) {
      return NotFoundError(fmt::format(
          "destination rank {} needs source rank {} (its rank_{} directory or file is missing)",
          job.rank, rank, rank));
    }
    for (const auto& [name, info] : *params) {
      if (u.first.try_emplace(name, rank, info).second) u.names.push_back(name);
    }
  }
  return u;
}

// Checks that the file of every chosen holder has the slice the strategy says.
Status CheckSlices(std::string_view name, const SourceParam& want, const std::vector<Copy>& copies,
                   const Sources& in) {
  for (const Copy& c : copies) {
    const auto* params = in.Params(c.src_rank);
    auto it = std::find_if(params->begin(), params->end(),
                           [&](const auto& p) { return p.first == name; });
    if (it == params->end() || !it->second) {
      return NotFoundError(fmt::format(
          "source file {} (rank {}) lacks parameter {:?}, which the source strategy lists",
          in.Path(c.src_rank), c.src_rank, name));
    }
    if (it->second->dtype != want.dtype || it->second->shape != c.src_sizes) {
      return InvalidArgumentError(fmt::format(
          "source file {} (rank {}): parameter {:?} is {} {}, but the strategy gives rank {} the "
          "slice {} {}",
          in.Path(c.src_rank), c.src_rank, name, DTypeName(it->second->dtype),
          ShapeToString(it->second->shape), c.src_rank, DTypeName(want.dtype),
          ShapeToString(c.src_sizes)));
    }
  }
  return Status::OK();
}

// The full shape of a parameter whose home file holds `home`.
Result<Shape> GlobalShapeOf(const Side& src, std::string_view name, const SourceParam& home) {
  const MindSporeParamPlacement* p = src.Find(name);
  if (p == nullptr) return home.shape;
  Result<Shape> g = MindSporeGlobalShape(p->layout, home.shape);
  if (!g.ok()) {
    return g.status().WithContext(fmt::format("{}: parameter {:?}", SideName(src, "source"), name));
  }
  return g;
}

Result<OutTensor> PlanCut(const Side& src, const Side& dst, const Job& job, std::string_view name,
                          const SourceParam& home, const Sources& in) {
  SP_ASSIGN_OR_RETURN(Shape global, GlobalShapeOf(src, name, home));
  SP_ASSIGN_OR_RETURN(ShardSpec box, DstBox(dst, job, name, global));
  SP_ASSIGN_OR_RETURN(std::vector<Copy> copies,
                      SourceCopies(src, dst, job, name, global, box, &in));
  SP_RETURN_IF_ERROR(CheckSlices(name, home, copies, in));
  return OutTensor{std::string(name), home.dtype,        box.offsets,
                   box.sizes,         std::move(copies), home.int4};
}

// A parameter the source strategy lists must be in the file of its stage.
Status CheckListed(const Side& src, const Side& dst, const Job& job, const Universe& u,
                   const Sources& in) {
  if (!src.map) return Status::OK();
  for (const auto& [name, p] : src.map->params) {
    if (Dropped(src, dst, job, name) || u.first.count(name) > 0) continue;
    const int64_t rank = SrcRank(src, job, p.stages.front(), HomeLocal(src, dst, job));
    return NotFoundError(fmt::format(
        "source file {} (rank {}) lacks parameter {:?}, which source strategy file {} lists",
        in.Path(rank), rank, name, src.map->file));
  }
  return Status::OK();
}

}  // namespace

Result<RankPlan> PlanRank(const Side& src, const Side& dst, const Job& job, const Sources& in) {
  SP_ASSIGN_OR_RETURN(Universe u, HomeNames(src, dst, job, in));
  SP_RETURN_IF_ERROR(CheckListed(src, dst, job, u, in));
  RankPlan plan{.job = job};
  for (const std::string& name : u.names) {
    if (Dropped(src, dst, job, name)) continue;
    const auto& [rank, info] = u.first.at(name);
    if (!info || !IsCut(src, dst, job, name)) {
      if (info) plan.bytes += NumBytes(info->dtype, info->shape).value();
      plan.whole[rank].push_back(name);
      continue;
    }
    SP_ASSIGN_OR_RETURN(OutTensor t, PlanCut(src, dst, job, name, *info, in));
    plan.bytes += NumElements(t.sizes).value() * DTypeSize(t.dtype);
    plan.tensors.push_back(std::move(t));
  }
  return plan;
}

Result<std::vector<int64_t>> NeededRanks(const Side& src, const Side& dst, int64_t rank) {
  const Job job{.rank = rank};
  std::set<int64_t> out;
  for (int64_t s = 0; s < static_cast<int64_t>(src.stages()); ++s) {
    out.insert(SrcRank(src, job, s, HomeLocal(src, dst, job)));
  }
  if (src.map) {
    for (const auto& [name, p] : src.map->params) {
      if (Dropped(src, dst, job, name) || !IsCut(src, dst, job, name)) continue;
      const MindSporeParamPlacement* d = dst.Find(name);
      const Shape global =
          FakeShape(&p.layout, d ? &d->layout : nullptr, p.layout.tensor_map.size());
      SP_ASSIGN_OR_RETURN(ShardSpec box, DstBox(dst, job, name, global));
      SP_ASSIGN_OR_RETURN(std::vector<Copy> copies,
                          SourceCopies(src, dst, job, name, global, box, nullptr));
      for (const Copy& c : copies) out.insert(c.src_rank);
    }
  }
  return std::vector<int64_t>(out.rbegin(), out.rend());
}

Result<OutTensor> PlanBox(const Side& src, std::string_view name, const SourceParam& home,
                          int64_t home_rank, const ShardSpec& box, const Sources* in) {
  SP_ASSIGN_OR_RETURN(Shape global, GlobalShapeOf(src, name, home));
  if (box.global_shape != global) {
    return InvalidArgumentError(fmt::format(
        "parameter {:?} is {} {} in the source checkpoint ({}), the target layout says {}", name,
        DTypeName(home.dtype), ShapeToString(global), SideName(src, "source"),
        ShapeToString(box.global_shape)));
  }
  SP_RETURN_IF_ERROR(dist::CheckBox(name, global, box.offsets, box.sizes));
  std::vector<Copy> copies;
  if (src.map && src.Find(name) == nullptr) {  // not split: the home file's copy
    Copy c{.src_rank = home_rank, .src_offsets = Shape(global.size(), 0), .src_sizes = global};
    if (dist::IntersectBoxes(box.offsets, box.sizes, c.src_offsets, global, &c.offsets, &c.sizes)) {
      copies.push_back(std::move(c));
    }
  } else {
    SP_ASSIGN_OR_RETURN(copies, SourceCopies(src, Side{}, Job{}, name, global, box, in));
  }
  if (in != nullptr) SP_RETURN_IF_ERROR(CheckSlices(name, home, copies, *in));
  return OutTensor{std::string(name), home.dtype,        box.offsets,
                   box.sizes,         std::move(copies), home.int4};
}

Result<std::vector<OutTensor>> PlanBoxes(const Side& src, const std::vector<std::string>& names,
                                         const ShardLayout& layout, const Sources& home,
                                         const Sources* in) {
  SP_ASSIGN_OR_RETURN(Universe u, HomeNames(src, Side{}, Job{}, home));
  SP_RETURN_IF_ERROR(CheckListed(src, Side{}, Job{}, u, home));
  std::vector<OutTensor> out;
  for (const std::string& name : names) {
    auto it = u.first.find(name);
    if (it == u.first.end()) {
      return NotFoundError(fmt::format(
          "no parameter {:?} in the source files (first rank of each stage; rank 0: {})", name,
          home.Path(0)));
    }
    const auto& [rank, info] = it->second;
    if (!info) {
      return InvalidArgumentError(
          fmt::format("parameter {:?} of source file {} is not a tensor (a string or a hash map)",
                      name, home.Path(rank)));
    }
    SP_ASSIGN_OR_RETURN(Shape global, GlobalShapeOf(src, name, *info));
    auto l = layout.find(name);
    const ShardSpec box =
        l != layout.end() ? l->second : ShardSpec{global, Shape(global.size(), 0), global, {}};
    SP_ASSIGN_OR_RETURN(OutTensor t, PlanBox(src, name, *info, rank, box, in));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace savepoint::transform
