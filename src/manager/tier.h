// Internal: the remote tier of a checkpoint manager (ManagerOptions::remote, savepoint/manager.h).
//
// The manager offers each committed local checkpoint (with the links of its delta chain, oldest
// first); an uploader thread copies the ones the remote lacks (CopyCheckpoint: data files, then
// the MANIFEST, the commit point), then adds them to the remote index (the index files of
// manager/index.h, in the remote location), applies the remote retention and writes the index.
// A checkpoint whose name the remote holds with another creation time (the local one was saved
// again) is deleted remotely first, then uploaded again.
//
// Opening the tier reads and reconciles the remote index (one listing of the location). Restores
// then read the index kept in memory, the manifest and the data: no listing.
//
// Thread safety: every method may be called from any thread; the uploader thread is the only
// writer of the remote location.
#ifndef SAVEPOINT_MANAGER_TIER_H_
#define SAVEPOINT_MANAGER_TIER_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "manager/chains.h"
#include "manager/index.h"
#include "manager/options.h"
#include "manager/store.h"
#include "savepoint/manager.h"

namespace savepoint::manager {

class Tier {
 public:
  // `options.remote.location` must be set and `options` valid; `options` must outlive the tier.
  static Result<std::unique_ptr<Tier>> Open(const ManagerOptions& options);
  // Close().
  ~Tier();
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  // Queues the upload of `chain` (a committed local checkpoint last, the links of its delta chain
  // before it, oldest first) if its last link is due (RemoteTier::upload_every_n_steps, or a
  // breakpoint). Links the remote has with the same creation time are skipped.
  void Offer(std::vector<CheckpointRecord> chain);
  // Whether a checkpoint of this name is queued or being uploaded.
  bool Busy(const std::string& name);
  // Takes a checkpoint of this name out of the queue and waits until it is not being uploaded:
  // called before the name is saved again locally, so that no upload reads a checkpoint while it
  // is replaced (its commit offers the new one).
  void Withdraw(const std::string& name);
  // The remote checkpoints, oldest first.
  std::vector<CheckpointRecord> Records();
  // Whether `path` names a checkpoint of the remote location.
  bool Holds(const std::string& path) const;
  // The store that reads remote checkpoints (Load, OpenSource).
  Store& store() { return *store_; }
  const std::string& location() const { return location_; }

  // Blocks until every queued upload finished. Then, or at once without `block`, returns the first
  // upload error since the last call (and forgets it) and moves the statistics of the uploads and
  // remote deletions done so far into `stats`.
  Status Collect(bool block, std::vector<CheckpointStats>* stats);
  // Finishes the queued uploads and stops the uploader. Idempotent.
  void Close();

 private:
  explicit Tier(const ManagerOptions& options);
  void Run();
  // Uploads one link (under no lock); then indexes it and applies retention (under mu_).
  Status Upload(const CheckpointRecord& local);
  // Removes the data objects at `target` (a bucket prefix without a MANIFEST) that an upload left
  // when its process died, which a new upload of the name is refused for: the remote location
  // belongs to this manager. Returns whether it removed any.
  bool RemovedLeftovers(const std::string& target);
  // Adds the uploaded checkpoint to the index, applies the retention, writes the index. The
  // uploader thread works on a copy and publishes it under mu_, so readers never wait for the
  // remote.
  Status IndexUpload(CheckpointRecord remote, const CheckpointStats& stats);
  // Takes out of `index` the records the remote retention deletes (never the base of a kept
  // delta) and returns them.
  std::vector<CheckpointRecord> Doomed(Index& index);

  const RemoteTier& o_;
  const std::string location_;
  const Policy policy_;
  const ManagerOptions store_options_;  // the manager's, with the remote fs and no async saves
  FileSystem* const fs_;                // the remote location's
  FileSystem* const source_fs_;         // the local directory's
  const int64_t steps_per_epoch_;
  std::unique_ptr<Store> store_;

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<CheckpointRecord> queue_;  // links to upload, in order
  std::string active_;                  // the name being uploaded, "" when idle
  bool stop_ = false;
  Status error_;
  std::vector<CheckpointStats> stats_;
  Index index_;                   // written by the uploader thread only
  std::unique_ptr<Bases> bases_;  // used by the uploader thread only
  std::thread thread_;
};

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_TIER_H_
