// Crash test for CheckpointManager: a child training process (helpers/manager_trainer.cc, async
// saves every 3 steps) is SIGKILLed at random moments, then restarted in the same directory,
// again and again. After every kill the directory must open (the lock died with the child), its
// latest checkpoint must restore into exactly the state an uninterrupted run has at that step, and
// the next child must report resuming from that very step. Finally a child runs to the end and
// its final state must equal the uninterrupted run's.
//
// Kills: 25 by default; SAVEPOINT_CRASH_ITERATIONS overrides (at least 1).
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "helpers/toy_trainer.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

constexpr uint64_t kTrainSeed = 7;

int Iterations() {
  const char* env = std::getenv("SAVEPOINT_CRASH_ITERATIONS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 25;
}

pid_t Spawn(const std::string& dir, int64_t total) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string t = std::to_string(total), seed = std::to_string(kTrainSeed);
    ::execl(MANAGER_TRAINER_PATH, MANAGER_TRAINER_PATH, dir.c_str(), t.c_str(), seed.c_str(),
            nullptr);
    ::_exit(127);
  }
  return pid;
}

// The uninterrupted run's state after `step` steps.
testing::ToyTrainer Reference(int64_t step) {
  testing::ToyTrainer t(kTrainSeed);
  while (t.step() < step) t.Step();
  return t;
}

// The lines of the children's log (one per child that got as far as restoring).
std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Opens the directory, restores the latest checkpoint and checks it; returns its step (0: none).
int64_t CheckLatest(const std::string& dir) {
  ManagerOptions o;
  o.naming.directory = dir;
  auto m = CheckpointManager::Open(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return -1;
  std::optional<int64_t> latest = (*m)->LatestStep();
  if (!latest) return 0;
  testing::ToyTrainer restored(12345);  // different seed: everything must come from the checkpoint
  SP_EXPECT_OK(restored.Register(**m));
  Result<CheckpointRecord> rec = (*m)->RestoreRegistered();
  EXPECT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(restored.step(), *latest);
  EXPECT_TRUE(restored == Reference(*latest)) << "state of " << (rec.ok() ? rec->path : "?");
  for (const CheckpointRecord& r : (*m)->All()) SP_EXPECT_OK(VerifyCheckpoint(r.path));
  return *latest;
}

TEST(ManagerCrash, ResumeAfterSigkillAtRandomPoints) {
  std::mt19937_64 rng(testing::TestSeed("ManagerCrash.ResumeAfterSigkillAtRandomPoints"));
  testing::TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  const std::string log = tmp.Sub("trainer.log");
  int64_t latest = 0;
  int resumed = 0;
  for (int i = 0; i < Iterations(); ++i) {
    SCOPED_TRACE(fmt::format("kill {}", i));
    const size_t logged = Lines(log).size();
    pid_t pid = Spawn(dir, 1'000'000);
    ASSERT_GT(pid, 0);
    // Kill at a random moment after the child has restored (up to 5 s for a slow start, as
    // under sanitizers), so every kill interrupts training and saving.
    for (int waited = 0; Lines(log).size() == logged && waited < 5000; ++waited) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "trainer exited by itself: " << status;
    std::vector<std::string> lines = Lines(log);
    if (lines.size() > logged) {  // the child got as far as restoring before the kill
      EXPECT_EQ(lines.back(), latest == 0 ? "fresh" : fmt::format("resumed {}", latest));
      resumed += latest > 0;
    }
    int64_t now = CheckLatest(dir);
    ASSERT_FALSE(::testing::Test::HasFailure());
    EXPECT_GE(now, latest) << "the latest checkpoint went back in time";
    latest = now;
  }
  // Run to completion from wherever the last kill left it.
  const int64_t total = latest + 20;
  pid_t pid = Spawn(dir, total);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(Lines(log).back(), latest == 0 ? "fresh" : fmt::format("resumed {}", latest));
  EXPECT_EQ(CheckLatest(dir), total);
  fmt::print("{} kills, {} resumed runs, final step {}\n", Iterations(), resumed, total);
}

}  // namespace
}  // namespace savepoint

namespace savepoint {
namespace {

// Runs helpers/job_trainer.cc to the end or to its own SIGKILL; returns the wait status.
int RunJob(const std::string& dir, int64_t epochs, int64_t kill_at, const char* mode) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string e = std::to_string(epochs), k = std::to_string(kill_at);
    ::execl(JOB_TRAINER_PATH, JOB_TRAINER_PATH, dir.c_str(), e.c_str(), k.c_str(), mode, nullptr);
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// A JobRunner job killed at the start of epoch 3 and run again: the second run resumes from epoch
// 2 (also with a MetadataHandler that only wants Report statistics), checkpoints every later
// epoch in the same series of names ("ckpt-E_0", no "ckpt_1-..."), and ends in the state of an
// uninterrupted run. Regression: after a resume every epoch save asked for the restored step and
// was silently refused; a Report-only handler turned resuming off.
TEST(JobRunnerCrash, KilledJobResumesAndKeepsCheckpointing) {
  for (const char* mode : {"plain", "report"}) {
    SCOPED_TRACE(mode);
    testing::TempDir tmp;
    const std::string dir = JoinPath(tmp.path(), "ckpt");
    int st = RunJob(dir, 5, 3, mode);
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "status " << st;
    st = RunJob(dir, 5, 0, mode);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
    EXPECT_EQ(Lines(JoinPath(tmp.path(), "job.log")),
              (std::vector<std::string>{"fresh", "resumed 2", "done 5 failed=0"}));
    ManagerOptions o;
    o.naming.directory = dir;
    auto m = CheckpointManager::Open(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    std::vector<std::string> names;
    for (const CheckpointRecord& r : (*m)->All()) {
      names.push_back(r.name);
      EXPECT_TRUE(r.epoch_end) << r.name;
    }
    EXPECT_EQ(names, (std::vector<std::string>{"ckpt-0_0", "ckpt-1_0", "ckpt-2_0", "ckpt-3_0",
                                               "ckpt-4_0", "ckpt-5_0"}));
    testing::ToyTrainer restored(999);
    SP_ASSERT_OK(restored.Register(**m));
    ASSERT_TRUE((*m)->RestoreRegistered().ok());
    EXPECT_TRUE(restored == Reference(15));  // 5 epochs of 3 steps, as without the kill
  }
}

}  // namespace
}  // namespace savepoint
