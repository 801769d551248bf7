// `savepoint cp SOURCE TARGET [--overwrite] [--threads N] [--json]`: copies a committed checkpoint
// directory between a disk and a bucket (either way) or within one, committed whole at the target
// (CopyCheckpoint), with a progress line on a terminal.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "cp";

struct CpArgs {
  std::string source;
  std::string target;
  bool overwrite = false;
  int threads = 4;
  bool json = false;
};

int RunCp(const CpArgs& args) {
  ProgressLine progress(kCommand, args.json);
  CopyOptions o;
  o.overwrite = args.overwrite;
  o.threads = args.threads;
  o.progress = progress.Phase("");
  Result<CopyStats> st = CopyCheckpoint(args.source, args.target, o);
  progress.End();
  if (!st.ok()) return Fail(kCommand, st.status());
  const double mbps = st->seconds > 0 ? st->bytes / st->seconds / 1e6 : 0;
  if (args.json) {
    PrintJson({{"source", args.source},
               {"target", args.target},
               {"files", st->files},
               {"bytes", st->bytes},
               {"seconds", st->seconds}});
  } else {
    fmt::print("copied {} to {}: {} files, {} in {:.2f} s ({:.0f} MB/s)\n", args.source,
               args.target, st->files, HumanBytes(st->bytes), st->seconds, mbps);
  }
  return kExitOk;
}

}  // namespace

void RegisterCp(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<CpArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Copy a checkpoint (disk or s3://, either way), committed whole at the target");
  sub->add_option("SOURCE", args->source, "Committed checkpoint directory")->required();
  sub->add_option("TARGET", args->target, "Where the copy goes (must not hold a checkpoint)")
      ->required();
  sub->add_flag("--overwrite", args->overwrite,
                "Replace a checkpoint at TARGET (not in a bucket: delete it there first)");
  sub->add_option("--threads", args->threads, "Blocks copied at the same time (1..64)")
      ->default_val(4);
  sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunCp(*args); }); });
}

}  // namespace savepoint::cli
