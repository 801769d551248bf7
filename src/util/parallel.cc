#include "util/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace savepoint {

Status ParallelFor(size_t n, int threads, const std::function<Status(size_t, int)>& task) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t first_bad = n;
  Status first_error;
  auto work = [&](int worker) {
    for (size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) {
      Status s = task(i, worker);
      if (s.ok()) continue;
      failed.store(true);
      std::lock_guard<std::mutex> lock(mu);
      if (i < first_bad) {
        first_bad = i;
        first_error = std::move(s);
      }
    }
  };
  int t = static_cast<int>(std::min<size_t>(std::max(threads, 1), std::max<size_t>(n, 1)));
  std::vector<std::thread> pool;
  for (int w = 1; w < t; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& th : pool) th.join();
  return first_error;
}

}  // namespace savepoint
