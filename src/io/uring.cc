// io_uring batches and backend selection. See uring.h.
//
// The batch loop: the ops are cut into pieces of at most kMaxPiece bytes and queued. While pieces
// are queued and no error has been seen, free submission slots are filled; then the loop submits
// and waits for at least one completion, and handles every completion available:
//   res == -EINTR / -EAGAIN     the piece goes back to the queue unchanged;
//   res < 0                     the first such error is kept; nothing new is submitted;
//   res == 0                    a write that wrote nothing is an IOError, a read hit end of file;
//   0 < res < len               the rest of the piece goes back to the queue (a direct read that
//                               is short by a non-multiple of the alignment hit end of file);
//   res == len                  done.
// It returns once nothing is in flight, so no completion for this batch is left in the ring.
#include "io/uring.h"

#include <fmt/format.h>
#include <liburing.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {
namespace {

// Largest single transfer (the SQE length is 32 bits; Linux moves < 2 GiB per request anyway).
constexpr size_t kMaxPiece = size_t{1} << 30;

// Creates `ring` with flags that suit one ring per thread, retrying without them on kernels that
// do not know them. Returns 0 or a negative errno.
int InitRing(io_uring* ring) {
  int err = io_uring_queue_init(kUringQueueDepth, ring,
                                IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN);
  if (err == -EINVAL) err = io_uring_queue_init(kUringQueueDepth, ring, 0);
  return err;
}

// Counts closed rings. liburing maps and unmaps ring memory with raw system calls, which
// ThreadSanitizer does not see, so when a new thread's ring is mapped where an exited thread's
// was, the new thread's writes to the submission entries looked like a race with the old
// thread's. Closing a ring releases this counter before unmapping; creating one acquires it after
// mapping, which orders every use of a recycled mapping after every use of its previous life
// (true in fact: the kernel cannot hand out the address before the unmap).
std::atomic<uint64_t> closed_rings{0};

// InitRing, then the acquire described above.
int OpenRing(io_uring* ring) {
  const int err = InitRing(ring);
  closed_rings.load(std::memory_order_acquire);
  return err;
}

// The release described above, then io_uring_queue_exit.
void CloseRing(io_uring* ring) {
  closed_rings.fetch_add(1, std::memory_order_release);
  io_uring_queue_exit(ring);
}

// This thread's ring. Created on first use; closed when the thread exits.
//
// A ring is also reopened in a child of fork(): the child inherits the parent's ring (the fd and
// the submission and completion queues, which are shared memory), so submitting on it would race
// with the parent's submissions, and a single-issuer ring refuses them (EEXIST). The child closes
// its copies (its own mappings and fd; the parent's ring lives on) and opens its own.
class ThreadRing {
 public:
  ThreadRing() { Open(); }
  ~ThreadRing() { Close(); }
  ThreadRing(const ThreadRing&) = delete;
  ThreadRing& operator=(const ThreadRing&) = delete;

  // Reopens the ring when the calling process is not the one that opened it (see above).
  void ReopenIfForked() {
    if (pid_ == ::getpid()) return;
    Close();
    Open();
  }
  bool ok() const { return err_ == 0 && !broken_; }
  io_uring* ring() { return &ring_; }
  // Called when the ring refused a submission: it is not used again by this thread.
  void MarkBroken() { broken_ = true; }

 private:
  void Open() {
    err_ = OpenRing(&ring_);
    pid_ = ::getpid();
    broken_ = false;
  }
  void Close() {
    if (err_ == 0) CloseRing(&ring_);
    err_ = -EBADF;
  }

  io_uring ring_{};
  int err_ = -EBADF;
  pid_t pid_ = 0;
  bool broken_ = false;
};

ThreadRing& ThisThreadRing() {
  thread_local ThreadRing ring;
  ring.ReopenIfForked();
  return ring;
}

// One transfer in the queue or in flight: the rest of an op still to move.
struct Piece {
  size_t op = 0;        // index of the op in the batch (for messages)
  uint64_t offset = 0;  // file offset of buf[0]
  std::byte* buf = nullptr;
  size_t len = 0;
};

// What a batch is doing: a write or a read, on which file.
struct BatchTarget {
  int fd;
  const std::string& path;
  bool write;
  bool direct;
};

class Batch {
 public:
  Batch(ThreadRing* ring, const BatchTarget& target, size_t num_ops)
      : owner_(ring), ring_(ring->ring()), t_(target), slots_(kUringQueueDepth), ops_(num_ops) {
    for (unsigned i = 0; i < kUringQueueDepth; ++i) free_.push_back(kUringQueueDepth - 1 - i);
  }

  // Queues op number `op` (`len` bytes at `offset`), cut into pieces.
  void Add(size_t op, uint64_t offset, std::byte* buf, size_t len) {
    ops_[op] = {offset, len};
    for (size_t done = 0; done < len;) {
      const size_t n = std::min(len - done, kMaxPiece);
      queue_.push_back(Piece{op, offset + done, buf + done, n});
      done += n;
    }
  }

  Status Run() {
    while (true) {
      if (status_.ok()) Fill();
      if (in_flight_ == 0) break;
      const int r = io_uring_submit_and_wait(ring_, 1);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        // The ring refused the submission (not seen with a valid ring): retire the ring, drop
        // what the kernel never took, and wait for what it did, so no buffer stays in its use.
        Fail(ErrnoToStatus(-r, fmt::format("io_uring submit for {}", t_.path)));
        owner_->MarkBroken();
        in_flight_ -= std::min(in_flight_, io_uring_sq_ready(ring_));
        if (in_flight_ == 0 || !WaitOne()) break;
      }
      Reap();
    }
    return status_;
  }

 private:
  // Prepares queued pieces into free slots.
  void Fill() {
    while (!queue_.empty() && !free_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring_);
      if (sqe == nullptr) return;
      const unsigned slot = free_.back();
      free_.pop_back();
      slots_[slot] = queue_.front();
      queue_.pop_front();
      const Piece& p = slots_[slot];
      const unsigned len = static_cast<unsigned>(p.len);
      if (t_.write) {
        io_uring_prep_write(sqe, t_.fd, p.buf, len, p.offset);
      } else {
        io_uring_prep_read(sqe, t_.fd, p.buf, len, p.offset);
      }
      io_uring_sqe_set_data64(sqe, slot);
      ++in_flight_;
    }
  }

  void Reap() {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(ring_, &cqe) == 0 && cqe != nullptr) {
      const unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(ring_, cqe);
      Complete(slots_[slot], res);
      free_.push_back(slot);
      --in_flight_;
    }
  }

  void Complete(Piece p, int res) {
    const char* op = t_.write ? "write" : "read";
    if (res == -EINTR || res == -EAGAIN) {
      queue_.push_back(p);
      return;
    }
    if (res < 0) {
      Fail(ErrnoToStatus(-res, fmt::format("{} {} at offset {}", op, t_.path, p.offset)));
      return;
    }
    const size_t n = static_cast<size_t>(res);
    if (n == 0 && t_.write) {
      Fail(
          IOError(fmt::format("write {} at offset {}: io_uring wrote nothing", t_.path, p.offset)));
      return;
    }
    const bool eof = !t_.write && (n == 0 || (t_.direct && n % kDirectIOAlignment != 0));
    if (n < p.len && eof) {
      const auto [offset, size] = ops_[p.op];
      Fail(OutOfRangeError(
          fmt::format("read {} at offset {} ({} bytes): past end of file, which ends at byte {}",
                      t_.path, offset, size, p.offset + n)));
      return;
    }
    if (n < p.len) queue_.push_back(Piece{p.op, p.offset + n, p.buf + n, p.len - n});
  }

  void Fail(Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

  // Waits for one completion (retrying EINTR). False if the ring cannot even wait.
  bool WaitOne() {
    io_uring_cqe* cqe = nullptr;
    int r;
    do {
      r = io_uring_wait_cqe(ring_, &cqe);
    } while (r == -EINTR);
    return r == 0;
  }

  ThreadRing* const owner_;
  io_uring* const ring_;
  const BatchTarget t_;
  std::deque<Piece> queue_;   // pieces to submit, in op order (ascending offsets help the disk)
  std::vector<Piece> slots_;  // in-flight pieces, indexed by SQE user data
  std::vector<unsigned> free_;
  std::vector<std::pair<uint64_t, uint64_t>> ops_;  // (offset, size) of each op, for messages
  unsigned in_flight_ = 0;
  Status status_;
};

// Logs `message` at `level` the first time a given outcome is reached in this process.
void LogOnce(int outcome, spdlog::level::level_enum level, const std::string& message) {
  static std::once_flag flags[4];
  std::call_once(flags[outcome], [&] { spdlog::log(level, "{}", message); });
}

}  // namespace

const UringSupport& ProbeUring() {
  static const UringSupport support = [] {
    UringSupport s;
    io_uring ring{};
    const int err = OpenRing(&ring);
    if (err == 0) {
      CloseRing(&ring);
      s.available = true;
    } else {
      s.reason = fmt::format("io_uring_queue_init: {}", std::strerror(-err));
    }
    return s;
  }();
  return support;
}

Result<IoBackend> ParseIoBackend(std::string_view name) {
  if (name == "auto") return IoBackend::kAuto;
  if (name == "uring" || name == "io_uring") return IoBackend::kUring;
  if (name == "pwrite") return IoBackend::kPwrite;
  return InvalidArgumentError(
      fmt::format("SAVEPOINT_IO_BACKEND={:?}: expected auto, uring or pwrite", name));
}

IoBackend ResolveIoBackend(IoBackend requested, const char* env) {
  const char* source = "FileOptions::io_backend";
  if (requested == IoBackend::kAuto && env != nullptr) {
    Result<IoBackend> parsed = ParseIoBackend(env);
    if (parsed.ok()) {
      requested = *parsed;
      source = "SAVEPOINT_IO_BACKEND";
    } else {
      LogOnce(0, spdlog::level::warn,
              fmt::format("savepoint: {}; using auto", parsed.status().message()));
    }
  }
  if (requested == IoBackend::kPwrite) {
    LogOnce(1, spdlog::level::info, fmt::format("savepoint: I/O backend pwrite ({})", source));
    return IoBackend::kPwrite;
  }
  const UringSupport& uring = ProbeUring();
  if (uring.available) {
    LogOnce(2, spdlog::level::info, "savepoint: I/O backend io_uring");
    return IoBackend::kUring;
  }
  LogOnce(3, requested == IoBackend::kUring ? spdlog::level::warn : spdlog::level::info,
          fmt::format("savepoint: I/O backend pwrite (io_uring unavailable: {})", uring.reason));
  return IoBackend::kPwrite;
}

IoBackend ResolveIoBackend(IoBackend requested) {
  return ResolveIoBackend(requested, std::getenv("SAVEPOINT_IO_BACKEND"));
}

bool UringThreadAvailable() { return ThisThreadRing().ok(); }

Status UringWriteMany(int fd, const std::string& path, std::span<const WriteOp> ops) {
  ThreadRing& ring = ThisThreadRing();
  if (!ring.ok()) return UnimplementedError(fmt::format("write {}: no io_uring ring", path));
  Batch batch(&ring, BatchTarget{fd, path, true, false}, ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    // io_uring never writes through the pointer of a write request.
    std::byte* buf = const_cast<std::byte*>(ops[i].data.data());
    batch.Add(i, ops[i].offset, buf, ops[i].data.size());
  }
  return batch.Run();
}

Status UringReadMany(int fd, const std::string& path, bool direct, std::span<const ReadOp> ops) {
  ThreadRing& ring = ThisThreadRing();
  if (!ring.ok()) return UnimplementedError(fmt::format("read {}: no io_uring ring", path));
  Batch batch(&ring, BatchTarget{fd, path, false, direct}, ops.size());
  for (size_t i = 0; i < ops.size(); ++i)
    batch.Add(i, ops[i].offset, ops[i].dst.data(), ops[i].dst.size());
  return batch.Run();
}

}  // namespace savepoint
