// Internal: the remote tier of a checkpoint manager (ManagerOptions::remote, savepoint/manager.h).
//
// The manager offers each committed local checkpoint (with the links of its delta chain, oldest
// first); an uploader thread copies the ones the remote lacks (CopyCheckpoint: data files, then
// the MANIFEST, the commit point), then adds them to the remote index (the index files of
// manager/index.h, in the remote location), applies the remote retention and writes the index.
// A checkpoint whose name the remote holds with another creation time (the local one was saved
// again) is deleted remotely first, then uploaded again.
//
// In an object store with compare-and-swap (FileSystem::ReadVersioned) the index is one object,
// kIndexObjectName, replaced only if unchanged since it was read (a writer that lost the race
// reads it again and applies its change again). Opening the tier then reads that object (one GET)
// and restores read the manifest and the data: no listing on the way to a restore. The first
// upload reconciles the index with a listing of the location first. Elsewhere (a directory, a
// store without compare-and-swap, or a remote written before index objects) the index is the
// generation files of manager/index.h, read and reconciled when the tier opens (one listing).
//
// Thread safety: every method may be called from any thread; the uploader thread is the only
// writer of the remote location.
#ifndef SAVEPOINT_MANAGER_TIER_H_
#define SAVEPOINT_MANAGER_TIER_H_

#include <condition_variable>
#include <deque>
#include <functional>
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
  // Adds the uploaded checkpoint to the index, applies the retention, writes the index, then
  // deletes what the retention dropped.
  Status IndexUpload(CheckpointRecord remote, const CheckpointStats& stats);
  // Applies `change` to a copy of the index (an error stops it) and writes it (with
  // compare-and-swap: on a conflict the index is read again and `change` applied to it again, a few
  // times), then makes it the index readers see (also when the write failed: the next write
  // publishes it, and the error is returned). Uploader thread only.
  Status Publish(const std::function<Status(Index&)>& change);
  // Reads the index generations (or none in a new bucket prefix), reconciles them with a listing
  // and writes the index if that changed it (or, with cas_, into the index object).
  Status OpenListing();
  // Once, before the first upload of an index object: Reconcile with a listing.
  Status ReconcileOnce();
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
  bool cas_ = false;              // the index is kIndexObjectName (set by Open)
  bool reconciled_ = true;        // false until ReconcileOnce ran (uploader thread only)
  std::unique_ptr<Bases> bases_;  // used by the uploader thread only
  std::thread thread_;
};

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_TIER_H_
