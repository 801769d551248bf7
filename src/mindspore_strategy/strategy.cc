// Resolving strategy files (stage prefixes, checks), the layout math on top of ShardFromLayout
// (src/distributed/layout.cc), MindSpore's remove_redundancy assignment, and
// merge_pipeline_strategys.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>

#include "distributed/shard.h"
#include "interop/byte_layout.h"
#include "mindspore_strategy/strategy_internal.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint {
namespace {

constexpr int64_t kMaxDevices = int64_t{1} << 20;

Status Invalid(const std::string& file, std::string_view param, std::string_view why) {
  return InvalidArgumentError(
      fmt::format("strategy file {}: parameter {:?}: {}", file, param, why));
}

// "{stage}-{name}": the stage and the name, when `name` has that form.
std::optional<std::pair<uint32_t, std::string>> SplitStagePrefix(const std::string& name) {
  const size_t dash = name.find('-');
  if (dash == 0 || dash == std::string::npos || dash > 9) return std::nullopt;
  uint32_t stage = 0;
  for (size_t i = 0; i < dash; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    stage = stage * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  return std::pair{stage, name.substr(dash + 1)};
}

bool IsMerged(const MindSporeStrategy& s) {
  return !s.layouts.empty() && std::all_of(s.layouts.begin(), s.layouts.end(), [](const auto& l) {
    return SplitStagePrefix(l.first).has_value();
  });
}

bool SameLayout(const MindSporeParamLayout& a, const MindSporeParamLayout& b) {
  return a.dev_matrix == b.dev_matrix && a.tensor_map == b.tensor_map &&
         a.param_split_shape == b.param_split_shape && a.indices_offset == b.indices_offset &&
         a.opt_weight_shard_size == b.opt_weight_shard_size &&
         a.opt_weight_shard_step == b.opt_weight_shard_step;
}

Result<int64_t> Devices(const MindSporeParamLayout& l, const std::string& file,
                        std::string_view param) {
  int64_t n = 1;
  for (int64_t d : l.dev_matrix) {
    if (d < 1 || d > kMaxDevices || n * d > kMaxDevices) {
      return Invalid(file, param,
                     fmt::format("dev_matrix [{}]: axes must be >= 1 with a product of at most {}",
                                 fmt::join(l.dev_matrix, ", "), kMaxDevices));
    }
    n *= d;
  }
  if (l.dev_matrix.empty()) return Invalid(file, param, "empty dev_matrix");
  return n;
}

// Checks a layout on a made-up shape of the right rank (strategy files state no shapes). The
// check allows uneven splits, so any size serves: `devices` in every dim, or, under a manual split
// of dim 0, the split's sum (up to 2^62) there and 1 elsewhere, so that the made-up shape's
// element count cannot overflow.
Status CheckParamLayout(const MindSporeParamLayout& l, int64_t devices, const std::string& file,
                        std::string_view param) {
  Shape fake(l.tensor_map.size(), devices);
  if (!fake.empty() && !l.param_split_shape.empty()) {
    int64_t sum = 0;
    for (int64_t v : l.param_split_shape) {
      if (v < 0 || v > (int64_t{1} << 62) - sum)
        return Invalid(file, param, "bad param_split_shape");
      sum += v;
    }
    fake.assign(fake.size(), 1);
    fake[0] = sum;
  }
  MindSporeLayout ml = internal::ToMindSporeLayout(l);
  ml.even = false;
  Status s = internal::CheckMindSporeLayout(fake, ml);
  return s.ok() ? s : Invalid(file, param, s.message());
}

Status AddParam(const std::string& file, const std::string& name, uint32_t stage,
                const MindSporeParamLayout& l, MindSporeLayoutMap* m) {
  auto [it, fresh] = m->params.try_emplace(name, MindSporeParamPlacement{l, {stage}});
  if (fresh) return Status::OK();
  if (!SameLayout(it->second.layout, l)) {
    return Invalid(file, name,
                   fmt::format("stages {} and {} give it different layouts",
                               fmt::join(it->second.stages, ", "), stage));
  }
  auto& st = it->second.stages;
  if (std::find(st.begin(), st.end(), stage) == st.end()) st.push_back(stage);
  std::sort(st.begin(), st.end());
  return Status::OK();
}

Status CheckStages(const std::string& file, MindSporeLayoutMap* m) {
  std::set<uint32_t> stages;
  for (const auto& [name, p] : m->params) stages.insert(p.stages.begin(), p.stages.end());
  if (stages.empty()) return Status::OK();
  if (*stages.rbegin() + 1 != stages.size()) {
    return InvalidArgumentError(
        fmt::format("strategy file {}: pipeline stages [{}] are not 0..{} (a stage's strategy is "
                    "missing from the merge)",
                    file, fmt::join(stages, ", "), stages.size() - 1));
  }
  m->stages = static_cast<uint32_t>(stages.size());
  return Status::OK();
}

}  // namespace

namespace internal {

MindSporeLayout ToMindSporeLayout(const MindSporeParamLayout& l) {
  MindSporeLayout out;
  out.dev_matrix = l.dev_matrix;
  out.nested_tensor_map = l.tensor_map;
  if (out.nested_tensor_map.empty()) out.tensor_map = {};
  // MindSpore shards optimizer state only when both the size and the step are set.
  out.opt_shard_size = l.opt_weight_shard_step == 0 ? 0 : l.opt_weight_shard_size;
  out.opt_shard_step = std::max(1, l.opt_weight_shard_step);
  out.dim0_sizes = l.param_split_shape;
  out.dim0_offsets = l.indices_offset;
  out.even = true;
  return out;
}

}  // namespace internal

namespace {
// a * b, INT64_MAX (or INT64_MIN) where it overflows: products of dev_matrix entries of a layout
// that may not have passed ResolveMindSporeStrategy's caps.
int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
}
}  // namespace

std::vector<int64_t> MindSporeSplitCounts(const MindSporeParamLayout& l) {
  std::vector<int64_t> out;
  const int64_t n = static_cast<int64_t>(l.dev_matrix.size());
  for (const auto& axes : l.tensor_map) {
    int64_t c = 1;
    for (int32_t k : axes) {
      if (k >= 0 && k < n) c = SaturatingMul(c, l.dev_matrix[n - 1 - k]);
    }
    out.push_back(c);
  }
  return out;
}

Result<Shape> MindSporeGlobalShape(const MindSporeParamLayout& l, const Shape& slice) {
  const std::vector<int64_t> counts = MindSporeSplitCounts(l);
  if (counts.size() != slice.size()) {
    return InvalidArgumentError(fmt::format("a slice of shape {} for a tensor map of {} dims",
                                            ShapeToString(slice), counts.size()));
  }
  const MindSporeLayout ml = internal::ToMindSporeLayout(l);
  int64_t opt = ml.opt_shard_size;
  if (opt == -1) {
    const int64_t devices =
        std::accumulate(l.dev_matrix.begin(), l.dev_matrix.end(), int64_t{1}, SaturatingMul);
    opt = devices / std::max<int64_t>(1, std::accumulate(counts.begin(), counts.end(), int64_t{1},
                                                         SaturatingMul));
  }
  Shape out(slice.size());
  for (size_t d = 0; d < slice.size(); ++d) {
    __int128 v = SaturatingMul(SaturatingMul(slice[d], counts[d]), d == 0 && opt > 1 ? opt : 1);
    if (d == 0 && !l.param_split_shape.empty()) {
      v = std::accumulate(l.param_split_shape.begin(), l.param_split_shape.end(), __int128{0});
    }
    if (v < 0 || v > (int64_t{1} << 62)) {
      return InvalidArgumentError(
          fmt::format("the global shape of slice {} (split counts [{}]) is negative or over 2^62 "
                      "in dim {}",
                      ShapeToString(slice), fmt::join(counts, ", "), d));
    }
    out[d] = static_cast<int64_t>(v);
  }
  if (Result<int64_t> n = NumElements(out); !n.ok()) {  // e.g. [2^62, 2, 0]: no valid shape
    return InvalidArgumentError(fmt::format("the global shape of slice {} is {}: {}",
                                            ShapeToString(slice), ShapeToString(out),
                                            n.status().message()));
  }
  return out;
}

Result<ShardSpec> MindSporeShard(const MindSporeParamLayout& layout, const Shape& global_shape,
                                 int64_t local_rank, std::string_view param) {
  if (local_rank < 0 || local_rank >= kMaxDevices) {
    return InvalidArgumentError(
        fmt::format("parameter {:?}: rank {} out of range", param, local_rank));
  }
  Result<ShardSpec> s = ShardFromLayout(global_shape, internal::ToMindSporeLayout(layout),
                                        static_cast<int>(local_rank));
  if (s.ok()) return s;
  return InvalidArgumentError(fmt::format("parameter {:?} of shape {}: {}", param,
                                          ShapeToString(global_shape), s.status().message()));
}

Result<MindSporeLayoutMap> ResolveMindSporeStrategy(const MindSporeStrategy& strategy,
                                                    const std::string& file) {
  MindSporeLayoutMap m;
  m.file = file;
  if (!strategy.nodes.empty()) m.file_stage = strategy.nodes.front().stage;
  const bool merged = IsMerged(strategy);
  std::string first;
  for (const auto& [raw, layout] : strategy.layouts) {
    uint32_t stage = 0;
    std::string name = raw;
    if (merged) std::tie(stage, name) = *SplitStagePrefix(raw);
    SP_ASSIGN_OR_RETURN(const int64_t devices, Devices(layout, file, raw));
    if (first.empty()) first = raw, m.stage_devices = devices;
    if (devices != m.stage_devices) {
      return Invalid(
          file, raw,
          fmt::format("dev_matrix [{}] holds {} ranks, but parameter {:?}'s holds {}: "
                      "every stage must have the same number of ranks",
                      fmt::join(layout.dev_matrix, ", "), devices, first, m.stage_devices));
    }
    SP_RETURN_IF_ERROR(CheckParamLayout(layout, devices, file, raw));
    SP_RETURN_IF_ERROR(AddParam(file, name, stage, layout, &m));
  }
  SP_RETURN_IF_ERROR(CheckStages(file, &m));
  return m;
}

Result<MindSporeLayoutMap> ReadMindSporeLayouts(const std::string& path, FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(MindSporeStrategy s, ReadMindSporeStrategy(path, fs));
  return ResolveMindSporeStrategy(s, path);
}

Result<std::vector<std::string>> MindSporeRedundancyFreeParams(
    const MindSporeLayoutMap& layouts, const std::map<std::string, Shape, std::less<>>& shapes,
    int64_t local_rank) {
  std::map<std::vector<int>, int> seen;  // replica group -> parameters assigned so far
  std::vector<std::string> out;
  for (const auto& [name, shape] : shapes) {
    auto it = layouts.params.find(name);
    if (it == layouts.params.end()) {
      out.push_back(name);
      continue;
    }
    SP_ASSIGN_OR_RETURN(ShardSpec s, MindSporeShard(it->second.layout, shape, local_rank, name));
    std::sort(s.replicas.begin(), s.replicas.end());
    const int k = seen[s.replicas]++;
    if (s.replicas[k % s.replicas.size()] == local_rank) out.push_back(name);
  }
  return out;
}

namespace {

// The strategy files of `dir` merge_pipeline_strategys takes, sorted, and their format.
Result<std::pair<std::vector<std::string>, MindSporeStrategyFormat>> StrategyFiles(
    FileSystem* fs, const std::string& dir) {
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(dir));
  std::vector<std::string> pb, json;
  for (const FileInfo& e : entries) {
    if (e.is_dir) continue;
    if (e.name.ends_with(".ckpt")) pb.push_back(dir + "/" + e.name);
    if (e.name.ends_with(".json")) json.push_back(dir + "/" + e.name);
  }
  if (!pb.empty() && !json.empty()) {
    return InvalidArgumentError(fmt::format(
        "merge strategies in {}: the files must be all .ckpt (protobuf) or all .json", dir));
  }
  if (pb.empty() && json.empty()) {
    return NotFoundError(fmt::format("merge strategies: no .ckpt or .json file in {}", dir));
  }
  auto& files = pb.empty() ? json : pb;
  std::sort(files.begin(), files.end());
  return std::pair{
      files, pb.empty() ? MindSporeStrategyFormat::kJson : MindSporeStrategyFormat::kProtobuf};
}

Result<std::string> ReadWhole(FileSystem* fs, const std::string& path) {
  SP_ASSIGN_OR_RETURN(auto file, fs->NewRandomAccessFile(path, {}));
  if (file->size() > (uint64_t{256} << 20)) {
    return InvalidArgumentError(fmt::format("strategy file {} is too large", path));
  }
  std::string bytes(file->size(), '\0');
  SP_RETURN_IF_ERROR(file->ReadAt(0, std::as_writable_bytes(std::span(bytes))));
  return bytes;
}

}  // namespace

Status MergeMindSporeStrategies(const std::string& src_dir, const std::string& dst_file,
                                const IoOptions& io) {
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(auto found, StrategyFiles(fs, src_dir));
  MindSporeStrategy out;
  out.current_stage = 1;
  std::set<std::string> contents;
  std::set<uint32_t> stages;
  for (const std::string& path : found.first) {
    SP_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(fs, path));
    if (!contents.insert(bytes).second) continue;  // the same file twice
    SP_ASSIGN_OR_RETURN(MindSporeStrategy s, ParseMindSporeStrategy(bytes, path));
    if (s.nodes.empty() || s.layouts.empty()) {
      return InvalidArgumentError(
          fmt::format("merge strategies: strategy file {} has no {}", path,
                      s.nodes.empty() ? "operator strategies (no stage)" : "parameter layouts"));
    }
    const uint32_t stage = s.nodes.front().stage;
    if (!stages.insert(stage).second) continue;  // MindSpore keeps the first file of a stage
    for (auto& [name, layout] : s.layouts) {
      out.layouts.emplace_back(fmt::format("{}-{}", stage, name), std::move(layout));
    }
    for (auto& n : s.nodes) out.nodes.push_back(std::move(n));
  }
  return WriteMindSporeStrategy(out, dst_file, found.second, io);
}

}  // namespace savepoint
