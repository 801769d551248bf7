// `savepoint transform --src DIR --dst DIR [--src-strategy F] [--dst-strategy F] [--prefix P]
// [--format ckpt|safetensors|native] [--rank N]... [--memory-budget BYTES] [--threads N] [--json]`:
// moves a MindSpore distributed checkpoint (rank_N/ directories of .ckpt files) from one parallel
// layout to another, as mindspore.parallel.transform_checkpoints does
// (savepoint/mindspore_strategy.h, docs/CLI.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "transform";

struct TransformArgs {
  std::string src;
  std::string dst;
  std::string src_strategy;  // "" = not split
  std::string dst_strategy;
  std::string prefix = "checkpoint_";
  std::string format = "ckpt";
  std::vector<int64_t> ranks;
  uint64_t memory_budget = MindSporeTransformOptions().memory_budget_bytes;
  int threads = IoOptions().io_threads;
  bool json = false;
};

int RunTransform(const TransformArgs& args) {
  MindSporeTransformOptions o;
  if (!args.src_strategy.empty()) o.src_strategy_file = args.src_strategy;
  if (!args.dst_strategy.empty()) o.dst_strategy_file = args.dst_strategy;
  o.ranks = args.ranks;
  o.memory_budget_bytes = args.memory_budget;
  Result<MindSporeTransformFormat> format = MindSporeTransformFormatFromName(args.format);
  if (!format.ok()) return Fail(kCommand, format.status());
  o.output_format = *format;
  ProgressLine progress(kCommand, args.json);
  o.progress = progress.Phase("");
  const auto t0 = std::chrono::steady_clock::now();
  Status s = MindSporeTransformCheckpoints(args.src, args.dst, args.prefix, o,
                                           {.io_threads = args.threads});
  progress.End();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (args.json) {
    PrintJson(Json{{"src", args.src},
                   {"dst", args.dst},
                   {"ok", s.ok()},
                   {"error", s.ok() ? Json(nullptr) : Json(s.ToString())},
                   {"code", StatusCodeName(s.code())},
                   {"seconds", seconds}});
  }
  if (!s.ok()) return Fail(kCommand, s);
  if (!args.json) {
    fmt::print("OK: transformed {} into {} ({}) in {:.3f} s\n", args.src, args.dst,
               args.ranks.empty() ? std::string("every rank")
                                  : fmt::format("ranks {}", fmt::join(args.ranks, " ")),
               seconds);
  }
  return kExitOk;
}

}  // namespace

void RegisterTransform(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<TransformArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Move a MindSpore distributed checkpoint to another parallel layout");
  sub->add_option("--src", args->src, "Source directory of rank_N/ subdirectories")->required();
  sub->add_option("--dst", args->dst, "Destination directory")->required();
  sub->add_option("--src-strategy", args->src_strategy,
                  "Source strategy file (default: not split)");
  sub->add_option("--dst-strategy", args->dst_strategy,
                  "Destination strategy file (default: not split)");
  sub->add_option("--prefix", args->prefix, "Output file prefix: rank_N/{prefix}N.ckpt")
      ->capture_default_str();
  sub->add_option("--format", args->format,
                  "Output format: .ckpt, MindSpore's safetensors, or a native checkpoint per rank")
      ->check(CLI::IsMember({"ckpt", "safetensors", "native"}))
      ->capture_default_str();
  sub->add_option("--rank", args->ranks, "Destination rank to write (repeat; default: all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--memory-budget", args->memory_budget,
                  "Most destination tensor bytes in memory at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--threads", args->threads, "Destination ranks and reads in parallel")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->callback([args, exit_code] {
    *exit_code = RunGuarded(kCommand, [&] { return RunTransform(*args); });
  });
}

}  // namespace savepoint::cli
