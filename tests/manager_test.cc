// CheckpointManager behaviour: the direct API (save / restore / latest / all), intervals, async
// saves, reopening a directory (prefix conflict rule), the lock, append_info, callables, the
// RecIS-style Step(), exception and signal saves.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "helpers/toy_trainer.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::ToyTrainer;

ManagerOptions MemOptions(FileSystem* fs, std::string dir = "/ckpt") {
  ManagerOptions o;
  o.naming.directory = std::move(dir);
  o.io.fs = fs;
  return o;
}

std::unique_ptr<CheckpointManager> OpenOrDie(const ManagerOptions& o) {
  auto m = CheckpointManager::Open(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

SaveArgs Force() {
  SaveArgs a;
  a.force = true;
  return a;
}

SaveArgs InEpoch(int64_t epoch) {
  SaveArgs a;
  a.epoch = epoch;
  return a;
}

State StateAt(int64_t step) { return testing::RandomState(step, 3, 64 << 10); }

ToyTrainer TrainedTo(int64_t step) {
  ToyTrainer t(1);
  while (t.step() < step) t.Step();
  return t;
}

TEST(Manager, SaveRestoreLatestAll) {
  MemFileSystem fs;
  ManagerOptions o = MemOptions(&fs);
  o.retention.keep_last_n = 3;
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->LatestStep().has_value());
  EXPECT_THAT(m->Restore(), StatusIs(StatusCode::kNotFound));
  for (int64_t step = 1; step <= 5; ++step) {
    Result<bool> saved = m->Save(step, StateAt(step));
    ASSERT_TRUE(saved.ok() && *saved) << saved.status().ToString();
  }
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(m->LatestStep(), 5);
  EXPECT_EQ(m->Latest()->name, "ckpt-1_5");
  std::vector<int64_t> deleted;  // the deleted checkpoints' statistics name their steps
  for (const CheckpointStats& st : m->stats()) {
    if (st.action == "checkpoint_delete") deleted.push_back(st.step);
  }
  EXPECT_EQ(deleted, (std::vector<int64_t>{1, 2}));
  Result<State> four = m->Restore(Which::Step(4));
  ASSERT_TRUE(four.ok()) << four.status().ToString();
  EXPECT_TRUE(four->Contains(StateAt(4).entries().begin()->first));
  Result<State> latest = m->Restore();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->metadata()["step"], 5);
  EXPECT_TRUE(m->Restore(Which::Name("ckpt-1_3")).ok());
  Status gone = m->Restore(Which::Step(1)).status();
  EXPECT_THAT(gone, StatusIs(StatusCode::kNotFound, "at step 1"));
  EXPECT_FALSE(fs.Exists("/ckpt/ckpt-1_1"));  // deleted by retention
  SP_EXPECT_OK(m->Close());
  EXPECT_THAT(m->Save(6, StateAt(6)), StatusIs(StatusCode::kFailedPrecondition));
}

TEST(Manager, StepIntervalForceAndNeverTwice) {
  MemFileSystem fs;
  ManagerOptions o = MemOptions(&fs);
  o.save_policy.interval_steps = 10;
  o.save_policy.steps_per_epoch = 8;
  auto m = OpenOrDie(o);
  State s = StateAt(1);
  EXPECT_FALSE(*m->Save(5, s));
  EXPECT_TRUE(m->ShouldSave(10));
  EXPECT_TRUE(*m->Save(10, s));
  EXPECT_FALSE(*m->Save(10, s, Force()));  // never one step twice
  EXPECT_FALSE(*m->Save(15, s));
  EXPECT_TRUE(*m->Save(15, s, Force()));
  EXPECT_FALSE(*m->Save(24, s));  // 15 + 10 > 24
  EXPECT_TRUE(*m->Save(25, s));
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{10, 15, 25}));
  EXPECT_EQ(m->Latest()->name, "ckpt-4_1");  // step 25 = epoch 4, step 1 of 8
}

TEST(Manager, SecondsInterval) {
  MemFileSystem fs;
  ManagerOptions o = MemOptions(&fs);
  o.save_policy.interval_steps = 0;
  o.save_policy.interval_seconds = 1;
  auto m = OpenOrDie(o);
  EXPECT_FALSE(*m->Save(1, StateAt(1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(*m->Save(2, StateAt(2)));
  EXPECT_FALSE(*m->Save(3, StateAt(3)));
}

TEST(Manager, AsyncSavesAreIndexedWhenCommitted) {
  testing::TempDir dir;
  ManagerOptions o;
  o.naming.directory = dir.Sub("ckpt");
  o.async_save.enabled = true;
  o.retention.keep_last_n = 2;
  o.async_save.checkpointer.staging_bytes = 1 << 20;
  o.async_save.checkpointer.slab_bytes = 64 << 10;
  auto m = OpenOrDie(o);
  for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(*m->Save(step, StateAt(step)));
  SP_ASSERT_OK(m->Wait());
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{3, 4}));
  Result<State> four = m->Restore();
  ASSERT_TRUE(four.ok()) << four.status().ToString();
  State expected = StateAt(4);
  for (const auto& [name, e] : expected.entries()) EXPECT_TRUE(four->Contains(name)) << name;
  int saves = 0;
  for (const CheckpointStats& s : m->stats()) saves += s.action == "checkpoint_save";
  EXPECT_EQ(saves, 4);
}

TEST(Manager, ReopenPicksUpAndUsesANewPrefix) {
  MemFileSystem fs;
  {
    auto m = OpenOrDie(MemOptions(&fs));
    for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(*m->Save(step, StateAt(step)));
  }
  // Debris of a crash (a writer pid above pid_max: no process).
  const std::string debris = "/ckpt/.ckpt-1_9.savepoint-tmp.999999999.0000000000000000";
  ASSERT_TRUE(fs.CreateDir(debris).ok());
  auto m = OpenOrDie(MemOptions(&fs));
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(m->prefix(), "ckpt_1");
  ASSERT_TRUE(*m->Save(4, StateAt(4), Force()));
  EXPECT_EQ(m->Latest()->name, "ckpt_1-1_4");
  EXPECT_FALSE(fs.Exists(debris));  // garbage-collected on open
}

// A run that resumes from a checkpoint of its directory continues that checkpoint's series of
// names (SeriesRule::kContinue, the default), through every way of resuming; a run that saves
// without resuming starts a new series; kNew always starts one (MindSpore's rule).
TEST(Manager, ResumedRunContinuesItsSeries) {
  MemFileSystem fs;
  {
    auto m = OpenOrDie(MemOptions(&fs));
    for (int64_t step = 1; step <= 2; ++step) ASSERT_TRUE(*m->Save(step, StateAt(step)));
  }
  for (int how = 0; how < 3; ++how) {  // Restore, ResumeFrom, RestoreRegistered
    auto m = OpenOrDie(MemOptions(&fs));
    EXPECT_EQ(m->prefix(), "ckpt_1");  // would be a new series until it resumes
    ToyTrainer t(1);
    if (how == 0) {
      ASSERT_TRUE(m->Restore().ok());
    } else if (how == 1) {
      EXPECT_EQ(m->ResumeFrom()->step, 3);
    } else {
      SP_ASSERT_OK(t.Register(*m));
      ASSERT_TRUE(*m->SaveRegistered(10, Force()));  // a first save fixes the series ...
      EXPECT_EQ(m->Latest()->name, "ckpt_1-1_10");
      ASSERT_TRUE(m->RestoreRegistered(Which::Step(10)).ok());
      EXPECT_EQ(m->prefix(), "ckpt_1");  // ... a later resume does not move it
      continue;
    }
    EXPECT_EQ(m->prefix(), "ckpt");
    const int64_t next = 3 + how;
    ASSERT_TRUE(*m->Save(next, StateAt(next), Force()));
    EXPECT_EQ(m->Latest()->name, fmt::format("ckpt-1_{}", next));
  }
  ManagerOptions o = MemOptions(&fs);
  o.naming.series = SeriesRule::kNew;
  auto m = OpenOrDie(o);
  ASSERT_TRUE(m->ResumeFrom(Which::Name("ckpt-1_4")).ok());
  EXPECT_EQ(m->global_step(), 4);
  EXPECT_EQ(m->prefix(), "ckpt_2");
  EXPECT_THAT(m->ResumeFrom(Which::Step(99)), StatusIs(StatusCode::kNotFound));
}

TEST(Manager, IndexIsRebuiltWhenMissingOrStale) {
  MemFileSystem fs;
  {
    auto m = OpenOrDie(MemOptions(&fs));
    for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(*m->Save(step, StateAt(step)));
  }
  // A checkpoint committed after the last index update (crash before the update) ...
  State extra = StateAt(9);
  extra.metadata()["savepoint.manager"] = {{"step", 9}, {"epoch", 1}, {"step_in_epoch", 9}};
  SP_ASSERT_OK(Save(extra, "/ckpt/ckpt-1_9", {}, {.fs = &fs}));
  // ... and one deleted behind the index's back.
  SP_ASSERT_OK(DeleteCheckpoint("/ckpt/ckpt-1_2", &fs));
  {
    auto m = OpenOrDie(MemOptions(&fs));
    EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{1, 3, 9}));
  }
  // No index at all: rebuilt from the checkpoints.
  for (const FileInfo& f : *fs.ListDir("/ckpt")) {
    if (f.name.starts_with("savepoint-index-")) SP_ASSERT_OK(fs.RemoveFile("/ckpt/" + f.name));
  }
  auto m = OpenOrDie(MemOptions(&fs));
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{1, 3, 9}));
}

TEST(Manager, SecondManagerOnTheSameDirectoryIsRefused) {
  testing::TempDir dir;
  ManagerOptions o;
  o.naming.directory = dir.Sub("ckpt");
  auto first = OpenOrDie(o);
  Result<std::unique_ptr<CheckpointManager>> second = CheckpointManager::Open(o);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second, StatusIs(StatusCode::kFailedPrecondition));
  const std::string msg = second.status().message();
  EXPECT_NE(msg.find("another checkpoint manager is using it"), std::string::npos) << msg;
  EXPECT_NE(msg.find("savepoint.lock"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("pid {}", ::getpid())), std::string::npos) << msg;
  SP_ASSERT_OK(first->Close());
  EXPECT_TRUE(CheckpointManager::Open(o).ok());

  MemFileSystem fs;  // the process-local lock of other file systems
  auto mem_first = OpenOrDie(MemOptions(&fs));
  EXPECT_EQ(CheckpointManager::Open(MemOptions(&fs)).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(Manager, AppendInfoAndCallables) {
  MemFileSystem fs;
  ManagerOptions o = MemOptions(&fs);
  o.storage.append_info = {"epoch_num", "step_num"};
  o.storage.append_dict = {{"learning_rate", Value(0.5)}, {"run", Value("demo")}};
  o.naming.prefix_fn = [](const StepInfo& i) { return fmt::format("model_at_{}", i.step); };
  o.naming.directory_fn = [](const StepInfo& i) {
    return fmt::format("/runs/part{}", i.step / 10);
  };
  o.retention.keep_all = true;
  auto m = OpenOrDie(o);
  ASSERT_TRUE(*m->Save(3, StateAt(3), InEpoch(2)));
  ASSERT_TRUE(*m->Save(12, StateAt(12)));
  EXPECT_TRUE(fs.Exists("/runs/part0/model_at_3"));
  EXPECT_TRUE(fs.Exists("/runs/part1/model_at_12"));
  EXPECT_EQ(m->directory(), "/runs/part1");
  Result<State> s = Load("/runs/part0/model_at_3", {}, {.fs = &fs});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->FindValue("epoch_num")->as_int(), 2);
  EXPECT_EQ(s->FindValue("step_num")->as_int(), 3);
  EXPECT_EQ(s->FindValue("learning_rate")->as_float(), 0.5);
  EXPECT_EQ(s->FindValue("run")->as_string(), "demo");
  State clash = StateAt(20);
  SP_ASSERT_OK(clash.PutValue("learning_rate", 1.0));
  Status st = m->Save(20, clash).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kAlreadyExists));
}

TEST(Manager, RecisStyleStep) {
  MemFileSystem fs;
  ManagerOptions o = MemOptions(&fs);
  o.save_policy.interval_steps = 4;
  o.retention.keep_all = true;
  auto m = OpenOrDie(o);
  ToyTrainer t(1);
  SP_ASSERT_OK(t.Register(*m));
  for (int i = 0; i < 10; ++i) {
    t.Step();
    ASSERT_TRUE(m->Step().ok());
  }
  EXPECT_EQ(m->global_step(), 10);
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{4, 8}));
  ToyTrainer fresh(99);
  auto reader = OpenOrDie(MemOptions(&fs, "/reader"));
  SP_ASSERT_OK(fresh.Register(*reader));
  SP_ASSERT_OK(reader->LoadFrom("/ckpt/ckpt-1_8", {}));
  EXPECT_TRUE(fresh == TrainedTo(8));
}

TEST(Manager, ExceptionSaveWritesALoadableBreakpoint) {
  MemFileSystem fs;
  ManagerOptions o = MemOptions(&fs);
  o.save_policy.interval_steps = 5;
  o.breakpoints.on_exception = true;
  auto m = OpenOrDie(o);
  ToyTrainer t(1);
  SP_ASSERT_OK(t.Register(*m));
  try {
    ExceptionSaveGuard guard(*m);
    for (;;) {
      t.Step();
      SP_ASSERT_OK(m->OnStepEnd(t.step(), t.epoch()));
      if (t.step() == 7) throw std::runtime_error("diverged");
    }
  } catch (const std::runtime_error&) {
  }
  std::optional<CheckpointRecord> bp = m->Latest();
  ASSERT_TRUE(bp.has_value());
  EXPECT_TRUE(bp->breakpoint);
  EXPECT_EQ(bp->name, "ckpt-1_7_breakpoint");
  EXPECT_EQ(bp->step, 7);
  ToyTrainer restored(42);
  auto other = OpenOrDie(MemOptions(&fs, "/other"));
  SP_ASSERT_OK(restored.Register(*other));
  SP_ASSERT_OK(other->LoadFrom(bp->path, {}));
  EXPECT_TRUE(restored == TrainedTo(7));

  ManagerOptions no = MemOptions(&fs, "/third");
  auto third = OpenOrDie(no);
  EXPECT_THAT(third->SaveBreakpoint(), StatusIs(StatusCode::kFailedPrecondition));
}

TEST(Manager, SigtermSavesBreakpointThenDies) {
  testing::TempDir dir;
  ManagerOptions o;
  o.naming.directory = dir.Sub("ckpt");
  o.save_policy.interval_steps = 5;
  o.breakpoints.on_exception = true;
  o.breakpoints.handle_signals = true;
  pid_t pid = ::fork();
  if (pid == 0) {
    auto m = CheckpointManager::Open(o);
    ToyTrainer t(1);
    if (!m.ok() || !t.Register(**m).ok()) ::_exit(3);
    for (;;) {
      t.Step();
      if (t.step() == 8) ::raise(SIGTERM);  // arrives mid-step; acted on at the next hook
      if (Status s = (*m)->OnStepEnd(t.step(), t.epoch()); !s.ok()) {
        std::fprintf(stderr, "child: OnStepEnd at step %lld: %s\n",
                     static_cast<long long>(t.step()), s.ToString().c_str());
        ::_exit(4);
      }
      if (t.step() > 20) ::_exit(5);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  o.breakpoints.handle_signals = false;
  auto m = OpenOrDie(o);
  ASSERT_EQ(m->AllSteps(), (std::vector<int64_t>{5, 8}));
  EXPECT_TRUE(m->Latest()->breakpoint);
  ToyTrainer restored(42);
  SP_ASSERT_OK(restored.Register(*m));
  ASSERT_TRUE(m->RestoreRegistered().ok());
  EXPECT_TRUE(restored == TrainedTo(8));
}

}  // namespace
}  // namespace savepoint
