// The controller across the launcher's restarts (ControllerOptions::max_restarts) and a
// preemption checkpoint asked for by a signal (SignalPolicy::kCheckpoint), inside one process.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

#include "failover/harness.h"
#include "savepoint/failover_rpc.h"
#include "savepoint/savepoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;
using namespace std::chrono_literals;
using namespace failover_harness;

// The outcomes the controller reported, one per generation, as they ended.
struct Outcomes {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<JobOutcome> all;

  void Add(const JobOutcome& o) {
    std::lock_guard lock(mu);
    all.push_back(o);
    cv.notify_all();
  }
  JobOutcome WaitFor(size_t n) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, 60s, [&] { return all.size() >= n; });
    return all.size() >= n ? all[n - 1] : JobOutcome{};
  }
};

// Runs `ranks` (of generation `generation`, resuming at `from_step`) against the controller
// listening on `port` until each stops or finishes `steps`.
void RunGeneration(std::vector<Rank>& ranks, int port, int generation, int64_t from_step,
                   int64_t steps) {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    Rank& r = ranks[i];
    r.rank = static_cast<int>(i);
    r.world = static_cast<int>(ranks.size());
    r.generation = generation;
    r.step = from_step;
    for (int e = 0; e < kElems; ++e) r.w[e] = WeightAt(from_step, e);
    threads.emplace_back([&r, port, steps] { RunRank(r, port, steps); });
  }
  for (std::thread& t : threads) t.join();
}

// A controller of `world` ranks serving `max_restarts` restarts, reporting into `outcomes`.
Result<std::unique_ptr<FailoverController>> StartServing(int world, const std::string& dir,
                                                         int max_restarts, Outcomes& outcomes) {
  ControllerOptions co = Options(world, dir);
  co.max_restarts = max_restarts;
  co.on_generation_end = [&outcomes](const JobOutcome& o) { outcomes.Add(o); };
  return FailoverController::Start(co);
}

void ExpectDumpOf(const JobOutcome& o) {
  ASSERT_TRUE(o.dumped) << o.dump_status.ToString();
  SP_ASSERT_OK_AND_ASSIGN(State loaded, Load(o.dump_path));
  const float* w = reinterpret_cast<const float*>(loaded.FindTensor("w")->data());
  for (int i = 0; i < kElems; ++i) EXPECT_EQ(w[i], WeightAt(o.dump_step, i));
}

TEST(FailoverGenerationsTest, ProtectsEachRestartedGenerationUntilTheJobEnds) {
  testing::TempDir dir;
  Outcomes outcomes;
  SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FailoverController> c,
                          StartServing(3, dir.path(), 2, outcomes));

  std::vector<Rank> first(3);
  first[1].at_step_end = DieAfter(4);
  RunGeneration(first, c->port(), 0, 0, 1000);
  const JobOutcome one = outcomes.WaitFor(1);
  EXPECT_EQ(one.generation, 0);
  EXPECT_EQ(one.failed_rank, 1);
  ExpectDumpOf(one);

  // The launcher restarts the job; it resumes from the dump, and rank 0 dies this time.
  std::vector<Rank> second(3);
  second[0].at_step_end = DieAfter(one.dump_step + 3);
  RunGeneration(second, c->port(), 1, one.dump_step, 1000);
  const JobOutcome two = outcomes.WaitFor(2);
  EXPECT_EQ(two.generation, 1);
  EXPECT_EQ(two.failed_rank, 0);
  EXPECT_EQ(two.dead, std::vector<int>{0});  // the first generation's exits count for nothing
  EXPECT_GT(two.dump_step, one.dump_step);
  ExpectDumpOf(two);

  // A rank of an older generation is refused while the third runs to its end (asked from the
  // third's rank 0, whose Connect returned: every rank of the third has registered).
  std::vector<Rank> third(3);
  Status stale_result;
  third[0].at_step_end = [&, port = c->port(), at = two.dump_step + 2](Rank& me) {
    if (me.step != at) return true;
    Rank stale;
    stale.world = 3;
    stale.generation = 1;
    RunRank(stale, port, 1);
    stale_result = stale.result;
    return true;
  };
  RunGeneration(third, c->port(), 2, two.dump_step, two.dump_step + 60);
  EXPECT_THAT(stale_result, StatusIs(StatusCode::kFailedPrecondition));
  for (const Rank& r : third) SP_EXPECT_OK(r.result);
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome last, c->Wait());
  EXPECT_EQ(last.generation, 2);
  EXPECT_FALSE(last.failure);
  EXPECT_EQ(outcomes.WaitFor(3).generation, 2);
}

TEST(FailoverGenerationsTest, RanksOfTheRestartArrivingDuringTheDumpWaitForIt) {
  testing::TempDir dir;
  Outcomes outcomes;
  SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FailoverController> c,
                          StartServing(3, dir.path(), 1, outcomes));
  std::atomic<bool> died{false};
  std::vector<Rank> first(3);
  first[2].at_step_end = [&, die = DieAfter(4)](Rank& r) {
    const bool go_on = die(r);
    if (!go_on) died = true;
    return go_on;
  };
  for (Rank& r : first) {
    r.source_hook = [](Rank& me) -> Result<DumpSource> {
      std::this_thread::sleep_for(600ms);  // a slow dump: the launcher restarts meanwhile
      return SourceOf(me);
    };
  }
  std::thread old([&] { RunGeneration(first, c->port(), 0, 0, 1000); });
  while (!died) std::this_thread::sleep_for(1ms);
  std::vector<Rank> second(3);  // every rank of generation 1 says hello during the dump
  RunGeneration(second, c->port(), 1, 0, 20);
  old.join();
  for (const Rank& r : second) SP_EXPECT_OK(r.result);
  EXPECT_TRUE(outcomes.WaitFor(1).dumped) << outcomes.WaitFor(1).dump_status.ToString();
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome last, c->Wait());
  EXPECT_EQ(last.generation, 1);
  EXPECT_FALSE(last.failure);
}

TEST(FailoverGenerationsTest, NoRestartedGenerationEndsTheJobWithTheLastOutcome) {
  testing::TempDir dir;
  ControllerOptions co = Options(2, dir.path());
  co.max_restarts = 1;
  co.register_timeout = 2s;
  SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FailoverController> c, FailoverController::Start(co));
  std::vector<Rank> ranks(2);
  ranks[0].at_step_end = DieAfter(3);
  RunGeneration(ranks, c->port(), 0, 0, 1000);
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, c->Wait());
  EXPECT_EQ(out.failed_rank, 0);
  ExpectDumpOf(out);
}

TEST(FailoverGenerationsTest, NoRestartsLeftRefusesANewGeneration) {
  testing::TempDir dir;
  SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FailoverController> c,
                          FailoverController::Start(Options(2, dir.path())));
  std::vector<Rank> ranks(2);
  ranks[1].at_step_end = DieAfter(3);
  RunGeneration(ranks, c->port(), 0, 0, 1000);
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, c->Wait());
  EXPECT_TRUE(out.dumped);
  Rank again;
  again.world = 2;
  again.generation = 1;
  RunRank(again, c->port(), 1);
  EXPECT_FALSE(again.result.ok());
}

TEST(FailoverGenerationsTest, BadSignalAndRestartOptionsAreRefused) {
  testing::TempDir dir;
  ControllerOptions co = Options(2, dir.path());
  co.max_restarts = -1;
  EXPECT_THAT(FailoverController::Start(co).status(),
              StatusIs(StatusCode::kInvalidArgument, "max_restarts -1"));
  AgentOptions o;
  o.controller = "127.0.0.1:1";
  o.token = kToken;
  o.rank = 0;
  o.world = 1;
  o.signal_budget = std::chrono::milliseconds(-1);
  EXPECT_THAT(FailoverAgent::Connect(o).status(),
              StatusIs(StatusCode::kInvalidArgument, "signal_budget"));
  o.signal_budget = 1s;
  o.signal_settle = std::chrono::milliseconds(-5);
  EXPECT_THAT(FailoverAgent::Connect(o).status(),
              StatusIs(StatusCode::kInvalidArgument, "signal_settle"));
}

std::atomic<int> g_terms{0};
void CountTerm(int) { ++g_terms; }

TEST(FailoverGenerationsTest, SigtermUnderCheckpointPolicyCommitsTheStepThenReachesTheHandler) {
  testing::TempDir dir;
  struct sigaction mine {
  }, before{};
  mine.sa_handler = CountTerm;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGTERM, &mine, &before), 0);
  g_terms = 0;
  std::vector<Rank> ranks(3);
  for (Rank& r : ranks) r.signals = SignalPolicy::kCheckpoint;
  ranks[2].at_step_end = [](Rank& r) {
    if (r.step == 5) ::kill(::getpid(), SIGTERM);  // the process's agent holds it back
    return true;
  };
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(3, dir.path()), 100000));
  sigaction(SIGTERM, &before, nullptr);
  EXPECT_TRUE(out.preempted);
  EXPECT_FALSE(out.failure);
  EXPECT_GE(out.dump_step, 5);
  ExpectDumpOf(out);
  for (const Rank& r : ranks) EXPECT_THAT(r.result, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(g_terms.load(), 1);  // delivered to the program's handler once, after the commit
}

}  // namespace
}  // namespace savepoint
