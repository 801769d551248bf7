// Save: writes a State as a native checkpoint directory and commits it.
//
// Commit protocol (docs/FORMAT.md, "Commit protocol"); every step must succeed before the next:
//   1. CreateDir(tmp), tmp = <parent>/.<name>.savepoint-tmp.<pid>.<random>
//   2. Write data file tmp/data-00000-00000.spd: a 4 KiB header, then every tensor as one
//      4 KiB-aligned extent, cut into chunks that worker threads copy, checksum (CRC32C, while the
//      bytes are hot in cache) and write in parallel.
//   3. Sync and close the data file.
//   4. Write tmp/MANIFEST (it names every file, extent and checksum) and sync it.
//   5. SyncDir(tmp): the directory's entries are durable.
//   6. Overwrite only: Rename(path, <parent>/.<name>.savepoint-old.<random>).
//   7. Rename(tmp, path) — the commit point. Rename never replaces an existing path.
//   8. SyncDir(parent): the commit is durable.
//   9. Overwrite only: remove the old checkpoint (best effort; gc finishes it after a crash).
// A crash before 7 leaves only hidden debris; between 6 and 7 the old checkpoint is restored by
// GarbageCollect. Readers only accept directories whose MANIFEST validates.
#include "engine/writer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>

#include "engine/paths.h"
#include "util/crc32c.h"
#include "util/parallel.h"

namespace savepoint::engine {
namespace {

using format::AlignUp;
using format::kAlignment;

constexpr uint64_t kCacheSlice = 256 << 10;  // copy+checksum granularity (fits in L2)

// Writes one chunk: straight from the caller's memory when the file's alignment rules allow it,
// else through this worker's aligned staging buffer. The CRC is taken on the bytes being written.
Status WriteChunk(const ChunkTask& t, WritableFile* f, std::byte* staging) {
  bool aligned = reinterpret_cast<uintptr_t>(t.src) % kAlignment == 0;
  if (t.len % kAlignment == 0 && (aligned || !f->direct())) {
    *t.crc = Crc32c({t.src, t.len});
    return f->WriteAt(t.file_offset, {t.src, t.len});
  }
  uint32_t crc = 0;
  for (uint64_t pos = 0; pos < t.len; pos += kCacheSlice) {
    uint64_t n = std::min(kCacheSlice, t.len - pos);
    std::memcpy(staging + pos, t.src + pos, n);
    crc = Crc32cExtend(crc, {staging + pos, n});
  }
  uint64_t padded = AlignUp(t.len);
  std::memset(staging + t.len, 0, padded - t.len);
  *t.crc = crc;
  return f->WriteAt(t.file_offset, {staging, padded});
}

Status CopyValues(const State& from, State* to) {
  for (const auto& [name, e] : from.entries()) {
    if (!e.is_tensor()) SP_RETURN_IF_ERROR(to->PutValue(name, e.value()));
  }
  to->metadata() = from.metadata();
  return Status::OK();
}

// Creates `dir` and its missing ancestors so that they survive power loss: each new directory's
// entry is synced in its parent.
Status CreateDirsDurably(FileSystem* fs, const std::string& dir) {
  if (dir.empty() || dir == "/" || dir == "." || fs->Exists(dir)) return Status::OK();
  std::string parent = Dirname(dir);
  SP_RETURN_IF_ERROR(CreateDirsDurably(fs, parent));
  Status s = fs->CreateDir(dir);
  if (s.code() == StatusCode::kAlreadyExists) return Status::OK();  // a concurrent creator
  SP_RETURN_IF_ERROR(s);
  return fs->SyncDir(parent);
}

}  // namespace

Status CheckSaveOptions(const SaveOptions& o) {
  if (o.chunk_bytes < format::kMinChunkBytes || o.chunk_bytes > format::kMaxChunkBytes ||
      o.chunk_bytes % kAlignment != 0) {
    return InvalidArgumentError(
        fmt::format("SaveOptions.chunk_bytes = {}: must be a multiple of 4096 in [4 KiB, 1 GiB]",
                    o.chunk_bytes));
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return InvalidArgumentError(
        fmt::format("SaveOptions.io_threads = {}: must be in [1, 64]", o.io_threads));
  }
  return Status::OK();
}

Result<SaveTarget> BeginSave(const std::string& raw_path, const SaveOptions& o) {
  SaveTarget t;
  t.fs = o.fs != nullptr ? o.fs : DefaultFileSystem();
  SP_RETURN_IF_ERROR(CheckSaveOptions(o));
  SP_ASSIGN_OR_RETURN(t.path, NormalizeCheckpointPath(raw_path));
  std::string context = fmt::format("save {}", t.path);
  if (!o.overwrite && t.fs->Exists(t.path)) {
    return AlreadyExistsError(fmt::format("{}: a checkpoint already exists there", context));
  }
  Status s = o.create_parents ? CreateDirsDurably(t.fs, Dirname(t.path)) : Status::OK();
  t.tmp = TmpPathFor(t.path);
  if (s.ok()) s = t.fs->CreateDir(t.tmp);
  if (!s.ok()) return s.WithContext(context);
  return t;
}

Result<std::vector<ChunkTask>> PlanSave(const State& state, uint64_t chunk_bytes,
                                        format::Manifest* m) {
  m->checkpoint_id = RandomU64();
  m->created_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  m->writer = "savepoint " SAVEPOINT_VERSION;
  m->chunk_bytes = chunk_bytes;
  SP_RETURN_IF_ERROR(CopyValues(state, &m->values));
  uint64_t offset = format::kDataHeaderBytes;
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    const TensorView& v = e.tensor();
    format::ShardRecord s{Shape(v.shape().size(), 0), v.shape(), 0, offset, v.nbytes(), {}};
    s.crc32c.resize(format::NumChunks(s.bytes, chunk_bytes));
    m->tensors.push_back({name, v.dtype(), v.shape(), {std::move(s)}});
    offset = AlignUp(offset + v.nbytes());
  }
  m->files.push_back({DataFileName(0, 0), offset});
  std::vector<ChunkTask> tasks;
  for (auto& t : m->tensors) {
    format::ShardRecord& s = t.shards[0];
    const std::byte* src = state.FindTensor(t.name)->data();
    for (uint64_t c = 0; c < s.crc32c.size(); ++c) {
      uint64_t pos = c * chunk_bytes;
      tasks.push_back(
          {src + pos, std::min(chunk_bytes, s.bytes - pos), s.offset + pos, &s.crc32c[c]});
    }
  }
  return tasks;
}

Result<std::unique_ptr<WritableFile>> CreateDataFile(const SaveTarget& t, const format::Manifest& m,
                                                     bool direct_io, uint32_t file_index) {
  std::string path = JoinPath(t.tmp, m.files[0].name);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                      t.fs->NewWritableFile(path, FileOptions{.direct_io = direct_io}));
  spdlog::debug("savepoint: writing {} ({})", path, f->direct() ? "O_DIRECT" : "buffered");
  SP_RETURN_IF_ERROR(f->Preallocate(m.files[0].bytes));
  SP_ASSIGN_OR_RETURN(Tensor header,
                      Tensor::Zeros(DType::kU8, {int64_t(format::kDataHeaderBytes)}));
  std::string h = format::EncodeDataHeader(m.checkpoint_id, file_index);
  std::memcpy(header.data(), h.data(), h.size());
  SP_RETURN_IF_ERROR(f->WriteAt(0, {header.data(), h.size()}));
  return f;
}

Status FinishFiles(const SaveTarget& t, WritableFile* data, const format::Manifest& m) {
  if (data != nullptr) {
    SP_RETURN_IF_ERROR(data->Sync());
    SP_RETURN_IF_ERROR(data->Close());
  }
  std::string manifest = format::EncodeManifest(m);
  if (manifest.size() - format::kManifestHeaderBytes > format::kMaxManifestBodyBytes) {
    return ResourceExhaustedError(fmt::format("manifest of {} bytes exceeds the cap of {}",
                                              manifest.size(), format::kMaxManifestBodyBytes));
  }
  SP_RETURN_IF_ERROR(t.fs->WriteFileSynced(JoinPath(t.tmp, format::kManifestFileName), manifest));
  return t.fs->SyncDir(t.tmp);
}

Status CommitSave(const SaveTarget& t, bool overwrite) {
  FileSystem* fs = t.fs;
  std::string parent = Dirname(t.path);
  std::string old;
  if (overwrite && fs->Exists(t.path)) {
    old = OldPathFor(t.path);
    SP_RETURN_IF_ERROR(fs->Rename(t.path, old));
  }
  Status s = fs->Rename(t.tmp, t.path);
  if (!s.ok()) {
    if (!old.empty()) fs->Rename(old, t.path).IgnoreError();  // put the old one back
    return s;
  }
  SP_RETURN_IF_ERROR(fs->SyncDir(parent));
  if (!old.empty()) {
    fs->RemoveAll(old).IgnoreError();
    fs->SyncDir(parent).IgnoreError();
  }
  return Status::OK();
}

void AbandonSave(const SaveTarget& t) { t.fs->RemoveAll(t.tmp).IgnoreError(); }

Status WriteChunkTasks(const std::vector<ChunkTask>& tasks, WritableFile* f, int io_threads,
                       uint64_t chunk_bytes) {
  std::vector<Tensor> staging(io_threads);
  return ParallelFor(tasks.size(), io_threads, [&](size_t i, int w) -> Status {
    if (staging[w].data() == nullptr) {
      SP_ASSIGN_OR_RETURN(staging[w], Tensor::Empty(DType::kU8, {int64_t(chunk_bytes)}));
    }
    return WriteChunk(tasks[i], f, staging[w].data());
  });
}

namespace {

Status WriteAndCommit(const State& state, const SaveTarget& target, const SaveOptions& o,
                      bool* direct) {
  format::Manifest m;
  SP_ASSIGN_OR_RETURN(std::vector<ChunkTask> tasks, PlanSave(state, o.chunk_bytes, &m));
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, CreateDataFile(target, m, o.direct_io));
  *direct = f->direct();
  std::vector<Tensor> staging(o.io_threads);
  SP_RETURN_IF_ERROR(ParallelFor(tasks.size(), o.io_threads, [&](size_t i, int w) -> Status {
    if (staging[w].data() == nullptr) {
      SP_ASSIGN_OR_RETURN(staging[w], Tensor::Empty(DType::kU8, {int64_t(m.chunk_bytes)}));
    }
    return WriteChunk(tasks[i], f.get(), staging[w].data());
  }));
  SP_RETURN_IF_ERROR(FinishFiles(target, f.get(), m));
  return CommitSave(target, o.overwrite);
}

}  // namespace
}  // namespace savepoint::engine

namespace savepoint {

Status Save(const State& state, const std::string& path, const SaveOptions& o) {
  auto start = std::chrono::steady_clock::now();
  SP_ASSIGN_OR_RETURN(engine::SaveTarget target, engine::BeginSave(path, o));
  bool direct = false;
  Status s = engine::WriteAndCommit(state, target, o, &direct);
  if (!s.ok()) {
    engine::AbandonSave(target);
    return s.WithContext(fmt::format("save {}", target.path));
  }
  if (o.stats != nullptr) {
    *o.stats = IoStats{state.tensor_bytes(), 0, 0, direct};
    for (const auto& [n, e] : state.entries()) {
      if (e.is_tensor()) o.stats->chunks += format::NumChunks(e.tensor().nbytes(), o.chunk_bytes);
    }
    o.stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Status::OK();
}

}  // namespace savepoint
