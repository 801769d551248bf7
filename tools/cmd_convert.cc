// `savepoint convert SRC DST [--from F] [--to F] [--crc] [--overwrite]`: converts between a native
// checkpoint directory, a safetensors file and a MindSpore `.ckpt` file, any way (docs/CLI.md).
//
// A format follows from --from / --to, else from the name: ".ckpt" is MindSpore, ".safetensors"
// is safetensors; otherwise the source is a native checkpoint when it is a directory (else
// safetensors) and the target a native checkpoint directory. Native and safetensors sources are
// mapped, not copied, where the file system allows it, and written straight from the mapping.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "savepoint/mindspore.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "convert";

enum class Format { kNative, kSafetensors, kMindSpore };

struct ConvertArgs {
  std::string src;
  std::string dst;
  std::string from;  // "", "native", "safetensors" or "ckpt"
  std::string to;
  bool crc = false;  // write MindSpore's CRC trailer (.ckpt targets)
  bool overwrite = false;
};

std::optional<Format> Named(const std::string& name) {
  if (name == "native") return Format::kNative;
  if (name == "safetensors") return Format::kSafetensors;
  if (name == "ckpt") return Format::kMindSpore;
  return std::nullopt;
}

const char* FormatName(Format f) {
  return f == Format::kNative ? "native" : f == Format::kSafetensors ? "safetensors" : "ckpt";
}

Result<Format> SourceFormat(const ConvertArgs& args) {
  if (!args.from.empty()) return *Named(args.from);
  if (args.src.ends_with(".ckpt")) return Format::kMindSpore;
  if (args.src.ends_with(".safetensors")) return Format::kSafetensors;
  SP_ASSIGN_OR_RETURN(FileInfo info, DefaultFileSystem()->Stat(args.src));
  return info.is_dir ? Format::kNative : Format::kSafetensors;
}

Format TargetFormat(const ConvertArgs& args) {
  if (!args.to.empty()) return *Named(args.to);
  if (args.dst.ends_with(".ckpt")) return Format::kMindSpore;
  if (args.dst.ends_with(".safetensors")) return Format::kSafetensors;
  return Format::kNative;
}

// Reads the source (a native checkpoint's chunks are verified here: progress "reading").
Result<State> LoadAny(const std::string& src, Format f, ProgressLine& progress) {
  switch (f) {
    case Format::kSafetensors:
      return LoadSafetensors(src, {.mmap = true, .progress = progress.Phase("reading")});
    case Format::kMindSpore:
      return LoadMindSporeCheckpoint(src, {.progress = progress.Phase("reading")});
    case Format::kNative:
      break;
  }
  return Load(src, {.mmap = true, .progress = progress.Phase("reading")});
}

Status SaveAny(const State& state, const ConvertArgs& args, Format f, ProgressLine& progress) {
  if (args.crc && f != Format::kMindSpore) {
    return InvalidArgumentError("--crc applies to a MindSpore .ckpt target only");
  }
  switch (f) {
    case Format::kSafetensors:
      return SaveSafetensors(state, args.dst,
                             {.overwrite = args.overwrite, .progress = progress.Phase("writing")});
    case Format::kMindSpore:
      return SaveMindSporeCheckpoint(state, args.dst,
                                     {.overwrite = args.overwrite,
                                      .crc_check = args.crc,
                                      .progress = progress.Phase("writing")});
    case Format::kNative:
      break;
  }
  return Save(state, args.dst,
              {.overwrite = args.overwrite, .progress = progress.Phase("writing")});
}

int RunConvert(const ConvertArgs& args) {
  Result<Format> from = SourceFormat(args);
  if (!from.ok()) return Fail(kCommand, from.status());
  const Format to = TargetFormat(args);
  ProgressLine progress(kCommand, /*json=*/false);
  Result<State> state = LoadAny(args.src, *from, progress);
  Status s = state.ok() ? SaveAny(*state, args, to, progress) : state.status();
  progress.End();
  if (!s.ok()) return Fail(kCommand, s);
  fmt::print("converted {} ({}) to {} ({}): {} tensors, {} values, {}\n", args.src,
             FormatName(*from), args.dst, FormatName(to), state->num_tensors(),
             state->size() - state->num_tensors(), HumanBytes(state->tensor_bytes()));
  return kExitOk;
}

}  // namespace

void RegisterConvert(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Convert between native checkpoints, safetensors and MindSpore .ckpt files");
  sub->add_option("SRC", args->src, "Checkpoint directory, .safetensors or .ckpt file")->required();
  sub->add_option("DST", args->dst, "Target checkpoint directory, .safetensors or .ckpt file")
      ->required();
  const auto formats = CLI::IsMember({"native", "safetensors", "ckpt"});
  sub->add_option("--from", args->from, "Source format (default: from SRC)")->check(formats);
  sub->add_option("--to", args->to, "Target format (default: from DST's extension)")
      ->check(formats);
  sub->add_flag("--crc", args->crc, "Append MindSpore's CRC-32 trailer (.ckpt targets)");
  sub->add_flag("--overwrite", args->overwrite, "Replace an existing target");
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunConvert(*args); }); });
}

}  // namespace savepoint::cli
