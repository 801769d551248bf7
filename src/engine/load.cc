// engine::LoadTensors (the public Load of a checkpoint without sparse tables: src/api/load.cc),
// engine::LoadInto (the public LoadInto of one process) and VerifyCheckpoint on top of
// engine::Reader.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "engine/reader.h"
#include "engine/select.h"
#include "savepoint/checkpoint.h"
#include "savepoint/savepoint.h"
#include "util/progress.h"

namespace savepoint {
namespace {

// Load with LoadOptions::mmap: single-shard tensors become views into the data files' mappings
// (kept alive by the State), multi-shard and compressed ones are read into owned tensors. With
// verify_checksums, the mapped tensors' chunks are checked once here. On a file system that cannot
// map, every tensor is read instead.
Status LoadMapped(engine::Reader& reader, const std::vector<bool>& keep, const LoadOptions& options,
                  State* state) {
  auto start = std::chrono::steady_clock::now();
  std::vector<std::pair<size_t, engine::Destination>> jobs;
  std::vector<size_t> mapped;
  std::vector<std::shared_ptr<const MappedFile>> mappings;
  bool can_map = true;
  uint64_t bytes = 0;
  for (size_t i = 0; i < keep.size(); ++i) {
    if (!keep[i]) continue;
    const TensorInfo& info = reader.tensors()[i];
    bytes += info.nbytes;
    if (can_map && info.num_shards <= 1 && info.codec == "none") {
      std::shared_ptr<const MappedFile> mapping;
      Result<TensorView> view = reader.MapIndex(i, &mapping);
      if (view.ok()) {
        SP_RETURN_IF_ERROR(state->PutView(info.name, *view));
        mapped.push_back(i);
        if (mapping != nullptr &&
            std::find(mappings.begin(), mappings.end(), mapping) == mappings.end()) {
          mappings.push_back(std::move(mapping));
        }
        continue;
      }
      if (view.status().code() != StatusCode::kUnimplemented) return view.status();
      can_map = false;  // the file system cannot map: read this and every later tensor
    }
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info.dtype, info.shape));
    jobs.emplace_back(i, engine::Destination{t.data(), t.capacity()});
    SP_RETURN_IF_ERROR(state->Put(info.name, std::move(t)));
  }
  for (auto& m : mappings) state->KeepAlive(std::move(m));
  // Progress counts what is read here: the mapped tensors when they are verified, and the rest.
  uint64_t work_bytes = 0;
  for (size_t i : mapped) work_bytes += options.verify_checksums ? reader.tensors()[i].nbytes : 0;
  for (const auto& job : jobs) work_bytes += reader.tensors()[job.first].nbytes;
  Progress progress(options.progress, work_bytes);
  uint64_t verified = 0;
  if (options.verify_checksums) {
    SP_RETURN_IF_ERROR(reader.VerifyMapped(mapped, &verified, &progress));
  }
  LoadStats read_stats;
  SP_RETURN_IF_ERROR(reader.ReadMany(jobs, &read_stats, options.verify_checksums, &progress));
  progress.Finish();
  if (options.stats != nullptr) {
    // (The data files are opened for their header checks even when nothing is read from them.)
    bool direct = !jobs.empty() && read_stats.direct_io;
    *options.stats = LoadStats{bytes, verified + read_stats.chunks, 0, direct, 0};
    for (size_t i = 0; i < keep.size(); ++i) {
      if (keep[i]) options.stats->stored_bytes += reader.tensors()[i].stored_bytes;
    }
    options.stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path,
                                                                 const LoadOptions& options,
                                                                 const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<engine::Reader> r,
                      engine::Reader::OpenImpl(path, options, io));
  return std::unique_ptr<CheckpointReader>(std::move(r));
}

namespace engine {

Result<State> LoadTensors(std::unique_ptr<Reader> reader, const std::string& path,
                          const LoadOptions& options) {
  if (options.mmap && reader->encrypted()) {
    return InvalidArgumentError(fmt::format(
        "load {}: LoadOptions.mmap: the checkpoint is encrypted, so its tensors cannot be mapped "
        "(their bytes on disk are ciphertext): load it without mmap",
        path));
  }
  std::vector<std::string> all;
  for (const auto& t : reader->tensors()) all.push_back(t.name);
  SP_ASSIGN_OR_RETURN(std::vector<bool> keep,
                      engine::SelectTensors(options.names, all, reader->values(),
                                            fmt::format("checkpoint {}", path)));
  // Before allocating what the manifest says (unreadable without its key: ReadMany says so).
  if (reader->CheckReadable().ok()) SP_RETURN_IF_ERROR(reader->OpenFilesOf(keep));
  State state;
  if (options.mmap) {
    SP_RETURN_IF_ERROR(LoadMapped(*reader, keep, options, &state));
    SP_RETURN_IF_ERROR(engine::CopyValues(reader->values(), &state, options.names));
    return state;
  }
  std::vector<std::pair<size_t, engine::Destination>> jobs;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!keep[i]) continue;
    const TensorInfo& info = reader->tensors()[i];
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info.dtype, info.shape));
    jobs.emplace_back(i, engine::Destination{t.data(), t.capacity()});
    SP_RETURN_IF_ERROR(state.Put(info.name, std::move(t)));
  }
  SP_RETURN_IF_ERROR(reader->ReadMany(jobs, options.stats, options.verify_checksums));
  SP_RETURN_IF_ERROR(engine::CopyValues(reader->values(), &state, options.names));
  return state;
}

Status LoadInto(const std::string& path, State& targets, const LoadOptions& options,
                const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(auto reader, engine::Reader::OpenImpl(path, options, io));
  std::vector<std::pair<size_t, engine::Destination>> jobs;
  for (const auto& [name, e] : targets.entries()) {
    if (!e.is_tensor()) continue;
    int64_t i = reader->IndexOf(name);
    if (i < 0) return NotFoundError(fmt::format("checkpoint {}: no tensor {:?}", path, name));
    const TensorInfo& info = reader->tensors()[i];
    const TensorView& v = e.tensor();
    if (info.dtype != v.dtype() || info.shape != v.shape()) {
      return InvalidArgumentError(fmt::format(
          "checkpoint {}: tensor {:?} is {} {}, target is {} {}", path, name, DTypeName(info.dtype),
          ShapeToString(info.shape), DTypeName(v.dtype()), ShapeToString(v.shape())));
    }
    const Tensor* owned = std::get_if<Tensor>(&e.item);
    jobs.emplace_back(i, engine::Destination{v.data(), owned ? owned->capacity() : v.nbytes()});
  }
  SP_RETURN_IF_ERROR(reader->ReadMany(jobs, options.stats, options.verify_checksums));
  SP_RETURN_IF_ERROR(engine::CopyValues(reader->values(), &targets));
  targets.Erase(format::kSparseValueName);  // the tables' description is not a user value
  return Status::OK();
}

}  // namespace engine

Status VerifyCheckpoint(const std::string& path, const LoadOptions& options, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(auto reader, engine::Reader::OpenImpl(path, options, io));
  return reader->Verify(options.stats);
}

}  // namespace savepoint
