// ParallelFor: runs n independent tasks on up to `threads` threads, stopping at the first error.
#ifndef SAVEPOINT_UTIL_PARALLEL_H_
#define SAVEPOINT_UTIL_PARALLEL_H_

#include <cstddef>
#include <functional>

#include "savepoint/status.h"

namespace savepoint {

// Calls task(i, worker) for every i in [0, n), where worker in [0, threads) identifies the calling
// thread (for per-thread scratch buffers). Tasks are claimed in index order. After a task fails, no
// new task starts; the error of the lowest-numbered failing task among those run is returned.
// threads <= 1 runs inline on the caller's thread.
Status ParallelFor(size_t n, int threads, const std::function<Status(size_t i, int worker)>& task);

}  // namespace savepoint

#endif  // SAVEPOINT_UTIL_PARALLEL_H_
