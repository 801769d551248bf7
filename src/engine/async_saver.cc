// Checkpointer: two-phase (snapshot, then persist) asynchronous saves through a capped staging
// pool. See include/savepoint/async.h for the contract.
//
// Layout: the data file is staged as consecutive slabs covering file bytes
// [4096 + k * S, 4096 + (k + 1) * S). The snapshot (engine/snapshot.h) copies each chunk into the
// slab(s) covering its file range on up to snapshot_threads threads and computes the chunk's
// CRC32C in the same pass over memory. A filled slab goes onto a queue; writer
// threads write it at its file offset and return it to the pool. When the queue is drained the
// job finishes the files and commits with the same steps as a synchronous save.
//
// Compressed saves stage each compressed chunk in a slab of its own instead (CRC32C of the raw
// bytes fused with the copy); writer threads compress it, write the stored form at an offset handed
// out by an ExtentAllocator (starting after the packed region of small tensors, which is staged in
// slabs like an uncompressed file) as chunks finish (or the staged raw bytes, with the snapshot's
// CRC, when it does not shrink) and return the slab.
//
// Encrypted saves (engine/seal.h): the key is resolved in SaveAsync, before the snapshot. The
// snapshot encrypts uncompressed chunks into their slabs instead of copying them (the CRC32C then
// covers the ciphertext); writer threads encrypt compressed chunks after compressing them, and
// staged chunks that did not shrink in place, before writing.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "engine/checkpointer.h"
#include "engine/request.h"
#include "engine/seal.h"
#include "engine/snapshot.h"
#include "engine/staging_pool.h"
#include "engine/writer.h"
#include "savepoint/async.h"

namespace savepoint {

using Clock = std::chrono::steady_clock;

static double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One save in flight; shared by the Checkpointer, its threads and every SaveHandle copy. The
// snapshot hands it staged slabs (engine::SnapshotSink).
struct SaveHandle::Shared final : engine::SnapshotSink {
  using Slab = engine::StagedSlab;

  engine::SaveTarget target;
  bool overwrite = false;
  format::Manifest manifest;
  engine::ChunkSeal seal;                // encrypted saves (manifest.encryption.enabled)
  std::vector<engine::ChunkTask> tasks;  // point into `manifest` (and to `seal`)
  // The request's late tensors (WriteRequest::late): written after the snapshot by WriteLate,
  // from the memory that `hold` keeps alive until Finish.
  std::vector<engine::ChunkTask> late_tasks;
  std::function<Status()> late_prepare;
  std::shared_ptr<const void> hold;
  engine::ExtentAllocator alloc;
  std::unique_ptr<WritableFile> file;
  engine::StagingPool* pool = nullptr;
  Clock::time_point start;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Slab> queue;     // guarded by mu
  bool queue_closed = false;  // guarded by mu
  bool writers_held = false;  // guarded by mu; writers wait while true and the queue is open
  bool done = false;          // guarded by mu
  Status result;              // guarded by mu (valid once done)
  SaveStats stats;            // guarded by mu
  std::atomic<bool> has_failed{false};
  Status first_error;  // guarded by mu

  void Fail(Status s) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = std::move(s);
      has_failed = true;
    }
    cv.notify_all();
    pool->Wake();
  }
  bool failed() const override { return has_failed.load(); }
  void StartPersist() override {
    {
      std::lock_guard<std::mutex> lock(mu);
      writers_held = false;
    }
    cv.notify_all();
  }
  void Push(const Slab& slab) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(slab);
    }
    cv.notify_all();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue_closed = true;
    }
    cv.notify_all();
  }
  // Compresses and writes a staged chunk (or writes it raw if it does not shrink).
  Status WriteStaged(const Slab& slab, engine::CompressBuffers* b) {
    SP_ASSIGN_OR_RETURN(bool done,
                        engine::WriteCompressedChunk(*slab.task, slab.data, manifest.chunk_bytes,
                                                     file.get(), &alloc, b));
    if (done) return Status::OK();
    return engine::StoreRawChunk(*slab.task, slab.data, slab.crc, file.get(), &alloc, nullptr);
  }
  // Writer thread body: write slabs until the queue is closed and empty.
  void Drain() {
    engine::CompressBuffers buffers;
    for (;;) {
      Slab slab;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return (!writers_held && !queue.empty()) || queue_closed; });
        if (queue.empty()) return;
        slab = queue.front();
        queue.pop_front();
      }
      if (!has_failed) {
        Status s = slab.task != nullptr ? WriteStaged(slab, &buffers)
                                        : file->WriteAt(slab.offset, {slab.data, slab.len});
        if (!s.ok()) Fail(std::move(s));
      }
      pool->Release(slab.data);
    }
  }
  // Late tensors' thread body: once the snapshot has ended, prepares them and writes their chunks
  // on `threads` threads (as a synchronous save writes, gathering rows into storage order).
  void WriteLate(int threads) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return queue_closed; });
    }
    if (failed()) return;
    Status s = late_prepare ? late_prepare() : Status::OK();
    if (failed()) return;  // (a write of the snapshot failed meanwhile)
    if (s.ok()) {
      s = engine::WriteTasks(late_tasks, manifest.chunk_bytes, threads, file.get(), &alloc);
    }
    if (!s.ok()) Fail(std::move(s));
  }
  void Finish() {
    Status s;
    {
      std::lock_guard<std::mutex> lock(mu);
      s = first_error;
    }
    uint64_t stored = 0;
    if (s.ok()) {
      if (format::UsesCompression(manifest)) manifest.files[0].bytes = alloc.end();
      for (const auto& t : manifest.tensors) stored += format::StoredBytes(t.shards[0]);
      s = engine::FinishFiles(target, file.get(), manifest,
                              manifest.encryption.enabled ? &seal.keys : nullptr);
    }
    if (s.ok()) s = engine::CommitSave(target, overwrite);
    if (!s.ok()) {
      engine::AbandonSave(target);
      s = s.WithContext(fmt::format("save {}", target.path));
    }
    file.reset();
    hold.reset();  // before `done`: a waiter may reuse what it held (sparse::CopyBuffers)
    {
      std::lock_guard<std::mutex> lock(mu);
      result = s;
      stats.seconds = Since(start);
      stats.stored_bytes = stored;
      done = true;
    }
    cv.notify_all();
  }
};

bool SaveHandle::Poll() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->done;
}

Status SaveHandle::Wait() const {
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  return s_->result;
}

bool SaveHandle::WaitFor(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(s_->mu);
  return s_->cv.wait_for(lock, timeout, [&] { return s_->done; });
}

Status SaveHandle::status() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->done ? s_->result
                  : FailedPreconditionError("save " + s_->target.path + " still running");
}

SaveStats SaveHandle::stats() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->stats;
}

const std::string& SaveHandle::path() const { return s_->target.path; }

namespace engine {
namespace {

uint64_t DefaultStagingBytes() {
  uint64_t ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  return std::min(ram / 4, uint64_t{16} << 30);
}

class CheckpointerImpl final : public Checkpointer {
 public:
  CheckpointerImpl(const CheckpointerOptions& o, const IoOptions& io, FlattenTables flatten)
      : options_(o),
        io_(io),
        flatten_(std::move(flatten)),
        pool_(o.slab_bytes,
              (o.staging_bytes != 0 ? o.staging_bytes : DefaultStagingBytes()) / o.slab_bytes,
              o.copier) {}

  ~CheckpointerImpl() override {
    WaitAll().IgnoreError();
    std::thread reserving;
    {
      std::lock_guard<std::mutex> lock(reserve_mu_);
      stop_reserve_ = true;
      reserving = std::move(reserve_thread_);
    }
    if (reserving.joinable()) reserving.join();  // outside the lock: the loop takes it to end
  }

  void Reserve(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(reserve_mu_);
    if (bytes > reserve_target_) reserve_target_ = bytes;
    if (reserving_ || stop_reserve_) return;  // the running thread sees the new target
    if (reserve_thread_.joinable()) reserve_thread_.join();  // a finished one
    reserving_ = true;
    reserve_thread_ = std::thread([this] { ReserveLoop(); });
  }

  Result<SaveHandle> SaveAsync(const State& state, const std::string& path,
                               const SaveOptions& options) override;
  Result<SaveHandle> SaveAsync(const State& state, const std::string& path,
                               const SparseSaveOptions& options) override;

  Status WaitAll() override {
    std::vector<Job> jobs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs.swap(jobs_);
    }
    Status first;
    for (Job& j : jobs) {
      j.thread.join();
      Status s = SaveHandle(j.shared).Wait();
      if (first.ok()) first = s;
    }
    return first;
  }

  uint64_t staging_allocated_bytes() const override { return pool_.allocated_bytes(); }
  uint64_t staging_in_use_bytes() const override { return pool_.in_use_bytes(); }
  uint64_t staging_cap_bytes() const override { return pool_.cap_bytes(); }

 private:
  struct Job {
    std::shared_ptr<SaveHandle::Shared> shared;
    std::thread thread;
  };

  // Plans, snapshots and launches the save of `r` (its state, gathers, late tensors, path and
  // options; r.io is ignored: the Checkpointer's io_ writes). `hold` keeps what `r` points to
  // alive until the save ends (its late tensors are written after Prepare returns).
  Result<std::shared_ptr<SaveHandle::Shared>> Prepare(const WriteRequest& r,
                                                      std::shared_ptr<const void> hold);
  // SaveAsync of either kind: `tables` null for a State without tables.
  Result<SaveHandle> Start(const State& state, const std::string& path, const SaveOptions& options,
                           const SparseSaveOptions* tables);
  void Launch(std::shared_ptr<SaveHandle::Shared> job);

  // Grows the pool slab by slab to reserve_target_ (Reserve's thread).
  void ReserveLoop() {
    for (;;) {
      Result<bool> grew = pool_.GrowOne(reserve_target_.load());
      if (grew.ok() && *grew && !stop_reserve_) continue;
      if (!grew.ok())
        spdlog::warn("savepoint: reserving staging memory: {}", grew.status().ToString());
      std::lock_guard<std::mutex> lock(reserve_mu_);
      if (!grew.ok() || stop_reserve_ || !NeedsGrowth()) {
        reserving_ = false;
        return;
      }
    }
  }
  bool NeedsGrowth() const {
    uint64_t allocated = pool_.allocated_bytes();
    return allocated < reserve_target_ && allocated < pool_.cap_bytes();
  }

  const CheckpointerOptions options_;
  const IoOptions io_;
  const FlattenTables flatten_;
  StagingPool pool_;
  std::mutex save_mu_;  // serialises snapshots
  std::mutex mu_;       // guards jobs_
  std::vector<Job> jobs_;
  std::mutex reserve_mu_;  // guards reserving_ and reserve_thread_
  bool reserving_ = false;
  std::thread reserve_thread_;
  std::atomic<uint64_t> reserve_target_{0};
  std::atomic<bool> stop_reserve_{false};
};

// SaveOptions fields an async save cannot use: a chunk size other than the default and the
// Checkpointer's slab size, statistics and progress are refused rather than ignored.
Status CheckAsyncSaveOptions(const SaveOptions& o, const CheckpointerOptions& c,
                             const std::string& path) {
  const SaveOptions defaults;
  if (o.chunk_bytes != defaults.chunk_bytes && o.chunk_bytes != c.slab_bytes) {
    return InvalidArgumentError(fmt::format(
        "save {}: SaveOptions.chunk_bytes = {} is not used by an async save: its chunks are the "
        "Checkpointer's slabs (CheckpointerOptions.slab_bytes = {}); set that instead",
        path, o.chunk_bytes, c.slab_bytes));
  }
  if (o.stats != nullptr) {
    return InvalidArgumentError(fmt::format(
        "save {}: SaveOptions.stats is not filled by an async save; use SaveHandle::stats()",
        path));
  }
  if (o.progress) {
    return InvalidArgumentError(fmt::format(
        "save {}: SaveOptions.progress is not called by an async save; poll the SaveHandle", path));
  }
  return RefuseTopology(o.topology, "async save " + path, "SaveOptions");
}

// Moves the tasks of `r`'s late tensors (the last ones: PlanSave) from job->tasks to
// job->late_tasks; returns where the snapshot's layout ends (the late tensors' region starts).
uint64_t SplitLate(const WriteRequest& r, SaveHandle::Shared* job) {
  uint64_t end = job->manifest.files[0].bytes;
  if (r.late == nullptr) return end;
  auto first = std::find_if(job->tasks.begin(), job->tasks.end(), [&](const ChunkTask& t) {
    return r.late->names.contains(t.tensor->name);
  });
  for (auto it = first; it != job->tasks.end(); ++it) {
    if (it->stored == nullptr) end = std::min(end, it->file_offset);
  }
  job->late_tasks.assign(first, job->tasks.end());
  job->tasks.erase(first, job->tasks.end());
  job->late_prepare = r.late->prepare;
  return end;
}

Result<std::shared_ptr<SaveHandle::Shared>> CheckpointerImpl::Prepare(
    const WriteRequest& r, std::shared_ptr<const void> hold) {
  const State& state = *r.state;
  const std::string& path = r.path;
  SaveOptions o = r.options;
  o.chunk_bytes = options_.slab_bytes;
  std::optional<format::CheckpointKeys> keys;
  if (o.key) {  // resolved on the caller's thread, before anything is created
    Result<format::CheckpointKeys> k = NewSaveKeys(o.key, FileSystemOf(io_));
    if (!k.ok()) return k.status().WithContext(fmt::format("save {}", path));
    keys = std::move(*k);
  }
  auto job = std::make_shared<SaveHandle::Shared>();
  job->start = Clock::now();
  job->pool = &pool_;
  job->overwrite = o.overwrite;
  SP_ASSIGN_OR_RETURN(job->target, BeginSave(path, o, io_));
  Result<std::unique_ptr<WritableFile>> file = Status();
  job->hold = std::move(hold);
  Result<std::vector<ChunkTask>> tasks = PlanSave(
      state, o.chunk_bytes, &job->manifest, o.compression, o.format_version, r.gathers, r.late);
  if (tasks.ok() && keys) EnableSealing(std::move(*keys), 0, &job->manifest, &*tasks, &job->seal);
  if (tasks.ok()) file = CreateDataFile(job->target, job->manifest, io_.direct_io);
  if (!tasks.ok() || !file.ok()) {
    AbandonSave(job->target);
    Status s = tasks.ok() ? file.status() : tasks.status();
    return s.WithContext(fmt::format("save {}", job->target.path));
  }
  job->file = std::move(*file);
  job->tasks = std::move(*tasks);
  job->alloc.Reset(job->manifest.files[0].bytes);  // compressed chunks go after the packed region
  job->stats.bytes = state.tensor_bytes();
  for (const auto& t : job->manifest.tensors) {
    for (const auto& s : t.shards) job->stats.chunks += s.crc32c.size();
  }
  job->stats.direct_io = job->file->direct();
  job->writers_held = !options_.persist_during_snapshot;
  const uint64_t staged_end = SplitLate(r, job.get());
  Launch(job);
  auto t0 = Clock::now();
  engine::SnapshotPlan plan;
  plan.tasks = &job->tasks;
  plan.data_file_bytes = staged_end;
  plan.pool = &pool_;
  plan.copier = options_.copier;
  plan.threads = options_.snapshot_threads > 0 ? options_.snapshot_threads
                                               : engine::DefaultSnapshotThreads(options_.copier);
  engine::RunSnapshot(plan, job.get());  // errors go to the job
  job->Close();
  std::lock_guard<std::mutex> lock(job->mu);
  job->stats.snapshot_seconds = Since(t0);
  return job;
}

void CheckpointerImpl::Launch(std::shared_ptr<SaveHandle::Shared> job) {
  int threads = io_.io_threads;
  std::thread t([job, threads] {
    std::vector<std::thread> writers;
    for (int i = 1; i < threads; ++i) writers.emplace_back([&job] { job->Drain(); });
    if (!job->late_tasks.empty()) {
      writers.emplace_back([&job, threads] { job->WriteLate(threads); });
    }
    job->Drain();
    for (auto& w : writers) w.join();
    job->Finish();
  });
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back({std::move(job), std::move(t)});
}

Result<SaveHandle> CheckpointerImpl::SaveAsync(const State& state, const std::string& path,
                                               const SaveOptions& options) {
  if (state.tables().empty()) return Start(state, path, options, nullptr);
  const SparseSaveOptions tables{.save = options};
  return Start(state, path, options, &tables);
}

Result<SaveHandle> CheckpointerImpl::SaveAsync(const State& state, const std::string& path,
                                               const SparseSaveOptions& options) {
  if (options.timeout != SparseSaveOptions{}.timeout) {
    return InvalidArgumentError(fmt::format(
        "save {}: SparseSaveOptions.timeout applies to distributed saves, not to an async save of "
        "one process",
        path));
  }
  return Start(state, path, options.save, &options);
}

Result<SaveHandle> CheckpointerImpl::Start(const State& state, const std::string& path,
                                           const SaveOptions& options,
                                           const SparseSaveOptions* tables) {
  auto t0 = Clock::now();
  SP_RETURN_IF_ERROR(CheckAsyncSaveOptions(options, options_, path));
  std::lock_guard<std::mutex> serial(save_mu_);
  if (!options_.allow_concurrent_saves) WaitAll().IgnoreError();  // errors went to their handles
  WriteRequest in;
  in.path = path;
  in.state = &state;
  in.options = options;
  in.io = io_;
  // The tables' tensors: alive until the snapshot ends, or the save's end with late tensors.
  std::shared_ptr<const WriteRequest> flat;
  if (tables != nullptr) {  // (after the wait: a delta's base may be the save before)
    SP_ASSIGN_OR_RETURN(flat, flatten_(in, *tables));
  }
  SP_ASSIGN_OR_RETURN(std::shared_ptr<SaveHandle::Shared> job,
                      Prepare(flat ? *flat : in, flat && flat->late ? flat : nullptr));
  std::lock_guard<std::mutex> lock(job->mu);
  job->stats.blocked_seconds = Since(t0);
  return SaveHandle(job);
}

}  // namespace

Result<std::unique_ptr<Checkpointer>> NewCheckpointer(const CheckpointerOptions& o,
                                                      const IoOptions& io, FlattenTables flatten) {
  if (o.slab_bytes < (64 << 10) || o.slab_bytes > format::kMaxChunkBytes ||
      o.slab_bytes % format::kAlignment != 0) {
    return InvalidArgumentError(fmt::format(
        "CheckpointerOptions.slab_bytes = {}: must be a multiple of 4096 in [64 KiB, 1 GiB]",
        o.slab_bytes));
  }
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, "create checkpointer"));
  if (o.snapshot_threads < 0 || o.snapshot_threads > 64) {
    return InvalidArgumentError(
        fmt::format("CheckpointerOptions.snapshot_threads = {}: must be in [0, 64] (0 = default)",
                    o.snapshot_threads));
  }
  auto checkpointer = std::make_unique<CheckpointerImpl>(o, io, std::move(flatten));
  if (o.prefault_bytes > 0) checkpointer->Reserve(o.prefault_bytes);
  return std::unique_ptr<Checkpointer>(std::move(checkpointer));
}

}  // namespace engine
}  // namespace savepoint
