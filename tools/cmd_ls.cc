// `savepoint ls ROOT [--json]`: lists the checkpoints under a root directory, committed ones and
// debris of crashed saves, oldest first.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "ls";

struct LsArgs {
  std::string root;
  bool json = false;
};

std::string StatusText(const CheckpointEntry& e) {
  return e.committed ? "ok" : "INCOMPLETE: " + e.problem;
}

void PrintHuman(const std::string& root, const std::vector<CheckpointEntry>& entries) {
  if (entries.empty()) {
    fmt::print("no checkpoints under {}\n", root);
    return;
  }
  Table table({"NAME", "STEP", "SIZE", "CREATED", "STATUS"}, {false, true, true, false, false});
  for (const CheckpointEntry& e : entries) {
    table.AddRow({e.name, e.step ? std::to_string(*e.step) : "-", HumanBytes(e.bytes),
                  IsoTimeUtc(e.created_ns), StatusText(e)});
  }
  table.Print(stdout);
}

Json EntryJson(const CheckpointEntry& e) {
  return {{"name", e.name},
          {"path", e.path},
          {"committed", e.committed},
          {"problem", e.committed ? Json(nullptr) : Json(e.problem)},
          {"step", e.step ? Json(*e.step) : Json(nullptr)},
          {"bytes", e.bytes},
          {"created_ns", e.created_ns},
          {"tensors", e.num_tensors}};
}

void PrintJsonReport(const std::string& root, const std::vector<CheckpointEntry>& entries) {
  Json list = Json::array();
  for (const CheckpointEntry& e : entries) list.push_back(EntryJson(e));
  PrintJson({{"root", root}, {"checkpoints", std::move(list)}});
}

int RunLs(const LsArgs& args) {
  Result<std::vector<CheckpointEntry>> entries = ListCheckpoints(args.root);
  if (!entries.ok()) return Fail(kCommand, entries.status());
  if (args.json) {
    PrintJsonReport(args.root, *entries);
  } else {
    PrintHuman(args.root, *entries);
  }
  return kExitOk;
}

}  // namespace

void RegisterLs(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LsArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "List checkpoints under a directory, including debris of crashed saves");
  sub->add_option("ROOT", args->root, "Directory holding checkpoint directories")->required();
  sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunLs(*args); }); });
}

}  // namespace savepoint::cli
