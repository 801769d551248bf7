// Batched positional I/O through io_uring (liburing), for the POSIX file system's WriteAtMany /
// ReadAtMany, and the choice between it and plain pwrite/pread (FileOptions::io_backend,
// SAVEPOINT_IO_BACKEND).
//
// Each thread that submits a batch gets its own ring (thread_local, created on first use with
// kUringQueueDepth entries, closed when the thread exits), so no locking is needed and rings are
// never shared. A batch is cut into transfers of at most 1 GiB; up to kUringQueueDepth of them are
// in flight at once; short transfers are resubmitted for the rest, -EINTR / -EAGAIN completions
// are retried, and the first error is returned (as ErrnoToStatus would map the errno, naming the
// file and offset) after every transfer still in flight has completed, so no buffer is referenced
// by the kernel once a call returns.
//
// Detection: io_uring_queue_init can fail (ENOSYS on old kernels, EPERM under seccomp or with
// kernel.io_uring_disabled, ENOMEM with a small RLIMIT_MEMLOCK on kernels before 5.12). The first
// resolution of kAuto probes once per process and logs at info level which backend is used.
//
// Thread safety: everything here is thread-safe; the ring of a thread is used only by that thread.
#ifndef SAVEPOINT_IO_URING_H_
#define SAVEPOINT_IO_URING_H_

#include <span>
#include <string>
#include <string_view>

#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

// Entries of each thread's submission queue (transfers in flight per batch).
inline constexpr unsigned kUringQueueDepth = 32;

// Whether io_uring can be used in this process; probed once (creating and closing a small ring).
// When not, `reason` says why (e.g. "io_uring_queue_init: Operation not permitted").
struct UringSupport {
  bool available = false;
  std::string reason;
};
const UringSupport& ProbeUring();

// Parses a SAVEPOINT_IO_BACKEND value: "auto", "uring" (also "io_uring") or "pwrite".
Result<IoBackend> ParseIoBackend(std::string_view name);

// The backend a file opened with `requested` uses: an explicit kUring / kPwrite wins; kAuto defers
// to `env` (the value of SAVEPOINT_IO_BACKEND, nullptr when unset; an unknown value is ignored
// with a warning); auto means io_uring if ProbeUring() says it works. kUring falls back to
// kPwrite when io_uring is unavailable. Never returns kAuto. Logs the outcome once per process
// (info level; a forced io_uring that is unavailable, or a bad env value, at warn level).
IoBackend ResolveIoBackend(IoBackend requested, const char* env);
// ResolveIoBackend(requested, getenv("SAVEPOINT_IO_BACKEND")).
IoBackend ResolveIoBackend(IoBackend requested);

// Runs a batch on the calling thread's ring. Preconditions: the ops were validated (direct-mode
// alignment) by the caller; `fd` stays open for the call. `direct` tells a read that a short,
// unaligned transfer means end of file. Returns Unimplemented only when this thread's ring could
// not be created (the caller then falls back to pwrite/pread); see UringThreadAvailable.
Status UringWriteMany(int fd, const std::string& path, std::span<const WriteOp> ops);
Status UringReadMany(int fd, const std::string& path, bool direct, std::span<const ReadOp> ops);
// Whether the calling thread has (or can create) its ring.
bool UringThreadAvailable();

// InvalidArgument naming the first op that breaks the direct I/O alignment (offset, size and
// buffer address multiples of kDirectIOAlignment), else OK. Shared by every WriteAtMany /
// ReadAtMany implementation (src/io/filesystem.cc).
Status CheckWriteBatchAlignment(const std::string& path, std::span<const WriteOp> ops);
Status CheckReadBatchAlignment(const std::string& path, std::span<const ReadOp> ops);

}  // namespace savepoint

#endif  // SAVEPOINT_IO_URING_H_
