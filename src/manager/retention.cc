// Retention: the union of the keep rules of the policy (see retention.h).
#include "manager/retention.h"

#include <algorithm>
#include <numeric>

namespace savepoint::manager {
namespace {

void KeepLast(const Policy& p, std::vector<bool>& keep) {
  const size_t n = keep.size();
  const size_t last = static_cast<size_t>(std::min<int64_t>(p.keep_last_n, n));
  for (size_t i = n - last; i < n; ++i) keep[i] = true;
}

void KeepPerMinutes(const std::vector<CheckpointRecord>& rs, const Policy& p,
                    std::vector<bool>& keep) {
  if (p.keep_per_minutes <= 0) return;
  const int64_t window_ns = p.keep_per_minutes * 60 * int64_t{1'000'000'000};
  bool any = false;
  int64_t last_kept = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    if (!any || rs[i].created_ns - last_kept >= window_ns) {
      keep[i] = true;
      any = true;
      last_kept = rs[i].created_ns;
    }
  }
}

void KeepEveryN(const std::vector<CheckpointRecord>& rs, const Policy& p, std::vector<bool>& keep) {
  if (p.keep_every_n_steps <= 0) return;
  for (size_t i = 0; i < rs.size(); ++i) {
    if (rs[i].step % p.keep_every_n_steps == 0) keep[i] = true;
  }
}

void KeepBest(const std::vector<CheckpointRecord>& rs, const Policy& p, std::vector<bool>& keep) {
  if (p.keep_best_n <= 0) return;
  std::vector<size_t> ranked;
  for (size_t i = 0; i < rs.size(); ++i) {
    if (rs[i].metrics.count(p.best_metric) > 0) ranked.push_back(i);
  }
  auto metric = [&](size_t i) { return rs[i].metrics.at(p.best_metric); };
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
    return p.best_mode == MetricMode::kMin ? metric(a) < metric(b) : metric(a) > metric(b);
  });
  const size_t n = std::min<size_t>(ranked.size(), static_cast<size_t>(p.keep_best_n));
  for (size_t k = 0; k < n; ++k) keep[ranked[k]] = true;
}

}  // namespace

std::vector<std::string> SelectForDeletion(const std::vector<CheckpointRecord>& records,
                                           const Policy& policy) {
  if (policy.keep_all || records.empty()) return {};
  std::vector<bool> keep(records.size(), false);
  keep.back() = true;
  KeepLast(policy, keep);
  KeepPerMinutes(records, policy, keep);
  KeepEveryN(records, policy, keep);
  KeepBest(records, policy, keep);
  std::vector<std::string> out;
  for (size_t i = 0; i < records.size(); ++i) {
    if (!keep[i]) out.push_back(records[i].name);
  }
  return out;
}

}  // namespace savepoint::manager
