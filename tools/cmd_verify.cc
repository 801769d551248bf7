// `savepoint verify PATH [--json] [--threads N]`: re-reads every chunk of every tensor and checks
// its CRC32C. Exits 0 when the checkpoint is intact; otherwise with the code of the error
// (corruption 2, not found 3, unimplemented 4, anything else 1).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "verify";

struct VerifyArgs {
  std::string path;
  bool json = false;
  int threads = LoadOptions().io_threads;
};

struct VerifyOutcome {
  std::string path;  // as the reader normalized it, when it opened
  Status status;
  size_t tensors = 0;
  IoStats stats;
};

VerifyOutcome DoVerify(const VerifyArgs& args) {
  VerifyOutcome out;
  out.path = args.path;
  LoadOptions options;
  options.io_threads = args.threads;
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(args.path, options);
  if (!reader.ok()) {
    out.status = reader.status();
    return out;
  }
  out.path = (*reader)->path();
  out.tensors = (*reader)->tensors().size();
  out.status = (*reader)->Verify(&out.stats);
  return out;
}

void PrintJsonReport(const VerifyOutcome& v) {
  Json out = Json::object();
  out["path"] = v.path;
  out["ok"] = v.status.ok();
  out["error"] = v.status.ok() ? Json(nullptr) : Json(v.status.ToString());
  out["code"] = StatusCodeName(v.status.code());
  out["tensors"] = v.tensors;
  out["bytes"] = v.stats.bytes;
  out["chunks"] = v.stats.chunks;
  out["seconds"] = v.stats.seconds;
  out["stored_bytes"] = v.stats.stored_bytes;
  out["throughput_gbps"] = v.stats.throughput_gbps();
  out["direct_io"] = v.stats.direct_io;
  out["compression_ratio"] = v.stats.compression_ratio();
  PrintJson(out);
}

int RunVerify(const VerifyArgs& args) {
  VerifyOutcome v = DoVerify(args);
  if (args.json) PrintJsonReport(v);
  if (!v.status.ok()) return Fail(kCommand, v.status);
  if (!args.json) {
    fmt::print("OK: {}: {} tensors, {} bytes, {} chunks verified in {:.3f} s ({:.2f} GB/s)\n",
               v.path, v.tensors, v.stats.bytes, v.stats.chunks, v.stats.seconds,
               v.stats.throughput_gbps());
  }
  return kExitOk;
}

}  // namespace

void RegisterVerify(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Check the CRC32C of every chunk of every tensor of a checkpoint");
  sub->add_option("PATH", args->path, "Checkpoint directory")->required();
  sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->add_option("--threads", args->threads, "Threads reading and checking chunks")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunVerify(*args); }); });
}

}  // namespace savepoint::cli
