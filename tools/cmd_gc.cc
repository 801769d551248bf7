// `savepoint gc ROOT [--dry-run] [--min-age SECONDS] [--json]`: removes debris of crashed saves
// under a root directory (temporary directories of unfinished saves, leftovers of interrupted
// overwrites and deletes). A checkpoint set aside by an overwrite that crashed before the new one
// was committed is restored instead. Committed checkpoints are never touched.
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "common.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "gc";

// Hidden debris names (docs/FORMAT.md, "Directory layout").
constexpr std::string_view kTmpMarker = ".savepoint-tmp.";  // ".<name>.savepoint-tmp.<pid>.<hex>"
constexpr std::string_view kOldMarker = ".savepoint-old.";  // ".<name>.savepoint-old.<hex>"

// Upper bound of --min-age (about 285 years), so that it converts to nanoseconds without overflow.
constexpr int64_t kMaxMinAgeSeconds = 9'000'000'000;

struct GcArgs {
  std::string root;
  bool dry_run = false;
  int64_t min_age_seconds = 0;
  bool json = false;
};

// One path GarbageCollect returned: removed, or restored to `target`.
struct GcAction {
  std::string path;
  std::optional<std::string> target;
};

// For ".<name>.savepoint-old.<hex>", the checkpoint name; otherwise nullopt.
std::optional<std::string> SetAsideName(std::string_view entry) {
  if (entry.empty() || entry[0] != '.') return std::nullopt;
  size_t at = entry.rfind(kTmpMarker);
  if (at != std::string_view::npos && at > 1) return std::nullopt;
  at = entry.rfind(kOldMarker);
  if (at == std::string_view::npos || at <= 1) return std::nullopt;
  return std::string(entry.substr(1, at - 1));
}

// Set-aside checkpoints under `root` whose original is missing: GarbageCollect restores these
// (renames them back) rather than removing them. Maps debris path -> restore target.
std::vector<GcAction> FindRestorable(const std::string& root) {
  std::vector<GcAction> out;
  FileSystem* fs = DefaultFileSystem();
  Result<std::vector<FileInfo>> entries = fs->ListDir(root);
  if (!entries.ok()) return out;  // GarbageCollect reports the error
  for (const FileInfo& info : *entries) {
    std::optional<std::string> name = SetAsideName(info.name);
    if (!info.is_dir || !name) continue;
    std::string target = JoinPath(root, *name);
    if (!fs->Exists(target)) out.push_back({JoinPath(root, info.name), target});
  }
  return out;
}

// Pairs every path GarbageCollect returned with its restore target, if it was restored.
std::vector<GcAction> Classify(const std::vector<std::string>& paths,
                               const std::vector<GcAction>& restorable) {
  std::vector<GcAction> out;
  for (const std::string& p : paths) {
    GcAction a{p, std::nullopt};
    for (const GcAction& r : restorable) {
      if (r.path == p) a.target = r.target;
    }
    out.push_back(std::move(a));
  }
  return out;
}

void PrintHuman(const GcArgs& args, const std::vector<GcAction>& actions) {
  size_t restored = 0;
  const char* would = args.dry_run ? "would " : "";
  for (const GcAction& a : actions) {
    if (a.target) {
      fmt::print("{}{} {} -> {}\n", would, args.dry_run ? "restore" : "restored", a.path,
                 *a.target);
      ++restored;
    } else {
      fmt::print("{}{} {}\n", would, args.dry_run ? "remove" : "removed", a.path);
    }
  }
  size_t removed = actions.size() - restored;
  if (args.dry_run) {
    fmt::print("dry run: {} would be removed, {} would be restored\n", removed, restored);
  } else {
    fmt::print("{} removed, {} restored\n", removed, restored);
  }
}

void PrintJsonReport(const GcArgs& args, const std::vector<GcAction>& actions) {
  Json removed = Json::array();
  Json restored = Json::array();
  for (const GcAction& a : actions) {
    if (a.target) {
      restored.push_back({{"path", a.path}, {"target", *a.target}});
    } else {
      removed.push_back(a.path);
    }
  }
  PrintJson({{"root", args.root},
             {"dry_run", args.dry_run},
             {"removed", std::move(removed)},
             {"restored", std::move(restored)}});
}

int RunGc(const GcArgs& args) {
  GcOptions options;
  options.dry_run = args.dry_run;
  options.min_age_seconds = args.min_age_seconds;
  std::vector<GcAction> restorable = FindRestorable(args.root);
  Result<std::vector<std::string>> paths = GarbageCollect(args.root, options);
  if (!paths.ok()) return Fail(kCommand, paths.status());
  std::vector<GcAction> actions = Classify(*paths, restorable);
  if (args.json) {
    PrintJsonReport(args, actions);
  } else {
    PrintHuman(args, actions);
  }
  return kExitOk;
}

}  // namespace

void RegisterGc(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GcArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Remove debris of crashed saves under a directory (never committed checkpoints)");
  sub->add_option("ROOT", args->root, "Directory holding checkpoint directories")->required();
  sub->add_flag("--dry-run", args->dry_run, "Only report what would be removed or restored");
  sub->add_option("--min-age", args->min_age_seconds,
                  "Only touch debris last modified at least SECONDS ago")
      ->option_text("SECONDS")
      ->check(CLI::Range(int64_t{0}, kMaxMinAgeSeconds))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunGc(*args); }); });
}

}  // namespace savepoint::cli
