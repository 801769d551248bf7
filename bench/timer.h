// The benchmarks' one stopwatch: wall time and this process's CPU time (user, system) since
// construction or Restart. Header-only; not thread-safe (one thread reads one Timer).
#ifndef SAVEPOINT_BENCH_TIMER_H_
#define SAVEPOINT_BENCH_TIMER_H_

#include <sys/resource.h>

#include <chrono>
#include <utility>

namespace savepoint::bench {

class Timer {
 public:
  Timer() { Restart(); }
  void Restart() {
    wall_ = std::chrono::steady_clock::now();
    cpu_ = Cpu();
  }
  // Wall seconds since the start.
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_).count();
  }
  // CPU seconds of the whole process (every thread) since the start: {user, system}.
  std::pair<double, double> cpu_seconds() const {
    const std::pair<double, double> now = Cpu();
    return {now.first - cpu_.first, now.second - cpu_.second};
  }

 private:
  static std::pair<double, double> Cpu() {
    struct rusage ru {};
    ::getrusage(RUSAGE_SELF, &ru);
    auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6; };
    return {sec(ru.ru_utime), sec(ru.ru_stime)};
  }
  std::chrono::steady_clock::time_point wall_;
  std::pair<double, double> cpu_;
};

// Wall seconds of one call of fn().
template <typename Fn>
double Seconds(Fn&& fn) {
  Timer t;
  fn();
  return t.seconds();
}

}  // namespace savepoint::bench

#endif  // SAVEPOINT_BENCH_TIMER_H_
