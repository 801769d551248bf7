// `savepoint merge SRC DST [--format native|safetensors] [--max-file-bytes N] [--threads N]
// [--overwrite] [--json]`: rewrites a sharded (multi-rank) checkpoint with every tensor whole, as
// one process would have saved it, or as safetensors files in a new directory DST (split into
// files of at most N tensor bytes, with a Hugging Face index). Every chunk read is verified. Exit
// codes as for verify (docs/CLI.md).
#include <fmt/format.h>

#include <limits>
#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "savepoint/distributed.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "merge";

struct MergeArgs {
  std::string src;
  std::string dst;
  std::string format = "native";
  uint64_t max_file_bytes = 0;  // 0 = not given (one file)
  int threads = IoOptions().io_threads;
  bool overwrite = false;
  bool json = false;
};

// Tensors and shards of the source, for the report.
Status CountSource(const std::string& src, size_t* tensors, size_t* shards) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> r, CheckpointReader::Open(src));
  *tensors = r->tensors().size();
  *shards = 0;
  for (const TensorInfo& t : r->tensors()) *shards += t.num_shards;
  return Status::OK();
}

int RunMerge(const MergeArgs& args) {
  size_t tensors = 0, shards = 0;
  Status s = CountSource(args.src, &tensors, &shards);
  SaveStats stats;
  ProgressLine progress(kCommand, args.json);
  if (s.ok() && args.format == "safetensors") {
    MergeSafetensorsOptions o;
    o.load.progress = progress.Phase("reading");
    o.save.progress = progress.Phase("writing");
    o.max_file_bytes = args.max_file_bytes;
    o.save.stats = &stats;
    s = MergeToSafetensors(args.src, args.dst, o, {.io_threads = args.threads});
  } else if (s.ok()) {
    MergeOptions o;
    o.load.progress = progress.Phase("reading");
    o.save.overwrite = args.overwrite;
    o.save.stats = &stats;
    o.save.progress = progress.Phase("writing");
    s = MergeCheckpoint(args.src, args.dst, o, {.io_threads = args.threads});
  }
  progress.End();
  if (args.json) {
    Json out = Json::object();
    out["src"] = args.src;
    out["dst"] = args.dst;
    out["format"] = args.format;
    out["ok"] = s.ok();
    out["error"] = s.ok() ? Json(nullptr) : Json(s.ToString());
    out["code"] = StatusCodeName(s.code());
    out["tensors"] = tensors;
    out["source_shards"] = shards;
    out["bytes"] = stats.bytes;
    out["seconds"] = stats.seconds;
    PrintJson(out);
  }
  if (!s.ok()) return Fail(kCommand, s);
  if (!args.json) {
    fmt::print("OK: merged {} ({} tensors in {} shards) into {}: {} written in {:.3f} s\n",
               args.src, tensors, shards, args.dst, HumanBytes(stats.bytes), stats.seconds);
  }
  return kExitOk;
}

}  // namespace

void RegisterMerge(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<MergeArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Rewrite a sharded (multi-rank) checkpoint with every tensor whole");
  sub->add_option("SRC", args->src, "Checkpoint directory to read")->required();
  sub->add_option("DST", args->dst, "Checkpoint (or safetensors) directory to create")->required();
  sub->add_option("--format", args->format, "Output format")
      ->check(CLI::IsMember({"native", "safetensors"}))
      ->capture_default_str();
  CLI::Option* max_bytes =
      sub->add_option("--max-file-bytes", args->max_file_bytes,
                      "safetensors: at most N tensor bytes per file (several files + index)")
          ->check(CLI::Range(uint64_t{1}, std::numeric_limits<uint64_t>::max()));
  sub->add_option("--threads", args->threads, "Threads reading and writing chunks")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_flag("--overwrite", args->overwrite, "Replace an existing checkpoint at DST");
  sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->callback([args, exit_code, max_bytes] {
    if (max_bytes->count() > 0 && args->format != "safetensors") {
      throw CLI::ValidationError("--max-file-bytes", "needs --format safetensors");
    }
    if (args->overwrite && args->format == "safetensors") {
      throw CLI::ValidationError("--overwrite", "not supported with --format safetensors");
    }
    *exit_code = RunGuarded(kCommand, [&] { return RunMerge(*args); });
  });
}

}  // namespace savepoint::cli
