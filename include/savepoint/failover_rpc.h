// Failure-time checkpoints over gRPC: the controller that watches a job's ranks, and the agent
// each rank runs (docs/FAILOVER.md). Library savepoint_failover (built when Debian's
// libgrpc++-dev and protobuf-compiler-grpc are present), over libsavepoint.
//
// The controller runs outside the ranks (`savepoint controller`, started by the launcher). Each
// rank connects an agent, reports its step state around every optimizer update
// (BeginUpdate / EndUpdate) and heartbeats from a background thread. When a rank exits, is killed
// (its connection drops) or stops heartbeating (heartbeat_timeout), the controller:
//  1. stops the survivors at a step boundary (BeginUpdate blocks; an update under way may end),
//  2. applies DecideDump (savepoint/failover.h) to their parked step states,
//  3. has one writer per replica group save its part of step n with SaveDistributed over a
//     Communicator whose collectives the controller relays (no MPI, no dead rank involved); the
//     writers' coordinator commits the one manifest by atomic rename, so a writer that dies
//     mid-dump leaves nothing committed,
//  4. tells every survivor to exit (BeginUpdate returns the reason).
// Every message carries the job token; a wrong one is refused (UNAUTHENTICATED).
//
// Environment (AgentOptionsFromEnv, `savepoint controller`):
//   SAVEPOINT_CONTROLLER   host:port of the controller
//   SAVEPOINT_JOB_TOKEN    the shared job token (at least 16 characters)
//   SAVEPOINT_RANK, SAVEPOINT_WORLD_SIZE   this rank and the job's size (else RANK / WORLD_SIZE,
//                          else OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE)
//   SAVEPOINT_GENERATION   how many times the launcher restarted the job (else torchrun's
//                          TORCHELASTIC_RESTART_COUNT, else 0): AgentOptions::generation
#ifndef SAVEPOINT_FAILOVER_RPC_H_
#define SAVEPOINT_FAILOVER_RPC_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/export.h"
#include "savepoint/failover.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint {

// What a rank hands the dump: its state at the step it is parked at.
struct SAVEPOINT_API DumpSource {
  // Tensors (usually views of the live training buffers) and values (data-loader position, RNG
  // state, ...). The dump adds "failover.step", "failover.source_rank" and the manager metadata.
  State state;
  // The tensors' layout (ShardLayout semantics; a tensor without an entry is replicated on every
  // rank). Default: empty (pure data parallel).
  ShardLayout layout;
};

// What SIGTERM and SIGINT do to a rank with an agent (docs/FAILOVER.md, "Launchers and signals").
// Launchers answer one rank's death by sending SIGTERM to the others (SIGKILL a grace period
// later): a survivor that writes the dump must outlive it.
enum class SignalPolicy {
  // The agent leaves both signals alone.
  kUntouched,
  // The default. From Connect until Finish / Abandon, the agent catches them (the first agent of
  // a process; a signal the process ignores stays ignored). While the controller handles a
  // failure (from its Stop until its Exit), a caught signal waits until this rank's part of the
  // dump is written, at most signal_budget from its arrival; past the budget the rank gives up
  // (one line on stderr; the dump then commits nothing, the newest checkpoint stays the newest).
  // With no failure in sight for signal_settle, it acts at once. Then the signal is delivered
  // as the process had it before: the default action ends the process by that signal (the exit
  // the launcher expects), a handler (Python's KeyboardInterrupt) runs.
  kDefer,
  // As kDefer, but a signal with no failure in sight first asks the controller for a checkpoint
  // of the job's current step (preemption: Slurm's --signal, Kubernetes' grace period, spot
  // notices): the controller stops every rank at a step boundary, has the writers commit it as
  // it commits a failure dump, and ends the job; then the signal acts (within signal_budget).
  kCheckpoint,
};

struct SAVEPOINT_API AgentOptions {
  // host:port of the controller. Required.
  std::string controller;
  // The job token, the same as the controller's. Required (at least 16 characters).
  std::string token;
  // This rank and the job's size. Required: 0 <= rank < world.
  int rank = -1;
  int world = 0;
  // The replica groups of this rank's state (ReplicaGroupsOf, or DataParallelGroups; sparse tables
  // are the group {rank}: docs/FAILOVER.md, "What a dump holds"). Default:
  // empty = every rank holds the same state (one group of all ranks).
  std::vector<ReplicaGroup> groups;
  // Called on the agent's dump thread when this rank is chosen to write a dump, while the
  // training thread is parked (in BeginUpdate, or blocked elsewhere outside an update): returns
  // the state at the last step passed to EndUpdate. Required for a rank to be a writer; a rank
  // without it reports itself as holding no step.
  std::function<Result<DumpSource>()> source;
  // This rank's host as the controller sees it: a dead rank's snapshot is read by the controller
  // when it runs on the same host, else by a survivor of the same host. Set it when host names do
  // not tell which processes share shared memory (e.g. containers of one machine sharing
  // /dev/shm). Default: empty = gethostname().
  std::string host;
  // How long Connect waits for the controller (it retries while the controller starts).
  // Default: 10 s.
  std::chrono::milliseconds connect_timeout{10000};
  // Options of the dump's save (format, compression, key; overwrite is ignored). Default: {}.
  SaveOptions save;
  // File system and I/O threads of the dump's save. Default: IoOptions defaults.
  IoOptions io;
  // SIGTERM / SIGINT handling (see SignalPolicy). Default: kDefer.
  SignalPolicy signals = SignalPolicy::kDefer;
  // Longest a caught signal waits for this rank's part of a dump (or the preemption checkpoint),
  // from its arrival. Default: 25 s (inside torchrun's and Slurm's 30 s).
  std::chrono::milliseconds signal_budget{25000};
  // How long a signal with no failure in sight waits for the controller's Stop (a launcher may
  // signal before the controller has seen the death) before it acts. Default: 500 ms.
  std::chrono::milliseconds signal_settle{500};
  // How many times the launcher restarted the job (torchrun's restart count): the controller
  // serves generation after generation (ControllerOptions::max_restarts) and refuses ranks of an
  // older one. Default: -1 = $SAVEPOINT_GENERATION, else $TORCHELASTIC_RESTART_COUNT, else 0.
  int generation = -1;
};

// Options from the environment (see above): controller, token, rank, world. Other fields keep
// their defaults. InvalidArgument naming the variable that is missing or malformed.
SAVEPOINT_API Result<AgentOptions> AgentOptionsFromEnv();

// One rank's connection to the controller.
// Thread safety: BeginUpdate / EndUpdate / Finish are called from the training thread; the agent's
// own threads heartbeat, receive commands and write dumps.
class SAVEPOINT_API FailoverAgent {
 public:
  // Connects and registers (retrying until connect_timeout to reach the controller), then waits
  // until every rank of the job has registered (the job starts together). Unauthenticated for a
  // wrong token; FailedPrecondition when the controller refuses the rank (taken, or declared
  // dead).
  static Result<std::unique_ptr<FailoverAgent>> Connect(AgentOptions options);
  // Drops the connection (as Abandon) unless Finish was called.
  virtual ~FailoverAgent() = default;

  // Before the optimizer changes the state for `step`. OK: go on. When the controller has stopped
  // the job (another rank failed), blocks until the dump is over and returns the reason
  // (kFailedPrecondition, "job stopped: ..."): the rank should exit without touching its state.
  virtual Status BeginUpdate(int64_t step) = 0;
  // After the update of `step`: the state is now that of `step`. `epoch` / `step_in_epoch` name a
  // dump of this step (default: epoch 1, step_in_epoch = step).
  virtual void EndUpdate(int64_t step, int64_t epoch = 1, int64_t step_in_epoch = 0) = 0;
  // The job is over for this rank: says so and disconnects.
  virtual Status Finish() = 0;
  // Drops the connection without a word, as a crash does (tests; a rank leaving unannounced).
  virtual void Abandon() = 0;
  // OK while connected; the error once the controller was lost (training may go on unprotected).
  virtual Status controller_status() = 0;

  // For tests: stop / resume sending heartbeats (a hung rank whose connection stays up).
  virtual void PauseHeartbeatsForTesting(bool paused) = 0;
};

// How a failure dump is named and laid out in ControllerOptions::directory.
enum class DumpNaming {
  // A native savepoint checkpoint named FailureDumpName(prefix, epoch, step_in_epoch):
  // CheckpointManager indexes it. The default.
  kManager,
  // A native savepoint checkpoint named MindSporeDumpName(step): "tft_saved_checkpoints-step_{n}".
  kMindSpore,
  // Seed 004's MindSpore layout: the directory MindSporeDumpName(step) holds, for every rank r of
  // the job (dead ones included), MindSporeRankCheckpointPath(r, epoch, step_in_epoch) =
  // "rank_{r}/ttp_rank_{r}-{epoch}_{step_in_epoch}.ckpt", a MindSpore .ckpt (with the CRC
  // trailer) of r's whole state at step n, written by the writer of r's replica group
  // (SaveMindSporeDump; AgentOptions::save does not apply). Needs every rank's state in exactly
  // one group (CheckMindSporeDumpGroups), else the dump fails with FailedPrecondition. Not
  // indexed by CheckpointManager: it is for MindSpore's load_checkpoint.
  kMindSporeCkpt,
};

// What happened to a job (to one generation of it, ControllerOptions::max_restarts).
struct SAVEPOINT_API JobOutcome {
  int generation = 0;                 // the generation this is about
  bool failure = false;               // a rank failed
  bool preempted = false;             // a rank asked for a checkpoint (SignalPolicy::kCheckpoint)
  int preempted_by = -1;              // that rank
  int failed_rank = -1;               // the first rank declared dead
  std::string reason;                 // why it was declared dead
  std::vector<int> dead;              // every rank declared dead
  bool dumped = false;                // a dump was committed
  std::string dump_path;              // its path (when dumped)
  int64_t dump_step = -1;             // its step
  std::vector<int> writers;           // ranks that wrote it from their live state
  std::vector<int> snapshot_writers;  // ranks whose part came from their snapshot
  Status dump_status;                 // why there is no dump (when failure && !dumped)
  int64_t detected_unix_ns = 0;       // when the failure was detected (system clock)
  double detect_to_commit_ms = 0;     // from detection to the committed dump (or to giving up)
  int64_t refused_calls = 0;          // calls refused for a wrong or missing token
  int64_t late_messages = 0;          // messages of ranks already declared dead, ignored
};

struct SAVEPOINT_API ControllerOptions {
  // Address to listen on, "host:port" (port 0: any free port, see FailoverController::port).
  // Default: "127.0.0.1:0".
  std::string listen = "127.0.0.1:0";
  // The job token. Required (at least 16 characters).
  std::string token;
  // Number of ranks. Required (>= 1).
  int world = 0;
  // Where dumps go (shared storage), e.g. the CheckpointManager directory, or a bucket prefix
  // ("s3://bucket/run", savepoint/s3.h; DumpNaming::kManager only, since the MindSpore layout
  // commits by a rename). Required.
  std::string directory;
  // Name prefix of dumps under DumpNaming::kManager. Default: "ckpt".
  std::string prefix = "ckpt";
  DumpNaming naming = DumpNaming::kManager;
  // Heartbeat interval the agents use. Default: 100 ms.
  std::chrono::milliseconds heartbeat_interval{100};
  // A rank whose last heartbeat is older than this is declared dead. Default: 1000 ms.
  std::chrono::milliseconds heartbeat_timeout{1000};
  // How long survivors may take to park after Stop (an update under way finishing). Default: 2 s.
  std::chrono::milliseconds stop_grace{2000};
  // Timeout of each collective of the dump. Default: 60 s.
  std::chrono::milliseconds dump_timeout{60000};
  // How long to wait for every rank to register. Default: 5 minutes.
  std::chrono::milliseconds register_timeout{300000};
  // Shared-memory snapshots (docs/FAILOVER.md, "Snapshots"): a directory on a memory-backed file
  // system, the same path on every host (e.g. "/dev/shm"). The controller names a private run
  // directory in it (mode 0700), and every rank that has a dump source writes a snapshot of its
  // state there, on its own host, after every `snapshot_every` steps. A dead rank's snapshot
  // then stands in for a missing replica, so a job with data parallel = 1 still gets a dump: the
  // controller writes that part when the rank ran on its host, else a survivor of the rank's
  // host does (a rank whose whole host is gone has no snapshot left). The run directory is
  // removed when the job is over. Default: empty = no snapshots.
  std::string snapshot_dir;
  // Every how many steps a rank writes a snapshot (>= 1). Default: 1 (every step).
  int64_t snapshot_every = 1;
  // Options of the parts of a dump the controller writes from snapshots (format, compression,
  // key, as the agents' AgentOptions::save; overwrite is ignored). Default: {}.
  SaveOptions snapshot_save;
  // How many restarted generations of the job to serve (the launcher's restarts, as torchrun's
  // --max-restarts). After a failure is handled, the controller waits register_timeout for the
  // ranks of a newer generation (AgentOptions::generation; the same number when the launcher
  // does not count) and protects them as the first. The job ends when every rank of a
  // generation finished, a failure leaves no restart, a rank asked for a preemption checkpoint,
  // or no new generation registers in time. Default: 0 (the job ends at its first failure).
  int max_restarts = 0;
  // Called on the controller's thread as each generation ends (with its outcome), before the
  // next one is admitted. Default: none.
  std::function<void(const JobOutcome&)> on_generation_end;
};

// The controller: a gRPC server watching one job.
// Thread safety: all methods may be called from any thread.
class SAVEPOINT_API FailoverController {
 public:
  // Validates the options and starts listening. InvalidArgument for bad options; IOError when the
  // address cannot be bound.
  static Result<std::unique_ptr<FailoverController>> Start(ControllerOptions options);
  virtual ~FailoverController() = default;
  // The port listened on.
  virtual int port() const = 0;
  // Blocks until the job is over (ControllerOptions::max_restarts says when) and returns the
  // last generation's outcome; DeadlineExceeded when the first generation's ranks did not all
  // register in time.
  virtual Result<JobOutcome> Wait() = 0;
};

}  // namespace savepoint

#endif  // SAVEPOINT_FAILOVER_RPC_H_
