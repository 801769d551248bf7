// MergeCheckpoint / MergeToSafetensors: a sharded checkpoint rewritten with every tensor whole, as
// a single-rank checkpoint or as (possibly several) safetensors files.
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "engine/paths.h"
#include "engine/request.h"
#include "io/commit.h"
#include "savepoint/distributed.h"

namespace savepoint {
namespace {

std::string MergeContext(const std::string& src, const std::string& dst) {
  return fmt::format("merge {} into {}", src, dst);
}

// Load assembles multi-shard tensors into whole ones, verifying every chunk it reads. A merge
// reads: mapping options are refused, not ignored.
// A merge reads and writes whole tensors in one process: a topology is refused too.
Result<State> LoadWhole(const std::string& src, const LoadOptions& options, const IoOptions& io) {
  if (options.mmap || options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(
        "load.mmap and load.map_mode do not apply to a merge (it reads the source): leave them at "
        "their defaults");
  }
  SP_RETURN_IF_ERROR(engine::RefuseTopology(options.topology, "merge", "MergeOptions.load"));
  return Load(src, options, io);
}

// Tensor names in name order, packed greedily into groups of at most `cap` bytes (0 = no cap);
// a tensor larger than the cap gets a group of its own.
std::vector<std::vector<std::string>> PackTensors(const State& state, uint64_t cap) {
  std::vector<std::vector<std::string>> groups(1);
  uint64_t used = 0;
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    uint64_t n = e.tensor().nbytes();
    if (cap != 0 && !groups.back().empty() && used + n > cap) {
      groups.emplace_back();
      used = 0;
    }
    groups.back().push_back(name);
    used += n;
  }
  return groups;
}

// The given tensors (borrowed) plus every value and the metadata of `state`.
Result<State> FileState(const State& state, const std::vector<std::string>& tensors) {
  State out;
  out.metadata() = state.metadata();
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) SP_RETURN_IF_ERROR(out.PutValue(name, e.value()));
  }
  for (const std::string& name : tensors) {
    SP_RETURN_IF_ERROR(out.PutView(name, *state.FindTensor(name)));
  }
  return out;
}

std::string ShardFileName(size_t i, size_t n) {
  return fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, n);
}

// Writes the files (and the index when there are several) into the directory `dir`.
Status WriteSafetensorsFiles(const State& state, const std::string& dir,
                             const MergeSafetensorsOptions& options, const IoOptions& io,
                             SaveStats* total) {
  std::vector<std::vector<std::string>> groups = PackTensors(state, options.max_file_bytes);
  if (groups.size() > 99999) {
    return InvalidArgumentError(fmt::format(
        "max_file_bytes {} would need {} safetensors files (at most 99999): raise the cap",
        options.max_file_bytes, groups.size()));
  }
  Json weight_map = Json::object();
  for (size_t i = 0; i < groups.size(); ++i) {
    std::string name =
        groups.size() == 1 ? kSafetensorsSingleFile : ShardFileName(i, groups.size());
    SP_ASSIGN_OR_RETURN(State part, FileState(state, groups[i]));
    SafetensorsSaveOptions save = options.save;
    SaveStats stats;
    save.stats = &stats;
    if (options.save.progress) {  // the files' progress, one after the other, as one
      const uint64_t before = total->bytes, all = state.tensor_bytes();
      save.progress = [&options, before, all](uint64_t done, uint64_t) {
        options.save.progress(before + done, all);
      };
    }
    SP_RETURN_IF_ERROR(SaveSafetensors(part, dir + "/" + name, save, io));
    total->bytes += stats.bytes;
    total->stored_bytes += stats.stored_bytes;
    total->chunks += stats.chunks;
    total->direct_io = total->direct_io || stats.direct_io;
    for (const std::string& t : groups[i]) weight_map[t] = name;
  }
  if (groups.size() == 1) return Status::OK();
  Json index = {{"metadata", {{"total_size", state.tensor_bytes()}}}, {"weight_map", weight_map}};
  return FileSystemOf(io)->WriteFileSynced(dir + "/" + kSafetensorsIndexFile, index.dump(2) + "\n");
}

}  // namespace

Status MergeCheckpoint(const std::string& src, const std::string& dst, const MergeOptions& options,
                       const IoOptions& io) {
  if (Status s = engine::RefuseTopology(options.save.topology, "merge", "MergeOptions.save");
      !s.ok()) {
    return s.WithContext(MergeContext(src, dst));
  }
  Result<State> state = LoadWhole(src, options.load, io);
  if (!state.ok()) return state.status().WithContext(MergeContext(src, dst));
  // Save writes each tensor as one shard and commits atomically.
  Status s = Save(*state, dst, options.save, io);
  return s.ok() ? s : s.WithContext(MergeContext(src, dst));
}

Status MergeToSafetensors(const std::string& src, const std::string& dst,
                          const MergeSafetensorsOptions& options, const IoOptions& io) {
  auto start = std::chrono::steady_clock::now();
  FileSystem* fs = FileSystemOf(io);
  if (options.save.overwrite) {
    return InvalidArgumentError(MergeContext(src, dst) +
                                ": overwrite is not supported for "
                                "safetensors output; remove the directory");
  }
  SP_ASSIGN_OR_RETURN(std::string target, engine::NormalizeCheckpointPath(dst));
  if (fs->Exists(target)) {
    return AlreadyExistsError(MergeContext(src, dst) + ": " + target + " already exists");
  }
  Result<State> state = LoadWhole(src, options.load, io);
  if (!state.ok()) return state.status().WithContext(MergeContext(src, dst));
  // Everything goes into a hidden sibling directory, committed by the durable-commit protocol
  // (io/commit.h): new parent directories are synced too.
  io::CommitOptions co;
  co.create_parents = options.save.create_parents;
  Result<io::DurableCommit> commit =
      io::DurableCommit::Begin(fs, target, io::DurableCommit::Kind::kDirectory, co);
  if (!commit.ok()) return commit.status().WithContext(MergeContext(src, dst));
  SaveStats total;
  Status s = WriteSafetensorsFiles(*state, commit->tmp(), options, io, &total);
  if (s.ok()) s = commit->Commit();
  if (!s.ok()) {
    commit->Abandon();
    return s.WithContext(MergeContext(src, dst));
  }
  if (options.save.stats != nullptr) {
    total.seconds = total.blocked_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *options.save.stats = total;
  }
  return Status::OK();
}

}  // namespace savepoint
