// Failure-time checkpoints end to end inside one process (the job of harness.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <latch>
#include <thread>

#include "failover/harness.h"
#include "savepoint/failover_rpc.h"
#include "savepoint/manager.h"
#include "savepoint/mindspore.h"
#include "savepoint/savepoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using namespace std::chrono_literals;
using namespace failover_harness;

TEST(FailoverTest, JobThatEndsNormallyDumpsNothing) {
  testing::TempDir dir;
  std::vector<Rank> ranks(3);
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(3, dir.path()), 10));
  EXPECT_FALSE(out.failure);
  for (const Rank& r : ranks) SP_EXPECT_OK(r.result);
}

TEST(FailoverTest, Rank0DiesAndASurvivorDumpsTheLastStep) {
  testing::TempDir dir;
  std::vector<Rank> ranks(4);
  ranks[0].at_step_end = DieAfter(6);
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(4, dir.path()), 1000));
  ASSERT_TRUE(out.failure);
  EXPECT_EQ(out.failed_rank, 0);
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  ASSERT_EQ(out.writers.size(), 1u);
  EXPECT_NE(out.writers[0], 0);
  // The newest step a survivor finished (the ranks are not kept in step: under load a survivor
  // may still be before rank 0's last step 6 when it learns of the death).
  int64_t newest = 0;
  for (int r = 1; r < 4; ++r) newest = std::max(newest, ranks[r].step);
  EXPECT_GE(out.dump_step, 1);
  EXPECT_EQ(out.dump_step, newest);
  EXPECT_EQ(ranks[out.writers[0]].step, out.dump_step);
  for (int r = 1; r < 4; ++r)
    EXPECT_THAT(ranks[r].result, StatusIs(StatusCode::kFailedPrecondition));
  SP_ASSERT_OK_AND_ASSIGN(State loaded, Load(out.dump_path));
  const TensorView* w = loaded.FindTensor("w");
  ASSERT_NE(w, nullptr);
  for (int i = 0; i < kElems; ++i) {
    EXPECT_EQ(reinterpret_cast<const float*>(w->data())[i], WeightAt(out.dump_step, i));
  }
  EXPECT_EQ(loaded.FindValue("failover.step")->as_int(), out.dump_step);
  EXPECT_EQ(loaded.FindValue("loader.position")->as_int(), out.dump_step * 32);
  // The manager sees the dump as its newest checkpoint.
  ManagerOptions mo;
  mo.naming.directory = dir.path();
  SP_ASSERT_OK_AND_ASSIGN(auto manager, CheckpointManager::Open(mo));
  ASSERT_TRUE(manager->Latest().has_value());
  EXPECT_EQ(manager->Latest()->step, out.dump_step);
  EXPECT_EQ(manager->Latest()->name, FailureDumpName("ckpt", 1, out.dump_step));
}

// Two replica groups: ranks 0 and 2 hold rows [0, 8) of w, ranks 1 and 3 rows [8, 16).
void TwoGroups(std::vector<Rank>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int half = static_cast<int>(r % 2);
    ranks[r].layout["w"] = SplitDim({2 * kElems}, 0, 2, half, {half, half + 2}).value();
    ranks[r].groups = {{half, half + 2}};
  }
}

TEST(FailoverTest, OneDeadPerGroupDumpsFromTwoWriters) {
  testing::TempDir dir;
  std::vector<Rank> ranks(4);
  TwoGroups(ranks);
  ranks[0].at_step_end = DieAfter(4);
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(4, dir.path()), 1000));
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  ASSERT_EQ(out.writers.size(), 2u);  // rank 2 for rows [0, 8), rank 1 or 3 for rows [8, 16)
  EXPECT_EQ(out.writers[0] + out.writers[1] - 2 == 1 || out.writers[0] + out.writers[1] - 2 == 3,
            true);
  SP_ASSERT_OK_AND_ASSIGN(State loaded, Load(out.dump_path));
  const TensorView* w = loaded.FindTensor("w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->shape(), (Shape{2 * kElems}));
  for (int i = 0; i < 2 * kElems; ++i) {
    EXPECT_EQ(reinterpret_cast<const float*>(w->data())[i], WeightAt(out.dump_step, i));
  }
}

TEST(FailoverTest, TwoRanksOfOneGroupDieNoDump) {
  testing::TempDir dir;
  std::vector<Rank> ranks(4);
  TwoGroups(ranks);
  std::latch both(2);
  for (int r : {1, 3}) {
    ranks[r].at_step_end = [&both](Rank& me) {
      if (me.step < 5) return true;
      both.arrive_and_wait();
      me.agent->Abandon();
      return false;
    };
  }
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(4, dir.path()), 1000));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_FALSE(out.dump_status.ok());
  EXPECT_NE(out.dump_status.message().find("no dump"), std::string::npos)
      << out.dump_status.ToString();
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ADD_FAILURE() << "left " << e.path();
  }
}

TEST(FailoverTest, HungRankIsDeclaredDeadAndItsLateHeartbeatsIgnored) {
  testing::TempDir dir;
  std::vector<Rank> ranks(3);
  ranks[2].at_step_end = [](Rank& me) {
    if (me.step != 5) return true;
    me.agent->PauseHeartbeatsForTesting(true);
    std::this_thread::sleep_for(2000ms);  // hung: alive, connected, silent
    me.agent->PauseHeartbeatsForTesting(false);
    std::this_thread::sleep_for(200ms);
    return true;  // then tries to go on: BeginUpdate says the job stopped
  };
  auto t0 = std::chrono::steady_clock::now();
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(3, dir.path()), 1000));
  ASSERT_TRUE(out.failure);
  EXPECT_EQ(out.failed_rank, 2);
  EXPECT_NE(out.reason.find("no heartbeat"), std::string::npos) << out.reason;
  EXPECT_TRUE(out.dumped) << out.dump_status.ToString();
  EXPECT_GT(out.late_messages, 0);
  EXPECT_THAT(ranks[2].result, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(FailoverTest, DyingWriterCommitsNothing) {
  testing::TempDir dir;
  std::vector<Rank> ranks(3);
  ranks[0].at_step_end = DieAfter(3);
  // Whichever survivor is chosen dies while it writes.
  std::vector<std::thread> killers(3);
  for (int r : {1, 2}) {
    ranks[r].source_hook = [&killers](Rank& me) -> Result<DumpSource> {
      killers[me.rank] = std::thread([&me] { me.agent->Abandon(); });
      std::this_thread::sleep_for(800ms);  // the controller sees the writer gone meanwhile
      return SourceOf(me);
    };
  }
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(3, dir.path()), 1000));
  for (std::thread& k : killers) {
    if (k.joinable()) k.join();
  }
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_NE(out.dump_status.message().find("died during the dump"), std::string::npos)
      << out.dump_status.ToString();
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ADD_FAILURE() << "left " << e.path();
  }
}

TEST(FailoverTest, DeathMidUpdateDumpsTheSurvivorsStep) {
  testing::TempDir dir;
  std::vector<Rank> ranks(3);
  ranks[1].mid_update = [](Rank& me) {
    if (me.step < 5) return true;
    me.agent->Abandon();  // dies with its state half-updated: never a source
    return false;
  };
  ControllerOptions co = Options(3, dir.path());
  co.naming = DumpNaming::kMindSpore;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 1000));
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  EXPECT_EQ(out.failed_rank, 1);
  EXPECT_GE(out.dump_step, 5);
  EXPECT_EQ(std::filesystem::path(out.dump_path).filename(), MindSporeDumpName(out.dump_step));
  SP_ASSERT_OK_AND_ASSIGN(State loaded, Load(out.dump_path));
  EXPECT_EQ(reinterpret_cast<const float*>(loaded.FindTensor("w")->data())[3],
            WeightAt(out.dump_step, 3));
}

// The names under `dir`, sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

int64_t IntOf(const State& s, const std::string& name) {
  if (const Value* v = s.FindValue(name)) return v->as_int();
  const TensorView* t = s.FindTensor(name);  // an Int64 scalar entry, if not restored as a value
  return t == nullptr ? -1 : *reinterpret_cast<const int64_t*>(t->data());
}

// A DumpNaming::kMindSporeCkpt dump of `world` ranks at out.dump_step: rank_0..rank_{world-1},
// each with exactly one .ckpt holding the state of step n (rows from `first_row(r)` of w).
void ExpectCkptDump(const JobOutcome& out, int world, const std::function<int(int)>& first_row) {
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  const int64_t n = out.dump_step;
  EXPECT_EQ(std::filesystem::path(out.dump_path).filename(), MindSporeDumpName(n));
  std::vector<std::string> want;
  for (int r = 0; r < world; ++r) want.push_back("rank_" + std::to_string(r));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Names(out.dump_path), want);
  for (int r = 0; r < world; ++r) {
    const std::filesystem::path file =
        std::filesystem::path(out.dump_path) / MindSporeRankCheckpointPath(r, 1, n);
    EXPECT_EQ(Names(file.parent_path().string()),
              std::vector<std::string>{file.filename().string()});
    SP_ASSERT_OK_AND_ASSIGN(State loaded, LoadMindSporeCheckpoint(file.string()));
    const TensorView* w = loaded.FindTensor("w");
    ASSERT_NE(w, nullptr) << file;
    ASSERT_EQ(w->shape(), (Shape{kElems}));
    for (int i = 0; i < kElems; ++i) {
      EXPECT_EQ(reinterpret_cast<const float*>(w->data())[i], WeightAt(n, i + first_row(r)))
          << file << " element " << i;
    }
    EXPECT_EQ(IntOf(loaded, "failover.step"), n);
    EXPECT_EQ(IntOf(loaded, "step_num"), n);
    EXPECT_EQ(IntOf(loaded, "epoch_num"), 1);
    EXPECT_EQ(IntOf(loaded, "loader.position"), n * 32);
    EXPECT_EQ(loaded.metadata().at("savepoint.manager").at("step"), n);
  }
}

void RunCkptDataParallel(int victim) {
  testing::TempDir dir;
  std::vector<Rank> ranks(4);
  ranks[victim].at_step_end = DieAfter(5);
  ControllerOptions co = Options(4, dir.path());
  co.naming = DumpNaming::kMindSporeCkpt;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 1000));
  EXPECT_EQ(out.failed_rank, victim);
  ExpectCkptDump(out, 4, [](int) { return 0; });
  EXPECT_EQ(Names(dir.path()), std::vector<std::string>{MindSporeDumpName(out.dump_step)});
}

TEST(FailoverCkptLayoutTest, DataParallelWritesEveryRanksFile) { RunCkptDataParallel(2); }

TEST(FailoverCkptLayoutTest, Rank0DiesDataParallel) { RunCkptDataParallel(0); }

TEST(FailoverCkptLayoutTest, TwoGroupsWriteTheirHalves) {
  testing::TempDir dir;
  std::vector<Rank> ranks(4);
  TwoGroups(ranks);
  ranks[0].at_step_end = DieAfter(4);
  ControllerOptions co = Options(4, dir.path());
  co.naming = DumpNaming::kMindSporeCkpt;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 1000));
  EXPECT_EQ(out.writers.size(), 2u);
  ExpectCkptDump(out, 4, [](int r) { return r % 2 * kElems; });
}

TEST(FailoverCkptLayoutTest, StateSpanningGroupsFailsAndLeavesNothing) {
  testing::TempDir dir;
  std::vector<Rank> ranks(4);
  TwoGroups(ranks);
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].groups.push_back({0, 1, 2, 3});  // plus a replicated part: two groups per rank
  }
  ranks[1].at_step_end = DieAfter(4);
  ControllerOptions co = Options(4, dir.path());
  co.naming = DumpNaming::kMindSporeCkpt;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 1000));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_THAT(out.dump_status, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(out.dump_status.message().find("use the native layout"), std::string::npos)
      << out.dump_status.ToString();
  EXPECT_TRUE(Names(dir.path()).empty());
}

TEST(FailoverCkptLayoutTest, DyingWriterCommitsNothing) {
  testing::TempDir dir;
  std::vector<Rank> ranks(4);
  TwoGroups(ranks);
  ranks[0].at_step_end = DieAfter(3);
  // Rank 2, the only writer left for rows [0, 8), dies while writer 0 (rank 1) has begun.
  std::thread killer;
  ranks[2].source_hook = [&killer](Rank& me) -> Result<DumpSource> {
    killer = std::thread([&me] { me.agent->Abandon(); });
    std::this_thread::sleep_for(800ms);
    return SourceOf(me);
  };
  ControllerOptions co = Options(4, dir.path());
  co.naming = DumpNaming::kMindSporeCkpt;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 1000));
  if (killer.joinable()) killer.join();
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_NE(out.dump_status.message().find("died during the dump"), std::string::npos)
      << out.dump_status.ToString();
  for (const std::string& name : Names(dir.path())) ADD_FAILURE() << "left " << name;
}

TEST(FailoverCkptLayoutTest, NamesAndGroupCheck) {
  EXPECT_EQ(MindSporeRankCheckpointPath(3, 2, 17), "rank_3/ttp_rank_3-2_17.ckpt");
  SP_EXPECT_OK(CheckMindSporeDumpGroups(DataParallelGroups(4), 4));
  SP_EXPECT_OK(CheckMindSporeDumpGroups({{0, 2}, {1, 3}}, 4));
  EXPECT_EQ(CheckMindSporeDumpGroups({{0, 2}, {1, 3}, {0, 1, 2, 3}}, 4).code(),
            StatusCode::kFailedPrecondition);
  Status missing = CheckMindSporeDumpGroups({{0, 1}}, 3);
  EXPECT_NE(missing.message().find("rank 2 is in no group"), std::string::npos)
      << missing.ToString();
}

// SaveMindSporeDump over thread communicators: a writer whose file cannot be written (a dtype
// MindSpore lacks) makes the whole dump fail on every writer, and nothing appears.
TEST(FailoverCkptLayoutTest, FailingWriterLeavesNothing) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/" + MindSporeDumpName(7);
  std::vector<float> w(kElems, 1.0f);
  auto comms = NewThreadCommunicators(2);
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      State s;
      s.PutView("w", TensorView(w.data(), i == 0 ? DType::kF32 : DType::kC64, {kElems / 2}))
          .IgnoreError();
      results[i] = SaveMindSporeDump(*comms[i], s, {i, i + 2}, path, 1, 7, 10s);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : results) EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  for (const std::string& name : Names(dir.path())) ADD_FAILURE() << "left " << name;
}

TEST(FailoverTest, OnlyReplicaStuckMidUpdateMeansNoDump) {
  testing::TempDir dir;
  std::vector<Rank> ranks(2);
  std::atomic<bool> stuck{false};
  ranks[0].at_step_end = [&stuck](Rank& me) {
    if (me.step < 4) return true;
    while (!stuck) std::this_thread::sleep_for(1ms);
    me.agent->Abandon();  // dies while its only replica is mid-update
    return false;
  };
  ranks[1].mid_update = [&stuck](Rank& me) {
    if (me.step != 4) return true;  // the update of step 5
    stuck = true;
    std::this_thread::sleep_for(2500ms);  // longer than stop_grace (1 s)
    return true;
  };
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(2, dir.path()), 1000));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_NE(out.dump_status.message().find("mid-update"), std::string::npos)
      << out.dump_status.ToString();
}

TEST(FailoverTest, WrongTokenIsRefused) {
  testing::TempDir dir;
  SP_ASSERT_OK_AND_ASSIGN(auto c, FailoverController::Start(Options(1, dir.path())));
  AgentOptions o;
  o.controller = "127.0.0.1:" + std::to_string(c->port());
  o.token = "not-the-job-token-at-all";
  o.rank = 0;
  o.world = 1;
  o.connect_timeout = 2s;
  EXPECT_THAT(FailoverAgent::Connect(o), StatusIs(StatusCode::kUnauthenticated));
  o.token = kToken;
  SP_ASSERT_OK_AND_ASSIGN(auto agent, FailoverAgent::Connect(o));
  SP_ASSERT_OK(agent->Finish());
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, c->Wait());
  EXPECT_FALSE(out.failure);
  EXPECT_GE(out.refused_calls, 1);
}

TEST(FailoverTest, ControllerKilledTrainingGoesOn) {
  testing::TempDir dir;
  SP_ASSERT_OK_AND_ASSIGN(auto c, FailoverController::Start(Options(2, dir.path())));
  std::vector<Rank> ranks(2);
  std::atomic<int> at_5{0};
  for (Rank& r : ranks) {
    r.at_step_end = [&at_5](Rank& me) {
      if (me.step == 5) ++at_5;
      if (me.step > 5 && me.step < 40) std::this_thread::sleep_for(5ms);
      return true;
    };
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    ranks[i].rank = i;
    ranks[i].world = 2;
    threads.emplace_back([&, i, port = c->port()] { RunRank(ranks[i], port, 60); });
  }
  while (at_5 < 2) std::this_thread::sleep_for(1ms);
  c.reset();  // the controller goes away
  for (std::thread& t : threads) t.join();
  for (const Rank& r : ranks) {
    EXPECT_EQ(r.step, 60);
    EXPECT_FALSE(r.agent->controller_status().ok());
  }
}

}  // namespace
}  // namespace savepoint
