// Internal: sparse delta chains in a manager's directory (ManagerOptions::sparse.compaction,
// SaveArgs::delta): which checkpoints the kept ones need through their chains, and the
// compaction of a chain on a background thread.
//
// Thread safety: Bases and NeededByKept are used under the manager's mutex. A Compaction runs
// Store::Compact on its own thread (which touches only the checkpoint it compacts and the chain
// below it); its methods are called under the manager's mutex.
#ifndef SAVEPOINT_MANAGER_CHAINS_H_
#define SAVEPOINT_MANAGER_CHAINS_H_

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "manager/store.h"
#include "savepoint/manager.h"

namespace savepoint::manager {

// The base of each checkpoint, by name ("" for none), read from its manifest once and cached.
class Bases {
 public:
  explicit Bases(Store* store) : store_(store) {}
  // The name of the base of `r` (a sibling in the same directory), "" for a full checkpoint, one
  // without tables, or one whose manifest cannot be read (logged).
  const std::string& Of(const CheckpointRecord& r);
  // Records what is known: `name`'s base is `base` ("" after a compaction).
  void Set(const std::string& name, std::string base) { bases_[name] = std::move(base); }
  // Forgets what is known of `name` (read again when next asked).
  void Forget(const std::string& name) { bases_.erase(name); }

 private:
  Store* store_;
  std::map<std::string, std::string> bases_;
};

// Names of `records` that a record outside `doomed` needs through its chain: its base, that
// base's base, and so on.
std::set<std::string> NeededByKept(const std::vector<CheckpointRecord>& records,
                                   const std::vector<std::string>& doomed, Bases& bases);

// Whether the chain ending at `head` should be compacted under `policy`: its depth and the bytes
// of its deltas and of its full checkpoint (from the records where indexed, else the store).
Result<bool> ChainNeedsCompaction(Store& store, const std::string& head,
                                  const std::vector<CheckpointRecord>& records,
                                  const CompactionPolicy& policy);

// One compaction (Store::Compact of `record.path`) on a background thread, started by the
// constructor. The destructor waits for it.
class Compaction {
 public:
  Compaction(Store* store, CheckpointRecord record);
  ~Compaction();
  Compaction(const Compaction&) = delete;
  Compaction& operator=(const Compaction&) = delete;

  // Whether it has finished (never blocks).
  bool Done() const;
  // Waits for it; its result.
  Status Wait();
  const CheckpointRecord& record() const { return record_; }
  double seconds() const { return seconds_; }

 private:
  CheckpointRecord record_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  Status result_;
  double seconds_ = 0;
};

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_CHAINS_H_
