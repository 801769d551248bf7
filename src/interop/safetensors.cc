// SaveSafetensors, LoadSafetensors and InspectSafetensors: file I/O around the header codec of
// safetensors_header.cc.
//
// Save: plan the file (header + offsets; fail early on a dtype safetensors lacks), then the
// durable-commit protocol for a file (io/commit.h; docs/FORMAT.md §5): the hidden temporary file
// is written and synced by WriteLayout (step 3), then renamed into place. A failure removes the
// temporary file and leaves `path` as it was.
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
#include "interop/safetensors_header.h"
#include "io/commit.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint {
namespace {

using interop::Layout;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr uint64_t kStageBytes = uint64_t{8} << 20;  // bytes per write

// Copies bytes [begin, begin + dst.size()) of the planned file into `dst`.
void Gather(const Layout& layout, uint64_t begin, std::span<std::byte> dst) {
  const uint64_t end = begin + dst.size();
  auto copy = [&](uint64_t at, std::span<const std::byte> src) {  // src lies at file offset `at`
    const uint64_t lo = std::max(begin, at), hi = std::min(end, at + src.size());
    if (lo < hi) std::memcpy(dst.data() + (lo - begin), src.data() + (lo - at), hi - lo);
  };
  copy(0, std::as_bytes(std::span(layout.header)));
  // The last tensor starting at or before `begin` (tensors lie back to back in `items`).
  auto it = std::upper_bound(layout.items.begin(), layout.items.end(), begin,
                             [](uint64_t b, const Layout::Item& x) { return b < x.offset; });
  if (it != layout.items.begin()) --it;
  for (; it != layout.items.end() && it->offset < end; ++it) copy(it->offset, it->view->bytes());
}

// Step 2: the file is written in kStageBytes pieces, gathered from header and tensors into
// aligned per-thread staging buffers and written in parallel; with O_DIRECT when the file is a
// whole number of blocks (PlanLayout pads the header to make it so where it can), which on many
// systems is far faster than buffered writes followed by fsync. Counts the tensor bytes of each
// piece written in `progress`; sets *direct to whether O_DIRECT was in effect.
Status WriteLayout(const IoOptions& io, const std::string& tmp, const Layout& layout,
                   Progress* progress, bool* direct) {
  FileOptions fo;
  fo.direct_io = io.direct_io && layout.file_bytes % kDirectIOAlignment == 0;
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, FileSystemOf(io)->NewWritableFile(tmp, fo));
  *direct = f->direct();
  SP_RETURN_IF_ERROR(f->Preallocate(layout.file_bytes));
  const uint64_t pieces = (layout.file_bytes + kStageBytes - 1) / kStageBytes;
  const int threads = static_cast<int>(std::clamp<uint64_t>(pieces, 1, io.io_threads));
  std::vector<Tensor> staging;  // aligned buffers, one per thread
  for (int i = 0; i < threads; ++i) {
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kU8, {static_cast<int64_t>(kStageBytes)}));
    staging.push_back(std::move(t));
  }
  SP_RETURN_IF_ERROR(ParallelFor(pieces, threads, [&](size_t i, int worker) {
    const uint64_t begin = i * kStageBytes;
    std::span<std::byte> buf(staging[worker].data(),
                             std::min(kStageBytes, layout.file_bytes - begin));
    Gather(layout, begin, buf);
    SP_RETURN_IF_ERROR(f->WriteAt(begin, buf));
    // Tensor data fills the file from the end of the header on.
    const uint64_t data = layout.header.size(), end = begin + buf.size();
    progress->Add(end > data ? end - std::max(begin, data) : 0);
    return Status::OK();
  }));
  SP_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

// Checks the target before anything is written: not a directory; absent unless overwriting.
Status CheckTarget(FileSystem* fs, const std::string& path, bool overwrite) {
  Result<FileInfo> st = fs->Stat(path);
  if (!st.ok()) return st.status().code() == StatusCode::kNotFound ? Status::OK() : st.status();
  if (st->is_dir) {
    return AlreadyExistsError(fmt::format("safetensors file {}: a directory is in the way", path));
  }
  if (!overwrite) {
    return AlreadyExistsError(
        fmt::format("safetensors file {} exists (pass overwrite to replace it)", path));
  }
  return Status::OK();
}

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
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(std::string target, engine::NormalizeCheckpointPath(path));
  SP_ASSIGN_OR_RETURN(Layout layout, interop::PlanLayout(state, target));
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("save safetensors file {}", path)));
  SP_RETURN_IF_ERROR(CheckTarget(fs, target, options.overwrite));
  io::CommitOptions co;
  co.overwrite = options.overwrite;
  co.create_parents = options.create_parents;
  const std::string context = fmt::format("save safetensors file {}", target);
  Result<io::DurableCommit> commit =
      io::DurableCommit::Begin(fs, target, io::DurableCommit::Kind::kFile, co);
  if (!commit.ok()) return commit.status().WithContext(context);
  Progress progress(options.progress, state.tensor_bytes());
  bool direct = false;
  Status s = WriteLayout(io, commit->tmp(), layout, &progress, &direct);
  if (s.ok()) progress.Finish();
  if (s.ok()) s = commit->Commit();
  if (!s.ok()) {
    commit->Abandon();
    return s.WithContext(context);
  }
  if (options.stats != nullptr) {
    const double seconds = SecondsSince(start);
    const uint64_t bytes = state.tensor_bytes();
    *options.stats = SaveStats{bytes, 0, seconds, direct, bytes, seconds, 0};
  }
  return Status::OK();
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
