// The failover agent of one rank (savepoint/failover_rpc.h).
//
// One Session stream to the controller, three threads besides the training thread:
//  - the reader takes the controller's commands (Stop, Dump, Exit);
//  - the heartbeat thread sends the step state every heartbeat interval;
//  - a dump thread, started by a Dump command, writes this rank's part of the dump;
//  - unless SignalPolicy::kUntouched, a signal thread: it waits for SIGTERM / SIGINT caught by
//    the process's SignalGate and decides when the signal acts (signals.h): held back from the
//    controller's Stop until its Exit (the reader delivers it once the Exit arrived), at most
//    signal_budget; with no failure in sight after signal_settle, at once (kDefer) or after the
//    preemption checkpoint the controller is asked for (kCheckpoint);
//  - when the controller's Welcome names a snapshot directory (and the rank has a source), a
//    snapshot thread: after every snapshot_every-th EndUpdate it writes the state into that
//    directory (snapshot.h) while the training thread computes the next step; the next
//    BeginUpdate waits until it is written, since the update changes what it reads.
// The training thread only touches the step state under mu_ (BeginUpdate / EndUpdate), and parks
// in BeginUpdate once the controller has stopped the job.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include "failover/rpc/common.h"
#include "failover/rpc/dump_write.h"
#include "failover/rpc/relay_comm.h"
#include "failover/rpc/signals.h"
#include "failover/rpc/snapshot.h"
#include "savepoint/failover_rpc.h"

namespace savepoint {
namespace {

using failover::kTokenKey;
using Clock = std::chrono::steady_clock;
using Stream =
    grpc::ClientReaderWriter<failover::rpc::AgentMessage, failover::rpc::ControllerMessage>;

// The first of `names` that is set, as a rank or size; `otherwise` when none is (else
// InvalidArgument naming the first).
Result<int> EnvInt(std::initializer_list<const char*> names,
                   std::optional<int> otherwise = std::nullopt) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > (1 << 20)) {
      return InvalidArgumentError(fmt::format("{}={} is not a rank or size", name, v));
    }
    return static_cast<int>(n);
  }
  if (otherwise) return *otherwise;
  return InvalidArgumentError(fmt::format("{} is not set", *names.begin()));
}

Result<std::string> EnvString(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return InvalidArgumentError(fmt::format("{} is not set", name));
  return std::string(v);
}

class Agent final : public FailoverAgent {
 public:
  explicit Agent(AgentOptions o) : o_(std::move(o)) {}
  ~Agent() override { Abandon(); }

  Status Open();

  Status BeginUpdate(int64_t step) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] {
      return exit_.has_value() || ((!stopping_ || step <= stop_until_) && SnapshotIdle());
    });
    if (exit_) return *exit_;
    updating_ = true;
    return Status::OK();
  }
  void EndUpdate(int64_t step, int64_t epoch, int64_t step_in_epoch) override {
    std::lock_guard lock(mu_);
    state_.set_step(step);
    state_.set_epoch(epoch);
    state_.set_step_in_epoch(step_in_epoch > 0 ? step_in_epoch : step);
    updating_ = false;
    if (snapshots_on_ && step % snapshot_every_ == 0) snapshot_pending_ = step;
    cv_.notify_all();
  }
  Status Finish() override;
  void Abandon() override;
  Status controller_status() override {
    std::lock_guard lock(mu_);
    return controller_;
  }
  void PauseHeartbeatsForTesting(bool paused) override { heartbeats_paused_ = paused; }

 private:
  bool Send(const failover::rpc::AgentMessage& m) {
    std::lock_guard lock(write_mu_);
    return stream_ != nullptr && stream_->Write(m);
  }
  failover::rpc::StepState CurrentState() const {
    failover::rpc::StepState s = state_;
    if (!o_.source) s.set_step(-1);
    s.set_updating(updating_);
    for (const failover::StepInfo& at : snapshots_) {
      failover::rpc::SnapshotStep* p = s.add_snapshots();
      p->set_step(at.step);
      p->set_epoch(at.epoch);
      p->set_step_in_epoch(at.step_in_epoch);
    }
    return s;
  }
  // Under mu_: no snapshot waiting or being written.
  bool SnapshotIdle() const { return snapshot_pending_ < 0 && !snapshot_busy_; }
  void SnapshotLoop();
  // The part of another rank's snapshot (Dump::snapshot_rank), on a thread of its own.
  void WriteSnapshotPart(const failover::rpc::Dump& d);
  // The job is over: removes this rank's snapshots and those it wrote parts from (best effort).
  void DropSnapshots();
  Status Register();
  void ReadLoop();
  void HeartbeatLoop();
  void OnStop(const failover::rpc::Stop& stop);
  void OnExit(const failover::rpc::Exit& exit);
  void SignalLoop();
  // Lets a caught signal act (once); under the default action the process ends here.
  void DeliverSignal(const std::string& why);
  // Finish / Abandon, after the threads: gives the signals back, and lets one caught act.
  void ReleaseSignals(const std::string& why);
  Status Dump(const failover::rpc::Dump& d);
  void Join();

  AgentOptions o_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<failover::rpc::Failover::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> session_;
  std::mutex write_mu_;  // guards Write on stream_
  std::unique_ptr<Stream> stream_;
  std::chrono::milliseconds heartbeat_{100};

  std::mutex mu_;
  std::condition_variable cv_;
  failover::rpc::StepState state_;  // step -1 until the first EndUpdate
  bool updating_ = false;
  bool stopping_ = false;
  int64_t stop_until_ = -1;  // while stopping_, updates up to this step may still run
  bool closed_ = false;
  std::optional<Status> exit_;  // set once the job is over for this rank
  Status controller_;
  std::atomic<bool> heartbeats_paused_{false};
  // Snapshots (Welcome): the directory ("" = none), every how many steps, the step waiting to be
  // written (-1: none), whether one is being written, the newest written.
  std::string snapshot_dir_;
  int64_t snapshot_every_ = 1;
  bool snapshots_on_ = false;  // the snapshot thread runs and takes snapshots
  int64_t snapshot_pending_ = -1;
  bool snapshot_busy_ = false;
  std::vector<failover::StepInfo> snapshots_;  // committed, oldest first
  std::vector<int> parts_written_;             // ranks whose snapshot parts this agent wrote

  // Signals (SignalPolicy): the process's gate (null: untouched, or another agent holds it),
  // when the first caught signal was seen, whether a preemption checkpoint was asked for.
  std::unique_ptr<failover::SignalGate> gate_;
  std::optional<Clock::time_point> signal_at_;
  bool preempt_sent_ = false;
  std::atomic<bool> signal_delivered_{false};

  std::thread reader_, heartbeat_thread_, dump_thread_, snapshot_thread_, signal_thread_;
  std::vector<std::thread> part_threads_;
};

Status Agent::Open() {
  state_.set_step(-1);
  channel_ = grpc::CreateChannel(o_.controller, grpc::InsecureChannelCredentials());
  stub_ = failover::rpc::Failover::NewStub(channel_);
  const auto give_up = std::chrono::system_clock::now() + o_.connect_timeout;
  Status s;
  do {
    if (!channel_->WaitForConnected(
            std::min(give_up, std::chrono::system_clock::now() + std::chrono::milliseconds(200)))) {
      s = IOError(fmt::format("cannot reach the failover controller at {}", o_.controller));
      continue;
    }
    s = Register();
    if (s.ok() || s.code() != StatusCode::kIOError) break;
  } while (std::chrono::system_clock::now() < give_up);
  if (!s.ok()) return s;
  // The gate first: the reader (OnExit) and Finish read gate_ without a lock.
  if (o_.signals != SignalPolicy::kUntouched) {
    gate_ = failover::SignalGate::Acquire();
    if (!gate_) {
      failover::Log().debug(
          "savepoint failover: rank {}: another agent of this process holds the signals", o_.rank);
    }
  }
  reader_ = std::thread([this] { ReadLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  if (!snapshot_dir_.empty() && o_.source) {
    snapshots_on_ = true;
    snapshot_thread_ = std::thread([this] { SnapshotLoop(); });
  }
  if (gate_) signal_thread_ = std::thread([this] { SignalLoop(); });
  return Status::OK();
}

Status Agent::Register() {
  session_ = std::make_unique<grpc::ClientContext>();
  session_->AddMetadata(kTokenKey, o_.token);
  auto stream = stub_->Session(session_.get());
  failover::rpc::AgentMessage hello;
  failover::rpc::Hello* h = hello.mutable_hello();
  h->set_rank(o_.rank);
  h->set_world(o_.world);
  h->set_pid(::getpid());
  h->set_generation(o_.generation);
  char host[256] = {};
  if (!o_.host.empty()) {
    h->set_host(o_.host);
  } else if (::gethostname(host, sizeof(host) - 1) == 0) {
    h->set_host(host);
  }
  failover::GroupsToProto(o_.groups, h->mutable_groups());
  failover::rpc::ControllerMessage welcome;
  if (!stream->Write(hello) || !stream->Read(&welcome) || !welcome.has_welcome()) {
    Status s = failover::FromGrpc(stream->Finish(), "register with the failover controller");
    return s.ok() ? IOError("the failover controller closed the session") : s;
  }
  heartbeat_ = std::chrono::milliseconds(std::max<int64_t>(welcome.welcome().heartbeat_ms(), 1));
  snapshot_dir_ = welcome.welcome().snapshot_dir();
  snapshot_every_ = std::max<int64_t>(welcome.welcome().snapshot_every(), 1);
  std::lock_guard lock(write_mu_);
  stream_ = std::move(stream);
  return Status::OK();
}

void Agent::ReadLoop() {
  failover::rpc::ControllerMessage m;
  while (stream_->Read(&m)) {
    if (m.has_stop()) OnStop(m.stop());
    if (m.has_exit()) OnExit(m.exit());
    if (m.has_dump() && m.dump().has_snapshot_rank()) {
      part_threads_.emplace_back([this, d = m.dump()] { WriteSnapshotPart(d); });
    } else if (m.has_dump() && !dump_thread_.joinable()) {
      dump_thread_ = std::thread([this, d = m.dump()] {
        Status s = Dump(d);
        if (!s.ok())
          failover::Log().error("savepoint failover: rank {}: dump: {}", o_.rank, s.ToString());
        failover::rpc::AgentMessage done;
        done.mutable_dump_done()->set_code(static_cast<int32_t>(s.code()));
        done.mutable_dump_done()->set_message(s.message());
        done.mutable_dump_done()->set_writer(d.writer());
        Send(done);
      });
    }
  }
  std::lock_guard lock(mu_);
  if (closed_ || exit_) return;  // closed, or told the job is over
  controller_ = IOError(fmt::format("lost the failover controller at {}", o_.controller));
  failover::Log().warn("savepoint failover: rank {}: {}; training goes on without failure dumps",
                       o_.rank, controller_.message());
  if (stopping_ && !exit_) exit_ = FailedPreconditionError("job stopped: " + controller_.message());
  cv_.notify_all();
}

void Agent::HeartbeatLoop() {
  std::unique_lock lock(mu_);
  while (!closed_ && controller_.ok()) {
    if (!heartbeats_paused_) {
      failover::rpc::AgentMessage m;
      *m.mutable_heartbeat() = CurrentState();
      lock.unlock();
      bool sent = Send(m);
      lock.lock();
      if (!sent) break;
    }
    cv_.wait_for(lock, heartbeat_, [&] { return closed_; });
  }
}

void Agent::OnStop(const failover::rpc::Stop& stop) {
  failover::rpc::AgentMessage m;
  {
    std::unique_lock lock(mu_);
    stopping_ = true;
    stop_until_ = stop.until_step();
    failover::Log().warn("savepoint failover: rank {}: stopped{}: {}", o_.rank,
                         stop_until_ >= 0 ? fmt::format(" at step {}", stop_until_) : "",
                         stop.reason());
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::milliseconds(stop.grace_ms()),
                 [&] { return !updating_ && state_.step() >= stop_until_ && SnapshotIdle(); });
    *m.mutable_paused() = CurrentState();
  }
  Send(m);
}

void Agent::OnExit(const failover::rpc::Exit& exit) {
  {
    std::lock_guard lock(mu_);
    Status why = failover::FromWire(exit.code(), exit.reason());
    exit_ = why.ok() ? why : FailedPreconditionError("job stopped: " + exit.reason());
  }
  DropSnapshots();  // the dump is over
  // The controller's decision is carried out: a signal held back acts now (the training thread,
  // still parked, cannot exit first).
  if (gate_ && gate_->caught() != 0) DeliverSignal("the dump is over");
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

void Agent::DeliverSignal(const std::string& why) {
  if (signal_delivered_.exchange(true)) return;
  const int sig = gate_->caught();
  failover::Log().warn("savepoint failover: rank {}: {}: acting on {}", o_.rank, why,
                       failover::SignalName(sig));
  gate_->Deliver(sig);
}

void Agent::ReleaseSignals(const std::string& why) {
  if (!gate_) return;
  if (gate_->Release() != 0) DeliverSignal(why);  // (its restore is done already)
  gate_.reset();
}

void Agent::SignalLoop() {
  bool told = false;
  for (;;) {
    const int sig = gate_->Wait(std::chrono::milliseconds(20));
    std::unique_lock lock(mu_);
    if (closed_ || signal_delivered_) return;
    if (sig == 0) continue;
    const Clock::time_point now = Clock::now();
    if (!signal_at_) signal_at_ = now;
    const std::string name = failover::SignalName(sig);
    const bool failure = stopping_ && !exit_;
    // A launcher that saw a rank die signals the survivors at once: a failure's Stop may still
    // be on its way, so a preemption is asked for only after signal_settle.
    const bool settled = now - *signal_at_ >= o_.signal_settle;
    const bool preempt = !stopping_ && o_.signals == SignalPolicy::kCheckpoint && settled;
    if (!told && (failure || preempt)) {
      told = true;
      failover::Log().warn("savepoint failover: rank {}: {} held back until {} (at most {} ms)",
                           o_.rank, name,
                           failure ? "this rank's part of the dump is written"
                                   : "the preemption checkpoint is committed",
                           o_.signal_budget.count());
    }
    if (preempt && !preempt_sent_ && controller_.ok()) {
      preempt_sent_ = true;
      lock.unlock();
      failover::rpc::AgentMessage m;
      m.set_preempt(sig);
      Send(m);
      continue;
    }
    std::string why;
    if (exit_) {
      why = "the job is over";
    } else if ((failure || preempt_sent_) && now - *signal_at_ >= o_.signal_budget) {
      why = fmt::format(
          "gave up after {} ms: {} is not written, so nothing of it is committed and the newest "
          "checkpoint stays the newest",
          o_.signal_budget.count(), failure ? "the dump" : "the checkpoint");
    } else if (!failure && !preempt_sent_ && settled &&
               (o_.signals != SignalPolicy::kCheckpoint || !controller_.ok())) {
      why = "no failure in sight";
    } else {
      continue;
    }
    lock.unlock();
    DeliverSignal(why);
    return;  // a handler ran (the process lives on): the signals are the program's again
  }
}

void Agent::WriteSnapshotPart(const failover::rpc::Dump& d) {
  auto comm =
      failover::NewRelayCommunicator(stub_.get(), o_.token, d.dump_id(), d.writer(), d.writers());
  Status s = failover::WriteSnapshotPart(d, snapshot_dir_, o_.world, *comm, o_.save, o_.io);
  if (!s.ok()) {
    failover::Log().error("savepoint failover: rank {}: rank {}'s part from its snapshot: {}",
                          o_.rank, d.snapshot_rank(), s.ToString());
  }
  failover::rpc::AgentMessage done;
  done.mutable_dump_done()->set_code(static_cast<int32_t>(s.code()));
  done.mutable_dump_done()->set_message(s.message());
  done.mutable_dump_done()->set_writer(d.writer());
  {
    std::lock_guard lock(mu_);
    parts_written_.push_back(d.snapshot_rank());
  }
  Send(done);
}

void Agent::DropSnapshots() {
  std::vector<int> ranks;
  {
    std::lock_guard lock(mu_);
    if (snapshot_dir_.empty()) return;
    ranks = parts_written_;
  }
  ranks.push_back(o_.rank);
  FileSystem* fs = DefaultFileSystem();
  for (int r : ranks) fs->RemoveAll(failover::SnapshotRankDir(snapshot_dir_, r)).IgnoreError();
  fs->RemoveDir(snapshot_dir_).IgnoreError();  // the last rank of its host removes the run's
}

Status Agent::Dump(const failover::rpc::Dump& d) {
  failover::StepInfo at;
  {
    std::lock_guard lock(mu_);
    if (state_.step() != d.step() || updating_) {
      return FailedPreconditionError(fmt::format("rank {} is not parked at step {} (at {})",
                                                 o_.rank, d.step(), state_.step()));
    }
    at = {state_.step(), state_.epoch(), state_.step_in_epoch()};
  }
  if (!o_.source) return FailedPreconditionError("no dump source");
  SP_ASSIGN_OR_RETURN(DumpSource src, o_.source());
  auto comm =
      failover::NewRelayCommunicator(stub_.get(), o_.token, d.dump_id(), d.writer(), d.writers());
  return failover::WriteDumpPart(d, src, o_.rank, o_.world, at, *comm, o_.save, o_.io);
}

void Agent::SnapshotLoop() {
  const std::string rank_dir = failover::SnapshotRankDir(snapshot_dir_, o_.rank);
  failover::SnapshotWriter writer(snapshot_dir_, o_.rank, o_.world, SaveOptions{}, o_.io);
  // On another host than the controller's, this host's ranks make the run directory.
  if (Status s = failover::MakePrivateDir(snapshot_dir_); !s.ok()) {
    failover::Log().warn("savepoint failover: rank {}: {}; no snapshots", o_.rank, s.ToString());
    std::lock_guard lock(mu_);
    snapshots_on_ = false;
    return;
  }
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return closed_ || !controller_.ok() || snapshot_pending_ >= 0; });
    if (closed_ || !controller_.ok()) break;
    const failover::StepInfo at{snapshot_pending_, state_.epoch(), state_.step_in_epoch()};
    snapshot_pending_ = -1;
    snapshot_busy_ = true;
    lock.unlock();
    Result<DumpSource> src = o_.source();
    Status s = src.ok() ? writer.Write(*src, at) : src.status();
    lock.lock();
    snapshot_busy_ = false;
    cv_.notify_all();
    if (!s.ok()) {
      // Not fatal: training goes on, a failure then dumps from replicas only.
      failover::Log().warn(
          "savepoint failover: rank {}: snapshot of step {}: {}; no more snapshots", o_.rank,
          at.step, s.ToString());
      break;
    }
    snapshots_ = writer.committed();
  }
  snapshots_on_ = false;
  snapshot_pending_ = -1;
  cv_.notify_all();
  const bool lost = !controller_.ok();
  lock.unlock();
  // Nobody will read them once the controller is gone: give the memory back.
  if (lost) DefaultFileSystem()->RemoveAll(rank_dir).IgnoreError();
}

Status Agent::Finish() {
  {
    std::lock_guard lock(mu_);
    if (closed_) return FailedPreconditionError("the agent is closed");
    closed_ = true;
    cv_.notify_all();
  }
  failover::rpc::AgentMessage m;
  m.set_finished(true);
  bool sent = Send(m);
  {
    std::lock_guard lock(write_mu_);
    if (stream_) stream_->WritesDone();
  }
  Join();
  DropSnapshots();
  ReleaseSignals("the agent finished");
  return sent ? Status::OK() : controller_status();
}

void Agent::Abandon() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    if (!exit_) exit_ = FailedPreconditionError("the failover agent was closed");
    cv_.notify_all();
  }
  if (session_) session_->TryCancel();
  Join();
  ReleaseSignals("the agent was closed");
}

void Agent::Join() {
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (reader_.joinable()) reader_.join();
  if (dump_thread_.joinable()) dump_thread_.join();
  for (std::thread& t : part_threads_) t.join();
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  if (signal_thread_.joinable()) signal_thread_.join();
  std::lock_guard lock(write_mu_);
  if (stream_) stream_->Finish().ok();
  stream_.reset();
}

}  // namespace

Result<AgentOptions> AgentOptionsFromEnv() {
  AgentOptions o;
  SP_ASSIGN_OR_RETURN(o.controller, EnvString("SAVEPOINT_CONTROLLER"));
  SP_ASSIGN_OR_RETURN(o.token, EnvString("SAVEPOINT_JOB_TOKEN"));
  SP_ASSIGN_OR_RETURN(o.rank, EnvInt({"SAVEPOINT_RANK", "RANK", "OMPI_COMM_WORLD_RANK"}));
  SP_ASSIGN_OR_RETURN(o.world,
                      EnvInt({"SAVEPOINT_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"}));
  return o;
}

Result<std::unique_ptr<FailoverAgent>> FailoverAgent::Connect(AgentOptions options) {
  SP_RETURN_IF_ERROR(failover::CheckToken(options.token));
  if (options.controller.empty()) return InvalidArgumentError("no controller address");
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    return InvalidArgumentError(fmt::format("rank {} of {}", options.rank, options.world));
  }
  if (options.generation < 0) {
    // The launcher's restart count; 0 when it does not say.
    SP_ASSIGN_OR_RETURN(options.generation,
                        EnvInt({"SAVEPOINT_GENERATION", "TORCHELASTIC_RESTART_COUNT"}, 0));
  }
  if (options.signal_budget.count() < 0 || options.signal_settle.count() < 0) {
    return InvalidArgumentError("signal_budget and signal_settle must be >= 0");
  }
  auto agent = std::make_unique<Agent>(std::move(options));
  SP_RETURN_IF_ERROR(agent->Open());
  return std::unique_ptr<FailoverAgent>(std::move(agent));
}

}  // namespace savepoint
