// Save: writes a State as a native checkpoint directory and commits it.
//
// Commit protocol (docs/FORMAT.md, "Commit protocol"); every step must succeed before the next:
//   1. CreateDir(tmp), tmp = <parent>/.<name>.savepoint-tmp.<pid>.<random>
//   2. Write data file tmp/data-00000-00000.spd: a 4 KiB header, then every tensor as one
//      4 KiB-aligned extent, cut into chunks that worker threads copy, checksum (CRC32C, while the
//      bytes are hot in cache) and write in parallel. With compression (docs/FORMAT.md §7) each
//      chunk is compressed instead, its CRC32C taken on the compressed bytes right after, and its
//      stored form written at the next free 4 KiB-aligned offset (ExtentAllocator) as it finishes.
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

Status CopyValues(const State& from, State* to) {
  for (const auto& [name, e] : from.entries()) {
    if (!e.is_tensor()) SP_RETURN_IF_ERROR(to->PutValue(name, e.value()));
  }
  to->metadata() = from.metadata();
  return Status::OK();
}

}  // namespace

Status CreateDirsDurably(FileSystem* fs, const std::string& dir) {
  if (dir.empty() || dir == "/" || dir == "." || fs->Exists(dir)) return Status::OK();
  std::string parent = Dirname(dir);
  SP_RETURN_IF_ERROR(CreateDirsDurably(fs, parent));
  Status s = fs->CreateDir(dir);
  if (s.code() == StatusCode::kAlreadyExists) return Status::OK();  // a concurrent creator
  SP_RETURN_IF_ERROR(s);
  return fs->SyncDir(parent);
}

namespace {

Status CheckCompression(const Compression& c) {
  if (c.codec != Compression::Codec::kNone && c.codec != Compression::Codec::kZstd &&
      c.codec != Compression::Codec::kLz4) {
    return InvalidArgumentError(fmt::format(
        "SaveOptions.compression.codec = {}: not a Compression::Codec", static_cast<int>(c.codec)));
  }
  if (c.shuffle != Compression::Shuffle::kAuto && c.shuffle != Compression::Shuffle::kOn &&
      c.shuffle != Compression::Shuffle::kOff) {
    return InvalidArgumentError(
        fmt::format("SaveOptions.compression.shuffle = {}: not a Compression::Shuffle",
                    static_cast<int>(c.shuffle)));
  }
  if (c.codec == Compression::Codec::kZstd && (c.zstd_level < -7 || c.zstd_level > 22)) {
    return InvalidArgumentError(
        fmt::format("SaveOptions.compression.zstd_level = {}: must be in [-7, 22]", c.zstd_level));
  }
  return Status::OK();
}

// The codec options of a tensor of `dtype` under `c` (a codec other than kNone).
codec::CodecOptions ResolveCodec(const Compression& c, DType dtype) {
  codec::CodecOptions o;
  o.codec = c.codec == Compression::Codec::kZstd ? codec::Codec::kZstd : codec::Codec::kLz4;
  o.level = c.zstd_level;
  size_t e = DTypeSize(dtype);
  bool shuffle = c.shuffle == Compression::Shuffle::kOn
                     ? e > 1
                     : c.shuffle == Compression::Shuffle::kAuto && (e == 2 || e == 4 || e == 8);
  o.filter = shuffle ? codec::Filter::kShuffle : codec::Filter::kNone;
  return o;
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
  return CheckCompression(o.compression);
}

// Whether chunk `t` can be written straight from the caller's memory (no staging copy).
bool ZeroCopy(const ChunkTask& t, const WritableFile* f) {
  bool aligned = reinterpret_cast<uintptr_t>(t.src) % kAlignment == 0;
  return t.stored == nullptr && t.len % kAlignment == 0 && (aligned || !f->direct());
}

// Zero-copy chunks are written in batches of up to this many through WriteAtMany (io_uring where
// available): a worker checksums a batch while it is hot, then has all of it in flight at once.
constexpr size_t kWriteBatch = 4;

// Groups tasks into runs: up to kWriteBatch consecutive zero-copy chunks, or one other chunk.
std::vector<std::pair<size_t, size_t>> Batches(const std::vector<ChunkTask>& tasks,
                                               const WritableFile* f) {
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end)
  for (size_t i = 0; i < tasks.size();) {
    size_t end = i + 1;
    if (ZeroCopy(tasks[i], f)) {
      while (end < tasks.size() && end - i < kWriteBatch && ZeroCopy(tasks[end], f)) ++end;
    }
    runs.emplace_back(i, end);
    i = end;
  }
  return runs;
}

// Checksums and writes a run of zero-copy chunks with one batched submission.
Status WriteZeroCopyBatch(std::span<const ChunkTask> run, WritableFile* f) {
  std::vector<WriteOp> ops;
  ops.reserve(run.size());
  for (const ChunkTask& t : run) {
    *t.crc = Crc32c({t.src, t.len});
    ops.push_back({t.file_offset, {t.src, t.len}});
  }
  return f->WriteAtMany(ops);
}

// Writes one chunk, straight from the tensor when it is aligned for the file, else through
// `staging` (copied and checksummed in one pass by Crc32cCopy).
Status WriteChunk(const ChunkTask& t, WritableFile* f, std::byte* staging) {
  bool aligned = reinterpret_cast<uintptr_t>(t.src) % kAlignment == 0;
  if (t.len % kAlignment == 0 && (aligned || !f->direct())) {
    *t.crc = Crc32c({t.src, t.len});
    return f->WriteAt(t.file_offset, {t.src, t.len});
  }
  *t.crc = Crc32cCopy(0, t.src, staging, t.len);
  uint64_t padded = AlignUp(t.len);
  std::memset(staging + t.len, 0, padded - t.len);
  return f->WriteAt(t.file_offset, {staging, padded});
}

Result<bool> WriteCompressedChunk(const ChunkTask& t, const std::byte* raw, uint64_t chunk_bytes,
                                  WritableFile* f, ExtentAllocator* alloc, CompressBuffers* b) {
  if (b->out.data() == nullptr) {
    SP_ASSIGN_OR_RETURN(b->out, Tensor::Empty(DType::kU8, {int64_t(chunk_bytes)}));
  }
  bool shuffle = t.codec.filter == codec::Filter::kShuffle && t.elem_size > 1;
  if (shuffle && b->scratch.data() == nullptr) {
    SP_ASSIGN_OR_RETURN(b->scratch, Tensor::Empty(DType::kU8, {int64_t(chunk_bytes)}));
  }
  // `out` holds at most t.len bytes: output that does not fit did not shrink the chunk.
  std::span<std::byte> out(b->out.data(), t.len);
  std::span<std::byte> scratch(b->scratch.data(), shuffle ? t.len : 0);
  SP_ASSIGN_OR_RETURN(codec::CompressedChunk c,
                      codec::CompressChunk(t.codec, t.elem_size, {raw, t.len}, out, scratch));
  // Keep the compressed form only if it saves at least one 4 KiB block on disk; otherwise the raw
  // bytes cost no more space and need no decompression.
  if (!c.compressed || AlignUp(c.stored_bytes) >= AlignUp(t.len)) return false;
  *t.crc = Crc32c({out.data(), c.stored_bytes});  // the output is still hot in cache
  const uint64_t padded = AlignUp(c.stored_bytes);
  std::memset(out.data() + c.stored_bytes, 0, padded - c.stored_bytes);
  const uint64_t offset = alloc->Allocate(padded);
  *t.stored = {offset, c.stored_bytes, true};
  SP_RETURN_IF_ERROR(f->WriteAt(offset, {out.data(), padded}));
  return true;
}

Status StoreRawChunk(const ChunkTask& t, std::byte* staged, uint32_t staged_crc, WritableFile* f,
                     ExtentAllocator* alloc, std::byte* staging) {
  ChunkTask raw = t;
  raw.file_offset = alloc->Allocate(t.len);
  *t.stored = {raw.file_offset, t.len, false};
  if (staged == nullptr) return WriteChunk(raw, f, staging);
  const uint64_t padded = AlignUp(t.len);
  std::memset(staged + t.len, 0, padded - t.len);
  *t.crc = staged_crc;
  return f->WriteAt(raw.file_offset, {staged, padded});
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
                                        format::Manifest* m, const Compression& compression) {
  m->checkpoint_id = RandomU64();
  m->created_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  m->writer = "savepoint " SAVEPOINT_VERSION;
  m->chunk_bytes = chunk_bytes;
  SP_RETURN_IF_ERROR(CopyValues(state, &m->values));
  const bool compress = compression.codec != Compression::Codec::kNone;
  uint64_t offset = format::kDataHeaderBytes;
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    const TensorView& v = e.tensor();
    format::ShardRecord s;
    s.offsets = Shape(v.shape().size(), 0);
    s.sizes = v.shape();
    s.offset = offset;
    s.bytes = v.nbytes();
    s.crc32c.resize(format::NumChunks(s.bytes, chunk_bytes));
    if (compress && s.bytes > 0) {
      codec::CodecOptions c = ResolveCodec(compression, v.dtype());
      s.offset = 0;
      s.codec = c.codec;
      s.filter = c.filter;
      s.stored.resize(s.crc32c.size());
    }
    m->tensors.push_back({name, v.dtype(), v.shape(), {std::move(s)}});
    if (!compress) offset = AlignUp(offset + v.nbytes());
  }
  m->files.push_back({DataFileName(0, 0), offset});
  std::vector<ChunkTask> tasks;
  for (auto& t : m->tensors) {
    format::ShardRecord& s = t.shards[0];
    const std::byte* src = state.FindTensor(t.name)->data();
    for (uint64_t c = 0; c < s.crc32c.size(); ++c) {
      ChunkTask task;
      task.src = src + c * chunk_bytes;
      task.len = format::ChunkLen(s.bytes, c, chunk_bytes);
      task.file_offset = s.offset + c * chunk_bytes;
      task.crc = &s.crc32c[c];
      if (s.compressed()) {
        task.stored = &s.stored[c];
        task.codec = ResolveCodec(compression, t.dtype);
        task.elem_size = DTypeSize(t.dtype);
      }
      tasks.push_back(task);
    }
  }
  return tasks;
}

Result<std::unique_ptr<WritableFile>> CreateDataFile(const SaveTarget& t, const format::Manifest& m,
                                                     bool direct_io, uint32_t file_index) {
  std::string path = JoinPath(t.tmp, m.files[file_index].name);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                      t.fs->NewWritableFile(path, FileOptions{.direct_io = direct_io}));
  spdlog::debug("savepoint: writing {} ({})", path, f->direct() ? "O_DIRECT" : "buffered");
  SP_RETURN_IF_ERROR(f->Preallocate(m.files[file_index].bytes));
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

namespace {

Status WriteAndCommit(const State& state, const SaveTarget& target, const SaveOptions& o,
                      bool* direct, uint64_t* stored_bytes) {
  format::Manifest m;
  SP_ASSIGN_OR_RETURN(std::vector<ChunkTask> tasks,
                      PlanSave(state, o.chunk_bytes, &m, o.compression));
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, CreateDataFile(target, m, o.direct_io));
  *direct = f->direct();
  std::vector<Tensor> staging(o.io_threads);
  std::vector<CompressBuffers> buffers(o.io_threads);
  ExtentAllocator alloc;
  const std::vector<std::pair<size_t, size_t>> runs = Batches(tasks, f.get());
  SP_RETURN_IF_ERROR(ParallelFor(runs.size(), o.io_threads, [&](size_t r, int w) -> Status {
    const ChunkTask& t = tasks[runs[r].first];
    if (ZeroCopy(t, f.get())) {
      return WriteZeroCopyBatch({tasks.data() + runs[r].first, runs[r].second - runs[r].first},
                                f.get());
    }
    if (staging[w].data() == nullptr) {
      SP_ASSIGN_OR_RETURN(staging[w], Tensor::Empty(DType::kU8, {int64_t(m.chunk_bytes)}));
    }
    if (t.stored == nullptr) return WriteChunk(t, f.get(), staging[w].data());
    SP_ASSIGN_OR_RETURN(
        bool done, WriteCompressedChunk(t, t.src, m.chunk_bytes, f.get(), &alloc, &buffers[w]));
    return done ? Status::OK() : StoreRawChunk(t, nullptr, 0, f.get(), &alloc, staging[w].data());
  }));
  if (format::UsesCompression(m)) m.files[0].bytes = alloc.end();
  *stored_bytes = 0;
  for (const auto& t : m.tensors) *stored_bytes += format::StoredBytes(t.shards[0]);
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
  uint64_t stored = 0;
  Status s = engine::WriteAndCommit(state, target, o, &direct, &stored);
  if (!s.ok()) {
    engine::AbandonSave(target);
    return s.WithContext(fmt::format("save {}", target.path));
  }
  if (o.stats != nullptr) {
    *o.stats = IoStats{state.tensor_bytes(), 0, 0, direct, stored};
    for (const auto& [n, e] : state.entries()) {
      if (e.is_tensor()) o.stats->chunks += format::NumChunks(e.tensor().nbytes(), o.chunk_bytes);
    }
    o.stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Status::OK();
}

}  // namespace savepoint
