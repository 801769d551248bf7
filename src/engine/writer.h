// Internal building blocks of a save, shared by the synchronous Save (writer.cc) and the
// asynchronous Checkpointer (async_saver.cc). The commit protocol they implement is documented at
// the top of writer.cc and in docs/FORMAT.md §5.
#ifndef SAVEPOINT_ENGINE_WRITER_H_
#define SAVEPOINT_ENGINE_WRITER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec/codec.h"
#include "engine/request.h"
#include "format/manifest.h"
#include "savepoint/checkpoint.h"

namespace savepoint {
class Progress;  // util/progress.h
}  // namespace savepoint

namespace savepoint::engine {

struct ChunkSeal;  // engine/seal.h

// Copies bytes [offset, offset + len) of the stored (gathered) tensor to `dst`.
void GatherRows(const RowGather& g, uint64_t offset, uint64_t len, std::byte* dst);

// One chunk of one tensor: `len` bytes from `src`, to be stored at `file_offset`; its CRC32C is
// stored into `*crc` (a slot of the manifest) once computed.
//
// Compressed saves: `stored` (a slot of the manifest) is non-null; `file_offset` is then unused,
// the chunk is compressed with `codec` (filter element size `elem_size`) and its stored form goes
// wherever an ExtentAllocator puts it; `*crc` covers the stored bytes.
//
// Packed chunks (format version 2: extents below format::kPackBelowBytes): `span` is the file
// offset of the kPackSpanBytes span of the packed region that holds the chunk (0 for any other
// chunk). A packed chunk may share 4 KiB blocks with its neighbours, so the chunks of one span are
// written together, with one aligned write (WriteTasks).
//
// Encrypted saves (docs/FORMAT.md §10; engine/seal.h): `seal` (null when not encrypted) is the
// save's, `tensor` and `chunk` name the chunk (its shard's name and box go into the AAD), and
// `tag` is the manifest slot of its GCM tag. The chunk is sealed where it is written (never in the
// caller's memory) and *crc covers the ciphertext. PlanSave sets `tensor` and `chunk` of every
// task, EnableSealing the rest.
struct ChunkTask {
  const std::byte* src = nullptr;
  uint64_t len = 0;
  uint64_t file_offset = 0;
  uint32_t* crc = nullptr;
  format::StoredChunk* stored = nullptr;
  codec::CodecOptions codec;
  size_t elem_size = 1;
  uint64_t span = 0;
  const ChunkSeal* seal = nullptr;
  format::TensorRecord* tensor = nullptr;
  uint64_t chunk = 0;
  crypto::GcmTag* tag = nullptr;
  // Rows gathered into a staging buffer before the chunk is written (src is then the tensor's
  // memory at the chunk's offset in the stored order; WriteRequest::gathers). Default: none.
  const RowGather* gather = nullptr;
};

// Hands out 4 KiB-aligned extents at the end of a data file, in the order chunks finish.
// Thread-safe.
class ExtentAllocator {
 public:
  explicit ExtentAllocator(uint64_t start = format::kDataHeaderBytes) : next_(start) {}
  // Restarts at `start` (4096-aligned: the end of the planned layout), before any Allocate.
  void Reset(uint64_t start) { next_.store(start); }
  // The offset of a new extent of `bytes` bytes (rounded up to 4096).
  uint64_t Allocate(uint64_t bytes) { return next_.fetch_add(format::AlignUp(bytes)); }
  // The end of the last extent: the file's size.
  uint64_t end() const { return next_.load(); }

 private:
  std::atomic<uint64_t> next_;
};

// Buffers of one thread's compressed writes, allocated on first use (chunk_bytes each).
struct CompressBuffers {
  Tensor out;      // compressed bytes, zero-padded to 4 KiB before the write
  Tensor scratch;  // the shuffled chunk
};

// Where a save goes: the final path and the hidden temporary directory (already created by the
// durable commit's Begin, io/commit.h).
struct SaveTarget {
  FileSystem* fs = nullptr;
  std::string path;
  std::string tmp;
};

// Checks chunk_bytes, format_version and compression.
Status CheckSaveOptions(const SaveOptions& o);

// Steps 1-2 of the commit protocol (io/commit.h): validates the path, refuses an existing
// checkpoint unless overwriting, creates missing parents durably, creates the temporary directory.
// Also checks `io` (its fs becomes the target's).
Result<SaveTarget> BeginSave(const std::string& raw_path, const SaveOptions& o,
                             const IoOptions& io);

// A manifest of format `version` with a fresh id, the creation time, the writer and chunk size,
// the values and metadata of `state`, and every tensor laid out in data file 0. Returns the chunk
// tasks that fill the file, in file order (CRC and stored-chunk slots point into the manifest, so
// it must not move while they are used).
//
// Layout (docs/FORMAT.md §2, §8): version 1 starts every extent at a multiple of 4096. Version 2
// first packs the extents smaller than kPackBelowBytes back to back at 64-byte alignment in a
// region right after the header (none crossing a kPackSpanBytes boundary of the region), then
// starts every other extent at a multiple of 4096.
//
// With a codec in `compression`, every non-empty tensor that is not packed is a compressed shard
// whose chunks are placed as they finish: files[0].bytes is then only the planned layout's end
// (header and packed region), where the caller's ExtentAllocator starts, and the caller sets it to
// the allocator's end() once every chunk is written.
//
// `version` 0 (SaveOptions::format_version's default) writes format::kFormatVersion.
//
// `gathers` (may be null): tensors whose rows are gathered into storage order as they are written
// (WriteRequest::gathers); their tasks get the gather. `late` (may be null): tensors laid out, and
// tasked, after every other one (WriteRequest::late; never packed: InternalError otherwise).
Result<std::vector<ChunkTask>> PlanSave(const State& state, uint64_t chunk_bytes,
                                        format::Manifest* m, const Compression& compression = {},
                                        uint32_t version = format::kFormatVersion,
                                        const RowGathers* gathers = nullptr,
                                        const LateTensors* late = nullptr);

// Creates data file `file_index` of the manifest in the temporary directory, preallocates its
// manifest size and writes its header.
Result<std::unique_ptr<WritableFile>> CreateDataFile(const SaveTarget& t, const format::Manifest& m,
                                                     bool direct_io, uint32_t file_index = 0);

// Writes every task of a planned save into `f` on `threads` threads (1..64): consecutive zero-copy
// chunks with one batched submission per run, the packed chunks of one span with one aligned write
// through a span buffer, compressed chunks at offsets from `alloc` (nullptr when nothing is
// compressed), consecutive sealed (encrypted) chunks encrypted into per-thread buffers (up to 4 x
// chunk_bytes per thread) and written with one batched submission per run, any other chunk
// through a staging buffer. Sets every task's CRC. Counts the raw
// bytes of every task written in `progress` (when not null; the caller finishes it).
Status WriteTasks(const std::vector<ChunkTask>& tasks, uint64_t chunk_bytes, int threads,
                  WritableFile* f, ExtentAllocator* alloc, Progress* progress = nullptr);

// Writes one chunk of the raw layout (t.stored == nullptr) at t.file_offset: straight from the
// caller's memory when the file's alignment rules allow it, else through `staging` (chunk_bytes,
// 4 KiB-aligned). The CRC is fused with the copy.
Status WriteChunk(const ChunkTask& t, WritableFile* f, std::byte* staging);

// Compressed saves: compresses chunk `t` from `raw` (its t.len raw bytes, t.src or a staged copy).
// If that shrinks it by at least one 4 KiB block, writes the stored form zero-padded to 4 KiB at an
// offset from `alloc`, sets *t.crc (CRC32C of the stored bytes, computed right after compressing)
// and *t.stored, and returns true. Otherwise writes nothing and returns false: the caller stores
// the raw bytes instead (StoreRawChunk).
Result<bool> WriteCompressedChunk(const ChunkTask& t, const std::byte* raw, uint64_t chunk_bytes,
                                  WritableFile* f, ExtentAllocator* alloc, CompressBuffers* b);

// Compressed saves: stores chunk `t` raw at an offset from `alloc` and records it in *t.stored.
// `staged` null: from t.src through `staging` (as WriteChunk). `staged` non-null: a 4 KiB-aligned
// copy of the chunk with AlignUp(t.len) writable bytes (padded here) whose CRC32C is `staged_crc`.
Status StoreRawChunk(const ChunkTask& t, std::byte* staged, uint32_t staged_crc, WritableFile* f,
                     ExtentAllocator* alloc, std::byte* staging);

// Steps 3b-3c (writer.cc): syncs and closes the data file (unless `data` is null: a multi-rank
// save's ranks close their own), writes and syncs MANIFEST (authenticated with `keys` when `m` is
// encrypted).
Status FinishFiles(const SaveTarget& t, WritableFile* data, const format::Manifest& m,
                   const format::CheckpointKeys* keys = nullptr);

// FinishFiles with MANIFEST already encoded: the encoding of `m` (whose files it uses) is the
// concatenation of `manifest`, its first piece holding at least the header; `largest_section` is
// its largest version 3 section (format::LargestSection), which the size check needs when `m`
// does not hold the shards.
Status FinishEncoded(const SaveTarget& t, WritableFile* data, const format::Manifest& m,
                     std::span<const std::string_view> manifest, uint64_t largest_section);

// Steps 4-8 of the commit protocol (io::DurableCommit::Commit): syncs the temporary directory,
// renames it into place (setting an old checkpoint aside when overwriting) and syncs the parent.
Status CommitSave(const SaveTarget& t, bool overwrite);

// Removes the temporary directory after a failure (best effort).
void AbandonSave(const SaveTarget& t);

// Writes and commits one process's checkpoint: request.state (no sparse tables) to request.path
// with request.options and request.io, gathering the rows of request.gathers. Fills
// options.stats when set. The engine's single entry for a one-process save.
Status Write(const WriteRequest& request);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_WRITER_H_
