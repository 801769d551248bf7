// The remote tier of a checkpoint manager (manager/tier.h).
#include "manager/tier.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "engine/paths.h"
#include "format/manifest.h"
#include "io/commit.h"
#include "manager/retention.h"
#include "savepoint/catalog.h"

namespace savepoint::manager {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The manager's options as the remote store needs them: the remote file system, no async saves.
ManagerOptions StoreOptions(const ManagerOptions& o) {
  ManagerOptions s = o;
  if (o.remote.fs != nullptr) s.io.fs = o.remote.fs;
  s.async_save = {};
  return s;
}

}  // namespace

Tier::Tier(const ManagerOptions& options)
    : o_(options.remote),
      location_(WithoutTrailingSlashes(options.remote.location)),
      policy_(ResolveRetention(options.remote.retention)),
      store_options_(StoreOptions(options)),
      fs_(FileSystemOf(store_options_.io)),
      source_fs_(FileSystemOf(options.io)),
      steps_per_epoch_(options.save_policy.steps_per_epoch) {}

Result<std::unique_ptr<Tier>> Tier::Open(const ManagerOptions& options) {
  std::unique_ptr<Tier> t(new Tier(options));
  const std::string context = fmt::format("open remote tier {}", t->location_);
  SP_RETURN_IF_ERROR(io::CreateDirsDurably(t->fs_, t->location_).WithContext(context));
  SP_ASSIGN_OR_RETURN(t->store_, Store::Create(t->store_options_));
  if (t->fs_->IsObjectStore(t->location_)) {
    Result<Index> object = ReadIndexObject(t->fs_, t->location_);
    t->cas_ = object.ok() || object.status().code() == StatusCode::kNotFound;
    if (!t->cas_ && object.status().code() != StatusCode::kUnimplemented) {
      return object.status().WithContext(context);
    }
    if (object.ok()) {
      t->index_ = std::move(object).value();
      // No listing (the first upload reconciles), unless the object was damaged: rebuilt below.
      t->reconciled_ = t->index_.generation == 0;
    }
  }
  if (t->reconciled_) SP_RETURN_IF_ERROR(t->OpenListing().WithContext(context));
  t->bases_ = std::make_unique<Bases>(t->store_.get());
  t->thread_ = std::thread([p = t.get()] { p->Run(); });
  return t;
}

Status Tier::OpenListing() {
  Result<Index> generations = ReadIndex(fs_, location_);
  // A bucket prefix that holds nothing yet lists as NotFound: a new remote tier.
  if (generations.status().code() == StatusCode::kNotFound && fs_->IsObjectStore(location_)) {
    return Status::OK();
  }
  SP_RETURN_IF_ERROR(generations.status());
  // A remote written before index objects: its records move into the index object.
  index_.records = std::move(generations->records);
  if (!cas_) index_.generation = generations->generation;
  SP_ASSIGN_OR_RETURN(bool changed,
                      Reconcile(*store_, fs_, location_, index_.records, steps_per_epoch_));
  if (!changed && !(cas_ && !index_.records.empty())) return Status::OK();
  return cas_ ? WriteIndexObject(fs_, location_, index_) : WriteIndex(fs_, location_, index_);
}

Tier::~Tier() { Close(); }

void Tier::Offer(std::vector<CheckpointRecord> chain) {
  if (chain.empty()) return;
  const CheckpointRecord& head = chain.back();
  if (!head.breakpoint && head.step % o_.upload_every_n_steps != 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  for (CheckpointRecord& link : chain) {
    auto queued = std::find_if(queue_.begin(), queue_.end(),
                               [&](const CheckpointRecord& q) { return q.name == link.name; });
    if (queued != queue_.end()) {
      *queued = std::move(link);  // the newest local version of it
    } else {
      queue_.push_back(std::move(link));
    }
  }
  cv_.notify_all();
}

bool Tier::Busy(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return active_ == name ||
         std::any_of(queue_.begin(), queue_.end(), [&](const auto& r) { return r.name == name; });
}

void Tier::Withdraw(const std::string& name) {
  std::unique_lock<std::mutex> lock(mu_);
  std::erase_if(queue_, [&](const CheckpointRecord& r) { return r.name == name; });
  cv_.wait(lock, [&] { return active_ != name; });
}

std::vector<CheckpointRecord> Tier::Records() {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.records;
}

bool Tier::Holds(const std::string& path) const {
  return path.size() > location_.size() && path.starts_with(location_) &&
         path[location_.size()] == '/';
}

Status Tier::Collect(bool block, std::vector<CheckpointStats>* stats) {
  std::unique_lock<std::mutex> lock(mu_);
  if (block) cv_.wait(lock, [&] { return queue_.empty() && active_.empty(); });
  for (CheckpointStats& s : stats_) stats->push_back(std::move(s));
  stats_.clear();
  return std::exchange(error_, Status::OK());
}

void Tier::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Tier::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped, nothing left to upload
    CheckpointRecord local = std::move(queue_.front());
    queue_.pop_front();
    active_ = local.name;
    lock.unlock();
    Status s = Upload(local);
    lock.lock();
    if (!s.ok()) {
      spdlog::error("savepoint: remote tier: {}", s.ToString());
      if (error_.ok()) error_ = s;
    }
    active_.clear();
    cv_.notify_all();
  }
}

Status Tier::Upload(const CheckpointRecord& local) {
  const std::string target = JoinPath(location_, local.name);
  const std::string what = fmt::format("upload {} to {}", local.path, target);
  bool stale = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const CheckpointRecord& r : index_.records) {
      if (r.name != local.name) continue;
      if (r.created_ns == local.created_ns) return Status::OK();  // uploaded already
      stale = true;                                               // saved again locally since
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  SP_RETURN_IF_ERROR(ReconcileOnce().WithContext(what));
  if (stale) {  // (no atomic replace in a bucket: the old copy goes first, out of the index
                // first)
    SP_RETURN_IF_ERROR(Publish([&](Index& index) {
                         std::erase_if(index.records,
                                       [&](const auto& r) { return r.name == local.name; });
                         return Status::OK();
                       }).WithContext(what));
    bases_->Forget(local.name);
    Status s = store_->Delete(target);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s.WithContext(what);
  }
  CopyOptions co;
  co.source_fs = source_fs_;
  co.target_fs = fs_;
  co.threads = o_.threads;
  co.max_bytes_per_second = o_.max_bytes_per_second;
  Result<CopyStats> copied = CopyCheckpoint(local.path, target, co);
  if (copied.status().code() == StatusCode::kFailedPrecondition && RemovedLeftovers(target)) {
    copied = CopyCheckpoint(local.path, target, co);
  }
  if (!copied.ok()) return copied.status();  // it names both places
  CheckpointRecord remote = local;
  remote.path = target;
  CheckpointStats st{"checkpoint_upload", local.name,       local.step,
                     copied->bytes,       SecondsSince(t0), 0};
  return IndexUpload(std::move(remote), st).WithContext(what);
}

bool Tier::RemovedLeftovers(const std::string& target) {
  if (!fs_->IsObjectStore(target)) return false;  // elsewhere leftovers are hidden temporaries
  Result<std::vector<FileInfo>> listed = fs_->ListDir(target);
  if (!listed.ok()) return false;
  std::vector<std::string> doomed;
  for (const FileInfo& e : *listed) {
    if (e.name == format::kManifestFileName) return false;  // committed: not a leftover
    if (!e.is_dir && engine::IsCheckpointEntry(e.name)) doomed.push_back(e.name);
  }
  for (const std::string& name : doomed) {
    if (!fs_->RemoveFile(JoinPath(target, name)).ok()) return false;
  }
  spdlog::warn("savepoint: remote tier: removed {} data objects of an interrupted upload of {}",
               doomed.size(), target);
  return !doomed.empty();
}

Status Tier::IndexUpload(CheckpointRecord remote, const CheckpointStats& stats) {
  // Retention: the doomed records leave the index readers see before their objects go.
  std::vector<CheckpointRecord> doomed;
  SP_RETURN_IF_ERROR(Publish([&](Index& index) {
    std::erase_if(index.records, [&](const CheckpointRecord& r) { return r.name == remote.name; });
    index.records.push_back(remote);
    SortRecords(index.records);
    doomed = Doomed(index);
    return Status::OK();
  }));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.push_back(stats);
  }
  for (const CheckpointRecord& r : doomed) {
    auto t0 = std::chrono::steady_clock::now();
    Status s = store_->Delete(r.path);
    if (!s.ok() && s.code() != StatusCode::kNotFound) {
      // Still there, unindexed: the next reconciliation indexes it again.
      spdlog::warn("savepoint: remote retention: {}", s.ToString());
      continue;
    }
    bases_->Forget(r.name);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.push_back({"remote_delete", r.name, r.step, 0, SecondsSince(t0), 0});
  }
  return Status::OK();
}

Status Tier::Publish(const std::function<Status(Index&)>& change) {
  Index next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = index_;
  }
  constexpr int kTries = 5;
  Status written;
  for (int attempt = 1;; ++attempt) {
    SP_RETURN_IF_ERROR(change(next));
    if (!cas_) {
      written = WriteIndex(fs_, location_, next);
      break;
    }
    written = WriteIndexObject(fs_, location_, next);
    if (written.code() != StatusCode::kFailedPrecondition || attempt == kTries) break;
    // Another writer replaced the index since it was read: apply the change to its version.
    spdlog::warn("savepoint: remote tier: {}; reading it again", written.message());
    Result<Index> theirs = ReadIndexObject(fs_, location_);
    if (!theirs.ok() && theirs.status().code() != StatusCode::kNotFound) return theirs.status();
    next = theirs.ok() ? std::move(theirs).value() : Index{};
  }
  // Kept in memory even when the write failed: the remote has what it records (or, for a
  // removal, no longer needs it), and the next write publishes it.
  std::lock_guard<std::mutex> lock(mu_);
  index_ = std::move(next);
  return written;
}

Status Tier::ReconcileOnce() {
  if (reconciled_) return Status::OK();
  std::vector<CheckpointRecord> records = Records();
  SP_ASSIGN_OR_RETURN(bool changed, Reconcile(*store_, fs_, location_, records, steps_per_epoch_));
  if (changed) {  // (rare: a process died between an upload and its index write)
    SP_RETURN_IF_ERROR(Publish([&](Index& index) {
      return Reconcile(*store_, fs_, location_, index.records, steps_per_epoch_).status();
    }));
  }
  reconciled_ = true;
  return Status::OK();
}

std::vector<CheckpointRecord> Tier::Doomed(Index& index) {
  const std::vector<std::string> names = SelectForDeletion(index.records, policy_);
  const std::set<std::string> needed = NeededByKept(index.records, names, *bases_);
  std::vector<CheckpointRecord> doomed;
  std::erase_if(index.records, [&](const CheckpointRecord& r) {
    const bool goes =
        needed.count(r.name) == 0 && std::find(names.begin(), names.end(), r.name) != names.end();
    if (goes) doomed.push_back(r);
    return goes;
  });
  return doomed;
}

}  // namespace savepoint::manager
