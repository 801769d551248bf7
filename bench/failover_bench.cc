// The steady-state cost of failure-time snapshots (docs/FAILOVER.md, "Snapshots"): a training loop
// of one rank under an in-process controller, each step `step_ms` of compute (sleeping, as a rank
// waiting on its GPU, or a busy loop with --busy), then BeginUpdate, an update, EndUpdate. The
// same loop runs without snapshots and with them (a snapshot after every `every` steps, written
// into /dev/shm while the next step computes), and prints the time per step and what BeginUpdate
// waited for a snapshot to finish. The reference measured in the same run: memcpy of the state's
// bytes, and a plain Save of the state into the same directory. The first 2 * every steps (the
// snapshots that find no spare files to recycle) are not timed.
//
// With --cost it measures instead what protection costs without snapshots: BeginUpdate+EndUpdate
// on the training thread (200 000 steps, agent connected, heartbeats every 100 ms), and the CPU
// that agent and controller (one process) take per second while training is idle, against the
// same process's CPU over as long an idle time before the controller started.
//
// Usage: failover_bench [--mib 64,512] [--steps 30] [--step-ms 100] [--every 1] [--busy]
//                       [--shm /dev/shm]
//        failover_bench --cost
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/failover_rpc.h"
#include "savepoint/savepoint.h"

namespace {

using Clock = std::chrono::steady_clock;
using savepoint::Status;

struct Args {
  std::vector<int64_t> mib = {64, 512};
  int steps = 30;
  int step_ms = 100;
  int64_t every = 1;
  bool busy = false;
  bool cost = false;
  std::string shm = "/dev/shm";
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Compute(const Args& a) {
  if (!a.busy) return std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
  const auto until = Clock::now() + std::chrono::milliseconds(a.step_ms);
  volatile uint64_t x = 0;
  while (Clock::now() < until) {
    for (int i = 0; i < 1000; ++i) x = x + i;
  }
}

struct LoopResult {
  double step_ms = 0;  // mean wall time per step
  double wait_ms = 0;  // mean time in BeginUpdate
};

// Runs `a.steps` steps of one rank over `state`; snapshots when `snapshots`.
savepoint::Result<LoopResult> Loop(const Args& a, std::vector<uint8_t>& state, bool snapshots) {
  savepoint::ControllerOptions co;
  co.token = "bench-token-0123456789abcdef";
  co.world = 1;
  co.directory = a.shm + "/savepoint-failover-bench-dumps";
  if (snapshots) co.snapshot_dir = a.shm;
  co.snapshot_every = a.every;
  SP_ASSIGN_OR_RETURN(auto controller, savepoint::FailoverController::Start(co));
  savepoint::AgentOptions ao;
  ao.controller = fmt::format("127.0.0.1:{}", controller->port());
  ao.token = co.token;
  ao.rank = 0;
  ao.world = 1;
  int64_t step = 0;
  ao.source = [&]() -> savepoint::Result<savepoint::DumpSource> {
    savepoint::DumpSource d;
    SP_RETURN_IF_ERROR(
        d.state.PutView("model", savepoint::TensorView(state.data(), savepoint::DType::kU8,
                                                       {static_cast<int64_t>(state.size())})));
    SP_RETURN_IF_ERROR(d.state.PutValue("step", step));
    return d;
  };
  SP_ASSIGN_OR_RETURN(auto agent, savepoint::FailoverAgent::Connect(ao));
  LoopResult r;
  // Steady state: the first two snapshots find no spare files to recycle (fresh tmpfs pages are
  // allocated and zeroed); their steps are run but not timed.
  const int64_t warmup = 2 * a.every;
  auto t0 = Clock::now();
  for (step = 1; step <= warmup + a.steps; ++step) {
    if (step == warmup + 1) t0 = Clock::now();
    Compute(a);
    const auto w0 = Clock::now();
    SP_RETURN_IF_ERROR(agent->BeginUpdate(step));
    if (step > warmup) r.wait_ms += Ms(Clock::now() - w0);
    std::memset(state.data(), static_cast<int>(step), 4096);  // the update
    agent->EndUpdate(step);
  }
  r.step_ms = Ms(Clock::now() - t0) / a.steps;
  r.wait_ms /= a.steps;
  SP_RETURN_IF_ERROR(agent->Finish());
  SP_RETURN_IF_ERROR(controller->Wait().status());
  return r;
}

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// CPU milliseconds per second this process takes over `d` of idling.
double IdleCpuMsPerS(std::chrono::milliseconds d) {
  const double cpu0 = CpuSeconds();
  std::this_thread::sleep_for(d);
  return (CpuSeconds() - cpu0) * 1000 / (static_cast<double>(d.count()) / 1000);
}

// --cost: the steady-state cost of protection (docs/PERFORMANCE.md, "Failure-time checkpoints").
int Cost() {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "failed: {}\n", s.ToString());
    return 1;
  };
  constexpr auto kIdle = std::chrono::milliseconds(2000);
  const double before = IdleCpuMsPerS(kIdle);
  savepoint::ControllerOptions co;
  co.token = "bench-token-0123456789abcdef";
  co.world = 1;
  co.directory = "/tmp/savepoint-failover-bench-dumps";
  co.heartbeat_interval = std::chrono::milliseconds(100);
  co.heartbeat_timeout = std::chrono::milliseconds(1000);
  auto controller = savepoint::FailoverController::Start(co);
  if (!controller.ok()) return fail(controller.status());
  savepoint::AgentOptions ao;
  ao.controller = fmt::format("127.0.0.1:{}", (*controller)->port());
  ao.token = co.token;
  ao.rank = 0;
  ao.world = 1;
  auto agent = savepoint::FailoverAgent::Connect(ao);
  if (!agent.ok()) return fail(agent.status());
  constexpr int kSteps = 200000;
  const auto t0 = Clock::now();
  for (int s = 1; s <= kSteps; ++s) {
    if (Status st = (*agent)->BeginUpdate(s); !st.ok()) return fail(st);
    (*agent)->EndUpdate(s);
  }
  const double ns = Ms(Clock::now() - t0) * 1e6 / kSteps;
  const double during = IdleCpuMsPerS(kIdle);
  Status finished = (*agent)->Finish();
  auto outcome = (*controller)->Wait();
  if (!finished.ok()) return fail(finished);
  if (!outcome.ok()) return fail(outcome.status());
  fmt::print(
      "BeginUpdate+EndUpdate: {:.0f} ns per step ({} steps)\n"
      "CPU per second, agent + controller in one process, heartbeats every 100 ms: {:.1f} ms\n"
      "CPU per second, the same process idle before the controller started: {:.1f} ms\n"
      "hardware threads: {}\n",
      ns, kSteps, during, before, std::thread::hardware_concurrency());
  return 0;
}

// The reference: memcpy of the state, and one Save of it into the snapshot directory (ms).
std::pair<double, double> Reference(const Args& a, std::vector<uint8_t>& state) {
  std::vector<uint8_t> copy(state.size());
  std::memcpy(copy.data(), state.data(), state.size());  // fault the pages in first
  auto t = Clock::now();
  std::memcpy(copy.data(), state.data(), state.size());
  const double memcpy_ms = Ms(Clock::now() - t);
  savepoint::State s;
  s.PutView("model", savepoint::TensorView(state.data(), savepoint::DType::kU8,
                                           {static_cast<int64_t>(state.size())}))
      .IgnoreError();
  const std::string path = a.shm + "/savepoint-failover-bench-save";
  savepoint::IoOptions io;
  io.direct_io = false;
  t = Clock::now();
  Status saved = savepoint::Save(s, path, {.overwrite = true}, io);
  const double save_ms = Ms(Clock::now() - t);
  savepoint::DefaultFileSystem()->RemoveAll(path).IgnoreError();
  if (!saved.ok()) fmt::print(stderr, "save: {}\n", saved.ToString());
  return {memcpy_ms, save_ms};
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (k == "--mib") {
      a.mib.clear();
      std::stringstream ss(next());
      for (std::string v; std::getline(ss, v, ',');) a.mib.push_back(std::stoll(v));
    } else if (k == "--steps") {
      a.steps = std::stoi(next());
    } else if (k == "--step-ms") {
      a.step_ms = std::stoi(next());
    } else if (k == "--every") {
      a.every = std::stoll(next());
    } else if (k == "--busy") {
      a.busy = true;
    } else if (k == "--cost") {
      a.cost = true;
    } else if (k == "--shm") {
      a.shm = next();
    } else {
      fmt::print(stderr, "unknown option {}\n", k);
      std::exit(64);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  if (a.cost) return Cost();
  fmt::print("failover snapshots: {} steps of {} ms ({}), a snapshot every {} step(s) into {}\n",
             a.steps, a.step_ms, a.busy ? "busy loop" : "sleep", a.every, a.shm);
  fmt::print("{:>8} {:>10} {:>10} {:>9} {:>12} {:>10} {:>10}\n", "MiB", "off ms", "on ms",
             "overhead", "wait ms/step", "memcpy ms", "Save ms");
  for (int64_t mib : a.mib) {
    std::vector<uint8_t> state(static_cast<size_t>(mib) << 20, 0x5a);
    auto [memcpy_ms, save_ms] = Reference(a, state);
    auto off = Loop(a, state, false);
    auto on = Loop(a, state, true);
    if (!off.ok() || !on.ok()) {
      fmt::print(stderr, "failed: {}\n", (!off.ok() ? off.status() : on.status()).ToString());
      return 1;
    }
    fmt::print("{:>8} {:>10.1f} {:>10.1f} {:>8.2f}% {:>12.2f} {:>10.1f} {:>10.1f}\n", mib,
               off->step_ms, on->step_ms, 100.0 * (on->step_ms - off->step_ms) / off->step_ms,
               on->wait_ms, memcpy_ms, save_ms);
  }
  return 0;
}
