// `savepoint convert SRC DST [--from F] [--to F] [--crc] [--mindspore] [--overwrite]
// [--dec-key-file F [--dec-mode M]] [--enc-key-file F [--enc-mode M]]`: converts between a native
// checkpoint directory, a safetensors file and a MindSpore `.ckpt` file, any way, and imports a
// PyTorch DCP (FileSystemWriter) directory or a RecIS checkpoint directory, with its sparse tables
// (docs/CLI.md); encrypted `.ckpt` and native checkpoints are read and written with the key flags
// (key_flags.h).
//
// A format follows from --from / --to, else from the path (DetectFormat and TargetFormat,
// savepoint/format.h). The work is the library's Convert (savepoint/checkpoint.h); this command
// maps its flags onto ConvertOptions and names the flag when one does not fit the formats.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "key_flags.h"
#include "progress.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "convert";

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

// InvalidArgument naming the flag when key flags are given for a format without encryption, or a
// mode for a native checkpoint (always AES-256-GCM). (The library names its option fields; the
// CLI names its flags.)
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

Status CheckFlags(const ConvertArgs& args, Format from, Format to) {
  if (args.crc && to == Format::kNative) {
    return InvalidArgumentError(
        "--crc applies to .ckpt and .safetensors targets (native checkpoints always carry CRC32C "
        "per chunk)");
  }
  if (args.mindspore && to != Format::kSafetensors) {
    return InvalidArgumentError("--mindspore applies to a .safetensors target only");
  }
  SP_RETURN_IF_ERROR(CheckKeyFlags(args.dec, from));
  return CheckKeyFlags(args.enc, to);
}

void PrintReport(const ConvertArgs& args, const ConvertReport& r) {
  fmt::print("converted {} ({}) to {} ({}): {} tensors, {} values, {}\n", args.src,
             FormatName(r.from), args.dst, FormatName(r.to), r.tensors, r.values,
             HumanBytes(r.tensor_bytes));
  if (r.tables > 0) fmt::print("  {} sparse tables, {} rows\n", r.tables, r.table_rows);
  for (const std::string& n : r.notes) fmt::print("  {}\n", n);
}

int RunConvert(const ConvertArgs& args) {
  Result<Format> from = args.from.empty() ? DetectFormat(args.src) : ParseFormat(args.from);
  if (!from.ok()) return Fail(kCommand, from.status());
  const Format to = args.to.empty() ? TargetFormat(args.dst) : *ParseFormat(args.to);
  if (Status s = CheckFlags(args, *from, to); !s.ok()) return Fail(kCommand, s);
  ProgressLine progress(kCommand, /*json=*/false);
  Result<ConvertReport> r = Convert(args.src, args.dst,
                                    {.from = *from,
                                     .to = to,
                                     .overwrite = args.overwrite,
                                     .source_key = KeyOf(args.dec),
                                     .source_cipher = *ModeOf(args.dec),
                                     .key = KeyOf(args.enc),
                                     .cipher = ModeOf(args.enc)->value_or(Cipher::kAesGcm),
                                     .file_checksum = args.crc,
                                     .mindspore_flavour = args.mindspore,
                                     .read_progress = progress.Phase("reading"),
                                     .write_progress = progress.Phase("writing")});
  progress.End();
  if (!r.ok()) return Fail(kCommand, r.status());
  PrintReport(args, *r);
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
