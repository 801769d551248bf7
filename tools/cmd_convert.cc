// `savepoint convert SRC DST [--to native|safetensors] [--overwrite]`: converts between a native
// checkpoint directory and a safetensors file, either way (docs/CLI.md).
//
// The source format follows from SRC (a directory is a native checkpoint, a file is read as
// safetensors); the target format from --to, else from DST (a name ending in ".safetensors" is a
// safetensors file, anything else a checkpoint directory). Tensors are mapped, not copied, where
// the file system allows it, and written straight from the mapping.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "convert";

struct ConvertArgs {
  std::string src;
  std::string dst;
  std::string to;  // "", "native" or "safetensors"
  bool overwrite = false;
};

bool EndsWithSafetensors(const std::string& path) { return path.ends_with(".safetensors"); }

Result<bool> SourceIsSafetensors(const std::string& src) {
  SP_ASSIGN_OR_RETURN(FileInfo info, DefaultFileSystem()->Stat(src));
  return !info.is_dir;
}

// Maps the source (a native checkpoint's chunks are verified here: progress "reading").
Result<State> LoadAny(const std::string& src, bool safetensors, ProgressLine& progress) {
  if (safetensors) {
    SafetensorsLoadOptions o;
    o.mmap = true;
    o.progress = progress.Phase("reading");
    return LoadSafetensors(src, o);
  }
  LoadOptions o;
  o.mmap = true;
  o.progress = progress.Phase("reading");
  return Load(src, o);
}

Status SaveAny(const State& state, const std::string& dst, bool safetensors, bool overwrite,
               ProgressLine& progress) {
  if (safetensors) {
    SafetensorsSaveOptions o;
    o.overwrite = overwrite;
    o.progress = progress.Phase("writing");
    return SaveSafetensors(state, dst, o);
  }
  SaveOptions o;
  o.overwrite = overwrite;
  o.progress = progress.Phase("writing");
  return Save(state, dst, o);
}

const char* FormatName(bool safetensors) { return safetensors ? "safetensors" : "native"; }

int RunConvert(const ConvertArgs& args) {
  Result<bool> from_st = SourceIsSafetensors(args.src);
  if (!from_st.ok()) return Fail(kCommand, from_st.status());
  const bool to_st = args.to.empty() ? EndsWithSafetensors(args.dst) : args.to == "safetensors";
  ProgressLine progress(kCommand, /*json=*/false);
  Result<State> state = LoadAny(args.src, *from_st, progress);
  Status s =
      state.ok() ? SaveAny(*state, args.dst, to_st, args.overwrite, progress) : state.status();
  progress.End();
  if (!s.ok()) return Fail(kCommand, s);
  fmt::print("converted {} ({}) to {} ({}): {} tensors, {} values, {}\n", args.src,
             FormatName(*from_st), args.dst, FormatName(to_st), state->num_tensors(),
             state->size() - state->num_tensors(), HumanBytes(state->tensor_bytes()));
  return kExitOk;
}

}  // namespace

void RegisterConvert(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Convert between a native checkpoint and a safetensors file (either way)");
  sub->add_option("SRC", args->src, "Checkpoint directory or .safetensors file")->required();
  sub->add_option("DST", args->dst, "Target checkpoint directory or .safetensors file")->required();
  sub->add_option("--to", args->to, "Target format (default: from DST's extension)")
      ->check(CLI::IsMember({"native", "safetensors"}));
  sub->add_flag("--overwrite", args->overwrite, "Replace an existing target");
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunConvert(*args); }); });
}

}  // namespace savepoint::cli
