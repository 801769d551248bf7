// `savepoint verify PATH [--json] [--threads N]`: re-reads every chunk of every tensor of a
// checkpoint and checks its CRC32C, or, for a safetensors file, validates its header and reads
// every tensor byte (cmd_verify_safetensors.cc). Exits 0 when the checkpoint is intact; otherwise
// with the code of the error (corruption 2, not found 3, unimplemented 4, anything else 1).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "progress.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "verify";

struct VerifyArgs {
  std::string path;
  bool json = false;
  int threads = IoOptions().io_threads;
  KeyFlags dec;
};

VerifyReport VerifyNative(const VerifyArgs& args, const ProgressFn& progress) {
  VerifyReport out;
  out.path = args.path;
  out.format = "native";
  LoadOptions options;
  options.progress = progress;
  options.key = KeyOf(args.dec);
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(args.path, options, {.io_threads = args.threads});
  if (!reader.ok()) {
    out.status = reader.status();
    return out;
  }
  out.path = (*reader)->path();
  out.tensors = (*reader)->tensors().size();
  out.status = (*reader)->Verify(&out.stats);
  return out;
}

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

void PrintJsonReport(const VerifyReport& v) {
  Json out = Json::object();
  out["path"] = v.path;
  out["format"] = v.format;
  out["checksums"] = v.checksums;
  out["ok"] = v.status.ok();
  out["error"] = v.status.ok() ? Json(nullptr) : Json(v.status.ToString());
  out["code"] = StatusCodeName(v.status.code());
  out["tensors"] = v.tensors;
  out["bytes"] = v.stats.bytes;
  out["chunks"] = v.stats.chunks;
  out["seconds"] = v.stats.seconds;
  out["stored_bytes"] = v.stats.stored_bytes;
  out["throughput_gbps"] = v.stats.throughput_gbps();
  out["stored_throughput_gbps"] = Gbps(v.stats.stored_bytes, v.stats.seconds);
  out["direct_io"] = v.stats.direct_io;
  out["compression_ratio"] = v.stats.compression_ratio();
  PrintJson(out);
}

void PrintHumanReport(const VerifyReport& v) {
  const LoadStats& s = v.stats;
  std::string line;
  if (v.checksums) {
    line = fmt::format("OK: {}: {} tensors, {} bytes, {} chunks verified in {:.3f} s ({:.2f} GB/s)",
                       v.path, v.tensors, s.bytes, s.chunks, s.seconds, s.throughput_gbps());
  } else {
    line = fmt::format("OK: {}: {} file, {} tensors, {} bytes read in {:.3f} s ({:.2f} GB/s)",
                       v.path, v.format, v.tensors, s.bytes, s.seconds, s.throughput_gbps());
  }
  if (s.stored_bytes != s.bytes) {
    line += fmt::format("; stored: {} bytes read at {:.2f} GB/s, compression ratio {:.2f}",
                        s.stored_bytes, Gbps(s.stored_bytes, s.seconds), s.compression_ratio());
  }
  if (!v.checksums) {
    line += fmt::format("; header valid, every byte readable ({} has no checksums)", v.format);
  }
  fmt::print("{}\n", line);
}

int RunVerify(const VerifyArgs& args) {
  ProgressLine progress(kCommand, args.json);
  Result<FileInfo> st = DefaultFileSystem()->Stat(args.path);
  VerifyReport v = args.path.ends_with(".ckpt")
                       ? VerifyCkptFile(args.path, args.threads, progress.Phase(""), args.dec)
                   : st.ok() && !st->is_dir
                       ? VerifySafetensorsFile(args.path, args.threads, progress.Phase(""))
                       : VerifyNative(args, progress.Phase(""));
  progress.End();
  return PrintVerifyReport(v, args.json);
}

}  // namespace

int PrintVerifyReport(const VerifyReport& v, bool json) {
  if (json) PrintJsonReport(v);
  if (!v.status.ok()) return Fail(kCommand, v.status);
  if (!json) PrintHumanReport(v);
  return kExitOk;
}

void RegisterVerify(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand,
      "Check the CRC32C of every chunk of every tensor of a checkpoint (of a safetensors file: "
      "validate the header and read every byte; of a MindSpore .ckpt file: read every entry and "
      "check its CRC-32 trailer)");
  sub->add_option("PATH", args->path, "Checkpoint directory, .safetensors or .ckpt file")
      ->required();
  sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->add_option("--threads", args->threads, "Threads reading and checking chunks")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  AddKeyFlags(sub, &args->dec);
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunVerify(*args); }); });
}

}  // namespace savepoint::cli
