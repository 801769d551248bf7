// SIGTERM/SIGINT: record the signal, act at the next hook (see signals.h).
#include "manager/signals.h"

#include <signal.h>

#include <atomic>

namespace savepoint::manager {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
struct sigaction g_previous[2];
std::atomic<bool> g_installed{false};
std::atomic<int> g_pending{0};
static_assert(std::atomic<int>::is_always_lock_free);

void RestorePrevious() {
  for (int i = 0; i < 2; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
}

void Handler(int sig) {
  if (g_pending.load() != 0) {  // second signal: give up waiting for a hook
    RestorePrevious();
    ::raise(sig);
    return;
  }
  g_pending.store(sig);
}

}  // namespace

Status InstallSignalHandlers() {
  if (g_installed.exchange(true)) {
    return FailedPreconditionError(
        "handle_signals: another CheckpointManager in this process already handles signals");
  }
  g_pending.store(0);
  struct sigaction action {};
  action.sa_handler = Handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < 2; ++i) ::sigaction(kSignals[i], &action, &g_previous[i]);
  return Status::OK();
}

void UninstallSignalHandlers() {
  if (!g_installed.exchange(false)) return;
  RestorePrevious();
  g_pending.store(0);
}

int PendingSignal() { return g_pending.load(); }

void ReraiseSignal(int sig) {
  UninstallSignalHandlers();
  ::raise(sig);
}

}  // namespace savepoint::manager
