// Progress: reports the progress of one long operation to a caller's ProgressFn
// (savepoint/checkpoint.h) from many worker threads, cheaply and in order.
#ifndef SAVEPOINT_UTIL_PROGRESS_H_
#define SAVEPOINT_UTIL_PROGRESS_H_

#include <atomic>
#include <cstdint>
#include <mutex>

#include "savepoint/checkpoint.h"

namespace savepoint {

// Counts the bytes done by worker threads (Add) and passes (done, total) on to `fn`, at most once
// per kProgressInterval (the first time one interval after construction, so that an operation
// shorter than that reports only its end), plus once with done == total at Finish. Calls of `fn`
// are serialized by a mutex, and `done` never decreases from one call to the next (it is also
// capped at `total`). With an empty `fn`, every method returns at once.
//
// Thread safety: Add may be called from any number of threads at once; Finish after the last Add.
class Progress {
 public:
  // Least time between two calls of `fn` from Add: 100 ms (at most ~10 calls a second).
  static constexpr int64_t kIntervalNs = 100'000'000;

  // `fn` must outlive this object.
  Progress(const ProgressFn& fn, uint64_t total);

  // Tests: the interval of Progress objects constructed from now on (kIntervalNs by default; 0
  // reports from every Add that finds no other call running).
  static void SetIntervalForTesting(int64_t interval_ns);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Records `bytes` more done; calls `fn` when the interval has passed and no other call runs.
  void Add(uint64_t bytes) {
    if (fn_ == nullptr) return;
    AddSlow(bytes);
  }
  // Calls `fn(total, total)` unless the last call already said so. Call once the work succeeded.
  void Finish();

  bool enabled() const { return fn_ != nullptr; }
  uint64_t total() const { return total_; }

 private:
  void AddSlow(uint64_t bytes);
  void Report(uint64_t done);  // with mu_ held

  static std::atomic<int64_t> interval_for_new_ns_;

  const ProgressFn* fn_;  // null when the caller gave no function
  const uint64_t total_;
  const int64_t interval_ns_;
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> next_ns_;  // steady-clock time before which Add does not report
  std::mutex mu_;                 // serializes the calls of *fn_
  uint64_t reported_ = 0;         // guarded by mu_: `done` of the last call
  bool called_ = false;           // guarded by mu_: whether fn_ was called at all
};

}  // namespace savepoint

#endif  // SAVEPOINT_UTIL_PROGRESS_H_
