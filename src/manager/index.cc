// The manager's index: JSON records, atomic generations, reconciliation with the directory.
#include "manager/index.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <set>

#include "engine/paths.h"
#include "io/commit.h"
#include "io/debris.h"
#include "manager/options.h"
#include "savepoint/checkpoint.h"

namespace savepoint::manager {
namespace {

constexpr char kIndexFormat[] = "savepoint-manager-index";
constexpr std::string_view kIndexPrefix = "savepoint-index-";
constexpr std::string_view kIndexSuffix = ".json";
constexpr std::string_view kLegacyTempSuffix = ".tmp";
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxGeneration = uint64_t{1} << 62;

std::string IndexName(uint64_t generation) {
  return fmt::format("{}{:020}{}", kIndexPrefix, generation, kIndexSuffix);
}

// The generation of an index file name, or 0 if `name` is not one.
uint64_t GenerationOf(std::string_view name) {
  if (!name.starts_with(kIndexPrefix) || !name.ends_with(kIndexSuffix)) return 0;
  std::string_view digits =
      name.substr(kIndexPrefix.size(), name.size() - kIndexPrefix.size() - kIndexSuffix.size());
  uint64_t g = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), g);
  return ec == std::errc() && end == digits.data() + digits.size() ? g : 0;
}

// Whether `name` is exactly the name IndexName gives some generation.
bool IsIndexName(std::string_view name) {
  const uint64_t g = GenerationOf(name);
  return g > 0 && name == IndexName(g);
}

// Whether `name` is exactly what an index write leaves as its temporary: the durable commit's
// ".<index name>.savepoint-tmp.<pid>.<hex16>" (io/debris.h), or ".<index name>.tmp" as the
// versions before the durable-commit helper wrote. Nothing else is removed as one.
bool IsIndexTemp(std::string_view name) {
  std::string target;
  int64_t pid = 0;
  if (io::ClassifyDebris(name, &target, &pid) == io::DebrisKind::kTmp) return IsIndexName(target);
  return name.size() > 1 + kLegacyTempSuffix.size() && name.starts_with('.') &&
         name.ends_with(kLegacyTempSuffix) &&
         IsIndexName(name.substr(1, name.size() - 1 - kLegacyTempSuffix.size()));
}

Status FieldError(std::string_view field) {
  return InvalidArgumentError(fmt::format("field {:?} is missing or has the wrong type", field));
}

Status GetInt(const Json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return FieldError(key);
  *out = it->get<int64_t>();
  return Status::OK();
}

Status GetBool(const Json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::OK();  // optional, default false
  if (!it->is_boolean()) return FieldError(key);
  *out = it->get<bool>();
  return Status::OK();
}

Status GetMetrics(const Json& j, Metrics* out) {
  auto it = j.find("metrics");
  if (it == j.end()) return Status::OK();
  if (!it->is_object()) return FieldError("metrics");
  for (const auto& [k, v] : it->items()) {
    if (!v.is_number()) return FieldError(fmt::format("metrics.{}", k));
    (*out)[k] = v.get<double>();
  }
  return Status::OK();
}

Status ValidRecordName(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return InvalidArgumentError(fmt::format("bad checkpoint name {:?}", name));
  }
  return Status::OK();
}

Result<CheckpointRecord> RecordFromJson(const Json& j, const std::string& dir) {
  if (!j.is_object()) return InvalidArgumentError("a record is not an object");
  CheckpointRecord r;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return FieldError("name");
  r.name = name->get<std::string>();
  SP_RETURN_IF_ERROR(ValidRecordName(r.name));
  r.path = JoinPath(dir, r.name);
  SP_RETURN_IF_ERROR(ApplyRecordMeta(j, &r));
  SP_RETURN_IF_ERROR(GetInt(j, "created_ns", &r.created_ns));
  int64_t bytes = 0;
  SP_RETURN_IF_ERROR(GetInt(j, "bytes", &bytes));
  r.bytes = static_cast<uint64_t>(std::max<int64_t>(bytes, 0));
  return r;
}

// `generation`: the file name's; 0 takes the one the JSON carries (the index object's).
Result<Index> ParseIndex(const std::string& text, const std::string& dir, uint64_t generation) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return CorruptionError("not a JSON object");
  if (generation == 0) {
    auto g = j.find("generation");
    if (g == j.end() || !g->is_number_unsigned()) return FieldError("generation");
    generation = g->get<uint64_t>();
  }
  // Far below where counting on would wrap to 0 (an index nobody reads): a damaged number.
  if (generation > kMaxGeneration) return FieldError("generation");
  auto format = j.find("format");
  auto checkpoints = j.find("checkpoints");
  if (format == j.end() || *format != kIndexFormat || checkpoints == j.end() ||
      !checkpoints->is_array()) {
    return CorruptionError("not a savepoint manager index");
  }
  Index index;
  index.generation = generation;
  for (const Json& item : *checkpoints) {
    Result<CheckpointRecord> r = RecordFromJson(item, dir);
    if (!r.ok()) return CorruptionError(r.status().message());
    index.records.push_back(std::move(r).value());
  }
  return index;
}

Json IndexJson(const Index& index) {
  Json list = Json::array();
  for (const CheckpointRecord& r : index.records) {
    Json j = RecordMeta(r);
    j["name"] = r.name;
    j["created_ns"] = r.created_ns;
    j["bytes"] = r.bytes;
    list.push_back(std::move(j));
  }
  return Json{{"format", kIndexFormat},
              {"version", 1},
              {"generation", index.generation},
              {"checkpoints", std::move(list)}};
}

}  // namespace

Json RecordMeta(const CheckpointRecord& r) {
  Json metrics = Json::object();
  for (const auto& [k, v] : r.metrics) metrics[k] = v;
  return Json{{"step", r.step},
              {"epoch", r.epoch},
              {"step_in_epoch", r.step_in_epoch},
              {"metrics", std::move(metrics)},
              {"breakpoint", r.breakpoint},
              {"epoch_end", r.epoch_end}};
}

Status ApplyRecordMeta(const Json& j, CheckpointRecord* r) {
  if (!j.is_object()) return InvalidArgumentError("manager metadata is not an object");
  SP_RETURN_IF_ERROR(GetInt(j, "step", &r->step));
  SP_RETURN_IF_ERROR(GetInt(j, "epoch", &r->epoch));
  SP_RETURN_IF_ERROR(GetInt(j, "step_in_epoch", &r->step_in_epoch));
  SP_RETURN_IF_ERROR(GetMetrics(j, &r->metrics));
  SP_RETURN_IF_ERROR(GetBool(j, "breakpoint", &r->breakpoint));
  return GetBool(j, "epoch_end", &r->epoch_end);
}

void SortRecords(std::vector<CheckpointRecord>& records) {
  std::stable_sort(records.begin(), records.end(), [](const auto& a, const auto& b) {
    return std::tie(a.created_ns, a.step, a.name) < std::tie(b.created_ns, b.step, b.name);
  });
}

Result<Index> ReadIndex(FileSystem* fs, const std::string& dir) {
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(dir));
  std::vector<uint64_t> generations;
  for (const FileInfo& e : entries) {
    if (uint64_t g = GenerationOf(e.name); g > 0 && !e.is_dir) generations.push_back(g);
  }
  std::sort(generations.rbegin(), generations.rend());
  for (uint64_t g : generations) {
    std::string path = JoinPath(dir, IndexName(g));
    Result<std::string> text = fs->ReadFile(path, kMaxIndexBytes);
    Result<Index> index = text.ok() ? ParseIndex(*text, dir, g) : Result<Index>(text.status());
    if (index.ok()) return index;
    spdlog::warn("savepoint: checkpoint index {} ignored: {}", path, index.status().ToString());
  }
  return Index{};
}

Status WriteIndex(FileSystem* fs, const std::string& dir, Index& index) {
  const uint64_t generation = index.generation + 1;
  const std::string name = IndexName(generation);
  Index next{generation, index.records, ""};
  // The durable-commit protocol (io/commit.h). Overwrite: a file of this generation can only be
  // one that failed to parse (ReadIndex took the newest that did), so it is replaced.
  io::CommitOptions co;
  co.overwrite = true;
  co.create_parents = false;
  SP_RETURN_IF_ERROR(io::WriteFileDurably(fs, JoinPath(dir, name), IndexJson(next).dump(1), co));
  index.generation = generation;
  // Older generations and stray temporaries are garbage now; failing to remove them is harmless.
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(dir));
  for (const FileInfo& e : entries) {
    uint64_t g = GenerationOf(e.name);
    if ((g > 0 && g < generation) || IsIndexTemp(e.name)) {
      fs->RemoveFile(JoinPath(dir, e.name)).IgnoreError();
    }
  }
  return Status::OK();
}

Result<Index> ReadIndexObject(FileSystem* fs, const std::string& dir) {
  const std::string path = JoinPath(dir, kIndexObjectName);
  SP_ASSIGN_OR_RETURN(VersionedFile file, fs->ReadVersioned(path, kMaxIndexBytes));
  Result<Index> index = ParseIndex(file.contents, dir, /*generation=*/0);
  if (!index.ok()) {
    spdlog::warn("savepoint: checkpoint index {} ignored: {}", path, index.status().ToString());
    index = Index{};
  }
  index->version = std::move(file.version);
  return index;
}

Status WriteIndexObject(FileSystem* fs, const std::string& dir, Index& index) {
  Index next{index.generation + 1, index.records, ""};
  SP_ASSIGN_OR_RETURN(
      std::string version,
      fs->WriteIfVersion(JoinPath(dir, kIndexObjectName), IndexJson(next).dump(1), index.version));
  index.generation = next.generation;
  index.version = std::move(version);
  return Status::OK();
}

Result<CheckpointRecord> RecordFromCheckpoint(Store& store, const std::string& dir,
                                              const std::string& entry, int64_t steps_per_epoch) {
  CheckpointRecord r;
  r.name = entry;
  r.path = JoinPath(dir, entry);
  SP_ASSIGN_OR_RETURN(StoredFacts facts, store.Describe(r.path, /*metadata=*/true));
  r.created_ns = facts.created_ns;
  r.bytes = facts.bytes;
  const Json& meta = facts.metadata;
  std::optional<NameParts> parts =
      ParseCheckpointName(store.NameOf({.name = entry}).value_or(entry));
  if (meta.is_object() && meta.contains(kMetaKey)) {
    SP_RETURN_IF_ERROR(ApplyRecordMeta(meta[kMetaKey], &r).WithContext(r.path));
  } else if (facts.step_value) {
    r.step = *facts.step_value;
    r.epoch = 1;
    r.step_in_epoch = r.step;
  } else if (parts && parts->epoch > 0) {
    r.epoch = parts->epoch;
    r.step_in_epoch = parts->step_in_epoch;
    r.step = steps_per_epoch > 0 ? (parts->epoch - 1) * steps_per_epoch + parts->step_in_epoch
                                 : parts->step_in_epoch;
    r.breakpoint = parts->breakpoint;
  } else {
    return FailedPreconditionError(fmt::format("checkpoint {} has no step", r.path));
  }
  return r;
}

Result<bool> Reconcile(Store& store, FileSystem* fs, const std::string& dir,
                       std::vector<CheckpointRecord>& records, int64_t steps_per_epoch) {
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(dir));
  std::set<std::string> on_disk;
  for (const FileInfo& e : entries) {
    if (store.NameOf(e)) on_disk.insert(e.name);
  }
  bool changed = false;
  std::set<std::string> known;
  std::erase_if(records, [&](const CheckpointRecord& r) {
    bool gone = on_disk.count(r.name) == 0 || !known.insert(r.name).second;
    if (gone) spdlog::info("savepoint: index entry {} has no checkpoint: dropped", r.path);
    changed |= gone;
    return gone;
  });
  for (const std::string& name : on_disk) {
    if (known.count(name) > 0) continue;
    Result<CheckpointRecord> r = RecordFromCheckpoint(store, dir, name, steps_per_epoch);
    if (!r.ok()) {
      spdlog::debug("savepoint: {} is not a manager checkpoint: {}", JoinPath(dir, name),
                    r.status().ToString());
      continue;
    }
    spdlog::info("savepoint: checkpoint {} was missing from the index: added", r->path);
    records.push_back(std::move(r).value());
    changed = true;
  }
  SortRecords(records);
  return changed;
}

}  // namespace savepoint::manager
