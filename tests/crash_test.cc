// Crash test: a child process saving (and overwriting and deleting) checkpoints in a loop is
// SIGKILLed at random moments. After every kill, gc must leave only committed checkpoints, each of
// which verifies and holds exactly the state that was saved under its name, and the newest loads.
//
// Synchronous saves, asynchronous ones (killed during snapshot or background persist), and
// asynchronous zstd-compressed ones (killed while chunks are compressed and written).
// Iterations: 50 by default; set SAVEPOINT_CRASH_ITERATIONS for a longer manual run.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "savepoint/mindspore.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

int Iterations() {
  const char* env = std::getenv("SAVEPOINT_CRASH_ITERATIONS");
  return env != nullptr ? std::atoi(env) : 50;
}

// `mode`: nullptr (synchronous saves), "async", "async-zstd" or "ckpt" (see crash_saver.cc).
pid_t Spawn(const std::string& root, uint64_t first_step, const char* mode) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string step = std::to_string(first_step);
    ::execl(CRASH_SAVER_PATH, CRASH_SAVER_PATH, root.c_str(), step.c_str(), mode, nullptr);
    ::_exit(127);
  }
  return pid;
}

// Whether any tensor of the checkpoint at `path` is stored (partly) compressed.
bool HasCompressedTensor(const std::string& path) {
  Result<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(path);
  if (!r.ok()) return false;
  for (const TensorInfo& t : (*r)->tensors()) {
    if (t.codec != "none" && t.stored_bytes < t.nbytes) return true;
  }
  return false;
}

// Checks everything under root; returns the highest step seen (0 if none). Counts committed
// checkpoints holding compressed tensors in *compressed.
uint64_t CheckRoot(const std::string& root, int* compressed) {
  Result<std::vector<std::string>> gc = GarbageCollect(root);
  EXPECT_TRUE(gc.ok()) << gc.status().ToString();
  Result<std::vector<CheckpointEntry>> list = ListCheckpoints(root);
  EXPECT_TRUE(list.ok()) << list.status().ToString();
  uint64_t newest = 0;
  for (const CheckpointEntry& e : *list) {
    EXPECT_TRUE(e.committed) << e.path << ": " << e.problem;
    if (!e.committed) continue;
    SP_EXPECT_OK(VerifyCheckpoint(e.path));
    Result<State> loaded = Load(e.path);
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    if (!loaded.ok()) continue;
    EXPECT_TRUE(e.step.has_value()) << e.path;
    if (!e.step.has_value()) continue;
    uint64_t step = static_cast<uint64_t>(*e.step);
    *compressed += HasCompressedTensor(e.path);
    EXPECT_TRUE(testing::StatesEqual(testing::CrashState(step), *loaded)) << e.path;
    if (e.name != "latest") {
      EXPECT_EQ(e.name, fmt::format("step-{:08}", step));
      newest = std::max(newest, step);
    }
  }
  return newest;
}

// The MindSpore .ckpt files under root (hidden temporaries of unfinished saves aside) all load,
// their CRC verified, with CrashState's tensors; returns the highest step seen (0 if none).
uint64_t CheckCkptRoot(const std::string& root) {
  uint64_t newest = 0;
  for (const auto& f : std::filesystem::directory_iterator(root)) {
    const std::string name = f.path().filename().string();
    if (name.starts_with(".")) continue;
    Result<State> loaded = LoadMindSporeCheckpoint(f.path().string());
    EXPECT_TRUE(loaded.ok()) << name << ": " << loaded.status().ToString();
    const TensorView* step_t = loaded.ok() ? loaded->FindTensor("step") : nullptr;
    if (step_t == nullptr) continue;
    int64_t step = 0;
    std::memcpy(&step, step_t->data(), sizeof(step));
    State want = testing::CkptCrashState(static_cast<uint64_t>(step));
    for (const auto& [tname, e] : want.entries()) {
      if (!e.is_tensor()) continue;
      const TensorView* got = loaded->FindTensor(tname);
      EXPECT_TRUE(got != nullptr && got->nbytes() == e.tensor().nbytes() &&
                  std::memcmp(got->data(), e.tensor().data(), e.tensor().nbytes()) == 0)
          << name << ": tensor " << tname;
    }
    if (name != "latest.ckpt") {
      EXPECT_EQ(name, fmt::format("step-{:08}.ckpt", step));
      newest = std::max(newest, static_cast<uint64_t>(step));
    }
  }
  return newest;
}

// Waits until the saver started at `step` has committed that step (its final directory exists:
// the commit is a rename), or exited, or 120 s passed. Returns the time it waited.
std::chrono::microseconds WaitFirstCommit(const std::string& root, uint64_t step, pid_t pid,
                                          const char* suffix) {
  auto start = std::chrono::steady_clock::now();
  std::string first = fmt::format("{}/step-{:08}{}", root, step, suffix);
  auto exited = [pid] {  // without reaping it: the caller's waitpid reports how it ended
    siginfo_t info{};
    return ::waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != 0;
  };
  while (!std::filesystem::exists(first) && !exited() &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

// The first kill waits for the saver's first commit (so that a slow build, e.g. under
// ThreadSanitizer, still commits something); later kills land at random moments up to twice that
// time (at least 120 ms) after the start.
void KillLoop(const char* mode, const char* name) {
  uint64_t seed = testing::TestSeed(name);
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  uint64_t next = 1, window_us = 120000;
  int with_checkpoints = 0, compressed = 0;
  const bool ckpt = mode != nullptr && std::string(mode) == "ckpt";
  for (int i = 0; i < Iterations(); ++i) {
    pid_t pid = Spawn(dir.path(), next, mode);
    ASSERT_GT(pid, 0);
    if (i == 0) {
      window_us = std::max<uint64_t>(
          window_us, 2 * WaitFirstCommit(dir.path(), next, pid, ckpt ? ".ckpt" : "").count());
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % window_us));
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "saver exited by itself with status " << status;
    SCOPED_TRACE(fmt::format("after kill {}", i));
    uint64_t newest = ckpt ? CheckCkptRoot(dir.path()) : CheckRoot(dir.path(), &compressed);
    if (::testing::Test::HasFatalFailure()) return;
    with_checkpoints += newest > 0;
    next = std::max(next, newest + 1);
  }
  EXPECT_GT(with_checkpoints, 0) << "the saver never committed anything before being killed";
  if (mode != nullptr && std::string(mode) == "async-zstd") {
    EXPECT_GT(compressed, 0) << "no committed checkpoint held a compressed tensor";
  }
}

TEST(Crash, SigkillDuringSaveLoop) { KillLoop(nullptr, "Crash.SigkillDuringSaveLoop"); }
TEST(Crash, SigkillDuringAsyncSaveLoop) { KillLoop("async", "Crash.SigkillDuringAsyncSaveLoop"); }
TEST(Crash, SigkillDuringMindSporeCkptSaveLoop) {
  KillLoop("ckpt", "Crash.SigkillDuringMindSporeCkptSaveLoop");
}
TEST(Crash, SigkillDuringCompressedAsyncSaveLoop) {
  KillLoop("async-zstd", "Crash.SigkillDuringCompressedAsyncSaveLoop");
}

}  // namespace
}  // namespace savepoint
