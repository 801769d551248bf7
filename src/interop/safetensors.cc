// SaveSafetensors, LoadSafetensors and InspectSafetensors: file I/O around the header codec of
// safetensors_header.cc.
//
// Save: plan the file (header + offsets; fail early on a dtype safetensors lacks), then the
// durable-commit protocol for a file through interop::CommitFile (byte_layout.h; docs/FORMAT.md
// §5): the hidden temporary file is written and synced, then renamed into place. A failure
// removes the temporary file and leaves `path` as it was.
#include "savepoint/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "engine/paths.h"
#include "engine/select.h"
#include "engine/writer.h"
#include "interop/byte_layout.h"
#include "interop/safetensors_header.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint {
namespace {

using interop::Layout;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr uint64_t kStageBytes = uint64_t{8} << 20;  // bytes per read

// Reads and validates the header of an open file.
Result<SafetensorsInfo> ReadInfo(const RandomAccessFile& file, const std::string& path) {
  const uint64_t size = file.size();
  std::string prefix(std::min<uint64_t>(size, interop::kLengthPrefixBytes), '\0');
  SP_RETURN_IF_ERROR(file.ReadAt(0, std::as_writable_bytes(std::span(prefix))));
  SP_ASSIGN_OR_RETURN(uint64_t n, interop::DecodeHeaderLength(prefix, size, path));
  std::string json(n, '\0');
  SP_RETURN_IF_ERROR(
      file.ReadAt(interop::kLengthPrefixBytes, std::as_writable_bytes(std::span(json))));
  return interop::DecodeHeader(json, size, path);
}

// The file's mapping for LoadSafetensors with mmap; null when the file system cannot map.
Result<std::shared_ptr<const MappedFile>> MapWhole(FileSystem* fs, const SafetensorsInfo& info,
                                                   MapMode mode) {
  Result<std::shared_ptr<const MappedFile>> map = fs->MapFile(info.path, mode);
  if (!map.ok()) {
    if (map.status().code() == StatusCode::kUnimplemented)
      return std::shared_ptr<const MappedFile>();
    return map.status();
  }
  if ((*map)->data().size() != info.file_bytes) {
    return CorruptionError(
        fmt::format("safetensors file {}: changed size while being opened ({} bytes, {} mapped)",
                    info.path, info.file_bytes, (*map)->data().size()));
  }
  return *map;
}

// Adds the tensors `selected` (indices into info.tensors) to `state` as views into `map`.
Status AddViews(const SafetensorsInfo& info, const std::vector<size_t>& selected,
                const MappedFile& map, State* state) {
  for (size_t i : selected) {
    const SafetensorsTensorInfo& t = info.tensors[i];
    const std::byte* at = map.data().data() + info.data_offset + t.begin;
    SP_RETURN_IF_ERROR(state->PutView(t.name, TensorView(at, t.dtype, t.shape)));
  }
  return Status::OK();
}

// Adds the tensors `selected` to `state` as owned copies read from `file` in kStageBytes pieces,
// by `threads` threads (counted in `progress`).
Status AddCopies(const SafetensorsInfo& info, const std::vector<size_t>& selected,
                 const RandomAccessFile& file, int threads, State* state, Progress* progress) {
  struct Piece {
    size_t k;     // index into `selected` and `tensors`
    uint64_t at;  // offset inside the tensor
  };
  std::vector<Tensor> tensors;
  std::vector<Piece> pieces;
  for (size_t k = 0; k < selected.size(); ++k) {
    const SafetensorsTensorInfo& t = info.tensors[selected[k]];
    SP_ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(t.dtype, t.shape));
    tensors.push_back(std::move(tensor));
    for (uint64_t at = 0; at < t.nbytes(); at += kStageBytes) pieces.push_back({k, at});
  }
  SP_RETURN_IF_ERROR(ParallelFor(pieces.size(), threads, [&](size_t i, int) -> Status {
    const SafetensorsTensorInfo& t = info.tensors[selected[pieces[i].k]];
    const uint64_t at = pieces[i].at, n = std::min(kStageBytes, t.nbytes() - at);
    std::span<std::byte> dst(tensors[pieces[i].k].data() + at, static_cast<size_t>(n));
    Status s = file.ReadAt(info.data_offset + t.begin + at, dst);
    if (!s.ok())
      return s.WithContext(fmt::format("safetensors file {}: tensor {:?}", info.path, t.name));
    progress->Add(n);
    return Status::OK();
  }));
  for (size_t k = 0; k < selected.size(); ++k) {
    SP_RETURN_IF_ERROR(state->Put(info.tensors[selected[k]].name, std::move(tensors[k])));
  }
  return Status::OK();
}

}  // namespace

Status SaveSafetensors(const State& state, const std::string& path,
                       const SafetensorsSaveOptions& options, const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  SP_ASSIGN_OR_RETURN(std::string target, engine::NormalizeCheckpointPath(path));
  SP_ASSIGN_OR_RETURN(Layout layout, interop::PlanLayout(state, target));
  const std::string context = fmt::format("save safetensors file {}", target);
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, context));
  // The header, then the tensors back to back (PlanLayout pads the header so that the file is a
  // whole number of blocks where it can: O_DIRECT, often far faster than buffered writes + fsync).
  interop::ByteLayout bytes;
  bytes.AddOwned(layout.header);
  for (const Layout::Item& item : layout.items) bytes.AddBorrowed(item.view->bytes());
  return interop::CommitFile(io, target, bytes,
                             {.overwrite = options.overwrite,
                              .create_parents = options.create_parents,
                              .progress = options.progress,
                              .stats = options.stats},
                             context, start);
}

Result<SafetensorsInfo> InspectSafetensors(const std::string& path, FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(auto file, FileSystemOf({.fs = fs})->NewRandomAccessFile(path, {}));
  return ReadInfo(*file, path);
}

Result<State> LoadSafetensors(const std::string& path, const SafetensorsLoadOptions& options,
                              const IoOptions& io) {
  if (!options.mmap && options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "load safetensors file {}: map_mode is copy-on-write but mmap is false (set mmap = true)",
        path));
  }
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("load safetensors file {}", path)));
  const auto start = std::chrono::steady_clock::now();
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(auto file, fs->NewRandomAccessFile(path, FileOptions{}));
  SP_ASSIGN_OR_RETURN(SafetensorsInfo info, ReadInfo(*file, path));
  std::vector<std::string> names;
  for (const auto& t : info.tensors) names.push_back(t.name);
  SP_ASSIGN_OR_RETURN(std::vector<bool> keep,
                      engine::SelectTensors(options.names, names, info.values,
                                            fmt::format("safetensors file {}", path)));
  std::shared_ptr<const MappedFile> map;
  if (options.mmap) {
    SP_ASSIGN_OR_RETURN(map, MapWhole(fs, info, options.map_mode));
  }
  State state;
  uint64_t bytes = 0;
  std::vector<size_t> selected;
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (!keep[i]) continue;
    selected.push_back(i);
    bytes += info.tensors[i].nbytes();
  }
  Progress progress(options.progress, bytes);
  SP_RETURN_IF_ERROR(map != nullptr
                         ? AddViews(info, selected, *map, &state)
                         : AddCopies(info, selected, *file, io.io_threads, &state, &progress));
  progress.Finish();
  if (map != nullptr) state.KeepAlive(std::move(map));
  for (const auto& [name, e] : info.values.entries()) {
    if (engine::Selected(options.names, name)) SP_RETURN_IF_ERROR(state.PutValue(name, e.value()));
  }
  state.metadata() = info.values.metadata();
  if (options.stats != nullptr) {
    *options.stats = LoadStats{bytes, 0, SecondsSince(start), false, bytes};
  }
  return state;
}

}  // namespace savepoint
