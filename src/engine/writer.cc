// Save: writes a State as a native checkpoint directory and commits it.
//
// The checkpoint directory is committed by the durable-commit protocol (io/commit.h; docs/FORMAT.md
// §5, same step numbers). Steps 1-2 (BeginSave) create the hidden temporary directory; this file
// does step 3, the writing:
//   3a. Data file tmp/data-00000-00000.spd: a 4 KiB header, then every tensor as one extent
//       (PlanSave: with format version 2, tensors below 64 KiB are packed at 64-byte alignment in
//       one region, the others 4 KiB-aligned), cut into chunks that worker threads copy, checksum
//       (CRC32C, while the bytes are hot in cache) and write in parallel. With compression
//       (docs/FORMAT.md §7) each chunk is compressed instead, its CRC32C taken on the compressed
//       bytes right after, and its stored form written at the next free 4 KiB-aligned offset
//       (ExtentAllocator) as it finishes. With encryption (docs/FORMAT.md §10, engine/seal.h)
//       each chunk's stored form is encrypted into a staging buffer (in place after compression)
//       and the CRC32C taken on the ciphertext; the manifest is authenticated in 3c.
//   3b. Sync and close the data file.
//   3c. Write tmp/MANIFEST (it names every file, extent and checksum) and sync it.
// Steps 4-8 (CommitSave) sync the directory, rename it into place and sync the parent. Readers
// only accept directories whose MANIFEST validates.
#include "engine/writer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "engine/data_objects.h"
#include "engine/paths.h"
#include "engine/request.h"
#include "engine/seal.h"
#include "engine/select.h"
#include "format/endian.h"
#include "format/manifest_index.h"
#include "io/commit.h"
#include "util/crc32c.h"
#include "util/parallel.h"
#include "util/progress.h"
#include "util/random.h"

namespace savepoint::engine {
namespace {

using format::AlignUp;
using format::kAlignment;

io::CommitOptions CommitOptionsOf(bool overwrite, const SaveOptions& o) {
  io::CommitOptions co;
  co.overwrite = overwrite;
  co.create_parents = o.create_parents;
  co.owns = IsCheckpointEntry;  // an overwrite removes a checkpoint's own files only
  return co;
}

}  // namespace

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
  if (o.format != Format::kNative) {
    return InvalidArgumentError(fmt::format(
        "SaveOptions.format = {}: this call writes native checkpoints (Save alone writes the other "
        "formats)",
        FormatName(o.format)));
  }
  if (o.chunk_bytes < format::kMinChunkBytes || o.chunk_bytes > format::kMaxChunkBytes ||
      o.chunk_bytes % kAlignment != 0) {
    return InvalidArgumentError(
        fmt::format("SaveOptions.chunk_bytes = {}: must be a multiple of 4096 in [4 KiB, 1 GiB]",
                    o.chunk_bytes));
  }
  if (o.format_version > format::kMaxFormatVersion) {  // (0: savepoint's choice)
    return InvalidArgumentError(
        fmt::format("SaveOptions.format_version = {}: must be 0, or {} to {}", o.format_version,
                    format::kMinFormatVersion, format::kMaxFormatVersion));
  }
  return CheckCompression(o.compression);
}

// Whether chunk `t` can be written straight from the caller's memory (no staging copy).
bool ZeroCopy(const ChunkTask& t, const WritableFile* f) {
  bool aligned = reinterpret_cast<uintptr_t>(t.src) % kAlignment == 0;
  return t.stored == nullptr && t.span == 0 && t.seal == nullptr && t.gather == nullptr &&
         t.len % kAlignment == 0 && (aligned || !f->direct());
}

// Zero-copy chunks are written in batches of up to this many through WriteAtMany (io_uring where
// available): a worker checksums a batch while it is hot, then has all of it in flight at once.
constexpr size_t kWriteBatch = 4;

// Whether chunk `t` is encrypted into a staging buffer of its own (encrypted saves: every chunk
// neither packed nor compressed). Such chunks are written in batches like zero-copy ones, so that
// as many writes are in flight as without encryption.
bool Sealed(const ChunkTask& t) {
  return t.seal != nullptr && t.stored == nullptr && t.span == 0 && t.gather == nullptr;
}

// A run of tasks [begin, end) that one worker writes: up to kWriteBatch consecutive zero-copy
// chunks or sealed chunks, the packed chunks of one span, or one other chunk.
struct Run {
  enum class Kind { kZeroCopy, kSealed, kPacked, kSingle };
  size_t begin = 0;
  size_t end = 0;
  Kind kind = Kind::kSingle;
};

std::vector<Run> Runs(const std::vector<ChunkTask>& tasks, const WritableFile* f) {
  std::vector<Run> runs;
  for (size_t i = 0; i < tasks.size();) {
    Run run{i, i + 1, Run::Kind::kSingle};
    if (tasks[i].gather != nullptr) {
      // gathered into a staging buffer first: written on its own
    } else if (tasks[i].span != 0) {
      run.kind = Run::Kind::kPacked;
      while (run.end < tasks.size() && tasks[run.end].span == tasks[i].span) ++run.end;
    } else if (ZeroCopy(tasks[i], f)) {
      run.kind = Run::Kind::kZeroCopy;
      while (run.end < tasks.size() && run.end - i < kWriteBatch && ZeroCopy(tasks[run.end], f)) {
        ++run.end;
      }
    } else if (Sealed(tasks[i])) {
      run.kind = Run::Kind::kSealed;
      while (run.end < tasks.size() && run.end - i < kWriteBatch && Sealed(tasks[run.end])) {
        ++run.end;
      }
    }
    runs.push_back(run);
    i = run.end;
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

// Allocates `*t` with `bytes` bytes (4 KiB-aligned) on first use.
Status EnsureBuffer(Tensor* t, uint64_t bytes) {
  if (t->data() != nullptr) return Status::OK();
  SP_ASSIGN_OR_RETURN(*t, Tensor::Empty(DType::kU8, {static_cast<int64_t>(bytes)}));
  return Status::OK();
}

// Encrypts a run of sealed chunks into `bufs` (one chunk_bytes buffer each, allocated on first
// use), zero-padded to 4 KiB, then writes them with one batched submission.
Status WriteSealedBatch(std::span<const ChunkTask> run, uint64_t chunk_bytes, WritableFile* f,
                        std::vector<Tensor>* bufs) {
  if (bufs->size() < run.size()) bufs->resize(run.size());
  std::vector<WriteOp> ops;
  ops.reserve(run.size());
  for (size_t i = 0; i < run.size(); ++i) {
    const ChunkTask& t = run[i];
    SP_RETURN_IF_ERROR(EnsureBuffer(&(*bufs)[i], chunk_bytes));
    std::byte* out = (*bufs)[i].data();
    SP_RETURN_IF_ERROR(SealChunk(t, t.file_offset, t.src, out, t.len, false));
    const uint64_t padded = AlignUp(t.len);
    std::memset(out + t.len, 0, padded - t.len);
    ops.push_back({t.file_offset, {out, padded}});
  }
  return f->WriteAtMany(ops);
}

// Lays the packed chunks of one span out in `buf` (kPackSpanBytes, 4 KiB-aligned) as they lie in
// the file, each copied and checksummed in one pass, zero-fills the gaps, and writes the 4 KiB
// blocks they cover with one write. The blocks of two spans never overlap.
Status WritePackedRun(std::span<const ChunkTask> run, WritableFile* f, std::byte* buf) {
  const uint64_t begin = format::AlignDown(run.front().file_offset);
  uint64_t fill = 0;  // bytes of `buf` laid out so far
  for (const ChunkTask& t : run) {
    const uint64_t at = t.file_offset - begin;
    if (t.file_offset < begin || at < fill || t.len > format::kPackSpanBytes - at) {
      return InternalError(fmt::format(
          "packed chunk at offset {} ({} bytes) does not fit the span written from offset {}",
          t.file_offset, t.len, begin));
    }
    std::memset(buf + fill, 0, at - fill);
    if (t.seal != nullptr) {
      SP_RETURN_IF_ERROR(SealChunk(t, t.file_offset, t.src, buf + at, t.len, false));
    } else {
      *t.crc = Crc32cCopy(0, t.src, buf + at, t.len);
    }
    fill = at + t.len;
  }
  const uint64_t end = AlignUp(fill);
  std::memset(buf + fill, 0, end - fill);
  return f->WriteAt(begin, {buf, end});
}

// Gathers the rows of chunk `*t` into `buf` (chunk_bytes, 4 KiB-aligned) a slice at a time, each
// slice checksummed while still in cache, and points the task at `buf`. Returns the CRC32C.
uint32_t GatherChunk(ChunkTask* t, std::byte* buf) {
  const uint64_t offset = static_cast<uint64_t>(t->src - t->gather->base);
  uint32_t crc = 0;
  for (uint64_t done = 0; done < t->len; done += kCrc32cSlice) {
    const uint64_t n = std::min<uint64_t>(kCrc32cSlice, t->len - done);
    GatherRows(*t->gather, offset + done, n, buf + done);
    crc = Crc32cExtend(crc, {buf + done, n});
  }
  t->src = buf;
  t->gather = nullptr;
  return crc;
}

// Writes a gathered chunk (neither sealed nor compressed) from `buf`, zero-padded to 4 KiB.
Status WriteGathered(const ChunkTask& t, std::byte* buf, uint32_t crc, WritableFile* f) {
  *t.crc = crc;
  const uint64_t padded = AlignUp(t.len);
  std::memset(buf + t.len, 0, padded - t.len);
  return f->WriteAt(t.file_offset, {buf, padded});
}

// Writes one chunk, straight from the tensor when it is aligned for the file, else through
// `staging` (copied and checksummed in one pass by Crc32cCopy, or sealed there).
Status WriteChunk(const ChunkTask& t, WritableFile* f, std::byte* staging) {
  bool aligned = reinterpret_cast<uintptr_t>(t.src) % kAlignment == 0;
  if (t.seal != nullptr) {
    SP_RETURN_IF_ERROR(SealChunk(t, t.file_offset, t.src, staging, t.len, false));
  } else if (t.len % kAlignment == 0 && (aligned || !f->direct())) {
    *t.crc = Crc32c({t.src, t.len});
    return f->WriteAt(t.file_offset, {t.src, t.len});
  } else {
    *t.crc = Crc32cCopy(0, t.src, staging, t.len);
  }
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
  const uint64_t padded = AlignUp(c.stored_bytes);
  const uint64_t offset = alloc->Allocate(padded);
  if (t.seal != nullptr) {  // compress, then encrypt (in place)
    SP_RETURN_IF_ERROR(SealChunk(t, offset, out.data(), out.data(), c.stored_bytes, true));
  } else {
    *t.crc = Crc32c({out.data(), c.stored_bytes});  // the output is still hot in cache
  }
  std::memset(out.data() + c.stored_bytes, 0, padded - c.stored_bytes);
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
  if (t.seal != nullptr) {
    SP_RETURN_IF_ERROR(SealChunk(t, raw.file_offset, staged, staged, t.len, false));
  } else {
    *t.crc = staged_crc;
  }
  return f->WriteAt(raw.file_offset, {staged, padded});
}

Status WriteTasks(const std::vector<ChunkTask>& tasks, uint64_t chunk_bytes, int threads,
                  WritableFile* f, ExtentAllocator* alloc, Progress* progress) {
  struct Buffers {
    Tensor staging;  // chunk_bytes: one unaligned or short chunk
    Tensor span;     // kPackSpanBytes: the packed chunks of one span
    CompressBuffers compress;
    std::vector<Tensor> sealed;  // up to kWriteBatch x chunk_bytes: a run of sealed chunks
    Tensor gathered;             // chunk_bytes: the rows of one gathered chunk
  };
  std::vector<Buffers> buffers(threads);
  const std::vector<Run> runs = Runs(tasks, f);
  auto write = [&](size_t r, int w) -> Status {
    const std::span<const ChunkTask> run(tasks.data() + runs[r].begin, runs[r].end - runs[r].begin);
    Buffers& b = buffers[w];
    switch (runs[r].kind) {
      case Run::Kind::kZeroCopy:
        return WriteZeroCopyBatch(run, f);
      case Run::Kind::kSealed:
        return WriteSealedBatch(run, chunk_bytes, f, &b.sealed);
      case Run::Kind::kPacked:
        SP_RETURN_IF_ERROR(EnsureBuffer(&b.span, format::kPackSpanBytes));
        return WritePackedRun(run, f, b.span.data());
      case Run::Kind::kSingle:
        break;
    }
    ChunkTask t = run.front();
    SP_RETURN_IF_ERROR(EnsureBuffer(&b.staging, chunk_bytes));
    if (t.gather != nullptr) {  // then written as if the tensor's memory were the buffer
      SP_RETURN_IF_ERROR(EnsureBuffer(&b.gathered, chunk_bytes));
      const uint32_t crc = GatherChunk(&t, b.gathered.data());
      if (t.seal == nullptr && t.stored == nullptr)
        return WriteGathered(t, b.gathered.data(), crc, f);
    }
    if (t.stored == nullptr) return WriteChunk(t, f, b.staging.data());
    SP_ASSIGN_OR_RETURN(bool done,
                        WriteCompressedChunk(t, t.src, chunk_bytes, f, alloc, &b.compress));
    return done ? Status::OK() : StoreRawChunk(t, nullptr, 0, f, alloc, b.staging.data());
  };
  return ParallelFor(runs.size(), threads, [&](size_t r, int w) -> Status {
    SP_RETURN_IF_ERROR(write(r, w));
    if (progress == nullptr || !progress->enabled()) return Status::OK();
    uint64_t bytes = 0;
    for (size_t i = runs[r].begin; i < runs[r].end; ++i) bytes += tasks[i].len;
    progress->Add(bytes);
    return Status::OK();
  });
}

Result<SaveTarget> BeginSave(const std::string& raw_path, const SaveOptions& o,
                             const IoOptions& io) {
  SaveTarget t;
  t.fs = FileSystemOf(io);
  SP_RETURN_IF_ERROR(CheckSaveOptions(o));
  SP_RETURN_IF_ERROR(RefuseTopology(o.topology, "save " + raw_path, "SaveOptions"));
  SP_ASSIGN_OR_RETURN(t.path, NormalizeCheckpointPath(raw_path));
  std::string context = fmt::format("save {}", t.path);
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, context));
  if (!o.overwrite && !t.fs->IsObjectStore(t.path)) {
    Result<FileInfo> st = t.fs->Stat(t.path);
    if (!st.ok() && st.status().code() != StatusCode::kNotFound) {
      return st.status().WithContext(context);
    }
    if (st.ok() && !io::IsEmptyDirectory(t.fs, t.path)) {
      return AlreadyExistsError(fmt::format("{}: a checkpoint already exists there", context));
    }
  }
  Result<io::DurableCommit> c = io::DurableCommit::Begin(
      t.fs, t.path, io::DurableCommit::Kind::kDirectory, CommitOptionsOf(o.overwrite, o));
  if (!c.ok()) return c.status().WithContext(context);
  t.tmp = c->tmp();
  return t;
}

namespace {

// Whether format `version` packs an uncompressed extent of `bytes` bytes (writer policy).
bool Packs(uint32_t version, uint64_t bytes) {
  return version >= 2 && bytes < format::kPackBelowBytes;
}

// Places packed extents back to back at kPackAlignment in a region that starts at `region` (a
// multiple of 4096), moving an extent that would cross a kPackSpanBytes boundary of the region to
// that boundary, so that each span can be written on its own.
class PackCursor {
 public:
  explicit PackCursor(uint64_t region) : region_(region), next_(region) {}

  // The offset of the next extent of `bytes` bytes.
  uint64_t Place(uint64_t bytes) {
    const uint64_t a = format::kPackAlignment;
    uint64_t at = (next_ + a - 1) / a * a;
    if (bytes > 0 && SpanOf(at) != SpanOf(at + bytes - 1)) {
      at = region_ + (SpanOf(at) + 1) * format::kPackSpanBytes;
    }
    next_ = at + bytes;
    return at;
  }
  // The file offset where the span holding `offset` starts.
  uint64_t SpanStart(uint64_t offset) const {
    return region_ + SpanOf(offset) * format::kPackSpanBytes;
  }
  // The end of the last extent placed (the region's start when there is none).
  uint64_t end() const { return next_; }

 private:
  uint64_t SpanOf(uint64_t offset) const { return (offset - region_) / format::kPackSpanBytes; }

  const uint64_t region_;
  uint64_t next_;
};

// The manifest's tensors in `state`'s (name) order, each one shard covering all of it; compressed
// with `compression` when that has a codec and the tensor is neither empty nor packed. Offsets
// are set by the layout.
void AddTensors(const State& state, uint64_t chunk_bytes, const Compression& compression,
                format::Manifest* m) {
  const bool compress = compression.codec != Compression::Codec::kNone;
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    const TensorView& v = e.tensor();
    format::ShardRecord s;
    s.offsets = Shape(v.shape().size(), 0);
    s.sizes = v.shape();
    s.bytes = v.nbytes();
    s.crc32c.resize(format::NumChunks(s.bytes, chunk_bytes));
    if (compress && s.bytes > 0 && !Packs(m->version, s.bytes)) {
      codec::CodecOptions c = ResolveCodec(compression, v.dtype());
      s.codec = c.codec;
      s.filter = c.filter;
      s.stored.resize(s.crc32c.size());
    }
    m->tensors.push_back({name, v.dtype(), v.shape(), {std::move(s)}});
  }
}

// The chunk tasks of tensor `t` (its one shard), appended to `tasks`; `pack` (nullptr when the
// shard is not packed) gives each chunk's span.
void AddChunkTasks(format::TensorRecord& t, const std::byte* src, uint64_t chunk_bytes,
                   const Compression& compression, const PackCursor* pack,
                   std::vector<ChunkTask>* tasks) {
  format::ShardRecord& s = t.shards[0];
  for (uint64_t c = 0; c < s.crc32c.size(); ++c) {
    ChunkTask task;
    task.src = src + c * chunk_bytes;
    task.len = format::ChunkLen(s.bytes, c, chunk_bytes);
    task.file_offset = s.offset + c * chunk_bytes;
    task.crc = &s.crc32c[c];
    task.tensor = &t;
    task.chunk = c;
    if (pack != nullptr) task.span = pack->SpanStart(task.file_offset);
    if (s.compressed()) {
      task.stored = &s.stored[c];
      task.codec = ResolveCodec(compression, t.dtype);
      task.elem_size = DTypeSize(t.dtype);
    }
    tasks->push_back(task);
  }
}

// Attaches `gathers` (may be null) to the tasks of the tensors they name.
Status AttachGathers(const RowGathers* gathers, std::vector<ChunkTask>* tasks) {
  if (gathers == nullptr) return Status::OK();
  for (ChunkTask& t : *tasks) {
    auto it = gathers->find(t.tensor->name);
    if (it == gathers->end()) continue;
    const RowGather& g = it->second;
    const uint64_t bytes = g.rows * g.row_bytes;
    if (t.span != 0 || t.src < g.base || static_cast<uint64_t>(t.src - g.base) > bytes ||
        t.len > bytes - static_cast<uint64_t>(t.src - g.base)) {
      return InternalError(fmt::format("tensor {:?}: chunk {} lies outside its row gather",
                                       t.tensor->name, t.chunk));
    }
    t.gather = &g;
  }
  return Status::OK();
}

}  // namespace

void GatherRows(const RowGather& g, uint64_t offset, uint64_t len, std::byte* dst) {
  const uint64_t rb = g.row_bytes;
  uint64_t row = offset / rb;
  uint64_t in = offset % rb;
  constexpr uint64_t kAhead = 8;                        // rows prefetched ahead of the copy
  const uint64_t lines = std::min<uint64_t>(rb, 1024);  // bytes of a row prefetched
  for (uint64_t done = 0; done < len; ++row, in = 0) {
    if (row + kAhead < g.rows) {
      const std::byte* next = g.base + static_cast<uint64_t>(g.perm[row + kAhead]) * rb;
      for (uint64_t b = 0; b < lines; b += 64) __builtin_prefetch(next + b);
    }
    const uint64_t n = std::min(rb - in, len - done);
    std::memcpy(dst + done, g.base + static_cast<uint64_t>(g.perm[row]) * rb + in, n);
    done += n;
  }
}

Result<std::vector<ChunkTask>> PlanSave(const State& state, uint64_t chunk_bytes,
                                        format::Manifest* m, const Compression& compression,
                                        uint32_t version, const RowGathers* gathers,
                                        const LateTensors* late) {
  m->version = version == 0 ? format::kFormatVersion : version;
  m->checkpoint_id = RandomU64();
  m->created_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  m->writer = "savepoint " SAVEPOINT_VERSION;
  m->chunk_bytes = chunk_bytes;
  SP_RETURN_IF_ERROR(CopyValues(state, &m->values));
  for (const auto& [name, e] : state.entries()) {
    if (e.is_tensor()) SP_RETURN_IF_ERROR(format::CheckDimensions(name, e.tensor().shape()));
  }
  AddTensors(state, chunk_bytes, compression, m);
  // The packed region right after the header, then every other uncompressed extent 4096-aligned
  // (compressed chunks go after both, where the writer's ExtentAllocator places them).
  auto packed = [&](const format::ShardRecord& s) {
    return !s.compressed() && Packs(m->version, s.bytes);
  };
  // Which of the three groups a tensor is in: packed, the others, then the late ones.
  auto group = [&](const format::TensorRecord& t) {
    if (late != nullptr && late->names.contains(t.name)) return 2;
    return packed(t.shards[0]) ? 0 : 1;
  };
  PackCursor pack(format::kDataHeaderBytes);
  for (auto& t : m->tensors) {
    if (group(t) == 2 && packed(t.shards[0])) {
      return InternalError(
          fmt::format("tensor {:?} of {} bytes is late but packed", t.name, t.shards[0].bytes));
    }
    if (group(t) == 0) t.shards[0].offset = pack.Place(t.shards[0].bytes);
  }
  uint64_t offset = AlignUp(pack.end());
  for (int g : {1, 2}) {
    for (auto& t : m->tensors) {
      format::ShardRecord& s = t.shards[0];
      if (s.compressed() || group(t) != g) continue;
      s.offset = offset;
      offset = AlignUp(offset + s.bytes);
    }
  }
  m->files.push_back({DataFileName(0, 0), offset});
  // Tasks in file order (the asynchronous snapshot stages them in that order): packed chunks
  // first, then the others in name order, then the late ones.
  std::vector<ChunkTask> tasks;
  for (int g : {0, 1, 2}) {
    for (auto& t : m->tensors) {
      if (group(t) != g) continue;
      AddChunkTasks(t, state.FindTensor(t.name)->data(), chunk_bytes, compression,
                    g == 0 ? &pack : nullptr, &tasks);
    }
  }
  SP_RETURN_IF_ERROR(AttachGathers(gathers, &tasks));
  return tasks;
}

Result<std::unique_ptr<WritableFile>> CreateDataFile(const SaveTarget& t, const format::Manifest& m,
                                                     bool direct_io, uint32_t file_index) {
  std::string path = JoinPath(t.tmp, m.files[file_index].name);
  SP_ASSIGN_OR_RETURN(
      std::unique_ptr<WritableFile> f,
      t.fs->NewWritableFile(path, FileOptions{.direct_io = direct_io, .exclusive = true}));
  spdlog::debug("savepoint: writing {} ({})", path, f->direct() ? "O_DIRECT" : "buffered");
  SP_RETURN_IF_ERROR(f->Preallocate(m.files[file_index].bytes));
  SP_ASSIGN_OR_RETURN(Tensor header,
                      Tensor::Zeros(DType::kU8, {int64_t(format::kDataHeaderBytes)}));
  std::string h = format::EncodeDataHeader(m.checkpoint_id, file_index, m.version);
  std::memcpy(header.data(), h.data(), h.size());
  SP_RETURN_IF_ERROR(f->WriteAt(0, {header.data(), h.size()}));
  return f;
}

// ResourceExhausted unless readers accept the size of `manifest` (the encoding of `m`, whose
// largest section (versions 3 and 4) is `section` bytes): its JSON body (indexed: the head and
// each section) within kMaxManifestBodyBytes, an indexed file within kMaxManifestFileBytes.
Status CheckManifestSize(const format::Manifest& m, std::string_view header, uint64_t size,
                         uint64_t section) {
  const uint64_t body = format::GetU64(header, 16);
  if (body > format::kMaxManifestBodyBytes || section > format::kMaxManifestBodyBytes) {
    return ResourceExhaustedError(fmt::format(
        "manifest of {} bytes exceeds the cap of {} (its JSON is {} bytes{}){}", size,
        format::kMaxManifestBodyBytes, body,
        m.version >= format::kIndexedFormatVersion
            ? fmt::format(", its largest section {}", section)
            : "",
        m.version < format::kIndexedFormatVersion
            ? fmt::format(": format versions {} and {} keep the shards out of the JSON "
                          "(SaveOptions.format_version = {}, or 0, the default, which picks it "
                          "for a distributed save of many shards)",
                          format::kIndexedFormatVersion, format::kCompactFormatVersion,
                          format::kCompactFormatVersion)
            : ""));
  }
  if (size > format::kMaxManifestFileBytes) {
    return ResourceExhaustedError(fmt::format("manifest of {} bytes exceeds the cap of {}", size,
                                              format::kMaxManifestFileBytes));
  }
  return Status::OK();
}

Status FinishFiles(const SaveTarget& t, WritableFile* data, const format::Manifest& m,
                   const format::CheckpointKeys* keys) {
  if (m.encryption.enabled && keys == nullptr) {
    return InternalError("an encrypted manifest is written without its keys");
  }
  const std::string manifest = format::EncodeManifest(m, keys);
  const std::string_view whole[] = {manifest};
  return FinishEncoded(t, data, m, whole, format::LargestSection(m));
}

namespace {

// Writes `pieces` back to back into `f` from offset 0: one piece as it is, more through a buffer
// of a few MiB (a version 3 manifest of a 16,384-rank save is thousands of pieces).
Status WritePieces(WritableFile* f, std::span<const std::string_view> pieces) {
  if (pieces.size() == 1) return f->WriteAt(0, std::as_bytes(std::span(pieces[0])));
  constexpr size_t kBuffer = size_t{8} << 20;
  std::string buffer;
  buffer.reserve(kBuffer);
  uint64_t at = 0;
  for (std::string_view p : pieces) {
    while (!p.empty()) {
      const size_t n = std::min(p.size(), kBuffer - buffer.size());
      buffer.append(p.substr(0, n));
      p.remove_prefix(n);
      if (buffer.size() == kBuffer) {
        SP_RETURN_IF_ERROR(f->WriteAt(at, std::as_bytes(std::span(buffer))));
        at += buffer.size();
        buffer.clear();
      }
    }
  }
  return buffer.empty() ? Status::OK() : f->WriteAt(at, std::as_bytes(std::span(buffer)));
}

}  // namespace

Status FinishEncoded(const SaveTarget& t, WritableFile* data, const format::Manifest& m,
                     std::span<const std::string_view> manifest, uint64_t largest_section) {
  if (data != nullptr) {
    SP_RETURN_IF_ERROR(data->Sync());
    SP_RETURN_IF_ERROR(data->Close());
  }
  uint64_t size = 0;
  for (std::string_view p : manifest) size += p.size();
  if (manifest.empty() || manifest[0].size() < format::kManifestHeaderBytes) {
    return InternalError("a manifest is written without its header");
  }
  SP_RETURN_IF_ERROR(CheckManifestSize(m, manifest[0], size, largest_section));
  // Exclusive: in object storage this write is the commit point (docs/FORMAT.md §5.1), and it
  // must not replace a MANIFEST another save published meanwhile.
  const bool objects = t.fs->IsObjectStore(t.tmp);
  if (objects) SP_RETURN_IF_ERROR(CheckDataObjects(t, m));
  const std::string path = JoinPath(t.tmp, format::kManifestFileName);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                      t.fs->NewWritableFile(path, FileOptions{.exclusive = true}));
  SP_RETURN_IF_ERROR(WritePieces(f.get(), manifest));
  SP_RETURN_IF_ERROR(f->Sync());
  SP_RETURN_IF_ERROR(f->Close());
  if (!objects) return Status::OK();
  // Nothing stops another process (a gc that took a slow save for an abandoned one) from deleting
  // objects in a bucket, or, where the store's conditional writes race, another save of this
  // prefix from replacing one: checked again once committed, and uncommitted if one is gone or
  // not this save's.
  Status after = CheckDataObjects(t, m);
  if (!after.ok())
    RemoveOwnManifest(t.fs, path, manifest[0].substr(0, format::kManifestHeaderBytes));
  return after;
}

io::DurableCommit CommitOf(const SaveTarget& t, bool overwrite) {
  io::CommitOptions co;
  co.overwrite = overwrite;
  co.owns = IsCheckpointEntry;
  return io::DurableCommit::Adopt(t.fs, t.path, t.tmp, io::DurableCommit::Kind::kDirectory, co);
}

Status CommitSave(const SaveTarget& t, bool overwrite) { return CommitOf(t, overwrite).Commit(); }

void AbandonSave(const SaveTarget& t) { CommitOf(t, false).Abandon(); }

namespace {

// `keys`: the checkpoint's keys when it is encrypted, else null.
Status WriteAndCommit(const WriteRequest& r, const SaveTarget& target,
                      const format::CheckpointKeys* keys, bool* direct, uint64_t* stored_bytes) {
  const SaveOptions& o = r.options;
  format::Manifest m;
  if (r.late != nullptr && r.late->prepare) SP_RETURN_IF_ERROR(r.late->prepare());
  SP_ASSIGN_OR_RETURN(
      std::vector<ChunkTask> tasks,
      PlanSave(*r.state, o.chunk_bytes, &m, o.compression, o.format_version, r.gathers, r.late));
  ChunkSeal seal;
  if (keys != nullptr) EnableSealing(*keys, 0, &m, &tasks, &seal);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, CreateDataFile(target, m, r.io.direct_io));
  *direct = f->direct();
  ExtentAllocator alloc(m.files[0].bytes);  // compressed chunks go after the planned layout
  Progress progress(o.progress, r.state->tensor_bytes());
  SP_RETURN_IF_ERROR(WriteTasks(tasks, m.chunk_bytes, r.io.io_threads, f.get(), &alloc, &progress));
  progress.Finish();
  if (format::UsesCompression(m)) m.files[0].bytes = alloc.end();
  *stored_bytes = 0;
  for (const auto& t : m.tensors) *stored_bytes += format::StoredBytes(t.shards[0]);
  SP_RETURN_IF_ERROR(FinishFiles(target, f.get(), m, keys));
  return CommitSave(target, o.overwrite);
}

void FillStats(const WriteRequest& r, bool direct, uint64_t stored,
               std::chrono::steady_clock::time_point start) {
  SaveStats* stats = r.options.stats;
  if (stats == nullptr) return;
  *stats = SaveStats{r.state->tensor_bytes(), 0, 0, direct, stored, 0, 0};
  for (const auto& [n, e] : r.state->entries()) {
    if (e.is_tensor())
      stats->chunks += format::NumChunks(e.tensor().nbytes(), r.options.chunk_bytes);
  }
  stats->seconds = stats->blocked_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Status Write(const WriteRequest& r) {
  const auto start = std::chrono::steady_clock::now();
  if (!r.state->tables().empty()) {
    return InternalError(
        fmt::format("save {}: sparse tables reach the writer unflattened", r.path));
  }
  std::optional<format::CheckpointKeys> keys;
  if (r.options.key) {  // before anything is created: a bad key leaves no trace
    Result<format::CheckpointKeys> k = NewSaveKeys(r.options.key, FileSystemOf(r.io));
    if (!k.ok()) return k.status().WithContext(fmt::format("save {}", r.path));
    keys = std::move(*k);
  }
  SP_ASSIGN_OR_RETURN(SaveTarget target, BeginSave(r.path, r.options, r.io));
  bool direct = false;
  uint64_t stored = 0;
  Status s = WriteAndCommit(r, target, keys ? &*keys : nullptr, &direct, &stored);
  if (!s.ok()) {
    AbandonSave(target);
    return s.WithContext(fmt::format("save {}", target.path));
  }
  FillStats(r, direct, stored, start);
  return Status::OK();
}

}  // namespace savepoint::engine
