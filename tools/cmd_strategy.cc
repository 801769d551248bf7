// `savepoint strategy show F [--json]`, `savepoint strategy ranks --rank N [--src-strategy F]
// [--dst-strategy F] [--json]` and `savepoint strategy merge SRC_DIR DST_FILE`: MindSpore parallel
// strategy files (savepoint/mindspore_strategy.h, docs/CLI.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint::cli {
namespace {

constexpr char kShow[] = "strategy show";
constexpr char kRanks[] = "strategy ranks";
constexpr char kMerge[] = "strategy merge";

struct StrategyArgs {
  std::string file;               // show
  int64_t rank = 0;               // ranks
  std::string src_strategy;       // ranks ("" = not split)
  std::string dst_strategy;       // ranks
  std::string src_dir, dst_file;  // merge
  bool json = false;
};

// "[[1], [-1]]" -> "1,-1"; nested dims as "(1 0)".
std::string TensorMapText(const std::vector<std::vector<int32_t>>& map) {
  std::vector<std::string> dims;
  for (const auto& axes : map) {
    dims.push_back(axes.size() == 1 ? fmt::format("{}", axes[0])
                                    : fmt::format("({})", fmt::join(axes, " ")));
  }
  return fmt::format("{}", fmt::join(dims, ","));
}

Json LayoutJson(const std::string& name, const MindSporeParamPlacement& p,
                const std::vector<int64_t>& splits) {
  const MindSporeParamLayout& l = p.layout;
  return Json{{"name", name},
              {"stages", p.stages},
              {"dev_matrix", l.dev_matrix},
              {"tensor_map", l.tensor_map},
              {"split_counts", splits},
              {"opt_weight_shard_size", l.opt_weight_shard_size},
              {"opt_weight_shard_step", l.opt_weight_shard_step},
              {"param_split_shape", l.param_split_shape},
              {"field", l.field}};
}

int RunShow(const StrategyArgs& args) {
  Result<MindSporeLayoutMap> map = ReadMindSporeLayouts(args.file);
  if (!map.ok()) return Fail(kShow, map.status());
  if (args.json) {
    Json params = Json::array();
    for (const auto& [name, p] : map->params) {
      params.push_back(LayoutJson(name, p, MindSporeSplitCounts(p.layout)));
    }
    PrintJson(Json{{"file", args.file},
                   {"stage_devices", map->stage_devices},
                   {"stages", map->stages},
                   {"params", std::move(params)}});
    return kExitOk;
  }
  fmt::print("{}: {} parameters, {} pipeline stage(s) of {} device(s)\n", args.file,
             map->params.size(), map->stages, map->stage_devices);
  Table table({"parameter", "stages", "dev_matrix", "tensor_map", "splits", "opt_shard"},
              {false, false, false, false, false, true});
  for (const auto& [name, p] : map->params) {
    const MindSporeParamLayout& l = p.layout;
    table.AddRow({name, fmt::format("{}", fmt::join(p.stages, ",")),
                  fmt::format("{}", fmt::join(l.dev_matrix, "x")), TensorMapText(l.tensor_map),
                  fmt::format("{}", fmt::join(MindSporeSplitCounts(l), "x")),
                  fmt::format("{}", l.opt_weight_shard_size)});
  }
  table.Print(stdout);
  return kExitOk;
}

int RunRanks(const StrategyArgs& args) {
  MindSporeTransformOptions o;
  if (!args.src_strategy.empty()) o.src_strategy_file = args.src_strategy;
  if (!args.dst_strategy.empty()) o.dst_strategy_file = args.dst_strategy;
  Result<std::vector<int64_t>> ranks = MindSporeRankListForTransform(args.rank, o);
  if (!ranks.ok()) return Fail(kRanks, ranks.status());
  if (args.json) {
    PrintJson(Json{{"rank", args.rank}, {"source_ranks", *ranks}});
  } else {
    fmt::print("destination rank {} needs source ranks {}\n", args.rank, fmt::join(*ranks, " "));
  }
  return kExitOk;
}

int RunMergeStrategies(const StrategyArgs& args) {
  Status s = MergeMindSporeStrategies(args.src_dir, args.dst_file);
  if (!s.ok()) return Fail(kMerge, s);
  Result<MindSporeLayoutMap> map = ReadMindSporeLayouts(args.dst_file);
  if (!map.ok()) return Fail(kMerge, map.status());
  fmt::print("merged the strategies of {} into {}: {} parameters, {} stages\n", args.src_dir,
             args.dst_file, map->params.size(), map->stages);
  return kExitOk;
}

}  // namespace

void RegisterStrategy(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<StrategyArgs>();
  CLI::App* cmd = app.add_subcommand("strategy", "MindSpore parallel strategy files");
  cmd->require_subcommand(1);

  CLI::App* show = cmd->add_subcommand("show", "Print a strategy file's layouts as a table");
  show->add_option("FILE", args->file, "Strategy file (protobuf or JSON)")->required();
  show->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  show->callback(
      [args, exit_code] { *exit_code = RunGuarded(kShow, [&] { return RunShow(*args); }); });

  CLI::App* ranks =
      cmd->add_subcommand("ranks", "The source ranks a destination rank needs in a transform");
  ranks->add_option("--rank", args->rank, "Destination rank")
      ->required()
      ->check(CLI::NonNegativeNumber);
  ranks->add_option("--src-strategy", args->src_strategy, "Source strategy (default: not split)");
  ranks->add_option("--dst-strategy", args->dst_strategy,
                    "Destination strategy (default: not split)");
  ranks->add_flag("--json", args->json, "Print one JSON object");
  ranks->callback(
      [args, exit_code] { *exit_code = RunGuarded(kRanks, [&] { return RunRanks(*args); }); });

  CLI::App* merge =
      cmd->add_subcommand("merge", "Merge per-stage pipeline strategy files into one");
  merge->add_option("SRC_DIR", args->src_dir, "Directory of the stages' strategy files")
      ->required();
  merge->add_option("DST_FILE", args->dst_file, "Merged strategy file to write")->required();
  merge->callback([args, exit_code] {
    *exit_code = RunGuarded(kMerge, [&] { return RunMergeStrategies(*args); });
  });
}

}  // namespace savepoint::cli
