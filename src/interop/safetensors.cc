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

FileSystem* FsOr(FileSystem* fs) { return fs != nullptr ? fs : DefaultFileSystem(); }

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
// piece written in `progress`.
Status WriteLayout(FileSystem* fs, const std::string& tmp, const Layout& layout, int threads,
                   Progress* progress) {
  FileOptions fo;
  fo.direct_io = layout.file_bytes % kDirectIOAlignment == 0;
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, fs->NewWritableFile(tmp, fo));
  SP_RETURN_IF_ERROR(f->Preallocate(layout.file_bytes));
  const uint64_t pieces = (layout.file_bytes + kStageBytes - 1) / kStageBytes;
  threads = static_cast<int>(std::clamp<uint64_t>(pieces, 1, threads));
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

// Adds tensor `t` to `state`: a view into `map` when there is one, else an owned copy read from
// `file` in kStageBytes pieces (counted in `progress`).
Status AddTensor(const SafetensorsInfo& info, const SafetensorsTensorInfo& t,
                 const RandomAccessFile& file, const MappedFile* map, State* state,
                 Progress* progress) {
  const uint64_t offset = info.data_offset + t.begin;
  if (map != nullptr)
    return state->PutView(t.name, TensorView(map->data().data() + offset, t.dtype, t.shape));
  SP_ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(t.dtype, t.shape));
  for (uint64_t at = 0; at < t.nbytes(); at += kStageBytes) {
    const uint64_t n = std::min(kStageBytes, t.nbytes() - at);
    Status s = file.ReadAt(offset + at, {tensor.data() + at, static_cast<size_t>(n)});
    if (!s.ok())
      return s.WithContext(fmt::format("safetensors file {}: tensor {:?}", info.path, t.name));
    progress->Add(n);
  }
  return state->Put(t.name, std::move(tensor));
}

}  // namespace

Status SaveSafetensors(const State& state, const std::string& path,
                       const SafetensorsSaveOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  FileSystem* fs = FsOr(options.fs);
  SP_ASSIGN_OR_RETURN(std::string target, engine::NormalizeCheckpointPath(path));
  SP_ASSIGN_OR_RETURN(Layout layout, interop::PlanLayout(state, target));
  if (options.io_threads < 1 || options.io_threads > 64) {
    return InvalidArgumentError(fmt::format(
        "save safetensors file {}: io_threads {} is not in 1..64", path, options.io_threads));
  }
  SP_RETURN_IF_ERROR(CheckTarget(fs, target, options.overwrite));
  io::CommitOptions co;
  co.overwrite = options.overwrite;
  co.create_parents = options.create_parents;
  const std::string context = fmt::format("save safetensors file {}", target);
  Result<io::DurableCommit> commit =
      io::DurableCommit::Begin(fs, target, io::DurableCommit::Kind::kFile, co);
  if (!commit.ok()) return commit.status().WithContext(context);
  Progress progress(options.progress, state.tensor_bytes());
  Status s = WriteLayout(fs, commit->tmp(), layout, options.io_threads, &progress);
  if (s.ok()) progress.Finish();
  if (s.ok()) s = commit->Commit();
  if (!s.ok()) {
    commit->Abandon();
    return s.WithContext(context);
  }
  if (options.stats != nullptr) {
    const double seconds = SecondsSince(start);
    const uint64_t bytes = state.tensor_bytes();
    *options.stats = SaveStats{bytes, 0, seconds, false, bytes, seconds, 0};
  }
  return Status::OK();
}

Result<SafetensorsInfo> InspectSafetensors(const std::string& path,
                                           const SafetensorsLoadOptions& options) {
  SP_ASSIGN_OR_RETURN(auto file, FsOr(options.fs)->NewRandomAccessFile(path, FileOptions{}));
  return ReadInfo(*file, path);
}

Result<State> LoadSafetensors(const std::string& path, const SafetensorsLoadOptions& options) {
  if (!options.mmap && options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "load safetensors file {}: map_mode is copy-on-write but mmap is false (set mmap = true)",
        path));
  }
  const auto start = std::chrono::steady_clock::now();
  FileSystem* fs = FsOr(options.fs);
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
  for (size_t i = 0; i < info.tensors.size(); ++i) bytes += keep[i] ? info.tensors[i].nbytes() : 0;
  Progress progress(options.progress, bytes);
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (!keep[i]) continue;
    SP_RETURN_IF_ERROR(AddTensor(info, info.tensors[i], *file, map.get(), &state, &progress));
  }
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
