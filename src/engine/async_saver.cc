// Checkpointer: two-phase (snapshot, then persist) asynchronous saves through a capped staging
// pool. See include/savepoint/async.h for the contract.
//
// Layout: the data file is staged as consecutive slabs covering file bytes
// [4096 + k * S, 4096 + (k + 1) * S). The snapshot walks the chunks in file order, copies each
// into the slab(s) covering its file range (zero-filling alignment padding) and computes the
// chunk's CRC32C on the staged bytes in the same pass. A filled slab goes onto a queue; writer
// threads write it at its file offset and return it to the pool. When the queue is drained the
// job finishes the files and commits with the same steps as a synchronous save.
//
// Compressed saves stage each chunk in a slab of its own instead (CRC32C of the raw bytes fused
// with the copy); writer threads compress it, write the stored form at an offset handed out by an
// ExtentAllocator as chunks finish (or the staged raw bytes, with the snapshot's CRC, when it does
// not shrink) and return the slab.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "engine/staging_pool.h"
#include "engine/writer.h"
#include "savepoint/async.h"
#include "util/crc32c.h"

namespace savepoint {

using Clock = std::chrono::steady_clock;

static double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One save in flight; shared by the Checkpointer, its threads and every SaveHandle copy.
struct SaveHandle::Shared {
  // A staged piece of the data file at `offset` (raw layout), or one whole chunk `task` to be
  // compressed and placed by `alloc` (compressed saves; `crc` is its raw bytes' CRC32C).
  struct Slab {
    std::byte* data;
    uint64_t offset;
    uint64_t len;
    const engine::ChunkTask* task = nullptr;
    uint32_t crc = 0;
  };

  engine::SaveTarget target;
  bool overwrite = false;
  format::Manifest manifest;
  std::vector<engine::ChunkTask> tasks;  // point into `manifest`
  engine::ExtentAllocator alloc;
  std::unique_ptr<WritableFile> file;
  engine::StagingPool* pool = nullptr;
  Clock::time_point start;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Slab> queue;     // guarded by mu
  bool queue_closed = false;  // guarded by mu
  bool done = false;          // guarded by mu
  Status result;              // guarded by mu (valid once done)
  SaveStats stats;            // guarded by mu
  std::atomic<bool> failed{false};
  Status first_error;  // guarded by mu

  void Fail(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = std::move(s);
      failed = true;
    }
    cv.notify_all();
    pool->Wake();
  }
  void Push(Slab slab) {
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
        cv.wait(lock, [&] { return !queue.empty() || queue_closed; });
        if (queue.empty()) return;
        slab = queue.front();
        queue.pop_front();
      }
      if (!failed) {
        Status s = slab.task != nullptr ? WriteStaged(slab, &buffers)
                                        : file->WriteAt(slab.offset, {slab.data, slab.len});
        if (!s.ok()) Fail(std::move(s));
      }
      pool->Release(slab.data);
    }
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
      s = engine::FinishFiles(target, file.get(), manifest);
    }
    if (s.ok()) s = engine::CommitSave(target, overwrite);
    if (!s.ok()) {
      engine::AbandonSave(target);
      s = s.WithContext(fmt::format("save {}", target.path));
    }
    file.reset();
    {
      std::lock_guard<std::mutex> lock(mu);
      result = s;
      stats.persist_seconds = Since(start);
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

constexpr uint64_t kCacheSlice = 256 << 10;

// Phase 1 on the caller's thread: stages every chunk into slabs (see the file comment).
class Snapshotter {
 public:
  Snapshotter(SaveHandle::Shared* job, SnapshotCopier* copier)
      : job_(job), copier_(copier), slab_bytes_(job->pool->slab_bytes()) {}

  Status Run(const std::vector<ChunkTask>& tasks) {
    Status s;
    for (size_t i = 0; i < tasks.size() && s.ok() && !job_->failed; ++i) {
      s = tasks[i].stored != nullptr ? StageWhole(tasks[i]) : StageChunk(tasks[i]);
    }
    if (slab_ != nullptr && (!s.ok() || job_->failed)) {
      job_->pool->Release(slab_);  // stopped early: nothing more will be written
    } else if (slab_ != nullptr) {
      Flush(job_->manifest.files[0].bytes - win_);
    }
    slab_ = nullptr;
    return s;
  }

 private:
  Status StageChunk(const ChunkTask& t) {
    uint32_t crc = 0;
    for (uint64_t done = 0; done < t.len;) {
      uint64_t pos = t.file_offset + done;
      if (slab_ == nullptr || pos >= win_ + slab_bytes_) SP_RETURN_IF_ERROR(NextSlab(pos));
      if (slab_ == nullptr) return Status::OK();  // cancelled: the job failed
      uint64_t at = pos - win_;
      std::memset(slab_ + fill_, 0, at - fill_);
      uint64_t n = std::min({t.len - done, slab_bytes_ - at, kCacheSlice});
      SP_RETURN_IF_ERROR(CopyPiece(t.src + done, slab_ + at, n));
      crc = Crc32cExtend(crc, {slab_ + at, n});
      fill_ = at + n;
      done += n;
    }
    *t.crc = crc;
    return Status::OK();
  }

  // Compressed saves: copies one chunk into a slab of its own (CRC fused with the copy, for the
  // case that it does not compress) and queues it for compression.
  Status StageWhole(const ChunkTask& t) {
    SP_ASSIGN_OR_RETURN(std::byte * slab,
                        job_->pool->Acquire([this] { return job_->failed.load(); }));
    if (slab == nullptr) return Status::OK();  // cancelled: the job failed
    uint32_t crc = 0;
    for (uint64_t done = 0; done < t.len;) {
      uint64_t n = std::min(t.len - done, kCacheSlice);
      Status s = CopyPiece(t.src + done, slab + done, n);
      if (!s.ok()) {
        job_->pool->Release(slab);
        return s;
      }
      crc = Crc32cExtend(crc, {slab + done, n});
      done += n;
    }
    job_->Push({slab, 0, t.len, &t, crc});
    return Status::OK();
  }

  Status CopyPiece(const std::byte* src, std::byte* dst, uint64_t n) {
    if (copier_ != nullptr) return copier_->Copy(src, dst, n);
    std::memcpy(dst, src, n);
    return Status::OK();
  }

  Status NextSlab(uint64_t pos) {
    if (slab_ != nullptr) Flush(slab_bytes_);
    win_ = format::kDataHeaderBytes + (pos - format::kDataHeaderBytes) / slab_bytes_ * slab_bytes_;
    SP_ASSIGN_OR_RETURN(slab_, job_->pool->Acquire([this] { return job_->failed.load(); }));
    fill_ = 0;
    return Status::OK();
  }

  void Flush(uint64_t len) {
    std::memset(slab_ + fill_, 0, len - fill_);
    job_->Push({slab_, win_, len});
    slab_ = nullptr;
  }

  SaveHandle::Shared* job_;
  SnapshotCopier* copier_;
  const uint64_t slab_bytes_;
  std::byte* slab_ = nullptr;
  uint64_t win_ = 0;   // file offset of the current slab
  uint64_t fill_ = 0;  // bytes of the current slab written so far
};

uint64_t DefaultStagingBytes() {
  uint64_t ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  return std::min(ram / 4, uint64_t{16} << 30);
}

class CheckpointerImpl final : public Checkpointer {
 public:
  explicit CheckpointerImpl(const CheckpointerOptions& o)
      : options_(o),
        pool_(o.slab_bytes,
              (o.staging_bytes != 0 ? o.staging_bytes : DefaultStagingBytes()) / o.slab_bytes) {}

  ~CheckpointerImpl() override { WaitAll().IgnoreError(); }

  Result<SaveHandle> SaveAsync(const State& state, const std::string& path,
                               const SaveOptions& options) override;

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

  Result<std::shared_ptr<SaveHandle::Shared>> Prepare(const State& state, const std::string& path,
                                                      const SaveOptions& options);
  void Launch(std::shared_ptr<SaveHandle::Shared> job);

  const CheckpointerOptions options_;
  StagingPool pool_;
  std::mutex save_mu_;  // serialises snapshots
  std::mutex mu_;       // guards jobs_
  std::vector<Job> jobs_;
};

Result<std::shared_ptr<SaveHandle::Shared>> CheckpointerImpl::Prepare(const State& state,
                                                                      const std::string& path,
                                                                      const SaveOptions& options) {
  SaveOptions o = options;
  o.chunk_bytes = options_.slab_bytes;
  o.io_threads = options_.io_threads;
  auto job = std::make_shared<SaveHandle::Shared>();
  job->start = Clock::now();
  job->pool = &pool_;
  job->overwrite = o.overwrite;
  SP_ASSIGN_OR_RETURN(job->target, BeginSave(path, o));
  Result<std::unique_ptr<WritableFile>> file = Status();
  Result<std::vector<ChunkTask>> tasks =
      PlanSave(state, o.chunk_bytes, &job->manifest, o.compression);
  if (tasks.ok()) file = CreateDataFile(job->target, job->manifest, o.direct_io);
  if (!tasks.ok() || !file.ok()) {
    AbandonSave(job->target);
    Status s = tasks.ok() ? file.status() : tasks.status();
    return s.WithContext(fmt::format("save {}", job->target.path));
  }
  job->file = std::move(*file);
  job->tasks = std::move(*tasks);
  job->stats.bytes = state.tensor_bytes();
  job->stats.direct_io = job->file->direct();
  Launch(job);
  auto t0 = Clock::now();
  Snapshotter snap(job.get(), options_.copier);
  Status s = snap.Run(job->tasks);
  if (!s.ok()) job->Fail(s);
  job->Close();
  std::lock_guard<std::mutex> lock(job->mu);
  job->stats.snapshot_seconds = Since(t0);
  return job;
}

void CheckpointerImpl::Launch(std::shared_ptr<SaveHandle::Shared> job) {
  int threads = options_.io_threads;
  std::thread t([job, threads] {
    std::vector<std::thread> writers;
    for (int i = 1; i < threads; ++i) writers.emplace_back([&job] { job->Drain(); });
    job->Drain();
    for (auto& w : writers) w.join();
    job->Finish();
  });
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back({std::move(job), std::move(t)});
}

Result<SaveHandle> CheckpointerImpl::SaveAsync(const State& state, const std::string& path,
                                               const SaveOptions& options) {
  auto t0 = Clock::now();
  std::lock_guard<std::mutex> serial(save_mu_);
  if (!options_.allow_concurrent_saves) WaitAll().IgnoreError();  // errors went to their handles
  SP_ASSIGN_OR_RETURN(std::shared_ptr<SaveHandle::Shared> job, Prepare(state, path, options));
  std::lock_guard<std::mutex> lock(job->mu);
  job->stats.blocked_seconds = Since(t0);
  return SaveHandle(job);
}

}  // namespace
}  // namespace engine

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(const CheckpointerOptions& o) {
  if (o.slab_bytes < (64 << 10) || o.slab_bytes > format::kMaxChunkBytes ||
      o.slab_bytes % format::kAlignment != 0) {
    return InvalidArgumentError(fmt::format(
        "CheckpointerOptions.slab_bytes = {}: must be a multiple of 4096 in [64 KiB, 1 GiB]",
        o.slab_bytes));
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return InvalidArgumentError(
        fmt::format("CheckpointerOptions.io_threads = {}: must be in [1, 64]", o.io_threads));
  }
  return std::unique_ptr<Checkpointer>(new engine::CheckpointerImpl(o));
}

}  // namespace savepoint
