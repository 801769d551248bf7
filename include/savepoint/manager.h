// CheckpointManager: what a training loop talks to.
//
// A manager owns one checkpoint directory. It decides when to save (every N steps or N seconds),
// names checkpoints "{prefix}-{epoch}_{step_in_epoch}", saves synchronously or asynchronously,
// keeps an index of the committed checkpoints (oldest to newest), deletes old ones by a retention
// policy, restores the latest (or a chosen) checkpoint, and saves a "_breakpoint" checkpoint when
// training dies of an exception or SIGTERM/SIGINT.
//
// Two ways to use it:
//  - Direct: Save(step, state, args) / Restore(step) / LatestStep() / AllSteps() / Wait() /
//    Close() with a State you build yourself (what the Python front end wraps).
//  - Registered: Register(name, &object, category) once, then the hooks OnStepEnd / OnEpochEnd /
//    OnTrainEnd (or Step()) save every registered object; RestoreRegistered puts them back.
//
// On disk, in the directory:
//  - one checkpoint directory per save (docs/FORMAT.md), committed atomically by the engine;
//  - "savepoint-index-<generation>.json": the index. A new generation is written to a hidden
//    temporary file, synced, renamed into place, the directory synced, then older generations
//    are removed; the highest generation that parses wins. Open() reconciles it with the
//    directory: a checkpoint committed but missing from the index (crash between commit and index
//    update) is added back from its manifest; an entry whose directory is gone is dropped; debris
//    of crashed saves is ignored (and garbage-collected when ManagerOptions::gc_on_open).
//  - "savepoint.lock": held (FileSystem::LockFile) while the manager is open, so a second manager
//    on the same directory fails to open with FailedPrecondition naming the lock and its holder.
//
// Each checkpoint records, in its metadata under "savepoint.manager": step, epoch,
// step_in_epoch, metrics, whether it is a breakpoint or epoch-end save, and the registered objects
// with their categories; plus metadata "step" (what `savepoint ls` shows). With append_info the
// values "epoch_num", "step_num" and the user's key/value pairs are stored as values.
//
// Thread safety: all methods may be called from any thread; calls are serialised by an internal
// mutex. Registered objects are called from the calling thread only.
#ifndef SAVEPOINT_MANAGER_H_
#define SAVEPOINT_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "savepoint/async.h"
#include "savepoint/checkpoint.h"
#include "savepoint/encryption.h"
#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/format.h"
#include "savepoint/io_options.h"
#include "savepoint/sparse.h"
#include "savepoint/state.h"
#include "savepoint/stateful.h"
#include "savepoint/status.h"

namespace savepoint {

using Metrics = std::map<std::string, double>;

// Where training is when a checkpoint is named: passed to the prefix and directory callables.
struct SAVEPOINT_API StepInfo {
  int64_t step = 0;           // global step (1-based: the number of steps completed)
  int64_t epoch = 0;          // 1-based epoch
  int64_t step_in_epoch = 0;  // 1-based step within the epoch (0 for a save before any step)
};

// How the manager stores each checkpoint (see ManagerStorage::format): Format::kNative (a
// checkpoint directory "{name}"), kSafetensors (a file "{name}.safetensors") or kMindSporeCkpt (a
// MindSpore file "{name}.ckpt", as MindSpore's ModelCheckpoint writes them). The other formats
// are InvalidArgument. (The name of the manager's field type before savepoint/format.h existed.)
using CheckpointFormat = Format;

// Checkpoint names form series: "{prefix}-{epoch}_{step}" and, after MindSpore's conflict rule,
// "{prefix}_{n}-{epoch}_{step}" (n one more than the largest n in use).
enum class SeriesRule {
  // A manager that resumes from a checkpoint of its directory (Restore, RestoreRegistered,
  // ResumeFrom) before its first save is the same run: it continues that checkpoint's series. A
  // manager that saves without resuming, into a directory where the prefix is in use, is a new
  // run: it starts a new series by the conflict rule, so it never overwrites another run.
  kContinue,
  // MindSpore's ModelCheckpoint: the conflict rule applies at every open, resumed or not.
  kNew,
};
enum class MetricMode { kMin, kMax };

// Where checkpoints go and what they are called (ManagerOptions::naming).
struct SAVEPOINT_API ManagerNaming {
  // Checkpoint directory (created if missing). Required unless directory_fn is set.
  std::string directory;
  // Computes the directory at Open (with step 0) and before every save; when the result changes,
  // the manager finishes pending saves, releases the old directory and opens the new one (lock,
  // index). Default: empty (use `directory`).
  std::function<std::string(const StepInfo&)> directory_fn;
  // Name prefix: non-empty, no '/', not starting with '.', at most 200 bytes. What happens when
  // the directory already holds checkpoints of this prefix is `series`'s choice. Default: "ckpt".
  std::string prefix = "ckpt";
  // Which series of names new checkpoints join when the directory already holds checkpoints
  // named "{prefix}-..." or "{prefix}_{n}-..." (see SeriesRule). Default: kContinue.
  SeriesRule series = SeriesRule::kContinue;
  // Computes the whole checkpoint name (no "-{epoch}_{step}" suffix is added, and the conflict
  // rule does not apply) before every save; same rules as `prefix`. Default: empty.
  std::function<std::string(const StepInfo&)> prefix_fn;
};

// When a save is due (ManagerOptions::save_policy).
struct SAVEPOINT_API SavePolicy {
  // Save when step >= last saved step + this. 0 = not by steps. Default: 1.
  int64_t interval_steps = 1;
  // Save when more than this many seconds passed since the last save. Ignored when
  // interval_steps > 0. 0 = not by time. Default: 0.
  int64_t interval_seconds = 0;
  // Steps per epoch, to derive epoch and step_in_epoch for Save(step) calls that do not give
  // them (epoch = (step-1)/steps_per_epoch + 1). 0 = every step is in epoch 1. Default: 0.
  int64_t steps_per_epoch = 0;
};

// Which checkpoints are kept (ManagerOptions::retention). The newest committed checkpoint and any
// save in flight are never deleted. A checkpoint is kept if any rule keeps it.
struct SAVEPOINT_API RetentionPolicy {
  // Keep the newest N. Default: 5.
  int64_t keep_last_n = 5;
  // Keep one checkpoint per N minutes (the first committed in each N-minute window); ignored when
  // keep_last_n > 0. When both are 0, keep_last_n becomes 1 (as MindSpore does). Default: 0.
  int64_t keep_per_n_minutes = 0;
  // Keep everything: keep_last_n and keep_per_n_minutes are ignored. Default: false.
  bool keep_all = false;
  // Also keep forever every checkpoint whose step is a multiple of this. 0 = off. Default: 0.
  int64_t keep_every_n_steps = 0;
  // Also keep the best N checkpoints by metrics[best_metric] (smallest for kMin, largest for kMax;
  // checkpoints without the metric do not rank). 0 = off; > 0 requires best_metric. Default: 0.
  int64_t keep_best_n = 0;
  std::string best_metric;  // Default: empty.
  MetricMode best_mode = MetricMode::kMin;
};

// Asynchronous saves (ManagerOptions::async_save).
struct SAVEPOINT_API AsyncSavePolicy {
  // Save through an async Checkpointer: the save blocks training only for the snapshot copy
  // (of sparse tables too, and of deltas: Checkpointer::SaveAsync). Default: false.
  bool enabled = false;
  // Staging options of the async Checkpointer (its I/O is ManagerOptions::io). With a file format
  // only snapshot_threads applies: an async save copies the state into fresh memory on that many
  // threads while the caller waits, then writes the copy on a background thread. Default:
  // CheckpointerOptions defaults.
  CheckpointerOptions checkpointer;
  // With kNative: whenever an object is registered, reserve and pre-touch staging memory for the
  // registered objects' tensor bytes in the background (Checkpointer::Reserve), so the first save
  // blocks for the copy alone. Default: true.
  bool prefault_staging = true;
};

// How each checkpoint is stored and read back (ManagerOptions::storage).
struct SAVEPOINT_API ManagerStorage {
  // How each checkpoint is stored. kNative: a checkpoint directory "{name}". kSafetensors: one
  // file "{name}.safetensors" (savepoint/safetensors.h). kMindSporeCkpt: one file "{name}.ckpt"
  // (savepoint/mindspore.h), so a MindSpore training loop keeps ModelCheckpoint's file layout
  // ("{prefix}-{epoch}_{step}.ckpt"). Every option works with every format except: key (not
  // with kSafetensors), file_checksum and cipher (file formats only), and the async Checkpointer
  // options (see AsyncSavePolicy::checkpointer). The manager metadata travels in each file (the
  // "savepoint.metadata" entry of a .ckpt, the header metadata of a safetensors file); a .ckpt
  // file without it (written by MindSpore) is indexed by its name "{prefix}-{epoch}_{step}.ckpt",
  // its step derived from SavePolicy::steps_per_epoch. Record names include the file suffix
  // ("ckpt-1_5.ckpt"); Which::name accepts either form. Other formats are InvalidArgument.
  // Default: kNative.
  Format format = Format::kNative;
  // Verify checksums when restoring: every chunk's CRC32C (native; always written), a .ckpt
  // file's CRC-32 trailer or a safetensors file's crc_num when the file has one. Default: true.
  bool verify_checksums = true;
  // Encrypts every checkpoint the manager saves and decrypts every one it restores: native
  // checkpoints as SaveOptions::key / LoadOptions::key (docs/FORMAT.md §10), .ckpt files as
  // MindSpore's enc_key / dec_key with `cipher` (docs/INTEROP.md). A key provider is asked once
  // per save and per restore. Restoring a checkpoint that is not encrypted with a key set is
  // InvalidArgument; listing and retention need no key. With kSafetensors: InvalidArgument.
  // Default: none (not encrypted).
  EncryptionKey key = {};
  // File formats: write MindSpore's checksum: the CRC-32 trailer of a .ckpt file, or the
  // MindSpore safetensors flavour with its crc_num (MindSpore's crc_check=True). With kNative:
  // InvalidArgument (native checkpoints always carry per-chunk CRC32C). Default: false.
  bool file_checksum = false;
  // kMindSporeCkpt with a key: the cipher (MindSpore's enc_mode). Another value than the default
  // without a key, or with another format, is InvalidArgument. Default: AES-GCM.
  Cipher cipher = Cipher::kAesGcm;
  // Extra values stored in every checkpoint (MindSpore's append_info): "epoch_num" and/or
  // "step_num" (others are InvalidArgument), plus append_dict's key/value pairs (int, float, bool
  // or string values; valid entry names other than "epoch_num", "step_num"). Default: none.
  std::vector<std::string> append_info;
  std::map<std::string, Value> append_dict;
};

// Checkpoints saved when training dies (ManagerOptions::breakpoints).
struct SAVEPOINT_API BreakpointPolicy {
  // Save a "{prefix}-{epoch}_{step}_breakpoint" checkpoint of the registered state when
  // training dies (ExceptionSaveGuard, SaveBreakpoint, or a signal with handle_signals).
  // MindSpore's exception_save. Default: false.
  bool on_exception = false;
  // Install SIGTERM and SIGINT handlers while the manager is open. The handler only sets a flag;
  // the next hook (OnStepEnd / OnEpochEnd / Step) then saves a breakpoint (if on_exception),
  // waits for every save, closes the manager and re-raises the signal with its previous handler.
  // A second signal before that re-raises at once. At most one manager per process may set it.
  // Default: false.
  bool handle_signals = false;
};

// Delta chains of sparse tables (savepoint/sparse.h), kNative only (ManagerOptions::sparse).
struct SAVEPOINT_API SparsePolicy {
  // Whether delta chains are compacted at all (false: a chain grows until the next full save; a
  // delta beyond 4096 links fails naming the limit). Default: true.
  bool compact = true;
  // After a delta save (SaveArgs::delta) commits, when ShouldCompact(depth of its chain, bytes of
  // the chain's deltas, bytes of its full checkpoint, compaction) holds, the manager folds the
  // chain into a full checkpoint under the same name (CompactSparse, committed atomically over
  // it: a crash leaves the delta or the full checkpoint, both loading the same state) on a
  // background thread. The next save, restore, Wait or Close waits for it first. Retention never
  // deletes a checkpoint that a kept checkpoint's chain needs: it goes once nothing kept needs it.
  // Default: CompactionPolicy defaults (more than 8 deltas, or deltas holding more than half the
  // full checkpoint's bytes).
  CompactionPolicy compaction = {};
};

// A second, remote tier (ManagerOptions::remote): every committed checkpoint (every
// upload_every_n_steps-th) is copied to the remote location in the background by an uploader
// thread (CopyCheckpoint: data files, then the MANIFEST, the commit point), while training goes
// on; Caffe2's upload step, made continuous. The remote location keeps its own index (the same
// index files as the directory's) and its own retention. A checkpoint queued or being uploaded
// is never deleted locally; a delta's base is uploaded before it (when the remote lacks it) and
// kept remotely while a kept delta needs it. Restore, ResumeFrom, Latest and All see both tiers:
// the newest checkpoint of either, the local copy when both have it, so a node that lost its disk
// resumes from the remote. Wait and Close wait for the uploads too; an upload that fails is
// logged and its error returned by the next Save, Wait or hook (the checkpoint stays local).
// kNative only.
struct SAVEPOINT_API RemoteTier {
  // Where checkpoints are copied: a bucket prefix ("s3://bucket/run", savepoint/s3.h) or any
  // directory; not the local directory, nor inside it. It belongs to one manager at a time: an
  // upload a killed process left unfinished (data objects without a MANIFEST) is removed before
  // the name is uploaded again. Empty = no remote tier. Default: empty.
  std::string location;
  // Which remote checkpoints are kept, by the same rules as ManagerOptions::retention applied to
  // the remote ones (e.g. keep_last_n = 0 with keep_every_n_steps = 1000: every 1000th step).
  // Default: RetentionPolicy defaults (the newest 5).
  RetentionPolicy retention;
  // Upload the checkpoints whose step is a multiple of this, and breakpoints; 1 = every one.
  // Default: 1.
  int64_t upload_every_n_steps = 1;
  // Blocks uploaded at the same time (CopyOptions::threads), 1..64. Default: 4.
  int threads = 4;
  // Upper bound on upload bytes per second; 0 = none (CopyOptions). Default: 0.
  uint64_t max_bytes_per_second = 0;
  // File system of the remote location (not owned; must outlive the manager). Default: nullptr =
  // the manager's io.fs (by default DefaultFileSystem(), which serves s3:// paths).
  FileSystem* fs = nullptr;
};

// Options of a CheckpointManager, grouped by role. Every field has a default but the directory
// (naming.directory or naming.directory_fn).
struct SAVEPOINT_API ManagerOptions {
  // Where checkpoints go and what they are called.
  ManagerNaming naming;
  // When a save is due.
  SavePolicy save_policy;
  // Which checkpoints are kept.
  RetentionPolicy retention;
  // Asynchronous saves.
  AsyncSavePolicy async_save;
  // How each checkpoint is stored and read back.
  ManagerStorage storage;
  // Checkpoints saved when training dies.
  BreakpointPolicy breakpoints;
  // Delta chains of sparse tables.
  SparsePolicy sparse;
  // A remote tier the checkpoints are copied to in the background. Default: none.
  RemoteTier remote;
  // This process's data shard and the number of shards: registered io_state objects are saved as
  // "<name>.shard-<shard_id>" and restoring checks num_shards. 0 <= shard_id < num_shards.
  // Default: 0 and 1.
  int shard_id = 0;
  int num_shards = 1;
  // Remove debris of crashed saves (GarbageCollect, skipping saves of live processes) on open.
  // Default: true.
  bool gc_on_open = true;
  // File system, I/O threads and direct I/O of every save (synchronous or through the async
  // Checkpointer, whose writer threads are io.io_threads), restore, index update and deletion.
  // Default: IoOptions defaults.
  IoOptions io;
};

// OK when the options are valid; otherwise InvalidArgument naming the field and value.
// CheckpointManager::Open calls it.
SAVEPOINT_API Status ValidateManagerOptions(const ManagerOptions& options);

// One committed checkpoint in the index.
struct SAVEPOINT_API CheckpointRecord {
  std::string name;  // directory entry: "ckpt-2_50", or with a file format "ckpt-2_50.ckpt"
  std::string path;  // directory/name (remote location/name for a checkpoint only remote has)
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  int64_t created_ns = 0;  // manifest creation time (file formats: the file's mtime)
  uint64_t bytes = 0;      // file bytes
  bool breakpoint = false;
  bool epoch_end = false;  // saved at the end of `epoch` (OnEpochEnd, JobRunner)
  Metrics metrics;
};

// Statistics of one checkpoint action, reported to a MetadataHandler (job_runner.h).
struct SAVEPOINT_API CheckpointStats {
  // "checkpoint_save", "checkpoint_load", "checkpoint_delete"; the remote tier's
  // "checkpoint_upload" and "remote_delete"
  std::string action;
  std::string name;  // checkpoint name
  int64_t step = 0;
  uint64_t bytes = 0;          // tensor bytes
  double seconds = 0;          // whole action (for async saves: start to commit)
  double blocked_seconds = 0;  // time the caller was blocked (== seconds when synchronous)
  double throughput_gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

// Per-save arguments.
struct SAVEPOINT_API SaveArgs {
  Metrics metrics;  // recorded in the index (keep_best_n ranks by them)
  // Save even if the interval says it is not due (never twice for one step). Default: false.
  bool force = false;
  // Epoch and step within it, for the name; default derived from SavePolicy::steps_per_epoch.
  std::optional<int64_t> epoch;
  std::optional<int64_t> step_in_epoch;
  bool epoch_end = false;   // mark as an epoch-end checkpoint
  bool breakpoint = false;  // name with "_breakpoint" and mark as such
  // Incremental save of sparse tables (kNative): the state's tables hold only the rows touched
  // since the manager's newest committed checkpoint plus the ids deleted since (MakeDelta,
  // DirtySet); the checkpoint is a delta on that one (SparseSaveOptions::base), loaded with its
  // chain applied by Restore. Saves in flight are waited for first; the delta is then written
  // as any save is (asynchronously with async_save.enabled, its base recorded and its chain
  // maybe compacted once it commits). FailedPrecondition when there is no
  // committed checkpoint to be its base; the base's errors (a base without the tables, other
  // slots) name it. Default: false (every table whole).
  bool delta = false;
};

// Which checkpoint to restore.
struct SAVEPOINT_API Which {
  std::optional<int64_t> step;  // the newest checkpoint at this step
  std::string name;             // or this name ("id"); both empty = the latest
  static Which Latest() { return {}; }
  static Which Step(int64_t s) { return {s, {}}; }
  static Which Name(std::string n) { return {std::nullopt, std::move(n)}; }
};

// How registered objects are loaded (RestoreRegistered, LoadInto).
struct SAVEPOINT_API LoadConfig {
  // Categories to load: CategoryName()s or "*". Default: {"*"}.
  std::vector<std::string> include = {"*"};
  // Categories to skip (applied after include): CategoryName()s or "*". Default: none.
  std::vector<std::string> exclude;
  // Strict: every entry of every included object must be in the checkpoint with the same dtype
  // and shape, and the checkpoint must have no other entries for the object (else NotFound /
  // InvalidArgument naming them). Lenient: load what matches, skip the rest. Default: true.
  bool strict = true;
  // Checkpoint entry name -> registered entry name ("old.w" -> "model.w"), full names.
  std::map<std::string, std::string> renames;
  // Only registered entries (full names, after renaming) matching one of these globs are loaded.
  // Empty = all. Default: empty.
  std::vector<std::string> only;
};

// One source of a "model bank" warm start: load some entries from the checkpoint at `path`.
struct SAVEPOINT_API ModelBankSource {
  std::string path;
  LoadConfig config;
};

class SAVEPOINT_API CheckpointManager {
 public:
  // Validates the options, creates the directory, takes the lock, reads and reconciles the index.
  static Result<std::unique_ptr<CheckpointManager>> Open(ManagerOptions options);
  // Close(), logging an error.
  virtual ~CheckpointManager() = default;

  // --- Direct API. ---
  // Saves `state` as the checkpoint of `step` if due (or args.force), returning whether it
  // started a save. Never saves one step twice (returns false; with args.epoch_end, the
  // checkpoint of that step is then marked as its epoch's end, as OnEpochEnd does). Synchronous:
  // committed, indexed and retention applied when it returns. Async: returns after the snapshot;
  // the checkpoint is indexed when the save commits (observed by the next call, or Wait). The state
  // may be modified once this returns.
  virtual Result<bool> Save(int64_t step, const State& state, const SaveArgs& args = {}) = 0;
  // Whether Save(step) would save now (without force).
  virtual bool ShouldSave(int64_t step) = 0;
  // Loads a whole checkpoint (waits for pending saves first). NotFound when none matches.
  // Resumes from it as ResumeFrom does.
  virtual Result<State> Restore(const Which& which = Which::Latest()) = 0;
  // Makes the manager continue from the chosen checkpoint without loading it (for front ends that
  // load the files themselves, like the Python package): waits for pending saves, sets the step
  // counters (global step, last saved step, epoch) to the checkpoint's and, under
  // SeriesRule::kContinue before the first save, continues its series. Returns its record;
  // NotFound when none matches.
  virtual Result<CheckpointRecord> ResumeFrom(const Which& which = Which::Latest()) = 0;
  // The newest committed checkpoint of either tier (the local record when both have it).
  virtual std::optional<CheckpointRecord> Latest() = 0;
  virtual std::optional<int64_t> LatestStep() = 0;
  // Committed checkpoints of both tiers, oldest first (one record per name, the local one when
  // both have it).
  virtual std::vector<CheckpointRecord> All() = 0;
  virtual std::vector<int64_t> AllSteps() = 0;
  // The remote tier's committed checkpoints, oldest first (empty without one). Uploads finished
  // by now are included.
  virtual std::vector<CheckpointRecord> Remote() = 0;
  // Async native saves: allocates and pre-touches (and, with a CUDA copier, page-locks) staging
  // memory for `bytes` (at most async_save.checkpointer.staging_bytes) in the background and
  // returns at once, so that the first save of that size blocks for the copy alone (the registered
  // objects' bytes are reserved already: AsyncSavePolicy::prefault_staging). FailedPrecondition
  // for other managers.
  virtual Status Reserve(uint64_t bytes) = 0;
  // Waits for every save in flight and every upload to the remote tier; indexes them and applies
  // retention. First error.
  virtual Status Wait() = 0;
  // Wait(), write the index, release the lock (and signal handlers). Further calls fail with
  // FailedPrecondition. Idempotent.
  virtual Status Close() = 0;
  virtual std::string directory() = 0;
  // The prefix of the series new checkpoints join (see SeriesRule). Empty with prefix_fn.
  virtual std::string prefix() = 0;
  // Every action's statistics so far, oldest first.
  virtual std::vector<CheckpointStats> stats() = 0;

  // --- Registered state. ---
  // Registers an object (not owned; must outlive the manager or be unregistered). Names must be
  // valid entry names without '.' and unique. io_state objects are per shard.
  virtual Status Register(const std::string& name, Stateful* object, Category category) = 0;
  virtual Status Unregister(const std::string& name) = 0;
  // Save(step, <every registered object's state>, args).
  virtual Result<bool> SaveRegistered(int64_t step, const SaveArgs& args = {}) = 0;
  // Loads the chosen checkpoint into the registered objects under `config` and resumes from it as
  // ResumeFrom does. Returns its record.
  virtual Result<CheckpointRecord> RestoreRegistered(const Which& which = Which::Latest(),
                                                     const LoadConfig& config = {}) = 0;
  // Loads the checkpoint at any path into the registered objects (no counters change). A model
  // bank is several calls with lenient configs, only-filters and renames.
  virtual Status LoadFrom(const std::string& path, const LoadConfig& config) = 0;

  // --- Training-loop hooks (registered state). ---
  // After a training step: remembers it as the last consistent point, saves if due, acts on a
  // pending signal. `metrics` go into the checkpoint's record.
  virtual Status OnStepEnd(int64_t step, int64_t epoch, const Metrics& metrics = {}) = 0;
  // After an epoch: forces an epoch-end save at the last step (unless just saved).
  virtual Status OnEpochEnd(int64_t epoch, const Metrics& metrics = {}) = 0;
  // After training: forces a final save, waits for every async save.
  virtual Status OnTrainEnd(const Metrics& metrics = {}) = 0;
  // RecIS style: counts the global step (+1) and saves when it is a multiple of
  // SavePolicy::interval_steps. Returns whether it saved.
  virtual Result<bool> Step(const Metrics& metrics = {}) = 0;
  virtual int64_t global_step() = 0;
  // Saves a "_breakpoint" checkpoint of the registered objects at the last step seen by a hook,
  // and waits for it. FailedPrecondition unless breakpoints.on_exception.
  virtual Status SaveBreakpoint() = 0;
};

// Saves a breakpoint when the scope is left by an exception (the exception keeps propagating):
//   { ExceptionSaveGuard guard(*manager); train(); }
// The breakpoint holds the registered objects as they are when the exception unwinds through the
// guard, labelled with the last step a hook saw; make the training step exception-safe (update
// state only at its end) for it to be a consistent state. Errors are logged.
class SAVEPOINT_API ExceptionSaveGuard {
 public:
  explicit ExceptionSaveGuard(CheckpointManager& manager);
  ~ExceptionSaveGuard();
  ExceptionSaveGuard(const ExceptionSaveGuard&) = delete;
  ExceptionSaveGuard& operator=(const ExceptionSaveGuard&) = delete;

 private:
  CheckpointManager& manager_;
  int exceptions_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_MANAGER_H_
