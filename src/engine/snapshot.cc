// Snapshot of an asynchronous save. See snapshot.h.
#include "engine/snapshot.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "engine/seal.h"
#include "util/crc32c.h"

namespace savepoint::engine {
namespace {

// A slab being filled. It goes to the sink when `pending` drops to zero: one reference is held by
// the walker until it moves past the slab, and one by every copy into it that has not finished.
struct SlabRec {
  std::byte* data = nullptr;
  uint64_t win = 0;  // file offset of data[0]
  uint64_t len = 0;  // bytes to write; set when the walker moves past the slab
  std::atomic<int> pending{1};
};

// A piece of one chunk's copy: bytes [from, from + n) of the chunk go to dst, inside `slab`
// (nullptr for a compressed save's slab of its own).
struct Segment {
  uint64_t from = 0;
  std::byte* dst = nullptr;
  uint64_t n = 0;
  SlabRec* slab = nullptr;
};

struct CopyJob {
  const ChunkTask* task = nullptr;
  std::vector<Segment> segments;
  bool whole = false;  // compressed save: segments[0] is a slab of its own
};

// Runs copy jobs on `threads - 1` helper threads and on the submitting thread.
class Crew {
 public:
  Crew(const SnapshotPlan& plan, SnapshotSink* sink) : plan_(plan), sink_(sink) {
    for (int i = 1; i < plan.threads; ++i) helpers_.emplace_back([this] { HelperLoop(); });
  }
  ~Crew() { Finish(); }
  Crew(const Crew&) = delete;
  Crew& operator=(const Crew&) = delete;

  // Queues a job; runs it (or an older one) on this thread when there are no helpers or the
  // queue is long, so the walker copies too instead of waiting.
  void Submit(CopyJob job) {
    if (helpers_.empty()) return Run(job);
    CopyJob mine;
    bool run_one = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(job));
      if (queue_.size() > 2 * helpers_.size()) {
        mine = std::move(queue_.front());
        queue_.pop_front();
        run_one = true;
      }
    }
    cv_.notify_one();
    if (run_one) Run(mine);
  }

  // Runs what is queued and waits for the helpers.
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
    while (auto job = Pop(false)) Run(*job);
    for (std::thread& t : helpers_) t.join();
    helpers_.clear();
  }

  // Drops one reference to `slab` (the walker's, or a finished copy's).
  void Unref(SlabRec* slab) {
    if (slab->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      sink_->Push({slab->data, slab->win, slab->len});
    }
  }

 private:
  std::optional<CopyJob> Pop(bool wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait) cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
    if (queue_.empty()) return std::nullopt;
    CopyJob job = std::move(queue_.front());
    queue_.pop_front();
    return job;
  }

  void HelperLoop() {
    while (auto job = Pop(true)) Run(*job);
  }

  // Bytes handed to one call of the custom copier (its max_copy_bytes, else kCrc32cSlice).
  uint64_t CopierPiece() const {
    const uint64_t m = plan_.copier->max_copy_bytes();
    return m != 0 ? m : kCrc32cSlice;
  }

  // Copies `n` bytes and extends *crc over them: Crc32cCopy, or the custom copier (when it takes
  // the source) piece by piece with the checksum of each staged piece right after it.
  Status CopySegment(const std::byte* src, std::byte* dst, uint64_t n, uint32_t* crc) {
    if (plan_.copier == nullptr || !plan_.copier->Copies(src)) {
      *crc = Crc32cCopy(*crc, src, dst, n);
      return Status::OK();
    }
    const uint64_t piece = CopierPiece();
    for (uint64_t done = 0; done < n;) {
      const uint64_t len = std::min<uint64_t>(n - done, piece);
      SP_RETURN_IF_ERROR(plan_.copier->Copy(src + done, dst + done, len));
      *crc = Crc32cExtend(*crc, {dst + done, len});
      done += len;
    }
    return Status::OK();
  }

  // Bytes [from, from + n) of the chunk of `t` into `dst`, extending *crc over them: copied
  // (CopySegment), or for a row gather (sparse tables, WriteRequest::gathers) gathered into
  // storage order a slice at a time, each slice checksummed right after.
  Status StageSegment(const ChunkTask& t, uint64_t from, std::byte* dst, uint64_t n,
                      uint32_t* crc) {
    if (t.gather == nullptr) return CopySegment(t.src + from, dst, n, crc);
    const uint64_t at = static_cast<uint64_t>(t.src - t.gather->base) + from;
    for (uint64_t done = 0; done < n;) {
      const uint64_t len = std::min<uint64_t>(n - done, kCrc32cSlice);
      GatherRows(*t.gather, at + done, len, dst + done);
      *crc = Crc32cExtend(*crc, {dst + done, len});
      done += len;
    }
    return Status::OK();
  }

  // Encrypted saves (engine/seal.h): seals the chunk of `job` into its segments: each piece is
  // copied by the custom copier first (when it takes the source) or gathered (a row gather), then
  // encrypted in place a slice at a time, each slice checksummed right after; sets the chunk's
  // tag and CRC (of the ciphertext).
  Status SealSegments(const CopyJob& job) {
    const ChunkTask& t = *job.task;
    SP_ASSIGN_OR_RETURN(crypto::GcmSealer sealer,
                        t.seal->keys.BeginSeal(IdentityOf(t, t.file_offset, t.len, false)));
    const bool custom =
        t.gather == nullptr && plan_.copier != nullptr && plan_.copier->Copies(t.src);
    const uint64_t piece = custom ? CopierPiece() : kCrc32cSlice;
    uint32_t crc = 0;
    for (const Segment& s : job.segments) {
      for (uint64_t done = 0; done < s.n;) {
        const uint64_t len = std::min<uint64_t>(s.n - done, piece);
        const std::byte* src = t.src + s.from + done;
        std::byte* dst = s.dst + done;
        if (t.gather != nullptr) {
          GatherRows(*t.gather, static_cast<uint64_t>(t.src - t.gather->base) + s.from + done, len,
                     dst);
          src = dst;
        } else if (custom) {
          SP_RETURN_IF_ERROR(plan_.copier->Copy(src, dst, len));
          src = dst;
        }
        for (uint64_t at = 0; at < len;) {
          const uint64_t n = std::min<uint64_t>(len - at, kCrc32cSlice);
          SP_RETURN_IF_ERROR(sealer.Update({src + at, n}, {dst + at, n}));
          crc = Crc32cExtend(crc, {dst + at, n});
          at += n;
        }
        done += len;
      }
    }
    SP_ASSIGN_OR_RETURN(*t.tag, sealer.Finish());
    *t.crc = crc;
    return Status::OK();
  }

  void Run(const CopyJob& job) {
    uint32_t crc = 0;
    bool ok = !sink_->failed();
    const bool seal = ok && !job.whole && job.task->seal != nullptr;
    if (seal) {
      Status st = SealSegments(job);
      if (!st.ok()) {
        sink_->Fail(std::move(st));
        ok = false;
      }
    }
    for (size_t i = 0; ok && !seal && i < job.segments.size(); ++i) {
      const Segment& s = job.segments[i];
      Status st = StageSegment(*job.task, s.from, s.dst, s.n, &crc);
      if (!st.ok()) {
        sink_->Fail(std::move(st));
        ok = false;
      }
    }
    if (job.whole) {
      std::byte* slab = job.segments[0].dst;
      if (ok) {
        sink_->Push({slab, 0, job.task->len, job.task, crc});
      } else {
        plan_.pool->Release(slab);
      }
      return;
    }
    if (ok && !seal) *job.task->crc = crc;
    for (const Segment& s : job.segments) Unref(s.slab);
  }

  const SnapshotPlan& plan_;
  SnapshotSink* const sink_;
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CopyJob> queue_;  // guarded by mu_
  bool closed_ = false;        // guarded by mu_
};

// Walks the chunks in file order, laying them out in slabs (see snapshot.h).
class Walker {
 public:
  Walker(const SnapshotPlan& plan, SnapshotSink* sink, Crew* crew)
      : plan_(plan), sink_(sink), crew_(crew), slab_bytes_(plan.pool->slab_bytes()) {}

  // Lays out every task; an error (allocating a slab) goes to the sink.
  void Run() {
    Status s;
    for (const ChunkTask& t : *plan_.tasks) {
      if (!s.ok() || sink_->failed()) break;
      // A compressed save's packed region (its uncompressed chunks come first): its last slab
      // goes to the sink before the compressed chunks take slabs of their own.
      if (t.stored != nullptr && cur_ != nullptr) {
        Seal(std::min(slab_bytes_, plan_.data_file_bytes - cur_->win));
      }
      s = t.stored != nullptr ? StageWhole(t) : StageChunk(t);
    }
    if (!s.ok())
      sink_->Fail(std::move(s));  // before sealing: a failed save's slabs are not written
    if (cur_ != nullptr) Seal(sink_->failed() ? 0 : plan_.data_file_bytes - cur_->win);
  }

 private:
  Status StageChunk(const ChunkTask& t) {
    CopyJob job{&t, {}, false};
    for (uint64_t done = 0; done < t.len;) {
      const uint64_t pos = t.file_offset + done;
      if (cur_ == nullptr || pos >= cur_->win + slab_bytes_) SP_RETURN_IF_ERROR(NextSlab(pos));
      if (cur_ == nullptr) break;  // no slab: the save failed while waiting for one
      const uint64_t at = pos - cur_->win;
      std::memset(cur_->data + fill_, 0, at - fill_);
      const uint64_t n = std::min(t.len - done, slab_bytes_ - at);
      cur_->pending.fetch_add(1, std::memory_order_relaxed);
      job.segments.push_back({done, cur_->data + at, n, cur_});
      fill_ = at + n;
      done += n;
    }
    if (!job.segments.empty()) crew_->Submit(std::move(job));
    return Status::OK();
  }

  Status StageWhole(const ChunkTask& t) {
    SP_ASSIGN_OR_RETURN(std::byte * slab, Acquire());
    if (slab == nullptr) return Status::OK();  // the save failed: Run stops at the next task
    crew_->Submit(CopyJob{&t, {Segment{0, slab, t.len, nullptr}}, true});
    return Status::OK();
  }

  Status NextSlab(uint64_t pos) {
    if (cur_ != nullptr) Seal(slab_bytes_);
    const uint64_t header = format::kDataHeaderBytes;
    const uint64_t win = header + (pos - header) / slab_bytes_ * slab_bytes_;
    SP_ASSIGN_OR_RETURN(std::byte * data, Acquire());
    if (data == nullptr) return Status::OK();  // the save failed: cur_ stays null
    SlabRec& rec = slabs_.emplace_back();
    rec.data = data;
    rec.win = win;
    cur_ = &rec;
    fill_ = 0;
    return Status::OK();
  }

  // A slab from the pool (nullptr if the save failed while waiting). Before waiting for one, lets
  // the sink's writers start, since only they give slabs back.
  Result<std::byte*> Acquire() {
    if (plan_.pool->exhausted()) sink_->StartPersist();
    return plan_.pool->Acquire([this] { return sink_->failed(); });
  }

  // Zero-fills the current slab's tail up to `len` and drops the walker's reference.
  void Seal(uint64_t len) {
    if (len > fill_) std::memset(cur_->data + fill_, 0, len - fill_);
    cur_->len = len;
    crew_->Unref(std::exchange(cur_, nullptr));
  }

  const SnapshotPlan& plan_;
  SnapshotSink* const sink_;
  Crew* const crew_;
  const uint64_t slab_bytes_;
  std::deque<SlabRec> slabs_;  // stable addresses; outlives every copy (the crew finishes first)
  SlabRec* cur_ = nullptr;
  uint64_t fill_ = 0;  // bytes of the current slab laid out so far
};

}  // namespace

void RunSnapshot(const SnapshotPlan& plan, SnapshotSink* sink) {
  Crew crew(plan, sink);
  Walker walker(plan, sink, &crew);
  walker.Run();
  crew.Finish();
}

int DefaultSnapshotThreads(const SnapshotCopier* copier) {
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1u, copier != nullptr ? 8u : 4u));
}

}  // namespace savepoint::engine
