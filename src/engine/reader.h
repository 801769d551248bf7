// CheckpointReader implementation and the chunk-read pipeline shared by Load, LoadInto and Verify,
// plus zero-copy access through read-only mappings of the data files (mmap.cc). Encrypted
// checkpoints (docs/FORMAT.md §10): Open authenticates the manifest with LoadOptions::key (Unlock)
// and every chunk is decrypted and authenticated after its CRC check (Unseal), in place in the
// destination or from the staging buffer; without the key only the manifest can be listed.
//
// Ownership: a Reader owns its open data files and mappings; views returned by MapTensor/MapIndex
// point into mappings it keeps alive until it is destroyed (callers that need a view to outlive it
// take the mapping's shared_ptr, as Load(mmap) does).
// Thread safety: all public methods may be called concurrently (files_ and maps_ are locked).
#ifndef SAVEPOINT_ENGINE_READER_H_
#define SAVEPOINT_ENGINE_READER_H_

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "format/manifest_index.h"
#include "savepoint/checkpoint.h"

namespace savepoint {
class Progress;  // util/progress.h
}  // namespace savepoint

namespace savepoint::engine {

// Where a tensor's bytes go: `data` (nullptr = verify only) with `capacity` writable bytes.
struct Destination {
  std::byte* data = nullptr;
  uint64_t capacity = 0;
};

// Consecutive chunks read with one batched submission: as many as fit in kReadBatchBytes (at least
// one), so that the bytes in flight per reader thread do not shrink with smaller chunks.
inline constexpr uint64_t kReadBatchBytes = uint64_t{32} << 20;
inline uint64_t ReadBatchChunks(uint64_t chunk_bytes) {
  return std::max<uint64_t>(1, kReadBatchBytes / std::max<uint64_t>(1, chunk_bytes));
}

// Chunks of small shards (below format::kPackBelowBytes, stored raw) are read in regions: one
// aligned read of at most kRegionBytes covering several of them that lie close together in a file
// (no hole wider than kRegionGapBytes between two), then each is verified and copied on its own.
// So thousands of tiny tensors (packed in version 2, one per 4 KiB block in version 1) cost a few
// reads, not one each.
inline constexpr uint64_t kRegionBytes = uint64_t{1} << 20;
inline constexpr uint64_t kRegionGapBytes = uint64_t{64} << 10;

// The part of a checkpoint a reader needs, by stored tensor name: the boxes it will read (empty:
// the whole tensor).
using ShardFilter = std::map<std::string, std::vector<format::Box>>;

class Reader final : public CheckpointReader {
 public:
  // Opens the checkpoint at `path`. With `only`, and a manifest of version 3 that is not encrypted,
  // reads just the manifest's head and the sections of the tensors `only` names, and keeps only
  // their shards that overlap its boxes: the manifest() of such a reader lists every tensor, the
  // others without shards, so it serves only reads of what `only` names (the distributed load).
  static Result<std::unique_ptr<Reader>> OpenImpl(const std::string& path, const LoadOptions& o,
                                                  const IoOptions& io,
                                                  const ShardFilter* only = nullptr);

  const std::string& path() const override { return path_; }
  uint32_t format_version() const override { return m_.version; }
  bool encrypted() const override { return m_.encryption.enabled; }
  int64_t created_ns() const override { return m_.created_ns; }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  uint64_t total_file_bytes() const override { return total_bytes_; }
  const TensorInfo* FindTensor(const std::string& name) const override;
  const State& values() const override { return m_.values; }
  // Built on first use (most readers never need it: for thousands of tensors it costs as much as
  // decoding the manifest).
  // (A mutex, not std::call_once: a call_once on a lambda makes libstdc++ instantiate a
  // default-visibility template named after it, which libsavepoint.so would export.)
  const Json& manifest_json() const override {
    std::lock_guard<std::mutex> lock(json_mu_);
    if (!json_built_) json_ = format::ManifestToJson(m_);
    json_built_ = true;
    return json_;
  }

  Status ReadTensor(const std::string& name, const TensorView& dst) override;
  Result<Tensor> ReadTensor(const std::string& name) override;
  Status Verify(LoadStats* stats) override;
  // Whether any data file opened so far is open with O_DIRECT.
  bool AnyFileDirect();
  Result<TensorView> MapTensor(const std::string& name, bool verify) override;

  // Reads several tensors (by index into the manifest) into their destinations in one parallel
  // pass. Destinations of multi-shard tensors receive the assembled global tensor. The raw bytes
  // of every chunk read are counted in `progress` when given (the caller finishes it), else
  // reported to LoadOptions::progress (total: the raw bytes of all chunks of `jobs`).
  Status ReadMany(const std::vector<std::pair<size_t, Destination>>& jobs, LoadStats* stats,
                  bool verify, Progress* progress = nullptr);
  // Index of a tensor in the manifest, or -1.
  int64_t IndexOf(std::string_view name) const;
  // OK unless the checkpoint is encrypted and was opened without LoadOptions::key
  // (InvalidArgument "checkpoint P is encrypted: pass LoadOptions::key"). Every read checks it.
  Status CheckReadable() const;
  // The validated manifest.
  const format::Manifest& manifest() const { return m_; }
  // Opens data file `index` (once), checking its header and size against the manifest.
  Status OpenFile(uint32_t index) { return File(index).status(); }
  // Opens every data file that holds a part of a tensor `keep` selects (by manifest index), so
  // that a manifest that declares more than its files hold is refused before any tensor of the
  // sizes it declares is allocated.
  Status OpenFilesOf(const std::vector<bool>& keep);
  // One worker's buffers (allocated on first use).
  struct Buffers {
    Tensor staging;  // chunk_bytes + 4096: a chunk read for verification only, unaligned for
                     // direct I/O (with the 4 KiB blocks around it), or compressed
    Tensor scratch;  // chunk_bytes: the shuffled form of a chunk being decompressed
    Tensor region;   // kRegionBytes: the small chunks of one region
  };
  // Reads chunk `chunk` of shard `shard` of tensor `tensor` (raw or compressed) into `dst`, which
  // receives its raw bytes, using worker buffers `b`, verifying its CRC32C when `verify`. For
  // readers of parts of tensors (the distributed load).
  Status ReadShardChunk(size_t tensor, size_t shard, uint64_t chunk, Destination dst, Buffers* b,
                        bool verify);
  // Reads chunks [first, first + count) of a shard into `dst` (their raw bytes back to back), in
  // one batched submission when they can go straight into it (as Load does), else one by one.
  Status ReadShardChunks(size_t tensor, size_t shard, uint64_t first, uint64_t count,
                         Destination dst, Buffers* b, bool verify);

  // --- Mapping (mmap.cc). ---
  // A read-only view of tensor `index` inside its data file's mapping, without verification.
  // FailedPrecondition for a tensor of several shards; the mapping's errors (Unimplemented when
  // the file system cannot map). `mapping`, when not null, receives the mapping the view points
  // into (null for an empty tensor stored without shards).
  Result<TensorView> MapIndex(size_t index, std::shared_ptr<const MappedFile>* mapping);
  // Checks the CRC32C of every chunk of the given single-shard tensors in their mappings, on
  // io_threads threads. Returns the number of chunks checked in *chunks (when not null). Counts
  // the bytes of every chunk checked in `progress` (when not null).
  Status VerifyMapped(const std::vector<size_t>& tensors, uint64_t* chunks,
                      Progress* progress = nullptr);

 private:
  Reader() = default;
  struct Task;
  struct Region;
  // A shard that is a box of its tensor: read into `buffer`, then copied into `dst`.
  struct Scatter {
    Tensor buffer;
    const format::TensorRecord* tensor;
    const format::ShardRecord* shard;
    Destination dst;
  };
  Result<RandomAccessFile*> File(uint32_t index);
  // Data file `index` mapped read-only, once, after File(index) has checked its header and size.
  Result<std::shared_ptr<const MappedFile>> Mapping(uint32_t index);
  Status ReadChunk(const Task& t, Buffers* b, bool verify);
  // Batched reads of chunks that go straight into their destinations (see reader.cc).
  bool DirectRead(const Task& t, const RandomAccessFile* f) const;
  Status ReadDirectBatch(std::span<const Task> run, RandomAccessFile* f, Buffers* b, bool verify);
  Result<std::vector<std::pair<size_t, size_t>>> ReadRuns(const std::vector<Task>& tasks);
  // Whether a chunk is read as part of a region (see kRegionBytes).
  static bool InRegion(const Task& t);
  // Moves the region chunks out of `tasks` into regions of `*regions`.
  void TakeRegions(std::vector<Task>* tasks, std::vector<Region>* regions) const;
  // Reads a region with one read, then verifies and copies each of its chunks. If the read fails,
  // reads its chunks one by one so that the error names the failing chunk.
  Status ReadRegion(const Region& r, Buffers* b, bool verify);
  // A chunk stored compressed: read into b->staging, verified there, decompressed into t.dst.
  Status ReadCompressedChunk(const Task& t, Buffers* b, bool verify);
  // "checkpoint P: tensor "T" chunk C (file F offset O, N bytes)": names a chunk in messages
  // (with ", zstd-compressed" for a compressed chunk; O and N are the stored extent's).
  std::string ChunkWhere(const format::TensorRecord& t, const format::ShardRecord& s,
                         uint64_t chunk) const;
  // ChunkWhere without the leading "checkpoint P: ".
  std::string ChunkDesc(const format::TensorRecord& t, const format::ShardRecord& s,
                        uint64_t chunk) const;
  // Corruption: data file `index` holds only `size` bytes (`how`: "" or " mapped"), fewer than
  // the manifest says; names the first chunk (tensor, chunk, offset) the file no longer holds.
  Status Truncated(uint32_t index, uint64_t size, std::string_view how) const;
  // Corruption (naming the chunk) unless `bytes` (chunk `chunk` of shard `s`) match its CRC32C.
  Status CheckChunk(const format::TensorRecord& t, const format::ShardRecord& s, uint64_t chunk,
                    std::span<const std::byte> bytes) const;
  // Turns the stored bytes `in` of chunk `chunk` of `s` (CRC-checked when verifying) into its
  // stored form in the clear at `out`: for an encrypted checkpoint, decrypts and authenticates
  // them (out == in allowed; out null: in place, to authenticate only; Unauthenticated naming the
  // chunk on failure); otherwise copies them unless out is null or equal to in.
  Status Unseal(const format::TensorRecord& t, const format::ShardRecord& s, uint64_t chunk,
                std::byte* in, std::byte* out) const;
  // Open: checks LoadOptions::key against the manifest (`bytes`, the MANIFEST file) and, for an
  // encrypted checkpoint with a key, authenticates the manifest and keeps the keys.
  Status Unlock(std::string_view bytes, const std::string& mpath);
  // Fills the per-tensor and per-file tables once m_ is set (`manifest_bytes`: MANIFEST's size).
  void Index(uint64_t manifest_bytes);
  Status AddTasks(size_t tensor, Destination dst, std::vector<Task>* tasks,
                  std::vector<Scatter>* scatter);

  FileSystem* fs_ = nullptr;
  LoadOptions options_;
  IoOptions io_;
  std::string path_;
  format::Manifest m_;
  std::optional<format::CheckpointKeys> keys_;  // set when encrypted and opened with the key
  mutable std::mutex json_mu_;                  // guards json_built_ and json_
  mutable bool json_built_ = false;
  mutable Json json_;  // set once by manifest_json()
  std::vector<TensorInfo> infos_;
  uint64_t total_bytes_ = 0;
  std::mutex mu_;  // guards files_
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::mutex map_mu_;  // guards maps_; never held while taking mu_ (Mapping calls File first)
  std::vector<std::shared_ptr<const MappedFile>> maps_;
};

// Loads the tensors `options` selects and every value from the open `reader` of the checkpoint
// at `path` (not one with sparse tables: src/api/load.cc sends those to LoadSparse): into owned
// tensors, or with options.mmap mapped where possible.
Result<State> LoadTensors(std::unique_ptr<Reader> reader, const std::string& path,
                          const LoadOptions& options);

// Fills the tensors of `targets` from the checkpoint at `path`, whole tensors of equal dtype and
// shape (the public LoadInto of one process, src/api/load.cc).
Status LoadInto(const std::string& path, State& targets, const LoadOptions& options,
                const IoOptions& io);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_READER_H_
