// The deterministic history the sparse crash test replays (tests/sparse_crash_test.cc) and its
// child process writes (helpers/sparse_crash_saver.cc): table "emb" (slots "embedding" and
// "exp_avg", F32 [rows, 16]) after every step, and what kind of checkpoint each step is saved as.
//
// Step 0 inserts kInitialRows ids; every later step that is not a compaction updates, deletes and
// inserts a few ids, drawn from an RNG seeded by the step. Rows hold values derived from (id, the
// step that last wrote the row, slot, column), so a stale or misplaced row never compares equal.
// Header-only.
#ifndef SAVEPOINT_TESTS_HELPERS_SPARSE_CRASH_MODEL_H_
#define SAVEPOINT_TESTS_HELPERS_SPARSE_CRASH_MODEL_H_

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "savepoint/sparse.h"
#include "testutil/sparse_tables.h"

namespace savepoint::testing::sparse_crash {

inline constexpr int64_t kWidth = 16;
inline constexpr int64_t kInitialRows = 3000;
inline constexpr int kUpdates = 150, kDeletes = 30, kInserts = 50;
inline constexpr uint64_t kFullEvery = 16;

// id -> the step that last wrote its row.
using Ref = std::map<int64_t, uint64_t>;

// "delta": mostly delta saves, a compaction every 8 steps; "compact": every third step.
enum class Mode { kDelta, kCompact };
// A step is saved whole (kFull), as a delta on the previous step (kDelta), or as the compaction of
// the previous step's chain (kCompact: no changes in that step).
enum class Kind { kFull, kDelta, kCompact };

inline Kind KindOf(uint64_t step, Mode mode) {
  if (step % kFullEvery == 0) return Kind::kFull;
  if (step % (mode == Mode::kCompact ? 3 : 8) == 2) return Kind::kCompact;
  return Kind::kDelta;
}

// The newest step <= `step` that starts a chain (a full save or a compaction).
inline uint64_t RootOf(uint64_t step, Mode mode) {
  while (KindOf(step, mode) == Kind::kDelta) --step;
  return step;
}

inline std::string StepPath(const std::string& root, uint64_t step) {
  return fmt::format("{}/step-{:08}", root, step);
}

inline uint64_t Mix(uint64_t x) {  // splitmix64's finaliser: a bijection
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The n-th id ever inserted: distinct for distinct n, negative about half the time, in any slice.
inline int64_t IdOf(uint64_t n) { return static_cast<int64_t>(Mix(n)); }

// What step `step` changes.
struct Ops {
  std::vector<int64_t> touched;  // updated or inserted, sorted
  std::vector<int64_t> deleted;  // sorted
};

inline Ops OpsAt(uint64_t step, Mode mode, const Ref& before) {
  Ops ops;
  if (step == 0) {
    for (int64_t n = 0; n < kInitialRows; ++n) ops.touched.push_back(IdOf(n));
  } else if (KindOf(step, mode) != Kind::kCompact) {
    std::vector<int64_t> live;
    for (const auto& [id, version] : before) live.push_back(id);
    std::mt19937_64 rng(step);
    std::shuffle(live.begin(), live.end(), rng);
    const size_t updates = std::min<size_t>(kUpdates, live.size());
    const size_t deletes = std::min<size_t>(kDeletes, live.size() - updates);
    ops.touched.assign(live.begin(), live.begin() + updates);
    ops.deleted.assign(live.begin() + updates, live.begin() + updates + deletes);
    for (int n = 0; n < kInserts; ++n)
      ops.touched.push_back(IdOf(kInitialRows + step * kInserts + n));
  }
  std::sort(ops.touched.begin(), ops.touched.end());
  std::sort(ops.deleted.begin(), ops.deleted.end());
  return ops;
}

inline void Apply(const Ops& ops, uint64_t step, Ref* ref) {
  for (int64_t id : ops.touched) (*ref)[id] = step;
  for (int64_t id : ops.deleted) ref->erase(id);
}

// Element `k` of slot `slot` (0: embedding, 1: exp_avg) of the row of `id` written at `version`.
inline float ValueOf(int64_t id, uint64_t version, int slot, int64_t k) {
  const uint64_t h = Mix(static_cast<uint64_t>(id) ^ (version * 0x100000001b3ULL + slot));
  return static_cast<float>((h >> 40) + static_cast<uint64_t>(k)) / 64.0f;
}

// Table "emb" holding the rows of `ref` whose ids are `ids` (in that order), with `deleted`.
inline SparseTable TableOf(const Ref& ref, const std::vector<int64_t>& ids,
                           const std::vector<int64_t>& deleted = {}) {
  std::vector<TableSlot> slots;
  for (int slot = 0; slot < 2; ++slot) {
    slots.push_back({slot == 0 ? "embedding" : "exp_avg", DType::kF32, kWidth,
                     [&ref, slot](int64_t id, std::span<std::byte> row) {
                       float v[kWidth];
                       for (int64_t k = 0; k < kWidth; ++k) v[k] = ValueOf(id, ref.at(id), slot, k);
                       std::memcpy(row.data(), v, sizeof(v));
                     }});
  }
  return MakeTable(ids, slots, deleted);
}

inline std::vector<int64_t> IdsOf(const Ref& ref) {
  std::vector<int64_t> ids;
  for (const auto& [id, version] : ref) ids.push_back(id);
  return ids;
}

// The state after each step, replayed from step 0, or from the state it kept of a step
// that is a multiple of kFullEvery.
class Replayer {
 public:
  explicit Replayer(Mode mode) : mode_(mode) {}
  const Ref& At(uint64_t step) {
    if (!started_ || step < step_) {
      auto it = kept_.upper_bound(step);
      if (it == kept_.begin()) {
        ref_.clear();
        Apply(OpsAt(0, mode_, ref_), 0, &ref_);
        step_ = 0;
        kept_[0] = ref_;
      } else {
        --it;
        step_ = it->first;
        ref_ = it->second;
      }
      started_ = true;
    }
    while (step_ < step) {
      ++step_;
      Apply(OpsAt(step_, mode_, ref_), step_, &ref_);
      if (step_ % kFullEvery == 0) kept_[step_] = ref_;
    }
    return ref_;
  }

 private:
  Mode mode_;
  bool started_ = false;
  uint64_t step_ = 0;
  Ref ref_;
  std::map<uint64_t, Ref> kept_;
};

}  // namespace savepoint::testing::sparse_crash

#endif  // SAVEPOINT_TESTS_HELPERS_SPARSE_CRASH_MODEL_H_
