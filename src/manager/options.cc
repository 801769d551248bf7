// ManagerOptions validation (the rules of MindSpore's CheckpointConfig, plus ours), the resolved
// policy, and checkpoint naming.
#include "manager/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <utility>

#include "savepoint/mindspore.h"

namespace savepoint::manager {
namespace {

constexpr size_t kMaxPrefixBytes = 200;

Status NonNegative(const char* field, int64_t value) {
  if (value >= 0) return Status::OK();
  return InvalidArgumentError(
      fmt::format("ManagerOptions.{} = {}: must be 0 (off) or positive", field, value));
}

// `r` is ManagerOptions.<field>.
Status ValidateRetention(const RetentionPolicy& r, const std::string& field) {
  SP_RETURN_IF_ERROR(NonNegative((field + ".keep_last_n").c_str(), r.keep_last_n));
  SP_RETURN_IF_ERROR(NonNegative((field + ".keep_per_n_minutes").c_str(), r.keep_per_n_minutes));
  SP_RETURN_IF_ERROR(NonNegative((field + ".keep_every_n_steps").c_str(), r.keep_every_n_steps));
  SP_RETURN_IF_ERROR(NonNegative((field + ".keep_best_n").c_str(), r.keep_best_n));
  if (r.keep_best_n > 0 && r.best_metric.empty()) {
    return InvalidArgumentError(
        fmt::format("ManagerOptions.{0}.keep_best_n = {1} needs {0}.best_metric (the metric to "
                    "rank by)",
                    field, r.keep_best_n));
  }
  if (r.keep_best_n == 0 && !r.best_metric.empty()) {
    return InvalidArgumentError(
        fmt::format("ManagerOptions.{0}.best_metric = {1:?} is set but {0}.keep_best_n is 0", field,
                    r.best_metric));
  }
  return Status::OK();
}

// The remote tier: a location that is not the local directory, native checkpoints, sane limits.
Status ValidateRemote(const ManagerOptions& o) {
  const RemoteTier& r = o.remote;
  if (r.location.empty()) {
    const RemoteTier d;
    if (r.upload_every_n_steps != d.upload_every_n_steps || r.threads != d.threads ||
        r.max_bytes_per_second != d.max_bytes_per_second || r.fs != nullptr) {
      return InvalidArgumentError(
          "ManagerOptions.remote: options are set but remote.location is empty (no remote tier)");
    }
    return Status::OK();
  }
  if (o.storage.format != CheckpointFormat::kNative) {
    return InvalidArgumentError(fmt::format(
        "ManagerOptions.remote.location = {:?}: the remote tier holds native checkpoints only "
        "(storage.format is {})",
        r.location, FormatName(o.storage.format)));
  }
  if (o.naming.directory_fn) {
    return InvalidArgumentError(fmt::format(
        "ManagerOptions.remote.location = {:?}: a remote tier needs one checkpoint directory "
        "(naming.directory), not naming.directory_fn",
        r.location));
  }
  if (r.upload_every_n_steps < 1) {
    return InvalidArgumentError(fmt::format(
        "ManagerOptions.remote.upload_every_n_steps = {}: must be >= 1", r.upload_every_n_steps));
  }
  if (r.threads < 1 || r.threads > 64) {
    return InvalidArgumentError(
        fmt::format("ManagerOptions.remote.threads = {}: must be in 1..64", r.threads));
  }
  const std::string remote = WithoutTrailingSlashes(r.location);
  const std::string local = WithoutTrailingSlashes(o.naming.directory);
  if (!local.empty() &&
      (remote == local || remote.starts_with(local + "/") || local.starts_with(remote + "/"))) {
    return InvalidArgumentError(fmt::format(
        "ManagerOptions.remote.location = {:?}: must not be the checkpoint directory {:?}, inside "
        "it or above it",
        r.location, o.naming.directory));
  }
  return ValidateRetention(r.retention, "remote.retention");
}

Status ValidateIntervals(const ManagerOptions& o) {
  SP_RETURN_IF_ERROR(NonNegative("save_policy.interval_steps", o.save_policy.interval_steps));
  SP_RETURN_IF_ERROR(NonNegative("save_policy.interval_seconds", o.save_policy.interval_seconds));
  SP_RETURN_IF_ERROR(ValidateRetention(o.retention, "retention"));
  SP_RETURN_IF_ERROR(NonNegative("save_policy.steps_per_epoch", o.save_policy.steps_per_epoch));
  if (o.save_policy.interval_steps == 0 && o.save_policy.interval_seconds == 0 &&
      o.retention.keep_last_n == 0 && o.retention.keep_per_n_minutes == 0 &&
      !o.retention.keep_all) {
    return InvalidArgumentError(
        "ManagerOptions: save_policy.interval_steps, save_policy.interval_seconds, "
        "retention.keep_last_n and retention.keep_per_n_minutes are all 0: nothing would ever be "
        "saved or kept (set one of them)");
  }
  SP_RETURN_IF_ERROR(NonNegative("sparse.compaction.max_depth", o.sparse.compaction.max_depth));
  if (!(o.sparse.compaction.max_delta_ratio > 0) ||
      !std::isfinite(o.sparse.compaction.max_delta_ratio)) {
    return InvalidArgumentError(
        fmt::format("ManagerOptions.sparse.compaction.max_delta_ratio = {}: must be finite and > 0",
                    o.sparse.compaction.max_delta_ratio));
  }
  return Status::OK();
}

Status ValidateAppendInfo(const ManagerOptions& o) {
  for (const std::string& item : o.storage.append_info) {
    if (item != "epoch_num" && item != "step_num") {
      return InvalidArgumentError(fmt::format(
          "ManagerOptions.storage.append_info: {:?} is not one of \"epoch_num\", \"step_num\"",
          item));
    }
  }
  for (const auto& [key, value] : o.storage.append_dict) {
    if (Status s = ValidateName(key); !s.ok()) {
      return InvalidArgumentError(
          fmt::format("ManagerOptions.storage.append_dict key {:?}: {}", key, s.message()));
    }
    if (key == "epoch_num" || key == "step_num") {
      return InvalidArgumentError(fmt::format(
          "ManagerOptions.storage.append_dict key {:?} is reserved (use storage.append_info)",
          key));
    }
    ValueKind k = value.kind();
    if (k != ValueKind::kInt && k != ValueKind::kFloat && k != ValueKind::kBool &&
        k != ValueKind::kString) {
      return InvalidArgumentError(fmt::format(
          "ManagerOptions.storage.append_dict[{:?}] is a {} value: only int, float, bool "
          "and string are allowed",
          key, ValueKindName(k)));
    }
  }
  return Status::OK();
}

// With a file format, async saves use only snapshot_threads of the Checkpointer's options.
Status ValidateFileAsync(const CheckpointerOptions& a) {
  const CheckpointerOptions d;
  const char* field =
      a.staging_bytes != d.staging_bytes                       ? "staging_bytes"
      : a.prefault_bytes != d.prefault_bytes                   ? "prefault_bytes"
      : a.slab_bytes != d.slab_bytes                           ? "slab_bytes"
      : a.persist_during_snapshot != d.persist_during_snapshot ? "persist_during_snapshot"
      : a.allow_concurrent_saves != d.allow_concurrent_saves   ? "allow_concurrent_saves"
      : a.copier != d.copier                                   ? "copier"
                                                               : nullptr;
  if (field == nullptr) return Status::OK();
  return InvalidArgumentError(
      fmt::format("ManagerOptions.async_save.checkpointer.{}: applies to native checkpoints only "
                  "(a file format's async "
                  "save snapshots into fresh memory; only snapshot_threads applies)",
                  field));
}

Status ValidateFormat(const ManagerOptions& o) {
  const bool ckpt = o.storage.format == CheckpointFormat::kMindSporeCkpt;
  if (o.storage.format != CheckpointFormat::kNative &&
      o.storage.format != CheckpointFormat::kSafetensors && !ckpt) {
    return InvalidArgumentError(fmt::format(
        "ManagerOptions.storage.format = {} ({}): the manager writes kNative, kSafetensors or "
        "kMindSporeCkpt",
        static_cast<int>(o.storage.format), FormatName(o.storage.format)));
  }
  if (o.storage.format == CheckpointFormat::kNative && o.storage.file_checksum) {
    return InvalidArgumentError(
        "ManagerOptions.storage.file_checksum: only with a file format (kSafetensors, "
        "kMindSporeCkpt); native "
        "checkpoints always carry a CRC32C per chunk");
  }
  if (o.storage.format == CheckpointFormat::kSafetensors && o.storage.key) {
    return InvalidArgumentError(
        "ManagerOptions.storage.key: safetensors files cannot be encrypted; use format kNative or "
        "kMindSporeCkpt");
  }
  if (o.storage.cipher != MindSporeCipher::kAesGcm && !(ckpt && o.storage.key)) {
    return InvalidArgumentError(
        fmt::format("ManagerOptions.storage.cipher = {}: only with format kMindSporeCkpt and a key",
                    MindSporeCipherName(o.storage.cipher)));
  }
  if (o.storage.format != CheckpointFormat::kNative)
    return ValidateFileAsync(o.async_save.checkpointer);
  return Status::OK();
}

Status ValidateWhere(const ManagerOptions& o) {
  if (o.naming.series != SeriesRule::kContinue && o.naming.series != SeriesRule::kNew) {
    return InvalidArgumentError(fmt::format("ManagerOptions.naming.series = {}: not a SeriesRule",
                                            static_cast<int>(o.naming.series)));
  }
  if (o.naming.directory.empty() && !o.naming.directory_fn) {
    return InvalidArgumentError(
        "ManagerOptions.naming.directory is empty and naming.directory_fn is not set");
  }
  if (!o.naming.prefix_fn)
    SP_RETURN_IF_ERROR(ValidatePrefix(o.naming.prefix, "ManagerOptions.naming.prefix"));
  if (o.num_shards < 1 || o.shard_id < 0 || o.shard_id >= o.num_shards) {
    return InvalidArgumentError(
        fmt::format("ManagerOptions: shard_id = {} and num_shards = {}: need 0 <= shard_id < "
                    "num_shards",
                    o.shard_id, o.num_shards));
  }
  return ValidateIoOptions(o.io, "ManagerOptions.io");
}

}  // namespace

Status ValidatePrefix(std::string_view prefix, std::string_view what) {
  if (prefix.empty() || prefix.size() > kMaxPrefixBytes || prefix[0] == '.' ||
      prefix.find('/') != std::string_view::npos || prefix.find('\0') != std::string_view::npos) {
    return InvalidArgumentError(
        fmt::format("{} {:?}: must be 1..{} bytes, contain no '/' or NUL and not start with '.'",
                    what, prefix, kMaxPrefixBytes));
  }
  return ValidateName(prefix).WithContext(fmt::format("{} {:?}", what, prefix));
}

Policy ResolvePolicy(const ManagerOptions& o) {
  Policy p = ResolveRetention(o.retention);
  p.save_steps = o.save_policy.interval_steps;
  p.save_seconds = o.save_policy.interval_steps > 0 ? 0 : o.save_policy.interval_seconds;
  return p;
}

std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

Policy ResolveRetention(const RetentionPolicy& r) {
  Policy p;
  p.keep_all = r.keep_all;
  if (!r.keep_all) {
    p.keep_last_n = r.keep_last_n;
    p.keep_per_minutes = r.keep_last_n > 0 ? 0 : r.keep_per_n_minutes;
    if (p.keep_last_n == 0 && p.keep_per_minutes == 0) p.keep_last_n = 1;
  }
  p.keep_every_n_steps = r.keep_every_n_steps;
  p.keep_best_n = r.keep_best_n;
  p.best_metric = r.best_metric;
  p.best_mode = r.best_mode;
  return p;
}

std::string CheckpointName(std::string_view prefix, const StepInfo& info, bool breakpoint) {
  return fmt::format("{}-{}_{}{}", prefix, info.epoch, info.step_in_epoch,
                     breakpoint ? "_breakpoint" : "");
}

namespace {

// A decimal integer >= 0 that fills `s`.
std::optional<int64_t> ParseCount(std::string_view s) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || n < 0) return std::nullopt;
  return n;
}

}  // namespace

std::optional<NameParts> ParseCheckpointName(std::string_view name) {
  NameParts parts;
  if (name.ends_with("_breakpoint")) {
    parts.breakpoint = true;
    name.remove_suffix(std::string_view("_breakpoint").size());
  }
  const size_t dash = name.rfind('-');
  if (dash == std::string_view::npos || dash == 0) return std::nullopt;
  std::string_view rest = name.substr(dash + 1);
  const size_t under = rest.find('_');
  if (under == std::string_view::npos) return std::nullopt;
  std::optional<int64_t> epoch = ParseCount(rest.substr(0, under));
  std::optional<int64_t> step = ParseCount(rest.substr(under + 1));
  if (!epoch || !step) return std::nullopt;
  parts.epoch = *epoch;
  parts.step_in_epoch = *step;
  return parts;
}

namespace {

// A name of a series of `prefix`: the series' number (0 for "{prefix}-...", n for
// "{prefix}_{n}-...") and the length of its series prefix; nullopt for other names.
std::optional<std::pair<int64_t, size_t>> ParseSeries(std::string_view prefix,
                                                      std::string_view name) {
  if (name.size() <= prefix.size() || !name.starts_with(prefix)) return std::nullopt;
  std::string_view rest = name.substr(prefix.size());
  if (rest[0] == '-') return std::make_pair(int64_t{0}, prefix.size());
  size_t dash = rest.find('-');
  if (rest[0] != '_' || dash == std::string_view::npos || dash < 2) return std::nullopt;
  int64_t n = 0;
  std::string_view digits = rest.substr(1, dash - 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return std::make_pair(n, prefix.size() + dash);
}

}  // namespace

std::string ResolvePrefixConflict(const std::string& prefix,
                                  const std::vector<std::string>& existing) {
  int64_t suffix = 0;
  for (const std::string& name : existing) {
    if (auto series = ParseSeries(prefix, name)) suffix = std::max(suffix, series->first + 1);
  }
  return suffix == 0 ? prefix : fmt::format("{}_{}", prefix, suffix);
}

std::optional<std::string> SeriesOf(std::string_view prefix, std::string_view name) {
  auto series = ParseSeries(prefix, name);
  if (!series) return std::nullopt;
  return std::string(name.substr(0, series->second));
}

}  // namespace savepoint::manager

namespace savepoint {

Status ValidateManagerOptions(const ManagerOptions& options) {
  SP_RETURN_IF_ERROR(manager::ValidateIntervals(options));
  SP_RETURN_IF_ERROR(manager::ValidateWhere(options));
  SP_RETURN_IF_ERROR(manager::ValidateAppendInfo(options));
  SP_RETURN_IF_ERROR(manager::ValidateFormat(options));
  return manager::ValidateRemote(options);
}

}  // namespace savepoint
