// Internal: SIGTERM/SIGINT handling for CheckpointManager
// (ManagerOptions::breakpoints.handle_signals).
//
// The handler is async-signal-safe: the first signal only records its number in a lock-free
// atomic; the manager acts on it at its next hook. A second signal before that restores the
// previous handlers (sigaction) and re-raises (raise), so a stuck program can still be stopped.
#ifndef SAVEPOINT_MANAGER_SIGNALS_H_
#define SAVEPOINT_MANAGER_SIGNALS_H_

#include "savepoint/status.h"

namespace savepoint::manager {

// Installs the handlers for SIGTERM and SIGINT. FailedPrecondition if already installed.
Status InstallSignalHandlers();
// Restores the previous handlers (no-op when not installed). Clears a pending signal.
void UninstallSignalHandlers();
// The signal received since installation, or 0.
int PendingSignal();
// Restores the previous handlers and raises `sig` again (for the default action: terminates).
void ReraiseSignal(int sig);

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_SIGNALS_H_
