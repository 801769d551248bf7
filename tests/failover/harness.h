// The in-process failover job of tests/failover/: a controller and N agents (one thread per
// rank) over gRPC on localhost. A rank "dies" by dropping its connection (Abandon: what the
// kernel does to a SIGKILLed process's socket) or by going silent (no heartbeats).
#ifndef SAVEPOINT_TESTS_FAILOVER_HARNESS_H_
#define SAVEPOINT_TESTS_FAILOVER_HARNESS_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/failover_rpc.h"
#include "savepoint/savepoint.h"

namespace savepoint::failover_harness {

using namespace std::chrono_literals;

inline constexpr char kToken[] = "test-token-0123456789abcdef";
inline constexpr int kElems = 8;

// The deterministic state of a rank after `step` updates: what every replica holds.
inline float WeightAt(int64_t step, int i) { return static_cast<float>(step * 0.5 + i); }

// One rank: its state, its agent, and what the test does to it.
struct Rank {
  int rank = 0;
  int world = 0;
  std::vector<float> w = std::vector<float>(kElems);
  int64_t step = 0;
  ShardLayout layout;                // set by two-group tests
  std::vector<ReplicaGroup> groups;  // empty: data parallel
  std::string host;                  // AgentOptions::host (empty: this host)
  int generation = -1;               // AgentOptions::generation
  SignalPolicy signals = SignalPolicy::kDefer;
  std::function<bool(Rank&)> at_step_end;  // returns false to stop the loop (the rank "dies")
  std::function<bool(Rank&)> mid_update;   // between BeginUpdate and the update; false: "dies"
  std::function<Result<DumpSource>(Rank&)> source_hook;
  std::unique_ptr<FailoverAgent> agent;
  Status result;
};

inline ControllerOptions Options(int world, const std::string& dir) {
  ControllerOptions o;
  o.token = kToken;
  o.world = world;
  o.directory = dir;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 1000ms;  // generous: the CI machine may be loaded
  o.stop_grace = 1000ms;
  o.dump_timeout = 10s;
  return o;
}

// The first row of w this rank holds (layouts split w by rows).
inline int FirstRow(const Rank& r) {
  return r.layout.empty() ? 0 : static_cast<int>(r.layout.at("w").offsets[0]);
}

inline DumpSource SourceOf(Rank& r) {
  DumpSource d;
  // Two-group layouts hold half of a [2*kElems] tensor; otherwise the whole [kElems].
  d.state.PutView("w", TensorView(r.w.data(), DType::kF32, {kElems})).IgnoreError();
  d.state.PutValue("loader.position", r.step * 32).IgnoreError();
  d.layout = r.layout;
  return d;
}

inline void RunRank(Rank& r, int port, int64_t steps) {
  AgentOptions o;
  o.controller = "127.0.0.1:" + std::to_string(port);
  o.token = kToken;
  o.rank = r.rank;
  o.world = r.world;
  o.groups = r.groups;
  o.host = r.host;
  o.generation = r.generation;
  o.signals = r.signals;
  o.source = [&r]() -> Result<DumpSource> {
    return r.source_hook ? r.source_hook(r) : SourceOf(r);
  };
  auto agent = FailoverAgent::Connect(o);
  if (!agent.ok()) {
    r.result = agent.status();
    return;
  }
  r.agent = std::move(agent).value();
  for (int64_t s = r.step + 1; s <= steps; ++s) {
    r.result = r.agent->BeginUpdate(s);
    if (!r.result.ok()) return;
    if (r.mid_update && !r.mid_update(r)) return;
    for (int i = 0; i < kElems; ++i) r.w[i] = WeightAt(s, i + FirstRow(r));
    r.step = s;
    r.agent->EndUpdate(s);
    if (r.at_step_end && !r.at_step_end(r)) return;
    std::this_thread::sleep_for(5ms);
  }
  r.result = r.agent->Finish();
}

// Runs a job of ranks.size() ranks for `steps` steps; returns the controller's outcome.
inline Result<JobOutcome> RunJob(std::vector<Rank>& ranks, const ControllerOptions& co,
                                 int64_t steps) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<FailoverController> c, FailoverController::Start(co));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    ranks[i].rank = static_cast<int>(i);
    ranks[i].world = static_cast<int>(ranks.size());
    threads.emplace_back([&, i, port = c->port()] { RunRank(ranks[i], port, steps); });
  }
  SP_RETURN_IF_ERROR(c->Wait().status());
  for (std::thread& t : threads) t.join();
  return c->Wait();  // again: counts what the ranks sent after the verdict
}

// A rank that crashes (drops its connection) after `step`.
inline std::function<bool(Rank&)> DieAfter(int64_t step) {
  return [step](Rank& r) {
    if (r.step < step) return true;
    r.agent->Abandon();
    return false;
  };
}

}  // namespace savepoint::failover_harness

#endif  // SAVEPOINT_TESTS_FAILOVER_HARNESS_H_
