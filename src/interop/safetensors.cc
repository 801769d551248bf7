// SaveSafetensors, LoadSafetensors and InspectSafetensors: file I/O around the header codec of
// safetensors_header.cc.
//
// Save protocol (every step must succeed before the next):
//   1. Plan the file (header + offsets); fail early on a dtype safetensors lacks. Create missing
//      parent directories durably.
//   2. Write <dir>/.<name>.savepoint-tmp.<pid>.<random> (see WriteLayout). Sync and close it.
//   3. Overwrite only: Rename(path, <dir>/.<name>.savepoint-old.<random>).
//   4. Rename(tmp, path) — the commit point (Rename never replaces).
//   5. SyncDir(dir): the commit is durable.
//   6. Overwrite only: remove the old file (best effort).
// A failure before 4 removes the temporary file and leaves `path` as it was (step 3 is undone).
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
#include "util/parallel.h"

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
// systems is far faster than buffered writes followed by fsync.
Status WriteLayout(FileSystem* fs, const std::string& tmp, const Layout& layout, int threads) {
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
    return f->WriteAt(begin, buf);
  }));
  SP_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

// Steps 3-6 of the protocol above.
Status Commit(FileSystem* fs, const std::string& tmp, const std::string& path, bool overwrite) {
  std::string old;
  if (overwrite && fs->Exists(path)) {
    old = engine::OldPathFor(path);
    SP_RETURN_IF_ERROR(fs->Rename(path, old));
  }
  Status s = fs->Rename(tmp, path);
  if (!s.ok()) {
    if (!old.empty()) fs->Rename(old, path).IgnoreError();
    return s;
  }
  SP_RETURN_IF_ERROR(fs->SyncDir(Dirname(path)));
  if (!old.empty()) fs->RemoveFile(old).IgnoreError();
  return Status::OK();
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
Result<std::shared_ptr<const MappedFile>> MapWhole(FileSystem* fs, const SafetensorsInfo& info) {
  Result<std::shared_ptr<const MappedFile>> map = fs->MapFile(info.path);
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
// `file`.
Status AddTensor(const SafetensorsInfo& info, const SafetensorsTensorInfo& t,
                 const RandomAccessFile& file, const MappedFile* map, State* state) {
  const uint64_t offset = info.data_offset + t.begin;
  if (map != nullptr)
    return state->PutView(t.name, TensorView(map->data().data() + offset, t.dtype, t.shape));
  SP_ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(t.dtype, t.shape));
  if (t.nbytes() > 0) {
    Status s = file.ReadAt(offset, {tensor.data(), static_cast<size_t>(t.nbytes())});
    if (!s.ok())
      return s.WithContext(fmt::format("safetensors file {}: tensor {:?}", info.path, t.name));
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
  if (options.create_parents) SP_RETURN_IF_ERROR(engine::CreateDirsDurably(fs, Dirname(target)));
  SP_RETURN_IF_ERROR(CheckTarget(fs, target, options.overwrite));
  const std::string tmp = engine::TmpPathFor(target);
  if (options.io_threads < 1 || options.io_threads > 64) {
    return InvalidArgumentError(fmt::format(
        "save safetensors file {}: io_threads {} is not in 1..64", path, options.io_threads));
  }
  Status s = WriteLayout(fs, tmp, layout, options.io_threads);
  if (s.ok()) s = Commit(fs, tmp, target, options.overwrite);
  if (!s.ok()) {
    fs->RemoveFile(tmp).IgnoreError();
    return s.WithContext(fmt::format("save safetensors file {}", target));
  }
  if (options.stats != nullptr) {
    *options.stats = IoStats{state.tensor_bytes(), 0, SecondsSince(start), false};
  }
  return Status::OK();
}

Result<SafetensorsInfo> InspectSafetensors(const std::string& path,
                                           const SafetensorsLoadOptions& options) {
  SP_ASSIGN_OR_RETURN(auto file, FsOr(options.fs)->NewRandomAccessFile(path, FileOptions{}));
  return ReadInfo(*file, path);
}

Result<State> LoadSafetensors(const std::string& path, const SafetensorsLoadOptions& options) {
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
    SP_ASSIGN_OR_RETURN(map, MapWhole(fs, info));
  }
  State state;
  uint64_t bytes = 0;
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (!keep[i]) continue;
    SP_RETURN_IF_ERROR(AddTensor(info, info.tensors[i], *file, map.get(), &state));
    bytes += info.tensors[i].nbytes();
  }
  if (map != nullptr) state.KeepAlive(std::move(map));
  for (const auto& [name, e] : info.values.entries()) {
    if (engine::Selected(options.names, name)) SP_RETURN_IF_ERROR(state.PutValue(name, e.value()));
  }
  state.metadata() = info.values.metadata();
  if (options.stats != nullptr) *options.stats = IoStats{bytes, 0, SecondsSince(start), false};
  return state;
}

}  // namespace savepoint
