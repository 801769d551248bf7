// The `savepoint` command-line tool: inspect, verify, list, clean up, convert and merge
// checkpoints (and safetensors files).
// Usage and exit codes: docs/CLI.md. Each subcommand lives in its own cmd_*.cc file.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <string>

#include "commands.h"
#include "common.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

// "savepoint: [<subcommand>: ]<message>" plus a pointer to --help, for usage errors.
std::string UsageFailure(const CLI::App* app, const CLI::Error& e) {
  std::string where = "savepoint";
  for (const CLI::App* sub : app->get_subcommands()) where += " " + sub->get_name();
  std::string message = e.what();
  if (app->get_subcommands().empty() && !app->remaining().empty()) {
    std::string arg = app->remaining().front();  // remaining() returns a copy
    message = fmt::format("unknown {} '{}'", arg.starts_with('-') ? "option" : "subcommand", arg);
  }
  std::string prefix = where == "savepoint" ? "" : where.substr(where.find(' ') + 1) + ": ";
  return fmt::format("savepoint: {}{}\nRun '{} --help' for usage.\n", prefix, message, where);
}

int Main(int argc, char** argv) {
  CLI::App app("savepoint " + std::string(Version()) +
                   ": inspect, verify, list, clean up, convert and merge savepoint checkpoints",
               "savepoint");
  app.failure_message(UsageFailure);  // before the subcommands, which inherit it
  app.set_version_flag("--version", std::string("savepoint ") + Version());
  app.require_subcommand(1);
  int exit_code = kExitOk;
  RegisterInspect(app, &exit_code);
  RegisterVerify(app, &exit_code);
  RegisterLs(app, &exit_code);
  RegisterCp(app, &exit_code);
  RegisterGc(app, &exit_code);
  RegisterConvert(app, &exit_code);
  RegisterMerge(app, &exit_code);
  RegisterStrategy(app, &exit_code);
  RegisterTransform(app, &exit_code);
#ifdef SAVEPOINT_HAVE_FAILOVER
  RegisterController(app, &exit_code);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // prints help, version or the usage error
    return rc == 0 ? kExitOk : kExitUsage;
  }
  return exit_code;
}

}  // namespace
}  // namespace savepoint::cli

int main(int argc, char** argv) {
  try {
    return savepoint::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "savepoint: internal error: {}\n", e.what());
  } catch (...) {
    fmt::print(stderr, "savepoint: internal error: unknown exception\n");
  }
  return savepoint::cli::kExitError;
}
