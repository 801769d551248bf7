// Internal: how a manager's checkpoints are stored, one Store per ManagerOptions::storage.format.
//
//  - kNative: a checkpoint directory "{name}" per save (docs/FORMAT.md), through the engine (and
//    its async Checkpointer).
//  - kSafetensors: a file "{name}.safetensors" (MindSpore's flavour with crc_num when
//    storage.file_checksum).
//  - kMindSporeCkpt: a file "{name}.ckpt" as MindSpore's ModelCheckpoint names them (CRC-32
//    trailer when storage.file_checksum, encrypted with storage.key and storage.cipher, a
//    "<file>.mac" sidecar for CBC modes).
//
// Every format carries the State's metadata, so the manager metadata (RecordMeta) is in each
// checkpoint and a record can be rebuilt from the checkpoint alone. A file without it (written
// by MindSpore's own ModelCheckpoint) is recognised by its name "{prefix}-{epoch}_{step}".
//
// File formats save asynchronously by copying the state into fresh memory on the caller's
// thread (the only time training is blocked) and writing the copy on a background thread; one
// save is in flight at a time (a new one first waits for the previous one).
//
// Thread safety: a Store is used under the manager's mutex; an InFlight may be polled from any
// thread.
#ifndef SAVEPOINT_MANAGER_STORE_H_
#define SAVEPOINT_MANAGER_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "manager/registry.h"
#include "savepoint/checkpoint.h"
#include "savepoint/manager.h"
#include "savepoint/sparse.h"

namespace savepoint::manager {

// One save in flight.
class InFlight {
 public:
  virtual ~InFlight() = default;
  // True once the save committed or failed.
  virtual bool Poll() = 0;
  // Blocks until the save finished; OK means committed and durable.
  virtual Status Wait() = 0;
  // Statistics (final once Poll() is true).
  virtual SaveStats stats() = 0;
};

// What the manager needs to index a committed checkpoint.
struct StoredFacts {
  int64_t created_ns = 0;             // manifest creation time (native) or file modification time
  uint64_t bytes = 0;                 // bytes on disk
  Json metadata;                      // the State's metadata (null when not read or not readable)
  std::optional<int64_t> step_value;  // a native checkpoint's int value "step", if any
};

class Store {
 public:
  virtual ~Store() = default;
  // `options` must be valid (ValidateManagerOptions) and outlive the Store.
  static Result<std::unique_ptr<Store>> Create(const ManagerOptions& options);

  // The directory entry of checkpoint `name` ("ckpt-1_5" -> "ckpt-1_5.ckpt").
  virtual std::string EntryName(std::string_view name) const = 0;
  // The checkpoint name of directory entry `e` when it is a committed checkpoint of this format
  // (by kind and suffix; hidden entries never are), else nullopt.
  virtual std::optional<std::string> NameOf(const FileInfo& e) const = 0;

  // Saves synchronously: committed and durable on return (replacing an existing one).
  virtual Status Save(const State& state, const std::string& path, SaveStats* stats) = 0;
  // Starts a save; returns once the caller may modify the state's tensors again.
  virtual Result<std::shared_ptr<InFlight>> SaveAsync(const State& state,
                                                      const std::string& path) = 0;
  // Loads a whole checkpoint.
  virtual Result<State> Load(const std::string& path, LoadStats* stats) = 0;
  // Opens a checkpoint for Registry::Load (file formats load it whole).
  virtual Result<std::unique_ptr<EntrySource>> OpenSource(const std::string& path) = 0;
  // Creation time and size; with `metadata`, also the State's metadata (cheap: no tensor read).
  virtual Result<StoredFacts> Describe(const std::string& path, bool metadata) = 0;
  // Deletes a committed checkpoint crash-safely (with its sidecar files).
  virtual Status Delete(const std::string& path) = 0;
  // Native async saves: reserve staging memory for this many bytes in the background; a no-op
  // otherwise.
  virtual void Reserve(uint64_t bytes) = 0;

  // Sparse delta chains (kNative only; the other formats fail with InvalidArgument naming the
  // format). Saves `state`, whose tables are deltas, synchronously as a delta on `base`.
  virtual Status SaveDelta(const State& state, const std::string& path, const std::string& base,
                           SaveStats* stats);
  // The same started asynchronously (SaveAsync): returns once the caller may modify the state.
  virtual Result<std::shared_ptr<InFlight>> SaveDeltaAsync(const State& state,
                                                           const std::string& path,
                                                           const std::string& base);
  // Folds the chain ending at `path` into a full checkpoint committed over `path`.
  virtual Status Compact(const std::string& path);
  // The base of the checkpoint at `path` when it is a delta, else nullopt (a full checkpoint, one
  // without tables, or another format).
  virtual Result<std::optional<std::string>> BaseOf(const std::string& path);
  // The chain ending at `path` (SparseChain), newest first; one link for a full checkpoint.
  virtual Result<std::vector<SparseChainLink>> Chain(const std::string& path);
};

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_STORE_H_
