// Subcommands of the `savepoint` command-line tool (docs/CLI.md), one file per subcommand.
//
// Each Register* function adds one subcommand to `app`. When that subcommand runs, it stores its
// process exit code (see ExitCode in common.h) in `*exit_code`, which must outlive the parse.
#ifndef SAVEPOINT_TOOLS_COMMANDS_H_
#define SAVEPOINT_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "key_flags.h"
#include "savepoint/checkpoint.h"
#include "savepoint/status.h"

namespace savepoint::cli {

void RegisterInspect(CLI::App& app, int* exit_code);    // cmd_inspect.cc
void RegisterVerify(CLI::App& app, int* exit_code);     // cmd_verify.cc
void RegisterLs(CLI::App& app, int* exit_code);         // cmd_ls.cc
void RegisterCp(CLI::App& app, int* exit_code);         // cmd_cp.cc
void RegisterGc(CLI::App& app, int* exit_code);         // cmd_gc.cc
void RegisterConvert(CLI::App& app, int* exit_code);    // cmd_convert.cc
void RegisterMerge(CLI::App& app, int* exit_code);      // cmd_merge.cc
void RegisterStrategy(CLI::App& app, int* exit_code);   // cmd_strategy.cc
void RegisterTransform(CLI::App& app, int* exit_code);  // cmd_transform.cc
// cmd_controller.cc; only in builds with gRPC (SAVEPOINT_HAVE_FAILOVER).
void RegisterController(CLI::App& app, int* exit_code);

// `inspect` of a safetensors file (cmd_inspect_safetensors.cc); returns the exit code.
int RunInspectSafetensors(std::string_view command, const std::string& path, bool json, bool tree);

// `inspect` and `verify` of a MindSpore .ckpt file (cmd_ckpt.cc), as the two above; `dec` is the
// key of an encrypted file.
int RunInspectCkpt(std::string_view command, const std::string& path, bool json,
                   const KeyFlags& dec);
struct VerifyReport;
VerifyReport VerifyCkptFile(const std::string& path, int threads, const ProgressFn& progress,
                            const KeyFlags& dec);

// What `verify` found, for either format (printed by PrintVerifyReport in cmd_verify.cc).
struct VerifyReport {
  std::string path;
  std::string format;  // "native", "safetensors" or "ckpt"
  // Whether the data was checked against checksums (safetensors: none; ckpt: its CRC-32 trailer
  // when it has one, counted as one chunk).
  bool checksums = true;
  Status status;
  size_t tensors = 0;
  LoadStats stats;  // bytes: logical tensor bytes verified; stored_bytes: as read from disk
};

// Prints `r` (the --json object, or the human line on success) and the error line on failure;
// returns the exit code.
int PrintVerifyReport(const VerifyReport& r, bool json);

// `verify` of a safetensors file (cmd_verify_safetensors.cc): the header validated, every tensor
// byte read on `threads` threads. Fills everything but the printing; `progress` as for LoadOptions.
VerifyReport VerifySafetensorsFile(const std::string& path, int threads,
                                   const ProgressFn& progress);

}  // namespace savepoint::cli

#endif  // SAVEPOINT_TOOLS_COMMANDS_H_
