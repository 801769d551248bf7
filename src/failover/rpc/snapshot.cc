// Shared-memory snapshots (snapshot.h).
#include "failover/rpc/snapshot.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <system_error>

namespace savepoint::failover {
namespace {

constexpr char kRecordKey[] = "failover.snapshot";

std::string SnapshotName(const StepInfo& at) {
  return fmt::format("step_{}_{}_{}", at.step, at.epoch, at.step_in_epoch);
}

// Parses "step_{n}_{epoch}_{step_in_epoch}" (non-negative decimals); false otherwise.
bool ParseName(std::string_view name, StepInfo* at) {
  if (!name.starts_with("step_")) return false;
  name.remove_prefix(5);
  int64_t v[3];
  for (int i = 0; i < 3; ++i) {
    auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v[i]);
    if (ec != std::errc() || end == name.data() || v[i] < 0) return false;
    name.remove_prefix(end - name.data());
    if (i < 2) {
      if (!name.starts_with('_')) return false;
      name.remove_prefix(1);
    }
  }
  if (!name.empty()) return false;
  *at = {v[0], v[1], v[2]};
  return true;
}

Json LayoutToJson(const ShardLayout& layout) {
  Json out = Json::object();
  for (const auto& [name, spec] : layout) {
    out[name] = {{"global_shape", spec.global_shape},
                 {"offsets", spec.offsets},
                 {"sizes", spec.sizes},
                 {"replicas", spec.replicas}};
  }
  return out;
}

Result<ShardLayout> LayoutFromJson(const Json& j) {
  if (!j.is_object()) return CorruptionError("snapshot layout is not an object");
  ShardLayout out;
  try {
    for (const auto& [name, spec] : j.items()) {
      ShardSpec s;
      s.global_shape = spec.at("global_shape").get<Shape>();
      s.offsets = spec.at("offsets").get<Shape>();
      s.sizes = spec.at("sizes").get<Shape>();
      s.replicas = spec.at("replicas").get<std::vector<int>>();
      out.emplace(name, std::move(s));
    }
  } catch (const Json::exception& e) {
    return CorruptionError(fmt::format("snapshot layout: {}", e.what()));
  }
  return out;
}

// Removes the rank's snapshots older than `keep_from` (best effort: a leftover costs memory only).
void Prune(FileSystem* fs, const std::string& rank_dir, int64_t keep_from) {
  Result<std::vector<FileInfo>> entries = fs->ListDir(rank_dir);
  if (!entries.ok()) return;
  for (const FileInfo& e : *entries) {
    StepInfo at;
    if (ParseName(e.name, &at) && at.step < keep_from) {
      fs->RemoveAll(rank_dir + "/" + e.name).IgnoreError();
    }
  }
}

}  // namespace

std::string SnapshotRankDir(const std::string& dir, int rank) {
  return fmt::format("{}/rank_{}", dir, rank);
}

std::vector<StepInfo> ListSnapshots(const std::string& dir, int rank, FileSystem* fs) {
  if (fs == nullptr) fs = DefaultFileSystem();
  const std::string rank_dir = SnapshotRankDir(dir, rank);
  std::vector<StepInfo> out;
  Result<std::vector<FileInfo>> entries = fs->ListDir(rank_dir);
  if (!entries.ok()) return out;
  for (const FileInfo& e : *entries) {
    StepInfo at;
    // A committed checkpoint directory has its MANIFEST (the rename comes after it is written).
    if (e.is_dir && ParseName(e.name, &at) && fs->Exists(rank_dir + "/" + e.name + "/MANIFEST")) {
      out.push_back(at);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StepInfo& a, const StepInfo& b) { return a.step < b.step; });
  return out;
}

Status WriteSnapshot(const DumpSource& src, const std::string& dir, int rank, int world,
                     const StepInfo& at, const SaveOptions& save, const IoOptions& io) {
  FileSystem* fs = FileSystemOf(io);
  const std::string rank_dir = SnapshotRankDir(dir, rank);
  if (!fs->Exists(rank_dir)) {
    Status made = fs->CreateDir(rank_dir);
    if (!made.ok() && made.code() != StatusCode::kAlreadyExists) {
      return made.WithContext("snapshot directory");
    }
  }
  std::vector<StepInfo> before = ListSnapshots(dir, rank, fs);
  State snap;
  for (const auto& [name, entry] : src.state.entries()) {
    SP_RETURN_IF_ERROR(entry.is_tensor() ? snap.PutView(name, entry.tensor())
                                         : snap.PutValue(name, entry.value()));
  }
  snap.metadata() = src.state.metadata().is_object() ? src.state.metadata() : Json::object();
  snap.metadata()[kRecordKey] = {
      {"rank", rank}, {"world", world}, {"layout", LayoutToJson(src.layout)}};
  SaveOptions o = save;
  o.overwrite = true;  // a snapshot of the same step again (a resumed job) replaces the old one
  o.create_parents = false;
  o.stats = nullptr;
  o.progress = nullptr;
  SP_RETURN_IF_ERROR(Save(snap, rank_dir + "/" + SnapshotName(at), o, io));
  // Keep this one and the newest before it.
  int64_t keep_from = at.step;
  for (const StepInfo& b : before) {
    if (b.step < at.step) keep_from = b.step;
  }
  Prune(fs, rank_dir, keep_from);
  return Status::OK();
}

Result<DumpSource> ReadSnapshot(const std::string& dir, int rank, int64_t step, StepInfo* at,
                                const IoOptions& io) {
  FileSystem* fs = FileSystemOf(io);
  for (const StepInfo& s : ListSnapshots(dir, rank, fs)) {
    if (s.step != step) continue;
    const std::string path = SnapshotRankDir(dir, rank) + "/" + SnapshotName(s);
    LoadOptions lo;
    lo.mmap = true;  // tmpfs pages are memory already: map instead of copying
    Result<State> loaded = Load(path, lo, io);
    if (!loaded.ok()) {
      return loaded.status().WithContext(fmt::format("rank {}'s snapshot of step {}", rank, step));
    }
    State state = *std::move(loaded);
    DumpSource out;
    const Json record = state.metadata().is_object() && state.metadata().contains(kRecordKey)
                            ? state.metadata()[kRecordKey]
                            : Json();
    if (!record.is_object() || !record.contains("layout") || !record.contains("rank") ||
        !record["rank"].is_number_integer() || record["rank"].get<int64_t>() != rank) {
      return CorruptionError(fmt::format("snapshot {}: no record of rank {}", path, rank));
    }
    Result<ShardLayout> layout = LayoutFromJson(record["layout"]);
    if (!layout.ok()) return layout.status().WithContext("snapshot " + path);
    out.layout = *std::move(layout);
    state.metadata().erase(kRecordKey);
    out.state = std::move(state);
    *at = s;
    return out;
  }
  return NotFoundError(fmt::format("no snapshot of step {} of rank {} in {}", step, rank, dir));
}

}  // namespace savepoint::failover
