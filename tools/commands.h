// Subcommands of the `savepoint` command-line tool (docs/CLI.md), one file per subcommand.
//
// Each Register* function adds one subcommand to `app`. When that subcommand runs, it stores its
// process exit code (see ExitCode in common.h) in `*exit_code`, which must outlive the parse.
#ifndef SAVEPOINT_TOOLS_COMMANDS_H_
#define SAVEPOINT_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

namespace savepoint::cli {

void RegisterInspect(CLI::App& app, int* exit_code);  // cmd_inspect.cc
void RegisterVerify(CLI::App& app, int* exit_code);   // cmd_verify.cc
void RegisterLs(CLI::App& app, int* exit_code);       // cmd_ls.cc
void RegisterGc(CLI::App& app, int* exit_code);       // cmd_gc.cc
void RegisterConvert(CLI::App& app, int* exit_code);  // cmd_convert.cc
void RegisterMerge(CLI::App& app, int* exit_code);    // cmd_merge.cc

// `inspect` of a safetensors file (cmd_inspect_safetensors.cc); returns the exit code.
int RunInspectSafetensors(std::string_view command, const std::string& path, bool json);

}  // namespace savepoint::cli

#endif  // SAVEPOINT_TOOLS_COMMANDS_H_
