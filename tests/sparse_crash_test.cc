// Crash test of sparse tables: a child process (helpers/sparse_crash_saver.cc) saves a table's
// history as full saves, delta saves on the previous step and compactions of the delta chain, and
// is SIGKILLed at random moments, then restarted after the newest committed step, again and again.
// After every kill gc must leave only committed checkpoints, and every one of them, the newest
// above all, must verify and load (its whole delta chain applied) exactly as the table was after
// its step, replayed in-process (helpers/sparse_crash_model.h). The saver never deletes a base of
// a chain it keeps, so no load may fail.
//
// SigkillDuringDeltaSaveLoop kills at random moments (mostly delta saves, a compaction every 8
// steps); SigkillDuringCompactionLoop kills at a random moment of a compaction (CompactSparse:
// load of the chain, then the atomic save of the full checkpoint).
// Kills: 20 per test by default; SAVEPOINT_CRASH_ITERATIONS overrides (at least 1).
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstring>
#include <optional>
#include <thread>

#include "helpers/sparse_crash_model.h"
#include "testutil/testutil.h"

namespace savepoint::testing::sparse_crash {
namespace {

using Clock = std::chrono::steady_clock;

int Iterations() {
  const char* env = std::getenv("SAVEPOINT_CRASH_ITERATIONS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 20;
}

// A running saver and the read end of its notification pipe.
struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string pending;  // bytes read past the last line returned
};

Child Spawn(const std::string& root, uint64_t first_step, const char* mode) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string step = std::to_string(first_step), fd = std::to_string(fds[1]);
    ::execl(SPARSE_CRASH_SAVER_PATH, SPARSE_CRASH_SAVER_PATH, root.c_str(), step.c_str(), mode,
            fd.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(fds[1]);
  return {pid, fds[0], {}};
}

// The step of the next notification "<what> <step>" of `c`, skipping others; nullopt when the
// saver exited (end of the pipe) or 120 s passed.
std::optional<uint64_t> WaitFor(Child& c, std::string_view what) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  for (;;) {
    for (size_t nl; (nl = c.pending.find('\n')) != std::string::npos;) {
      const std::string line = c.pending.substr(0, nl);
      c.pending.erase(0, nl + 1);
      if (line.starts_with(std::string(what) + " ")) {
        return std::strtoull(line.c_str() + what.size() + 1, nullptr, 10);
      }
    }
    pollfd p{c.fd, POLLIN, 0};
    if (Clock::now() > deadline) return std::nullopt;
    const int ready = ::poll(&p, 1, 1000);
    if (ready < 0) return std::nullopt;
    if (ready == 0) continue;
    char buf[256];
    const ssize_t n = ::read(c.fd, buf, sizeof(buf));
    if (n <= 0) return std::nullopt;
    c.pending.append(buf, static_cast<size_t>(n));
  }
}

// SIGKILLs the saver and reaps it; whether it died of the signal (not by itself).
bool Kill(Child& c) {
  ::kill(c.pid, SIGKILL);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  ::close(c.fd);
  return WIFSIGNALED(status);
}

// Whether loaded table `t` holds exactly the rows of `want` (ids, both slots, bit for bit).
::testing::AssertionResult Matches(const SparseTable& t, const Ref& want) {
  if (t.num_rows() != static_cast<int64_t>(want.size())) {
    return ::testing::AssertionFailure() << t.num_rows() << " rows, want " << want.size();
  }
  for (int slot = 0; slot < 2; ++slot) {
    const TensorView* v = t.FindSlot(slot == 0 ? "embedding" : "exp_avg");
    if (v == nullptr || v->dtype() != DType::kF32 || v->shape() != Shape{t.num_rows(), kWidth}) {
      return ::testing::AssertionFailure() << "slot " << slot << " missing or misshapen";
    }
    const float* rows = reinterpret_cast<const float*>(v->data());
    for (int64_t i = 0; i < t.num_rows(); ++i) {
      auto it = want.find(t.ids()[i]);
      if (it == want.end()) return ::testing::AssertionFailure() << "stray id " << t.ids()[i];
      for (int64_t k = 0; k < kWidth; ++k) {
        const float w = ValueOf(it->first, it->second, slot, k);
        if (std::memcmp(&rows[i * kWidth + k], &w, sizeof(w)) != 0) {
          return ::testing::AssertionFailure()
                 << "id " << it->first << " slot " << slot << " column " << k << ": "
                 << rows[i * kWidth + k] << ", want " << w << " (written at step " << it->second
                 << ")";
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Checks the committed checkpoint of `step` at `path`: it verifies, its chain reaches back to the
// root of its step, and it loads as the table after `step`.
void CheckStep(const std::string& path, uint64_t step, Mode mode, Replayer& replay) {
  SCOPED_TRACE(path);
  SP_EXPECT_OK(VerifyCheckpoint(path));
  Result<std::vector<SparseChainLink>> chain = SparseChain(path);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  EXPECT_EQ(chain->size(), step - RootOf(step, mode) + 1);
  Result<State> loaded = LoadSparse(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const SparseTable* t = loaded->FindTable("emb");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(Matches(*t, replay.At(step)));
}

// Collects debris, then checks every checkpoint under `root`; returns the newest step committed.
std::optional<uint64_t> CheckRoot(const std::string& root, Mode mode, Replayer& replay) {
  Result<std::vector<std::string>> gc = GarbageCollect(root);
  EXPECT_TRUE(gc.ok()) << gc.status().ToString();
  Result<std::vector<CheckpointEntry>> list = ListCheckpoints(root);
  EXPECT_TRUE(list.ok()) << list.status().ToString();
  if (!list.ok()) return std::nullopt;
  std::map<uint64_t, std::string> steps;
  for (const CheckpointEntry& e : *list) {
    EXPECT_TRUE(e.committed) << e.path << ": " << e.problem;
    uint64_t step = 0;
    if (e.committed && std::sscanf(e.name.c_str(), "step-%" SCNu64, &step) == 1)
      steps[step] = e.path;
  }
  for (const auto& [step, path] : steps) CheckStep(path, step, mode, replay);
  if (steps.empty()) return std::nullopt;
  return steps.rbegin()->first;
}

std::chrono::microseconds Since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
}

// Random kills: the first after the saver's first commit (so that a slow build, e.g. under
// ThreadSanitizer, still commits something), later ones up to twice that time after the start
// (at least 120 ms). Each restart continues after the newest committed step.
TEST(SparseCrash, SigkillDuringDeltaSaveLoop) {
  std::mt19937_64 rng(TestSeed("SparseCrash.SigkillDuringDeltaSaveLoop"));
  TempDir dir;
  Replayer replay(Mode::kDelta);
  uint64_t next = 0, window_us = 120000, max_step = 0;
  int with_checkpoints = 0;
  for (int i = 0; i < Iterations(); ++i) {
    SCOPED_TRACE(fmt::format("kill {}, saver started at step {}", i, next));
    Child c = Spawn(dir.path(), next, "delta");
    ASSERT_GT(c.pid, 0);
    const Clock::time_point start = Clock::now();
    if (i == 0) {
      EXPECT_TRUE(WaitFor(c, "commit").has_value()) << "the saver committed nothing";
      window_us = std::max<uint64_t>(window_us, 2 * Since(start).count());
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % window_us));
    }
    ASSERT_TRUE(Kill(c)) << "the saver exited by itself";
    std::optional<uint64_t> newest = CheckRoot(dir.path(), Mode::kDelta, replay);
    if (::testing::Test::HasFatalFailure()) return;
    with_checkpoints += newest.has_value();
    if (newest.has_value()) next = *newest + 1;
    max_step = std::max(max_step, next);
  }
  EXPECT_GT(with_checkpoints, 0) << "the saver never committed anything before being killed";
  std::cout << "[sparse crash] " << Iterations() << " kills, " << max_step << " steps committed"
            << std::endl;
}

// Kills at a random moment of a compaction: each restarted saver is killed between 0 and the
// duration of the first compaction (timed in the first round) after it announces one.
TEST(SparseCrash, SigkillDuringCompactionLoop) {
  std::mt19937_64 rng(TestSeed("SparseCrash.SigkillDuringCompactionLoop"));
  TempDir dir;
  Replayer replay(Mode::kCompact);
  uint64_t next = 0, window_us = 1000;
  int interrupted = 0;
  for (int i = 0; i < Iterations(); ++i) {
    SCOPED_TRACE(fmt::format("kill {}, saver started at step {}", i, next));
    Child c = Spawn(dir.path(), next, "compact");
    ASSERT_GT(c.pid, 0);
    const std::optional<uint64_t> compacting = WaitFor(c, "compact");
    ASSERT_TRUE(compacting.has_value()) << "the saver exited before compacting";
    ASSERT_EQ(KindOf(*compacting, Mode::kCompact), Kind::kCompact);
    const Clock::time_point start = Clock::now();
    if (i == 0) {
      EXPECT_EQ(WaitFor(c, "commit"), compacting) << "the compaction did not commit";
      window_us = std::max<uint64_t>(window_us, Since(start).count());
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % window_us));
    }
    ASSERT_TRUE(Kill(c)) << "the saver exited by itself";
    std::optional<uint64_t> newest = CheckRoot(dir.path(), Mode::kCompact, replay);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(newest.has_value());
    ASSERT_GE(*newest + 1, *compacting) << "the compacted chain is gone";
    interrupted += *newest < *compacting;
    next = *newest + 1;
  }
  std::cout << "[sparse crash] " << interrupted << " of " << Iterations()
            << " kills interrupted a compaction" << std::endl;
  if (Iterations() >= 20) {  // each lands in one with probability > 1/2
    EXPECT_GT(interrupted, 0) << "no kill landed in a compaction";
  }
}

}  // namespace
}  // namespace savepoint::testing::sparse_crash
