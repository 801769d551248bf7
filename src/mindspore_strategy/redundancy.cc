// SaveMindSporeRedundancyFree (savepoint/mindspore_strategy.h): a rank's .ckpt file as MindSpore
// writes it with remove_redundancy. MindSpore's own rule (mindspore/train/_utils.py,
// get_parameter_redundancy + remove_param_redundancy) is MindSporeRedundancyFreeParams over every
// parameter of the rank's stage; entries without a layout there are saved by every rank.
#include <fmt/format.h>

#include <algorithm>

#include "savepoint/mindspore_strategy.h"

namespace savepoint {
namespace {

using Shapes = std::map<std::string, Shape, std::less<>>;

// The full shape of every parameter the strategy lays out on `stage`, from the rank's slices.
Result<Shapes> StageShapes(const MindSporeLayoutMap& m, const State& local, uint32_t stage) {
  Shapes out;
  for (const auto& [name, p] : m.params) {
    if (std::find(p.stages.begin(), p.stages.end(), stage) == p.stages.end()) continue;
    const State::Entry* e = local.Find(name);
    if (e == nullptr || !e->is_tensor()) {
      return NotFoundError(fmt::format(
          "parameter {:?}, which the strategy lays out on stage {}, is not a tensor of the "
          "rank's state (remove_redundancy assigns parameters counting every one)",
          name, stage));
    }
    Result<Shape> g = MindSporeGlobalShape(p.layout, e->tensor().shape());
    if (!g.ok()) return g.status().WithContext(fmt::format("parameter {:?}", name));
    out.emplace(name, std::move(*g));
  }
  return out;
}

// The entries of `local` the rank saves: `kept` (sorted) and every one without a layout.
Result<State> Selection(const State& local, const Shapes& laid_out,
                        const std::vector<std::string>& kept) {
  State out;
  for (const auto& [name, e] : local.entries()) {
    const bool mine =
        laid_out.count(name) == 0 || std::binary_search(kept.begin(), kept.end(), name);
    if (!mine) continue;
    SP_RETURN_IF_ERROR(e.is_tensor() ? out.PutView(name, e.tensor())
                                     : out.PutValue(name, e.value()));
  }
  out.metadata() = local.metadata();
  return out;
}

Result<State> RedundancyFree(const State& local, const std::string& strategy_file, int64_t rank,
                             FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(MindSporeLayoutMap m, ReadMindSporeLayouts(strategy_file, fs));
  // A stage's own (unmerged) file holds the ranks of that stage only.
  const int64_t first = m.stages == 1 ? m.file_stage * m.stage_devices : 0;
  const int64_t ranks = m.stage_devices * m.stages;
  if (rank < first || rank >= first + ranks) {
    return InvalidArgumentError(
        fmt::format("the strategy holds ranks {} to {}", first, first + ranks - 1));
  }
  const int64_t index = rank - first;
  SP_ASSIGN_OR_RETURN(Shapes shapes,
                      StageShapes(m, local, static_cast<uint32_t>(index / m.stage_devices)));
  SP_ASSIGN_OR_RETURN(std::vector<std::string> kept,
                      MindSporeRedundancyFreeParams(m, shapes, index % m.stage_devices));
  return Selection(local, shapes, kept);
}

}  // namespace

Status SaveMindSporeRedundancyFree(const State& local, const std::string& strategy_file,
                                   int64_t rank, const std::string& path,
                                   const MindSporeSaveOptions& options, const IoOptions& io) {
  const std::string context = fmt::format(
      "remove_redundancy save of rank {} under strategy file {} to {}", rank, strategy_file, path);
  Result<State> mine = RedundancyFree(local, strategy_file, rank, FileSystemOf(io));
  if (!mine.ok()) return mine.status().WithContext(context);
  return SaveMindSporeCheckpoint(*mine, path, options, io).WithContext(context);
}

}  // namespace savepoint
