// Internal: validated, resolved manager options and checkpoint naming.
#ifndef SAVEPOINT_MANAGER_OPTIONS_H_
#define SAVEPOINT_MANAGER_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/manager.h"

namespace savepoint::manager {

// The save and retention rules after MindSpore's precedence rules are applied.
struct Policy {
  int64_t save_steps = 0;    // > 0: save by steps
  int64_t save_seconds = 0;  // > 0 (and save_steps == 0): save by time
  bool keep_all = false;
  int64_t keep_last_n = 0;         // > 0 unless keep_all or keep_per_minutes
  int64_t keep_per_minutes = 0;    // > 0 only when keep_last_n == 0
  int64_t keep_every_n_steps = 0;  // 0: off
  int64_t keep_best_n = 0;         // 0: off
  std::string best_metric;
  MetricMode best_mode = MetricMode::kMin;
};

// Precondition: ValidateManagerOptions(options) is OK.
Policy ResolvePolicy(const ManagerOptions& options);
// The retention rules of `retention` alone (save_steps and save_seconds 0): the remote tier's.
Policy ResolveRetention(const RetentionPolicy& retention);
// `path` without trailing slashes ("/" stays "/"): the form the remote tier compares and joins.
std::string WithoutTrailingSlashes(std::string path);

// OK when `prefix` can start a checkpoint name; `what` names it in the message ("prefix", ...).
Status ValidatePrefix(std::string_view prefix, std::string_view what);

// "{prefix}-{epoch}_{step_in_epoch}", plus "_breakpoint" for a breakpoint.
std::string CheckpointName(std::string_view prefix, const StepInfo& info, bool breakpoint);

// What a checkpoint name "{prefix}-{epoch}_{step_in_epoch}[_breakpoint]" says (the prefix may
// contain '-' and '_': the last '-' starts the suffix); nullopt for other names.
struct NameParts {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  bool breakpoint = false;
};
std::optional<NameParts> ParseCheckpointName(std::string_view name);

// MindSpore's conflict rule: `prefix` if no name in `existing` uses it, else "{prefix}_{n}" with
// n one more than the largest suffix in use (1 when only the bare prefix is used).
std::string ResolvePrefixConflict(const std::string& prefix,
                                  const std::vector<std::string>& existing);

// The series prefix of a checkpoint name of `prefix`'s series: "{prefix}" for "{prefix}-...",
// "{prefix}_{n}" for "{prefix}_{n}-..."; nullopt for a name of no such series.
std::optional<std::string> SeriesOf(std::string_view prefix, std::string_view name);

// The key under which the manager records its metadata in a checkpoint.
inline constexpr const char* kMetaKey = "savepoint.manager";

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_OPTIONS_H_
