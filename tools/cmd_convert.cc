// `savepoint convert SRC DST [--from F] [--to F] [--crc] [--mindspore] [--overwrite]
// [--dec-key-file F [--dec-mode M]] [--enc-key-file F [--enc-mode M]]`: converts between a native
// checkpoint directory, a safetensors file and a MindSpore `.ckpt` file, any way, and imports a
// PyTorch DCP (FileSystemWriter) directory or a RecIS checkpoint directory, with its sparse tables
// (docs/CLI.md); encrypted `.ckpt` and native checkpoints are read and written with the key flags
// (key_flags.h).
//
// A format follows from --from / --to, else from the name: ".ckpt" is MindSpore, ".safetensors"
// is safetensors; otherwise the source is a RecIS checkpoint when it holds `index` and
// `model-*-of-*.safetensors` files, a DCP directory when it holds `.metadata` and no MANIFEST, a
// native checkpoint when it is another directory (else safetensors), and the target a native
// checkpoint directory. Native and safetensors sources are
// mapped, not copied, where the file system allows it, and written straight from the mapping.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "key_flags.h"
#include "progress.h"
#include "savepoint/dcp.h"
#include "savepoint/mindspore.h"
#include "savepoint/recis.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "convert";

enum class Format { kNative, kSafetensors, kMindSpore, kDcp, kRecis };

struct ConvertArgs {
  std::string src;
  std::string dst;
  std::string from;  // "", "native", "safetensors", "ckpt", "dcp" or "recis" (sources only)
  std::string to;
  bool crc = false;        // write MindSpore's CRC (.ckpt trailer, safetensors crc_num)
  bool mindspore = false;  // safetensors targets: MindSpore's flavour (format: ms)
  bool overwrite = false;
  KeyFlags dec{.decrypt = true};   // the source's key
  KeyFlags enc{.decrypt = false};  // the target's key
};

std::optional<Format> Named(const std::string& name) {
  if (name == "native") return Format::kNative;
  if (name == "safetensors") return Format::kSafetensors;
  if (name == "ckpt") return Format::kMindSpore;
  if (name == "dcp") return Format::kDcp;
  if (name == "recis") return Format::kRecis;
  return std::nullopt;
}

const char* FormatName(Format f) {
  switch (f) {
    case Format::kNative:
      return "native";
    case Format::kSafetensors:
      return "safetensors";
    case Format::kMindSpore:
      return "ckpt";
    case Format::kRecis:
      return "recis";
    case Format::kDcp:
      break;
  }
  return "dcp";
}

Result<Format> SourceFormat(const ConvertArgs& args) {
  if (!args.from.empty()) return *Named(args.from);
  if (args.src.ends_with(".ckpt")) return Format::kMindSpore;
  if (args.src.ends_with(".safetensors")) return Format::kSafetensors;
  SP_ASSIGN_OR_RETURN(FileInfo info, DefaultFileSystem()->Stat(args.src));
  if (!info.is_dir) return Format::kSafetensors;
  FileSystem* fs = DefaultFileSystem();
  if (IsRecisCheckpoint(args.src, fs)) return Format::kRecis;
  const bool dcp =
      fs->Exists(JoinPath(args.src, ".metadata")) && !fs->Exists(JoinPath(args.src, "MANIFEST"));
  return dcp ? Format::kDcp : Format::kNative;
}

Format TargetFormat(const ConvertArgs& args) {
  if (!args.to.empty()) return *Named(args.to);
  if (args.dst.ends_with(".ckpt")) return Format::kMindSpore;
  if (args.dst.ends_with(".safetensors")) return Format::kSafetensors;
  return Format::kNative;
}

// InvalidArgument when key flags are given for a format without encryption (safetensors), or a
// mode for a native checkpoint (always AES-256-GCM).
Status CheckKeyFlags(const KeyFlags& k, Format f) {
  const char* verb = k.decrypt ? "dec" : "enc";
  if ((f == Format::kSafetensors || f == Format::kDcp || f == Format::kRecis) &&
      !k.key_file.empty()) {
    return InvalidArgumentError(
        fmt::format("--{}-key-file: {} files are not encrypted", verb, FormatName(f)));
  }
  if (f == Format::kNative && !k.mode.empty()) {
    return InvalidArgumentError(
        fmt::format("--{}-mode applies to .ckpt files; native checkpoints use AES-256-GCM", verb));
  }
  return ModeOf(k).status();
}

// Reads a RecIS checkpoint; what it did not import goes to `notes`.
Result<State> LoadRecis(const ConvertArgs& args, ProgressLine& progress,
                        std::vector<std::string>* notes) {
  Result<RecisCheckpoint> r =
      LoadRecisCheckpoint(args.src, {.progress = progress.Phase("reading")});
  if (!r.ok()) return r.status();
  if (r->path != args.src) notes->push_back(fmt::format("read {} (the newest listed)", r->path));
  for (const std::string& s : r->skipped) notes->push_back("skipped " + s);
  return std::move(r->state);
}

// Reads the source (a native checkpoint's chunks are verified here: progress "reading").
Result<State> LoadAny(const ConvertArgs& args, Format f, ProgressLine& progress,
                      std::vector<std::string>* notes) {
  SP_RETURN_IF_ERROR(CheckKeyFlags(args.dec, f));
  switch (f) {
    case Format::kSafetensors:
      return LoadSafetensors(args.src, {.mmap = true, .progress = progress.Phase("reading")});
    case Format::kMindSpore:
      return LoadMindSporeCheckpoint(args.src, {.dec_key = KeyOf(args.dec),
                                                .dec_mode = *ModeOf(args.dec),
                                                .progress = progress.Phase("reading")});
    case Format::kDcp:
      return LoadDcpCheckpoint(args.src, {.progress = progress.Phase("reading")});
    case Format::kRecis:
      return LoadRecis(args, progress, notes);
    case Format::kNative:
      break;
  }
  const bool encrypted = !args.dec.key_file.empty();  // (encrypted checkpoints are not mapped)
  return Load(args.src,
              {.mmap = !encrypted, .progress = progress.Phase("reading"), .key = KeyOf(args.dec)});
}

Status SaveAny(const State& state, const ConvertArgs& args, Format f, ProgressLine& progress) {
  if (args.crc && f == Format::kNative) {
    return InvalidArgumentError(
        "--crc applies to .ckpt and .safetensors targets (native checkpoints always carry CRC32C "
        "per chunk)");
  }
  if (args.mindspore && f != Format::kSafetensors) {
    return InvalidArgumentError("--mindspore applies to a .safetensors target only");
  }
  SP_RETURN_IF_ERROR(CheckKeyFlags(args.enc, f));
  if (!state.tables().empty() && f != Format::kNative && f != Format::kDcp && f != Format::kRecis) {
    return InvalidArgumentError(
        fmt::format("--to {}: the source has {} sparse tables, which only native checkpoints hold",
                    FormatName(f), state.tables().size()));
  }
  switch (f) {
    case Format::kDcp:
    case Format::kRecis:
      return InvalidArgumentError(fmt::format(
          "--to {}: {} directories are a source only (write savepoint checkpoints through DCP "
          "with savepoint.torch.StorageWriter, or RecIS-style ones with savepoint.recis.Saver)",
          FormatName(f), FormatName(f)));
    case Format::kSafetensors:
      return SaveSafetensors(state, args.dst,
                             {.overwrite = args.overwrite,
                              .progress = progress.Phase("writing"),
                              .mindspore_format = args.mindspore || args.crc,
                              .crc_check = args.crc});
    case Format::kMindSpore:
      return SaveMindSporeCheckpoint(
          state, args.dst,
          {.overwrite = args.overwrite,
           .crc_check = args.crc,
           .enc_key = KeyOf(args.enc),
           .enc_mode = ModeOf(args.enc)->value_or(MindSporeCipher::kAesGcm),
           .progress = progress.Phase("writing")});
    case Format::kNative:
      break;
  }
  return Save(
      state, args.dst,
      {.overwrite = args.overwrite, .progress = progress.Phase("writing"), .key = KeyOf(args.enc)});
}

int RunConvert(const ConvertArgs& args) {
  Result<Format> from = SourceFormat(args);
  if (!from.ok()) return Fail(kCommand, from.status());
  const Format to = TargetFormat(args);
  ProgressLine progress(kCommand, /*json=*/false);
  std::vector<std::string> notes;
  Result<State> state = LoadAny(args, *from, progress, &notes);
  Status s = state.ok() ? SaveAny(*state, args, to, progress) : state.status();
  progress.End();
  if (!s.ok()) return Fail(kCommand, s);
  fmt::print("converted {} ({}) to {} ({}): {} tensors, {} values, {}\n", args.src,
             FormatName(*from), args.dst, FormatName(to), state->num_tensors(),
             state->size() - state->num_tensors(), HumanBytes(state->tensor_bytes()));
  if (!state->tables().empty()) {
    uint64_t rows = 0;
    for (const auto& [name, t] : state->tables()) rows += static_cast<uint64_t>(t->num_rows());
    fmt::print("  {} sparse tables, {} rows\n", state->tables().size(), rows);
  }
  for (const std::string& n : notes) fmt::print("  {}\n", n);
  return kExitOk;
}

}  // namespace

void RegisterConvert(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand,
      "Convert between native checkpoints, safetensors and MindSpore .ckpt files; import PyTorch "
      "DCP and RecIS checkpoint directories");
  sub->add_option("SRC", args->src,
                  "Checkpoint directory, DCP or RecIS directory, .safetensors or .ckpt file")
      ->required();
  sub->add_option("DST", args->dst, "Target checkpoint directory, .safetensors or .ckpt file")
      ->required();
  const auto formats = CLI::IsMember({"native", "safetensors", "ckpt", "dcp", "recis"});
  sub->add_option("--from", args->from, "Source format (default: from SRC)")->check(formats);
  sub->add_option("--to", args->to, "Target format (default: from DST's extension)")
      ->check(formats);
  sub->add_flag("--crc", args->crc,
                "Write MindSpore's CRC-32: a .ckpt trailer, or a .safetensors crc_num (implies "
                "--mindspore)");
  sub->add_flag("--mindspore", args->mindspore,
                "Write MindSpore's safetensors flavour (\"format\": \"ms\"), as "
                "mindspore.save_checkpoint(format=\"safetensors\") does");
  sub->add_flag("--overwrite", args->overwrite, "Replace an existing target");
  AddKeyFlags(sub, &args->dec);
  AddKeyFlags(sub, &args->enc);
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunConvert(*args); }); });
}

}  // namespace savepoint::cli
