// controller_scale_bench: the failover controller (docs/FAILOVER.md) watching 64 .. 1,024 ranks
// (docs/PERFORMANCE.md, "Scale").
//
//   controller_scale_bench --cli build/tools/savepoint [--agents 64,256,1024] [--step-ms 100]
//                          [--measure-s 5] [--kill hang,drop]
//
// Per N: `savepoint controller --world N` runs in its own process (so its CPU and memory are its
// own); this process connects N agents (threads, 127.0.0.1, heartbeats every 100 ms) whose
// training threads call BeginUpdate / EndUpdate every --step-ms. After --measure-s of steady
// training it reads the controller's CPU time and RSS from /proc, then fails one rank (once per
// --kill kind, each in a job of its own): `hang`
// stops its heartbeats with the connection up (found by the 1 s heartbeat timeout), `drop` closes
// its connection as a crash does. Detection latency = the controller's detected_unix_ns (its
// --json outcome) minus the moment of the failure. Prints one JSON object per N.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/failover_rpc.h"

extern char** environ;

namespace {

using namespace savepoint;
using Clock = std::chrono::steady_clock;
constexpr char kToken[] = "scale-bench-token-0123456789";

struct Args {
  std::string cli;
  std::vector<std::string> kills = {"hang", "drop"};
  std::vector<int> agents = {64, 256, 1024};
  int step_ms = 100, measure_s = 5;
};

int64_t UnixNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// CPU seconds (user + system) of process `pid`.
double CpuSeconds(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string s((std::istreambuf_iterator<char>(in)), {});
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

uint64_t RssBytes(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) << 10;
  }
  return 0;
}

struct Controller {
  pid_t pid = -1;
  int port = 0;
  std::string out;  // file of its --json outcome
};

Controller Spawn(const Args& a, int n, const std::string& dir) {
  Controller c;
  const std::string port_file = dir + "/port";
  c.out = dir + "/outcome.json";
  std::vector<std::string> argv = {a.cli,   "controller",   "--world",     std::to_string(n),
                                   "--dir", dir + "/dumps", "--port-file", port_file,
                                   "--json"};
  std::vector<char*> ptrs;
  for (auto& s : argv) ptrs.push_back(s.data());
  ptrs.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, c.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  setenv("SAVEPOINT_JOB_TOKEN", kToken, 1);
  if (posix_spawn(&c.pid, a.cli.c_str(), &fa, nullptr, ptrs.data(), environ) != 0) {
    fmt::print(stderr, "controller_scale_bench: cannot start {}\n", a.cli);
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&fa);
  for (int i = 0; i < 500 && c.port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream in(port_file);
    in >> c.port;
  }
  return c;
}

struct Rank {
  std::unique_ptr<FailoverAgent> agent;
  std::thread training;
};

// Connects every rank (Connect returns once all registered), then trains until `stop`.
std::vector<Rank> StartRanks(const Args& a, int n, int port, std::atomic<bool>* stop,
                             std::atomic<int>* stopped) {
  std::vector<Rank> ranks(n);
  std::vector<std::thread> connect;
  for (int r = 0; r < n; ++r) {
    connect.emplace_back([&, r] {
      AgentOptions o;
      o.controller = fmt::format("127.0.0.1:{}", port);
      o.token = kToken;
      o.rank = r, o.world = n;
      o.signals = SignalPolicy::kUntouched;
      o.connect_timeout = std::chrono::seconds(60);
      Result<std::unique_ptr<FailoverAgent>> agent = FailoverAgent::Connect(o);
      if (!agent.ok()) {
        fmt::print(stderr, "rank {}: {}\n", r, agent.status().ToString());
        std::exit(1);
      }
      ranks[r].agent = std::move(*agent);
    });
  }
  for (auto& t : connect) t.join();
  for (int r = 0; r < n; ++r) {
    ranks[r].training = std::thread([&a, stop, stopped, agent = ranks[r].agent.get()] {
      for (int64_t step = 1; !stop->load(); ++step) {
        std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
        if (!agent->BeginUpdate(step).ok()) break;
        agent->EndUpdate(step);
      }
      stopped->fetch_add(1);
    });
  }
  return ranks;
}

// The detected_unix_ns of the controller's JSON outcome (0 when absent).
int64_t DetectedNs(const std::string& file) {
  std::ifstream in(file);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  const size_t at = s.find("\"detected_unix_ns\":");
  return at == std::string::npos ? 0 : std::stoll(s.substr(at + 19));
}

void RunOne(const Args& a, int n, const std::string& kill) {
  // A directory of our own (mkdtemp: new, unique), removed with what the controller wrote in it.
  std::string made = "/tmp/savepoint-controller-scale-XXXXXX";
  if (mkdtemp(made.data()) == nullptr) {
    std::perror("controller_scale_bench: mkdtemp");
    std::exit(1);
  }
  const std::string dir = made;
  Controller c = Spawn(a, n, dir);
  std::atomic<bool> stop{false};
  std::atomic<int> stopped{0};
  const auto t0 = Clock::now();
  std::vector<Rank> ranks = StartRanks(a, n, c.port, &stop, &stopped);
  const double connect_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu0 = CpuSeconds(c.pid);
  std::this_thread::sleep_for(std::chrono::seconds(a.measure_s));
  const double cores = (CpuSeconds(c.pid) - cpu0) / a.measure_s;
  const uint64_t rss = RssBytes(c.pid);
  const int victim = n / 2;
  const int64_t failed_at = UnixNs();
  if (kill == "drop") {
    ranks[victim].agent->Abandon();
  } else {
    ranks[victim].agent->PauseHeartbeatsForTesting(true);
  }
  int status = 0;
  waitpid(c.pid, &status, 0);  // the controller ends the job after the (failed) dump
  stop = true;
  for (auto& r : ranks) r.training.join();
  const int64_t detected = DetectedNs(c.out);
  fmt::print(
      "{{\"agents\": {}, \"kill\": \"{}\", \"connect_s\": {:.2f}, \"controller_cores\": {:.3f}, "
      "\"controller_rss_mib\": {:.1f}, \"detect_ms\": {:.0f}, \"stopped_ranks\": {}}}\n",
      n, kill, connect_s, cores, static_cast<double>(rss) / (1 << 20),
      detected > 0 ? static_cast<double>(detected - failed_at) / 1e6 : -1.0, stopped.load());
  std::fflush(stdout);
  for (auto& r : ranks) r.agent->Abandon();
  std::filesystem::remove_all(dir);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--cli") {
      a.cli = v;
    } else if (k == "--agents") {
      a.agents.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) a.agents.push_back(std::stoi(x));
    } else if (k == "--step-ms") {
      a.step_ms = std::stoi(v);
    } else if (k == "--measure-s") {
      a.measure_s = std::stoi(v);
    } else if (k == "--kill") {
      a.kills.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) {
        if (x != "hang" && x != "drop") {
          fmt::print(stderr, "controller_scale_bench: --kill takes hang and drop, not {}\n", x);
          std::exit(64);
        }
        a.kills.push_back(x);
      }
    } else {
      fmt::print(stderr, "controller_scale_bench: bad option {} {}\n", k, v);
      std::exit(64);
    }
  }
  if (a.cli.empty()) {
    fmt::print(stderr, "controller_scale_bench: --cli PATH (the savepoint CLI) is required\n");
    std::exit(64);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  rlimit files{};  // a socket or two per agent here, and per agent in the controller (inherits it)
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  const Args a = Parse(argc, argv);
  for (int n : a.agents) {
    for (const std::string& kill : a.kills) RunOne(a, n, kill);
  }
  return 0;
}
