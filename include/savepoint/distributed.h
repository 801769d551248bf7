// Distributed (multi-rank) checkpoints: sharded save, replicas written once, load into any layout.
//
// Each rank holds slices of tensors (tensor / pipeline / optimizer parallelism) and copies of
// others (data parallelism). A rank describes each local tensor as a box of a global tensor plus
// the ranks that hold identical copies of that box (its replica group):
//
//   global tensor [8, 6]          rank 0: box rows 0..4 (replicas {0, 2})
//   +-----------+                 rank 1: box rows 4..8 (replicas {1, 3})
//   | ranks 0,2 |                 rank 2: same box as rank 0
//   +-----------+                 rank 3: same box as rank 1
//   | ranks 1,3 |
//   +-----------+
//
// SaveDistributed writes one native checkpoint (docs/FORMAT.md) from all ranks at once: every
// rank writes its own data file data-<rank>-00000.spd; each replicated box is written by exactly
// one member of its replica group; the coordinator (rank 0) writes the one global MANIFEST after
// every rank reported success, then commits. LoadDistributed reads any layout back: another world
// size, other split dimensions, other replica groups, uneven splits. A distributed checkpoint is
// also an ordinary checkpoint: Load() on one process assembles full tensors.
//
// Thread safety: the calls are reentrant; each rank's thread calls them with its own Communicator.
#ifndef SAVEPOINT_DISTRIBUTED_H_
#define SAVEPOINT_DISTRIBUTED_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/comm.h"
#include "savepoint/export.h"
#include "savepoint/io_options.h"
#include "savepoint/safetensors.h"
#include "savepoint/state.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint {

// Where one local tensor lies in its global tensor, and who else holds the same bytes.
struct SAVEPOINT_API ShardSpec {
  Shape global_shape;  // shape of the whole tensor
  Shape offsets;       // first element of the local box in the global tensor
  Shape sizes;         // shape of the local box (must equal the local tensor's shape)
  // Ranks holding identical copies of this box, including this rank, in any order. Empty means
  // "only this rank".
  std::vector<int> replicas;
  // The stored tensor this local entry is a box of. Empty (the default): the entry's own name.
  // One rank holding several boxes of one tensor (several shards of a ShardedTensor, a chunked
  // DCP write) gives each box a local entry of its own name and the same `tensor`: a save stores
  // them as boxes of `tensor` (the coordinator checks that all boxes of every rank tile it), a
  // load fills each from `tensor`. Replicas hold the same local entries under the same names.
  std::string tensor = {};
};

// ShardLayout (tensor name -> ShardSpec, one rank's layout) is declared in savepoint/checkpoint.h,
// where Topology borrows one.

// --- Layout helpers. ---

// The box of part `index` of `parts` when dim `dim` of `global_shape` is split: part i covers
// [i * S / parts, (i + 1) * S / parts) (uneven splits allowed; S = global_shape[dim]), all other
// dims whole. `replicas` is copied into the result. InvalidArgument on a bad dim, parts or index.
SAVEPOINT_API Result<ShardSpec> SplitDim(const Shape& global_shape, int dim, int parts, int index,
                                         std::vector<int> replicas = {});

// Checks the layouts of a whole job (one ShardLayout per rank, indexed by rank) for one set of
// tensors: every box within its global shape, replicas consistent, boxes (after removing
// replicas) neither overlapping nor leaving gaps. InvalidArgument naming the tensor otherwise.
// SaveDistributed runs the same checks without gathering every layout on one rank.
SAVEPOINT_API Status ValidateLayouts(const std::vector<ShardLayout>& per_rank);

// --- Save. ---

struct SAVEPOINT_API DistributedSaveOptions {
  // Options of the underlying save: chunk_bytes, overwrite, create_parents, compression,
  // format_version, key. `stats` (when set) receives this rank's bytes and chunks written,
  // `progress` (when set) reports this rank's writes. Must be equal on every rank (stats and
  // progress aside). An encrypted save (key): every rank resolves its own key and seals its own
  // chunks under the coordinator's salt; a rank without a key, or with another key, makes the
  // save fail on every rank with InvalidArgument before anything is committed.
  SaveOptions save;
  // Timeout of every collective of the save (the coordinator's commit is included in the wait of
  // the last one). Ranks other than the coordinator wait up to twice this for the coordinator's
  // answers, so that a missing rank is reported by the coordinator, naming it. Default: 10 minutes.
  Timeout timeout = std::chrono::minutes(10);
};

// Saves a sharded state: called by every rank of `comm` with its local tensors and their layout.
// Values and metadata are taken from rank 0 only. Returns on every rank the same result: OK once
// the checkpoint is committed; otherwise the first error (naming the failing rank), nothing
// committed, the temporary directory removed. Rejects (InvalidArgument, naming the tensor or rank)
// layouts whose boxes overlap, leave gaps, exceed the global shape, or disagree across ranks on
// dtype or global shape, and sparse tables (SaveSparseDistributed saves those), before any data is
// written. `io.fs` must be shared storage, the same path on every rank.
// Save(local, path, {.topology = {&comm, &layout, timeout}}) is the same call; this one takes
// them as arguments (its options' own topology must be left unset).
SAVEPOINT_API Status SaveDistributed(Communicator& comm, const State& local,
                                     const ShardLayout& layout, const std::string& path,
                                     const DistributedSaveOptions& options = {},
                                     const IoOptions& io = {});

// --- The save's steps one by one. ---
//
// SaveDistributed is these steps joined by a Communicator's collectives (docs/DISTRIBUTED.md,
// "Save protocol"). A framework that runs its own collectives (the torch DCP storage plug-in,
// python/savepoint/torch.py) calls them itself and carries their bytes between the ranks:
//   every rank:   RankSave::Plan           -> plan bytes     (step 1), to the coordinator
//   coordinator:  SaveCoordinator::Decide  -> verdict bytes  (step 3), to every rank
//   every rank:   RankSave::Write(verdict) -> report bytes   (step 4), to the coordinator
//   coordinator:  SaveCoordinator::Commit(reports)           (step 6)
// A failed step's bytes carry its error, naming the rank, to the coordinator. The bytes are
// opaque and valid only between these calls of one save by one build of the library.
// Thread safety: an object is used by one thread at a time.
struct RankSaveAccess;  // internal (src/distributed/save_access.h)

class SAVEPOINT_API RankSave {
 public:
  RankSave(int rank, int world);
  ~RankSave();
  RankSave(const RankSave&) = delete;
  RankSave& operator=(const RankSave&) = delete;

  // Step 1: resolves `layout` for the tensors of `local` as SaveDistributed does, picks the shards
  // this rank writes (one member per replica group) and lays out its data file. Rank 0 also takes
  // the values and metadata of `local`. The tensors' memory must stay valid and unchanged until
  // Write returns. Returns the plan bytes; when planning failed they carry the error, which
  // planned() also returns.
  std::string Plan(const State& local, const ShardLayout& layout, const SaveOptions& o,
                   const IoOptions& io);
  const Status& planned() const;

  // Adds the non-tensor values of `values` (and its metadata, when not null) to what this rank
  // hands the coordinator's Commit. For the coordinator's rank, after Plan; Plan already took rank
  // 0's. InvalidArgument when a name is already taken.
  Status AddValues(const State& values);

  // Step 4: takes the coordinator's verdict. When the verdict is an error (or malformed) returns
  // it: the save is over and nothing is to be reported. Otherwise writes and syncs this rank's
  // data file (when it has shards) and returns the report bytes, which carry the write's error if
  // it failed (wrote() returns it too).
  Result<std::string> Write(std::string_view verdict, const SaveOptions& o, const IoOptions& io);
  const Status& wrote() const;

  uint64_t bytes() const;  // tensor bytes this rank writes (after Plan)
  size_t chunks() const;   // chunks this rank writes (after Plan)
  bool direct_io() const;  // whether its data file was written with O_DIRECT (after Write)

 private:
  friend class SaveCoordinator;
  friend struct RankSaveAccess;  // src/distributed/save_access.h: sparse row gathers, dry reports
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The coordinator's steps (rank 0 in SaveDistributed). `o`: the save's options (overwrite,
// create_parents; equal on every rank); `io.fs` the shared storage.
class SAVEPOINT_API SaveCoordinator {
 public:
  SaveCoordinator(std::string path, int world, SaveOptions o, IoOptions io);
  // Removes the temporary directory unless the save was committed.
  ~SaveCoordinator();
  SaveCoordinator(const SaveCoordinator&) = delete;
  SaveCoordinator& operator=(const SaveCoordinator&) = delete;

  // Step 3: merges the plans of ranks 0..world-1, checks dtypes, global shapes and that the shards
  // of every tensor tile it (InvalidArgument naming the tensor), creates the hidden temporary
  // directory and draws the checkpoint id. Returns the verdict bytes, the same for every rank;
  // they carry the error when the plans were refused (nothing was written then).
  std::string Decide(const std::vector<std::string>& plans);
  // The verdict's status after Decide (OK when the save goes on).
  const Status& decided() const;

  // Step 6: checks every rank's report, writes and syncs MANIFEST and commits by rename. `own` is
  // the coordinator's rank's RankSave after its Write: its plan carries the values, metadata and
  // (encrypted saves) the keys. On error removes the temporary directory.
  Status Commit(const std::vector<std::string>& reports, RankSave& own);

  // Removes the temporary directory, if any (a step failed elsewhere). Idempotent.
  void Abandon();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- Load into any layout. ---

// What a rank needs from a checkpoint to fill its layout (no data read).
struct SAVEPOINT_API ReadPlanSummary {
  std::vector<std::string> files;  // data file names, sorted
  std::vector<int> source_ranks;   // ranks that wrote those files, sorted
  uint64_t bytes = 0;              // bytes that will be read (whole chunks)
};

// Fills every tensor of `targets` (owned or borrowed buffers holding this rank's boxes) from the
// checkpoint at `path`: the box of a tensor is layout[name] (the whole tensor when absent; the
// target's shape must equal the box's sizes). Reads only the chunks that overlap the boxes, in
// parallel, each verified whole against its CRC32C (unless options.verify_checksums is false).
// Values and metadata of `targets` are replaced by the checkpoint's. options.names is ignored.
// Errors: NotFound (no such tensor, or a data file missing: names the file and the rank that
// wrote it), InvalidArgument (dtype or global shape differs, box outside the tensor), Corruption
// (a CRC mismatch, or stored shards that do not cover the box: names the tensor and the box).
// On error the targets' contents are unspecified (row blocks are read straight into them, as
// LoadInto does); the checkpoint is never changed. An encrypted checkpoint needs options.key
// (see LoadOptions::key); every chunk read is authenticated (Unauthenticated naming it).
// LoadInto(path, targets, {.topology = {.layout = &layout}}) is the same call.
SAVEPOINT_API Status LoadDistributed(const std::string& path, State& targets,
                                     const ShardLayout& layout, const LoadOptions& options = {},
                                     const IoOptions& io = {});

// One box of a stored tensor to read: the elements [offsets, offsets + view.shape()) of tensor
// `name` (global coordinates) into `view` (row-major, the box's shape, the tensor's dtype).
struct SAVEPOINT_API BoxTarget {
  std::string name;
  Shape offsets;
  TensorView view;
};

// Reads boxes of stored tensors into caller buffers, as LoadDistributed reads a layout's boxes
// (the same reads: only the overlapping chunks, in parallel, each verified whole), but with any
// number of boxes per tensor (boxes must not share target memory). Values and metadata are not
// read. Errors as LoadDistributed's; the Corruption of a CRC mismatch names the tensor and chunk.
SAVEPOINT_API Status LoadBoxes(const std::string& path, const std::vector<BoxTarget>& boxes,
                               const LoadOptions& options = {}, const IoOptions& io = {});

// Like LoadDistributed, allocating one tensor per layout entry (dtype from the checkpoint).
// Load(path, {.topology = {.layout = &layout}}) is the same call.
SAVEPOINT_API Result<State> LoadDistributedAlloc(const std::string& path, const ShardLayout& layout,
                                                 const LoadOptions& options = {},
                                                 const IoOptions& io = {});

// Which data files (and source ranks) LoadDistributed would read for `layout`; reads only the
// manifest, through `fs` (nullptr = DefaultFileSystem()). Like MindSpore's
// rank_list_for_transform.
SAVEPOINT_API Result<ReadPlanSummary> PlanDistributedLoad(const std::string& path,
                                                          const ShardLayout& layout,
                                                          FileSystem* fs = nullptr);

// --- Merge (export). ---

struct SAVEPOINT_API MergeOptions {
  // How the source is read (verify_checksums; names selects tensors; key decrypts an encrypted
  // source). `progress` (when set) reports the read. mmap and map_mode must be left at their
  // defaults (the merge reads).
  LoadOptions load;
  // How the result is written (chunk_bytes, overwrite, compression, key to encrypt it, which may
  // differ from load.key: a merge can re-key or decrypt a checkpoint). `stats` (when set)
  // receives the statistics of the write; `progress` (when set) reports the write.
  SaveOptions save;
};

// Writes the checkpoint at `src` (typically a distributed one: tensors stored as several shards
// in several ranks' files) to `dst` as a single-rank checkpoint: every tensor whole, in one data
// file, values and metadata copied. Every chunk read is verified (unless load.verify_checksums is
// false). Holds the whole selection in memory. The source is left unchanged.
SAVEPOINT_API Status MergeCheckpoint(const std::string& src, const std::string& dst,
                                     const MergeOptions& options = {}, const IoOptions& io = {});

struct SAVEPOINT_API MergeSafetensorsOptions {
  // How the source is read (verify_checksums; names selects tensors; key decrypts an encrypted
  // source: the safetensors files written are not encrypted). mmap and map_mode must be left at
  // their defaults.
  LoadOptions load;
  // How the files are written (create_parents; `overwrite` must be false).
  // `stats` (when set) receives the statistics of the whole write, summed over the files, and
  // `progress` reports the write of all files together: done counts the tensor bytes written to
  // every file so far, total is the selection's tensor bytes. `load.progress` reports the read.
  SafetensorsSaveOptions save;
  // Most tensor-data bytes per file; 0 = no cap (one file). A tensor larger than the cap goes
  // alone into its own file. Default: 0.
  uint64_t max_file_bytes = 0;
};

// Names inside the directory MergeToSafetensors writes (Hugging Face conventions).
inline constexpr char kSafetensorsSingleFile[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";

// Writes the checkpoint at `src` with every tensor whole as safetensors files in a new directory
// `dst` (which must not exist: AlreadyExists):
//  - max_file_bytes == 0, or all tensors fit in one file: `dst/model.safetensors`, no index;
//  - otherwise `dst/model-00001-of-0000K.safetensors` ... (tensors in name order, packed greedily
//    up to max_file_bytes of tensor data per file) and `dst/model.safetensors.index.json`:
//    {"metadata": {"total_size": <tensor bytes>}, "weight_map": {"<tensor>": "<file>", ...}}.
// Values and metadata are written into every file's `__metadata__` (as SaveSafetensors does), so
// each file loads on its own with them. Atomic: everything is written into a hidden sibling
// directory that is renamed to `dst` last (and the parent synced); on an error it is removed.
// Errors: AlreadyExists (dst), InvalidArgument (save.overwrite set, more than 99999 files, a C128
// tensor), and the errors of Load and SaveSafetensors. Holds the whole selection in memory.
SAVEPOINT_API Status MergeToSafetensors(const std::string& src, const std::string& dst,
                                        const MergeSafetensorsOptions& options = {},
                                        const IoOptions& io = {});

}  // namespace savepoint

#endif  // SAVEPOINT_DISTRIBUTED_H_
