// The termination signals a launcher sends (SIGTERM, SIGINT), held back while a failure dump is
// under way (docs/FAILOVER.md, "Launchers and signals").
//
// torchrun, Slurm and Kubernetes answer one rank's death by sending SIGTERM to the others and
// SIGKILL a grace period later. A survivor chosen to write the dump must live until its part is
// written, so the agent catches these signals, decides what each one means (a failure is being
// handled: defer; else exit as asked, or checkpoint first) and then delivers it to the process
// with the disposition it had before: the default action ends the process by that signal, as the
// launcher expects; a handler the program installed (Python's KeyboardInterrupt) runs.
//
// Process-wide: one SignalGate at a time holds the signals (the first agent of a process). The
// handler only records the signal and writes one byte to a pipe (async-signal-safe); the owner's
// thread waits on that pipe.
#ifndef SAVEPOINT_FAILOVER_RPC_SIGNALS_H_
#define SAVEPOINT_FAILOVER_RPC_SIGNALS_H_

#include <chrono>
#include <memory>
#include <string>

namespace savepoint::failover {

class SignalGate {
 public:
  // Catches SIGTERM and SIGINT (a signal the process ignores stays ignored). nullptr when another
  // gate of this process holds them, or the pipe cannot be made.
  static std::unique_ptr<SignalGate> Acquire();
  // Gives the signals back their previous disposition (Release). A signal caught is not
  // delivered: call Release and Deliver for that.
  ~SignalGate();
  SignalGate(const SignalGate&) = delete;
  SignalGate& operator=(const SignalGate&) = delete;

  // Waits up to `timeout` for a signal (the whole timeout once one was seen: a pacing for the
  // caller's loop); returns the first one caught so far (0: none). Thread safety: one waiting
  // thread.
  int Wait(std::chrono::milliseconds timeout);
  // The first signal caught so far (0: none). Any thread.
  int caught() const;
  // Gives both signals back their previous disposition and raises `sig` on the calling thread:
  // under the default action the process ends here. Returns when the previous disposition was
  // a handler (which has run). Later signals take their previous disposition. Any thread, once.
  // A signal whose handler the program replaced since Acquire keeps the program's.
  void Deliver(int sig);
  // Gives both signals back their previous disposition, then returns the first signal caught
  // (0: none), which the caller should Deliver: no signal that came before is lost.
  int Release();

 private:
  SignalGate() = default;
};

// "SIGTERM", "SIGINT", else "signal N".
std::string SignalName(int sig);

}  // namespace savepoint::failover

#endif  // SAVEPOINT_FAILOVER_RPC_SIGNALS_H_
