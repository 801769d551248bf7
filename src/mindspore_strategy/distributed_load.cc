// Loading a MindSpore distributed checkpoint straight into this rank's layout
// (savepoint/mindspore_strategy.h), on the transform's planning and reading code (transform.h).
//
// The layout form plans in two steps, so that a rank opens only the files it needs: the first
// rank of each source stage is scanned (its entries name the parameters and give the slice
// shapes, hence the full shapes), the boxes are planned from the layouts alone (one holder per
// intersecting source slice), then those holders' files are scanned and the plan is made again
// against them (the same holders: the ones chosen first are all present), checking every slice
// the strategy names. Then each tensor is filled from the byte runs of its copies, tensors in
// parallel. The strategy form is MindSporeTransformCheckpointByRank without the write.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "mindspore_strategy/transform.h"
#include "util/parallel.h"

namespace savepoint {
namespace {

using transform::OutTensor;
using transform::Side;
using transform::Sources;

using RankPaths = std::map<int64_t, std::string>;

// The source: its strategy and the file of every rank directory, checked against each other.
struct Source {
  Side side;
  RankPaths files;
};

Result<Source> OpenSource(const std::string& dir, const MindSporeDistributedLoadOptions& options,
                          FileSystem* fs) {
  Source s;
  SP_ASSIGN_OR_RETURN(s.side, transform::ReadSide(options.src_strategy_file, fs));
  SP_ASSIGN_OR_RETURN(s.files, transform::SourceRankFiles(fs, dir));
  if (s.files.empty()) {
    return NotFoundError(
        fmt::format("no rank_N directory with a .ckpt or .safetensors file in {}", dir));
  }
  SP_RETURN_IF_ERROR(transform::CheckSourceRanks(s.side, s.files, dir));
  return s;
}

// The files of `ranks` (each must be in `files`).
Result<RankPaths> Subset(const RankPaths& files, const std::set<int64_t>& ranks,
                         const std::string& dir) {
  RankPaths out;
  for (int64_t r : ranks) {
    auto it = files.find(r);
    if (it == files.end()) {
      return NotFoundError(
          fmt::format("source rank {} (directory {}/rank_{}) is missing", r, dir, r));
    }
    out.insert(*it);
  }
  return out;
}

// The planned tensors and the files they read.
struct BoxPlan {
  std::unique_ptr<transform::FileSources> sources;
  std::vector<OutTensor> tensors;
};

Result<BoxPlan> PlanLayout(const std::string& dir, const std::vector<std::string>& names,
                           const ShardLayout& layout,
                           const MindSporeDistributedLoadOptions& options, const IoOptions& io) {
  if (options.dst_strategy_file) {
    return InvalidArgumentError(
        "MindSporeDistributedLoadOptions.dst_strategy_file: the layout gives the boxes here (use "
        "LoadMindSporeDistributedRank for a destination strategy)");
  }
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(Source src, OpenSource(dir, options, fs));
  std::set<int64_t> ranks;
  for (uint32_t s = 0; s < src.side.stages(); ++s) ranks.insert(s * src.side.devices());
  SP_ASSIGN_OR_RETURN(RankPaths home_files, Subset(src.files, ranks, dir));
  SP_ASSIGN_OR_RETURN(auto home, transform::FileSources::Open(fs, home_files, io.io_threads));
  SP_ASSIGN_OR_RETURN(std::vector<OutTensor> draft,
                      transform::PlanBoxes(src.side, names, layout, *home, nullptr));
  for (const OutTensor& t : draft) {
    for (const transform::Copy& c : t.copies) ranks.insert(c.src_rank);
  }
  SP_ASSIGN_OR_RETURN(RankPaths needed, Subset(src.files, ranks, dir));
  BoxPlan plan;
  SP_ASSIGN_OR_RETURN(plan.sources, transform::FileSources::Open(fs, needed, io.io_threads));
  SP_ASSIGN_OR_RETURN(plan.tensors, transform::PlanBoxes(src.side, names, layout, *plan.sources,
                                                         plan.sources.get()));
  return plan;
}

// The target of each planned tensor must be its box, of its dtype.
Status CheckTargets(const std::vector<OutTensor>& tensors, const std::vector<TensorView>& views) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const OutTensor& t = tensors[i];
    if (views[i].dtype() == t.dtype && views[i].shape() == t.sizes) continue;
    return InvalidArgumentError(
        fmt::format("parameter {:?}: the target is {} {}, the box to load is {} {}", t.name,
                    DTypeName(views[i].dtype()), ShapeToString(views[i].shape()),
                    DTypeName(t.dtype), ShapeToString(t.sizes)));
  }
  return Status::OK();
}

Status Fill(const BoxPlan& plan, const std::vector<TensorView>& views, int threads) {
  SP_RETURN_IF_ERROR(CheckTargets(plan.tensors, views));
  return ParallelFor(plan.tensors.size(), threads, [&](size_t i, int) -> Status {
    return transform::FillTensor(plan.tensors[i], *plan.sources, views[i].data());
  });
}

std::string Context(const std::string& dir) {
  return fmt::format("loading MindSpore distributed checkpoint {}", dir);
}

Status LoadInto(const std::string& dir, State& targets, const ShardLayout& layout,
                const MindSporeDistributedLoadOptions& options, const IoOptions& io) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, "MindSpore distributed load"));
  std::vector<std::string> names;
  std::vector<TensorView> views;
  for (const auto& [name, e] : targets.entries()) {
    if (!e.is_tensor()) continue;
    names.push_back(name);
    views.push_back(e.tensor());
  }
  for (const auto& [name, spec] : layout) {
    if (!std::binary_search(names.begin(), names.end(), name)) {
      return InvalidArgumentError(
          fmt::format("the layout names tensor {:?}, not in the targets", name));
    }
  }
  SP_ASSIGN_OR_RETURN(BoxPlan plan, PlanLayout(dir, names, layout, options, io));
  return Fill(plan, views, io.io_threads);
}

}  // namespace

Status LoadMindSporeDistributed(const std::string& src_dir, State& targets,
                                const ShardLayout& layout,
                                const MindSporeDistributedLoadOptions& options,
                                const IoOptions& io) {
  return LoadInto(src_dir, targets, layout, options, io).WithContext(Context(src_dir));
}

Result<State> LoadMindSporeDistributedAlloc(const std::string& src_dir, const ShardLayout& layout,
                                            const MindSporeDistributedLoadOptions& options,
                                            const IoOptions& io) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, "MindSpore distributed load"));
  std::vector<std::string> names;
  for (const auto& [name, spec] : layout) names.push_back(name);
  Result<BoxPlan> plan = PlanLayout(src_dir, names, layout, options, io);
  if (!plan.ok()) return plan.status().WithContext(Context(src_dir));
  State out;
  std::vector<TensorView> views;
  for (const OutTensor& t : plan->tensors) {
    SP_ASSIGN_OR_RETURN(Tensor buffer, Tensor::Empty(t.dtype, t.sizes));
    views.push_back(buffer.view());
    SP_RETURN_IF_ERROR(out.Put(t.name, std::move(buffer)));
  }
  SP_RETURN_IF_ERROR(Fill(*plan, views, io.io_threads).WithContext(Context(src_dir)));
  return out;
}

Result<State> LoadMindSporeDistributedRank(const std::string& src_dir, int64_t rank,
                                           const MindSporeDistributedLoadOptions& options,
                                           const IoOptions& io) {
  const std::string context = fmt::format("{} for rank {}", Context(src_dir), rank);
  auto run = [&]() -> Result<State> {
    SP_RETURN_IF_ERROR(ValidateIoOptions(io, "MindSpore distributed load"));
    FileSystem* fs = FileSystemOf(io);
    SP_ASSIGN_OR_RETURN(Source src, OpenSource(src_dir, options, fs));
    SP_ASSIGN_OR_RETURN(Side dst, transform::ReadSide(options.dst_strategy_file, fs));
    if (rank < 0 || rank >= dst.devices() * dst.stages()) {
      return InvalidArgumentError(
          fmt::format("the destination has {} ranks", dst.devices() * dst.stages()));
    }
    SP_ASSIGN_OR_RETURN(std::vector<int64_t> ranks, transform::NeededRanks(src.side, dst, rank));
    SP_ASSIGN_OR_RETURN(RankPaths needed,
                        Subset(src.files, std::set<int64_t>(ranks.begin(), ranks.end()), src_dir));
    SP_ASSIGN_OR_RETURN(auto sources, transform::FileSources::Open(fs, needed, io.io_threads));
    SP_ASSIGN_OR_RETURN(transform::RankPlan plan,
                        transform::PlanRank(src.side, dst, {.rank = rank}, *sources));
    return transform::BuildRankState(plan, *sources, io);
  };
  Result<State> out = run();
  if (!out.ok()) return out.status().WithContext(context);
  return out;
}

}  // namespace savepoint
