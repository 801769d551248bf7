// Progress (util/progress.h).
#include "util/progress.h"

#include <algorithm>
#include <chrono>

namespace savepoint {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::atomic<int64_t> Progress::interval_for_new_ns_{Progress::kIntervalNs};

Progress::Progress(const ProgressFn& fn, uint64_t total)
    : fn_(fn ? &fn : nullptr),
      total_(total),
      interval_ns_(interval_for_new_ns_.load(std::memory_order_relaxed)),
      next_ns_(NowNs() + interval_ns_) {}

void Progress::SetIntervalForTesting(int64_t interval_ns) {
  interval_for_new_ns_.store(interval_ns, std::memory_order_relaxed);
}

void Progress::AddSlow(uint64_t bytes) {
  done_.fetch_add(bytes, std::memory_order_relaxed);
  const int64_t now = NowNs();
  if (now < next_ns_.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || now < next_ns_.load(std::memory_order_relaxed)) return;
  next_ns_.store(now + interval_ns_, std::memory_order_relaxed);
  // Read under the lock: the counter only grows, so successive calls never go backwards.
  Report(std::min(done_.load(std::memory_order_relaxed), total_));
}

void Progress::Finish() {
  if (fn_ == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (called_ && reported_ == total_) return;
  Report(total_);
}

void Progress::Report(uint64_t done) {
  done = std::max(done, reported_);
  reported_ = done;
  called_ = true;
  (*fn_)(done, total_);
}

}  // namespace savepoint
