// Saving and loading checkpoints in savepoint's native format (docs/FORMAT.md).
//
// A checkpoint is a directory. Save writes it under a hidden temporary name, syncs every file,
// writes the manifest last, and renames the directory into place (the commit). A reader never
// sees a half-written checkpoint: a directory without a valid MANIFEST is not a checkpoint.
//
// Thread safety: Save/Load/Verify are reentrant (distinct paths may be used concurrently).
// A CheckpointReader may be used from several threads at once.
#ifndef SAVEPOINT_CHECKPOINT_H_
#define SAVEPOINT_CHECKPOINT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "savepoint/dtype.h"
#include "savepoint/encryption.h"
#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/format.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint {

// Statistics of one save, whichever call made it: Save (SaveOptions::stats), an asynchronous save
// (SaveHandle::stats()), SaveSafetensors, SaveDistributed (this rank's share) and the merges.
struct SAVEPOINT_API SaveStats {
  uint64_t bytes = 0;      // tensor bytes saved (uncompressed; no padding, no manifest)
  uint64_t chunks = 0;     // checksummed chunks written
  double seconds = 0;      // from the call's start to the durable commit
  bool direct_io = false;  // whether O_DIRECT was in effect for the data files
  // Tensor bytes as stored on disk (after compression, no padding, no manifest); equals `bytes`
  // when uncompressed.
  uint64_t stored_bytes = 0;
  // How long the caller was blocked: == seconds for a synchronous save; for SaveAsync the time
  // until it returned (including waiting for an earlier save and for staging slabs).
  double blocked_seconds = 0;
  // Asynchronous saves: the copy-and-checksum phase (phase 1). 0 for synchronous saves.
  double snapshot_seconds = 0;
  double throughput_gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  // bytes / stored_bytes (1 when nothing was stored).
  double compression_ratio() const {
    return stored_bytes > 0 ? static_cast<double>(bytes) / stored_bytes : 1.0;
  }
};

// Statistics of one load or verify: Load, LoadInto (LoadOptions::stats), CheckpointReader::Verify,
// VerifyCheckpoint, LoadSafetensors, LoadDistributed.
struct SAVEPOINT_API LoadStats {
  uint64_t bytes = 0;      // tensor bytes loaded, mapped or verified (uncompressed)
  uint64_t chunks = 0;     // checksummed chunks read or verified
  double seconds = 0;      // wall time of the whole call
  bool direct_io = false;  // whether O_DIRECT was in effect for the data files
  // Tensor bytes as stored on disk (after compression); equals `bytes` when uncompressed.
  uint64_t stored_bytes = 0;
  double throughput_gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  // bytes / stored_bytes (1 when nothing was stored).
  double compression_ratio() const {
    return stored_bytes > 0 ? static_cast<double>(bytes) / stored_bytes : 1.0;
  }
};

// Progress of a long operation: `done_bytes` of `total_bytes` done (see the `progress` fields of
// LoadOptions, SaveOptions and the safetensors options).
using ProgressFn = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;

class Communicator;  // savepoint/comm.h
struct ShardSpec;    // savepoint/distributed.h

// Per-rank layout: tensor name -> where this rank's tensor of that name lies in its global tensor
// (ShardSpec, savepoint/distributed.h). A tensor of the local State without an entry is taken as
// the whole tensor, replicated on every rank.
using ShardLayout = std::map<std::string, ShardSpec, std::less<>>;

// Where the state of a call lives: in one process (the default), or sharded over ranks, this
// rank's part described by a layout (savepoint/distributed.h). Save takes it in
// SaveOptions::topology, Load and LoadInto in LoadOptions::topology; every other call taking
// SaveOptions or LoadOptions refuses a topology with comm or layout set (InvalidArgument naming
// the field). The pointers are borrowed for the call.
struct SAVEPOINT_API Topology {
  // Save: the ranks that save together. Every rank calls Save with its own tensors, the same
  // path and the same options; all return the same status, OK once the one checkpoint is
  // committed (what SaveDistributed does; native checkpoints only, and no sparse tables:
  // SaveSparseDistributed saves those). Loads take none: each rank reads its own boxes
  // (InvalidArgument). Default: null (one process).
  Communicator* comm = nullptr;
  // This rank's box of each tensor, by name. Save: needs comm; null there means every tensor is
  // whole and replicated. LoadInto: the boxes to fill, each target's shape being its box's sizes
  // (LoadDistributed); Load: one tensor allocated per entry, and only those (LoadDistributedAlloc).
  // Loads of native checkpoints only. Default: null (whole tensors).
  const ShardLayout* layout = nullptr;
  // Save with comm: timeout of every collective (the coordinator's commit is included in the
  // last one's wait). Default: 10 minutes.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

// Optional per-chunk compression of a save (docs/FORMAT.md, "Compressed shards"). Each chunk is
// compressed on its own and stored compressed only if that makes it smaller, so reads stay
// random-access. A compressed checkpoint lists the feature "compression" and cannot be read by
// builds older than this one; an uncompressed one is byte-identical to what older builds wrote.
// Compressed tensors cannot be mapped (CheckpointReader::MapTensor); Load with mmap reads them.
//
// When to use it: dense float weights compress poorly (bf16 ~1.2-1.6x with shuffle, f32 less) and
// cost CPU, so on a fast local disk it slows saves down (docs/PERFORMANCE.md). It pays off for
// slow or remote storage and for sparse or mostly-zero data (masks, fresh optimizer state).
struct SAVEPOINT_API Compression {
  enum class Codec : uint8_t {
    kNone,  // store raw bytes (the classic layout)
    kZstd,  // zstd: better ratio, slower
    kLz4,   // lz4: fast, lower ratio
  };
  enum class Shuffle : uint8_t {
    kAuto,  // byte-shuffle tensors whose element is 2, 4 or 8 bytes (f16, bf16, f32, f64, ints)
    kOn,    // byte-shuffle every tensor with elements wider than one byte
    kOff,   // never
  };
  // Default: kNone (no compression).
  Codec codec = Codec::kNone;
  // Byte-shuffle filter (byte planes of each element, so exponents and high bytes compress
  // together) applied before the codec. Default: kAuto.
  Shuffle shuffle = Shuffle::kAuto;
  // zstd level in [-7, 22] (0 = zstd's default, 3); higher is smaller and slower. Ignored by
  // lz4. Default: 1.
  int zstd_level = 1;
};

// What one save writes (per call). Where bytes go and how they move (file system, threads, direct
// I/O) is the IoOptions of the call or of the instance (savepoint/io_options.h).
struct SAVEPOINT_API SaveOptions {
  // Bytes per checksummed chunk: a multiple of 4096 in [4096, 1 GiB]. Default: 8 MiB. An
  // asynchronous save chunks by its Checkpointer's slab_bytes: there it must be left at the
  // default or equal slab_bytes (else InvalidArgument).
  uint64_t chunk_bytes = uint64_t{8} << 20;
  // Replace an existing checkpoint at the path. The old one stays intact until the new one is
  // committed; a crash in between leaves either (docs/FORMAT.md §5). Default: false
  // (AlreadyExists).
  bool overwrite = false;
  // Create missing parent directories. Default: true.
  bool create_parents = true;
  // Per-chunk compression (see Compression). Default: none.
  Compression compression = {};
  // On-disk format version to write (docs/FORMAT.md, §6); readers accept 1 to 4.
  //  - 2 packs tensors smaller than 64 KiB back to back at 64-byte alignment (a tiny tensor
  //    costs its bytes, not a 4 KiB block);
  //  - 1 starts every tensor at a 4096-byte boundary, for readers built before version 2;
  //  - 3 and 4 are version 2 with an indexed manifest, whose shards a loading rank reads in parts
  //    (4: compact records, a quarter of 3's bytes): what a job of thousands of ranks needs;
  //  - 0 (the default) leaves the choice to savepoint: 2 for a single-process save; for a
  //    distributed save the coordinator's: 4 when the save has more than 65,536 shards or 2^20
  //    chunks (version 2's JSON manifest would make every loading rank decode megabytes, and
  //    exceeds its cap beyond about 4 million shards), else 2. Every rank must pass the same
  //    value.
  uint32_t format_version = 0;
  // Optional: receives statistics of the save. An asynchronous save has them in its SaveHandle:
  // there it must be null (else InvalidArgument).
  SaveStats* stats = nullptr;
  // Optional progress of Save, SaveDistributed (this rank's share) and the merges' writes:
  // called with the tensor bytes (uncompressed) written so far and the state's tensor bytes, at
  // chunk granularity, at most about 10 times a second, and once more with done == total when all
  // data is written (before the commit). Called from the I/O worker threads and the calling
  // thread, never two calls at once; done never decreases. Must be cheap and must not call into
  // savepoint. An asynchronous save has no progress callback (SaveHandle::Poll tells when it is
  // done): there it must be empty (else InvalidArgument). Default: empty (never called).
  ProgressFn progress = nullptr;
  // Encrypts the checkpoint (docs/FORMAT.md §10): every chunk of tensor bytes is sealed with
  // AES-256-GCM under a key derived from this one and a fresh random salt, and the manifest is
  // authenticated (HMAC-SHA256). The key is 16 to 64 bytes (32 random bytes recommended): raw
  // bytes, a key file or a provider (savepoint/encryption.h), resolved once per save, never
  // logged; anything else is InvalidArgument naming this field. Compression, when set, is applied
  // before encryption. Tensor names, dtypes, shapes, non-tensor values and metadata stay readable
  // without the key (authenticated, not encrypted). Reading needs LoadOptions::key; an encrypted
  // checkpoint cannot be memory-mapped. Save, SaveAsync, SaveDistributed (the same key on every
  // rank) and the merges honour it. Costs AES-GCM's CPU time (several GB/s per core;
  // docs/PERFORMANCE.md). Default: none (not encrypted: the checkpoint is byte-identical to one
  // written by a build without encryption).
  EncryptionKey key = {};
  // The container to write (savepoint/format.h): kNative (a checkpoint directory), kSafetensors
  // (one safetensors file, SaveSafetensors) or kMindSporeCkpt (one MindSpore `.ckpt` file,
  // SaveMindSporeCheckpoint); kAuto picks by the name (TargetFormat: ".safetensors", ".ckpt",
  // else native). The file formats honour overwrite, create_parents, stats (bytes, seconds) and
  // progress, and kMindSporeCkpt the key (AES-GCM); any other field changed from its default is
  // InvalidArgument naming it, as is kDcp or kRecis (read only). Save alone honours it: an
  // asynchronous save, SaveDistributed and the merges write native checkpoints (another value is
  // InvalidArgument there). Default: kNative.
  Format format = Format::kNative;
  // One process, or this rank's part of a sharded state (see Topology). Save alone honours it.
  // Default: one process.
  Topology topology = {};
};

// Saves `state` as a checkpoint directory at `path` through `io` (or, by SaveOptions::format, as a
// safetensors or `.ckpt` file, committed the same way). Returns only after the
// checkpoint is durable (data, manifest and directory entry synced). On error nothing is
// committed, the temporary directory is removed (best effort), and any checkpoint previously at
// `path` is intact.
SAVEPOINT_API Status Save(const State& state, const std::string& path,
                          const SaveOptions& options = {}, const IoOptions& io = {});

// What one load reads and how it checks it (per call). The file system, threads and direct I/O
// are the IoOptions (savepoint/io_options.h).
struct SAVEPOINT_API LoadOptions {
  // Entries to load: exact names or glob patterns (the rule of MatchesName below). Empty =
  // everything. A name or pattern that matches nothing fails with NotFound.
  std::vector<std::string> names = {};
  // Verify every chunk's CRC32C while reading. Default: true.
  bool verify_checksums = true;
  // Map data files instead of reading them. Load returns tensors that are views into the mapping
  // (zero-copy) where possible; verification is lazy (see CheckpointReader::MapTensor).
  // Details (Load only; LoadInto, VerifyCheckpoint and CheckpointReader::ReadTensor ignore it,
  // Verify refuses it):
  //  - A tensor stored as one uncompressed shard becomes a borrowed TensorView straight into the
  //  read-only
  //    mapping of its data file; the returned State keeps the mappings alive (State::KeepAlive),
  //    so its views stay valid after Load returns, until the State is destroyed. The memory is
  //    read-only: with the POSIX file system it is mapped PROT_READ, so writing through the view's
  //    pointer crashes (SIGSEGV). Copy a tensor (Tensor::CopyOf) to modify it.
  //  - A tensor stored as several shards, or compressed, is read (and assembled, decompressed)
  //    into an owned Tensor as usual.
  //  - With verify_checksums, Load checks every chunk of every mapped tensor once before
  //    returning; this touches every page (the whole selection is read from storage, though not
  //    copied). With verify_checksums = false nothing but the data file headers is read at Load:
  //    pages are read on first access, and corruption goes undetected.
  //  - On a file system that cannot map (FileSystem::MapFile is Unimplemented), tensors are read
  //    into owned Tensors instead. A data file truncated while mapped makes access raise SIGBUS.
  // Default: false.
  bool mmap = false;
  // How data files are mapped (by Load with mmap, and by CheckpointReader::MapTensor): kReadOnly
  // (views are read-only, as above) or kCopyOnWrite (views are writable; a written page becomes a
  // private copy of this process and the files never change; the Python load(mmap=True) uses
  // it). Load with kCopyOnWrite but without mmap is InvalidArgument. Default: kReadOnly.
  MapMode map_mode = MapMode::kReadOnly;
  // Optional: receives statistics.
  LoadStats* stats = nullptr;
  // Optional progress of Load, LoadInto, and of CheckpointReader::Verify and ReadTensor on a
  // reader opened with these options (LoadDistributed ignores it): called with the tensor bytes
  // (uncompressed, also for compressed chunks) read or verified so far and the total of the call,
  // at chunk granularity, at most about 10 times a second, and once more with done == total when
  // the call succeeds. Load with mmap counts only what it reads or verifies. Called from the I/O
  // worker threads and the calling thread, never two calls at once; done never decreases. Must be
  // cheap and must not call into savepoint. Default: empty (never called).
  ProgressFn progress = nullptr;
  // The key of an encrypted checkpoint (SaveOptions::key; docs/FORMAT.md §10), resolved once per
  // call (per Open for a CheckpointReader). With it, opening checks the key (Unauthenticated
  // "wrong key") and authenticates the manifest (Unauthenticated: modified), and every chunk read
  // is authenticated by AES-GCM, also with verify_checksums = false (Unauthenticated naming the
  // tensor and chunk). Without it, reading tensors of an encrypted checkpoint (Load, LoadInto,
  // VerifyCheckpoint, LoadDistributed, a reader's ReadTensor, Verify and MapTensor) is
  // InvalidArgument "checkpoint X is encrypted: pass LoadOptions::key"; CheckpointReader::Open
  // itself succeeds, so that tools can list names, shapes and values, which are then not
  // authenticated. A key for a checkpoint that is not encrypted is InvalidArgument, so that an
  // unencrypted checkpoint cannot stand in for an encrypted one. Encrypted checkpoints cannot be
  // mapped: mmap (and MapTensor) is InvalidArgument. Default: none.
  EncryptionKey key = {};
  // The container to read (savepoint/format.h). kAuto: what DetectFormat finds at the path.
  // Load and Verify read every format: safetensors files honour names, verify_checksums (a
  // MindSpore crc_num), mmap, map_mode, stats and progress; `.ckpt` files names,
  // verify_checksums (the CRC-32 trailer), key, stats and progress; DCP and RecIS directories
  // names, stats and progress (loaded whole, then selected). A field a format cannot honour
  // changed from its default is InvalidArgument naming it (mmap for a format that is read, not
  // mapped: `.ckpt`, DCP, RecIS; a key for one that is not encrypted). LoadInto,
  // CheckpointReader::Open, LoadDistributed and VerifyCheckpoint read native checkpoints only:
  // there kAuto and kNative are accepted, anything else is InvalidArgument. Default: kAuto.
  Format format = Format::kAuto;
  // The boxes of a sharded load (Topology::layout; a comm is InvalidArgument). Load and LoadInto
  // alone honour it. Default: whole tensors.
  Topology topology = {};
};

// Loads a checkpoint into freshly allocated, aligned tensors (plus values and metadata). With
// options.topology.layout: only this rank's boxes, one tensor per layout entry.
SAVEPOINT_API Result<State> Load(const std::string& path, const LoadOptions& options = {},
                                 const IoOptions& io = {});

// Loads into caller-provided buffers: every tensor entry of `targets` (owned or borrowed) is filled
// from the checkpoint tensor of the same name, which must have the same dtype and shape (with
// options.topology.layout: the shape of its box, read from the tensor's shards). Value entries of
// `targets` are replaced by the checkpoint's. `options.names` is ignored.
SAVEPOINT_API Status LoadInto(const std::string& path, State& targets,
                              const LoadOptions& options = {}, const IoOptions& io = {});

// Description of one tensor in a checkpoint (from the manifest; no data read).
struct SAVEPOINT_API TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t nbytes = 0;
  size_t num_shards = 0;
  size_t num_chunks = 0;
  // "none", or the codec of its compressed shards ("zstd", "lz4") and their filter ("none",
  // "shuffle").
  std::string codec = "none";
  std::string filter = "none";
  // Bytes as stored in the data files (after compression, without padding); nbytes when
  // uncompressed.
  uint64_t stored_bytes = 0;
};

// An open checkpoint: the manifest has been read and validated; data files are opened on demand.
class SAVEPOINT_API CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;

  // Opens and validates the manifest of the checkpoint at `path`. Reads no tensor data. The
  // reader keeps `options` (verify_checksums, map_mode, progress, key; names, mmap and stats are
  // for Load and are not used) and `io` for every later call. An encrypted checkpoint is
  // authenticated here when options.key is set (see LoadOptions::key).
  static Result<std::unique_ptr<CheckpointReader>> Open(const std::string& path,
                                                        const LoadOptions& options = {},
                                                        const IoOptions& io = {});

  virtual const std::string& path() const = 0;
  virtual uint32_t format_version() const = 0;
  // Whether the checkpoint is encrypted (docs/FORMAT.md §10). Without LoadOptions::key the
  // manifest of an encrypted checkpoint is not authenticated and no tensor can be read.
  virtual bool encrypted() const = 0;
  virtual int64_t created_ns() const = 0;
  // Tensors in name order.
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // Sum of the sizes of the checkpoint's files (data + manifest).
  virtual uint64_t total_file_bytes() const = 0;
  virtual const TensorInfo* FindTensor(const std::string& name) const = 0;
  // Non-tensor values and user metadata (a State without tensors).
  virtual const State& values() const = 0;
  // The manifest as JSON (what `savepoint inspect --json` prints under "manifest").
  virtual const Json& manifest_json() const = 0;

  // Reads one tensor into `dst`, which must match its dtype and shape.
  virtual Status ReadTensor(const std::string& name, const TensorView& dst) = 0;
  // Reads one tensor into a new aligned Tensor.
  virtual Result<Tensor> ReadTensor(const std::string& name) = 0;
  // Zero-copy access: a read-only view of the tensor's bytes inside a mapping of its data file
  // (FileSystem::MapFile). The reader maps each data file once, lazily, after checking its header
  // and that the mapping covers the manifest's size, and keeps the mappings alive: views are valid
  // while the reader lives. The memory is read-only (POSIX: PROT_READ, writing through it crashes).
  // With `verify`, every chunk of the tensor is checked against its CRC32C first (this reads the
  // whole tensor); a mismatch is Corruption naming checkpoint, tensor, chunk, file and offset, like
  // ReadTensor's. Without it, nothing of the tensor is read until the caller touches its pages.
  // Errors: NotFound (no such tensor); FailedPrecondition (the tensor is stored as several shards
  // or compressed, so no contiguous copy of it exists: use ReadTensor); Unimplemented (the file
  // system cannot map); Corruption (bad data file header, file shorter than the manifest says, CRC
  // mismatch); InvalidArgument (the checkpoint is encrypted: its bytes on disk are ciphertext). An
  // empty tensor gives a view whose data() may be null.
  virtual Result<TensorView> MapTensor(const std::string& name, bool verify) = 0;
  // Re-reads every chunk of every tensor and checks its CRC32C. The first mismatch is returned
  // as Corruption naming checkpoint, tensor, chunk, file and offset. Compressed chunks are checked
  // in their stored (compressed) form, which is what their CRC32C covers; they are not
  // decompressed. Encrypted chunks are also authenticated (decrypted into scratch memory): a
  // failure is Unauthenticated naming the chunk.
  virtual Status Verify(LoadStats* stats = nullptr) = 0;
};

// Whether `pattern` selects the entry name `name`: the one rule of every name filter of savepoint
// (LoadOptions::names, SafetensorsLoadOptions::names, LoadConfig::only, the Python `names=`):
//  - a pattern equal to the name always selects it (so any exact name works as a pattern, even
//    "layers[0].w");
//  - a pattern without '*', '?' or '[' is an exact name;
//  - otherwise it is a glob: '*' matches any run of characters, '.' and '/' included; '?' any one
//    character; "[abc]", "[a-z]" one character of a set, "[!abc]" (or "[^abc]") one not in it; a
//    '[' without its ']' is an ordinary character;
//  - there are no escapes ('\' is an ordinary character); matching is case-sensitive.
SAVEPOINT_API bool MatchesName(const std::string& pattern, const std::string& name);

// Convenience: CheckpointReader::Open(path, options, io)->Verify(options.stats). Native only.
SAVEPOINT_API Status VerifyCheckpoint(const std::string& path, const LoadOptions& options = {},
                                      const IoOptions& io = {});

// Verifies the checkpoint at `path` in any format (LoadOptions::format; kAuto detects it) without
// keeping its data: every checksum the format has is checked (native: every chunk's CRC32C and,
// when encrypted, its tag; safetensors: MindSpore's crc_num when present; `.ckpt`: the CRC-32
// trailer when present, and the blocks of an encrypted file), and every tensor is read and
// decoded. A file with no checksum is read through, so a truncation or a malformed header is still
// found. Memory: native and safetensors data is read in bounded pieces; a `.ckpt` file (one CRC
// over the whole file) is loaded whole and dropped. Honours verify_checksums, key, stats and
// progress; names, mmap and map_mode must be left at their defaults. Errors name the file and,
// where the format locates the damage, the entry and the offset.
SAVEPOINT_API Status Verify(const std::string& path, const LoadOptions& options = {},
                            const IoOptions& io = {});

// What one Convert reads and writes.
struct SAVEPOINT_API ConvertOptions {
  // The source's format; kAuto: DetectFormat. Default: kAuto.
  Format from = Format::kAuto;
  // The target's format (kNative, kSafetensors or kMindSporeCkpt); kAuto: TargetFormat (by the
  // name). Default: kAuto.
  Format to = Format::kAuto;
  // Replace an existing target. Checked before the source is read (AlreadyExists otherwise).
  // Default: false.
  bool overwrite = false;
  // The key of an encrypted source (a native checkpoint or a `.ckpt` file). Default: none.
  EncryptionKey source_key = {};
  // The cipher an encrypted `.ckpt` source must use; nullopt accepts the one the file names.
  // Default: nullopt.
  std::optional<Cipher> source_cipher = std::nullopt;
  // Encrypt the target (native: AES-256-GCM per chunk; `.ckpt`: `cipher`). A safetensors target
  // with a key is InvalidArgument. Default: none.
  EncryptionKey key = {};
  // The cipher of an encrypted `.ckpt` target; another value than the default for any other
  // target, or without a key, is InvalidArgument. Default: kAesGcm.
  Cipher cipher = Cipher::kAesGcm;
  // File targets: write MindSpore's checksum (a `.ckpt` CRC-32 trailer, or the MindSpore
  // safetensors flavour with its crc_num). A native target is InvalidArgument (it always carries
  // CRC32C per chunk). Default: false.
  bool file_checksum = false;
  // A safetensors target in MindSpore's flavour (`__metadata__` "format": "ms"; implied by
  // file_checksum). Any other target is InvalidArgument. Default: false.
  bool mindspore_flavour = false;
  // Optional progress of reading the source and of writing the target, each as
  // SaveOptions::progress (the target's total is the tensor bytes read). Default: empty.
  ProgressFn read_progress = nullptr;
  ProgressFn write_progress = nullptr;
};

// What one Convert did.
struct SAVEPOINT_API ConvertReport {
  Format from = Format::kAuto;  // the formats used (never kAuto)
  Format to = Format::kAuto;
  size_t tensors = 0;  // dense tensors written
  size_t values = 0;   // non-tensor values written
  size_t tables = 0;   // sparse tables written (native targets only)
  uint64_t table_rows = 0;
  uint64_t tensor_bytes = 0;
  // What the source held that was not converted, and what was read instead of the path given
  // (a RecIS directory's newest listed checkpoint), one line each.
  std::vector<std::string> notes;
};

// Converts the checkpoint at `src` into `dst`, any readable format into any writable one (native
// <-> safetensors <-> `.ckpt`; DCP and RecIS directories as sources). Native and safetensors
// sources are mapped where the file system allows it and written straight from the mapping. A
// source with sparse tables converts only into a native checkpoint. The target is committed
// atomically (nothing is at `dst` on error; an old target stays intact until the new one is
// committed). Errors: InvalidArgument for an option the formats cannot honour (naming it), and
// those of the reads and writes.
SAVEPOINT_API Result<ConvertReport> Convert(const std::string& src, const std::string& dst,
                                            const ConvertOptions& options = {},
                                            const IoOptions& io = {});

}  // namespace savepoint

#endif  // SAVEPOINT_CHECKPOINT_H_
