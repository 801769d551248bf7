// The signal gate (signals.h). Everything the handler touches is a lock-free atomic or the pipe.
#include "failover/rpc/signals.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace savepoint::failover {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
constexpr int kCount = sizeof(kSignals) / sizeof(kSignals[0]);

std::atomic<bool> g_held{false};  // a gate exists
std::atomic<int> g_caught{0};     // the first signal caught (0: none)
int g_pipe[2] = {-1, -1};         // the handler writes a byte to [1]; made once, never closed
struct sigaction g_previous[kCount];
bool g_installed[kCount] = {};  // whether kSignals[i] is ours (not ignored before)
std::atomic<bool> g_restored{false};

void OnSignal(int sig) {
  const int saved = errno;
  int none = 0;
  g_caught.compare_exchange_strong(none, sig);
  const char byte = 1;
  ssize_t unused = ::write(g_pipe[1], &byte, 1);  // non-blocking: a full pipe wakes anyway
  (void)unused;
  errno = saved;
}

// Gives every caught signal its previous disposition (once), unless the program has installed a
// handler of its own since (which then stays).
void Restore() {
  if (g_restored.exchange(true)) return;
  for (int i = 0; i < kCount; ++i) {
    struct sigaction now;
    if (!g_installed[i] || ::sigaction(kSignals[i], nullptr, &now) != 0) continue;
    if (!(now.sa_flags & SA_SIGINFO) && now.sa_handler == OnSignal) {
      ::sigaction(kSignals[i], &g_previous[i], nullptr);
    }
  }
}

}  // namespace

std::unique_ptr<SignalGate> SignalGate::Acquire() {
  if (g_held.exchange(true)) return nullptr;
  // Never closed, so that a handler still running after a gate went never writes to a number
  // the process has reused.
  if (g_pipe[0] < 0 && ::pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_held = false;
    return nullptr;
  }
  g_caught = 0;
  g_restored = false;
  struct sigaction ours;
  std::memset(&ours, 0, sizeof(ours));
  ours.sa_handler = OnSignal;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESTART;
  for (int i = 0; i < kCount; ++i) {
    g_installed[i] = false;
    if (::sigaction(kSignals[i], nullptr, &g_previous[i]) != 0) continue;
    const bool ignored =
        !(g_previous[i].sa_flags & SA_SIGINFO) && g_previous[i].sa_handler == SIG_IGN;
    if (!ignored) g_installed[i] = ::sigaction(kSignals[i], &ours, nullptr) == 0;
  }
  return std::unique_ptr<SignalGate>(new SignalGate());
}

SignalGate::~SignalGate() {
  Restore();
  g_held = false;
}

int SignalGate::Wait(std::chrono::milliseconds timeout) {
  pollfd p{g_pipe[0], POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(timeout.count()));
  char drain[64];
  while (::read(g_pipe[0], drain, sizeof(drain)) > 0) {
  }
  return g_caught.load();
}

int SignalGate::caught() const { return g_caught.load(); }

void SignalGate::Deliver(int sig) {
  Restore();
  ::raise(sig);
}

int SignalGate::Release() {
  Restore();
  return g_caught.load();  // read after: a signal that came meanwhile is not lost
}

std::string SignalName(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGINT) return "SIGINT";
  return "signal " + std::to_string(sig);
}

}  // namespace savepoint::failover
