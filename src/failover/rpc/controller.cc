// The failover controller (savepoint/failover_rpc.h).
//
// A synchronous gRPC server. Each rank's Session runs on a server thread that reads the rank's
// messages into its slot; the driver thread watches the slots (registration, heartbeat deadlines,
// disconnects) and runs the failure protocol:
//   detect -> Stop to every survivor -> wait until each parked (or stop_grace) -> DecideDump ->
//   Dump to each writer -> wait for every writer's DumpDone (a writer that dies breaks the dump's
//   relayed collectives, so its coordinator commits nothing) -> Exit to every survivor.
// The dump's collectives (rpc Collective) are rounds in `dump_`: round k completes when every
// writer has sent its k-th contribution; a dead writer, an abort or a deadline breaks the dump.
// Everything shared is guarded by mu_; each slot's stream has its own write mutex, and the stream
// pointer is cleared (under that mutex) when its Session returns.
// Generations (ControllerOptions::max_restarts): after a failure is handled, the slots are
// emptied and the ranks of the launcher's next generation register into them; a Session of an
// earlier generation no longer owns its slot (its stream is not the slot's), so what it says
// and its end are ignored. A rank's preemption request (AgentMessage::preempt) is handled as a
// failure without a dead rank: stop, dump the current step, exit, and the job ends.
// Snapshots (ControllerOptions::snapshot_dir): every rank writes them into the run directory on
// its host. A dump part whose source is a snapshot is one more writer, on the snapshot's host:
// here (a thread joining the dump's collectives through an in-process channel to this server)
// when that is this host, else a parked survivor of that host (Dump::snapshot_rank).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "failover/rpc/common.h"
#include "failover/rpc/dump_write.h"
#include "failover/rpc/relay_comm.h"
#include "failover/rpc/signals.h"
#include "failover/rpc/snapshot.h"
#include "savepoint/failover_rpc.h"

namespace savepoint {
namespace {

using failover::rpc::AgentMessage;
using failover::rpc::ControllerMessage;
using Clock = std::chrono::steady_clock;
using ServerStream = grpc::ServerReaderWriter<ControllerMessage, AgentMessage>;

struct Slot {
  bool registered = false;
  bool healthy = true;
  bool finished = false;
  bool paused = false;
  Clock::time_point last_beat;
  failover::rpc::StepState state;
  std::vector<ReplicaGroup> groups;
  std::string host;
  std::vector<failover::StepInfo> snapshots;  // usable snapshots, set when parked
  std::unique_ptr<std::mutex> write_mu = std::make_unique<std::mutex>();
  ServerStream* stream = nullptr;  // while its Session runs
};

struct DumpRounds {
  struct Round {
    std::vector<std::string> in;
    std::vector<bool> sent;  // per writer: its bytes arrived (once)
    int arrived = 0;
    int left = 0;
  };
  std::string id;
  std::vector<int> writers;  // writer index -> the rank it runs in (-1: here, from a snapshot)
  Status broken;
  std::map<uint64_t, Round> rounds;
};

int64_t UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RandomId() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

class Controller final : public FailoverController, public failover::rpc::Failover::Service {
 public:
  explicit Controller(ControllerOptions o) : o_(std::move(o)), slots_(o_.world) {}
  ~Controller() override {
    {
      std::lock_guard lock(mu_);
      shutdown_ = true;
      cv_.notify_all();
    }
    if (driver_.joinable()) driver_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    RemoveRunDir();
  }

  Status Listen();
  int port() const override { return port_; }
  Result<JobOutcome> Wait() override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (!ended_.ok()) return ended_;
    return outcome_;  // the last generation's (and what its ranks sent after its end)
  }

  grpc::Status Session(grpc::ServerContext* ctx, ServerStream* stream) override;
  grpc::Status Collective(grpc::ServerContext* ctx, const failover::rpc::CollectiveRequest* req,
                          failover::rpc::CollectiveReply* reply) override;

 private:
  grpc::Status Refuse() {
    std::lock_guard lock(mu_);
    ++outcome_.refused_calls;
    failover::Log().warn("savepoint controller: refused a call without the job token");
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token");
  }
  grpc::Status Admit(const failover::rpc::Hello& h, ServerStream* stream);
  grpc::Status AdmitGeneration(std::unique_lock<std::mutex>& lock, int64_t generation);
  void Absorb(int rank, ServerStream* stream, const AgentMessage& m);
  void Preempt(int rank, int sig);
  void Detach(int rank, ServerStream* stream);
  void Send(int rank, const ControllerMessage& m);
  void DeclareDead(int rank, const std::string& why);
  void CheckHeartbeats();
  void Drive();
  // Ends the generation: its outcome becomes the job's last and goes to on_generation_end.
  void EndGeneration();
  // After a handled failure with a restart left: empties the slots for the next generation.
  bool NextGeneration();
  Status AwaitRegistration();
  bool AllFinished() const;
  void HandleFailure();
  Result<DumpPlan> Decide(const std::vector<RankReport>& reports) {
    std::lock_guard lock(mu_);
    return DecideDump(reports, Groups());
  }
  std::optional<int64_t> CatchUpStep(const std::vector<RankReport>& reports);
  std::vector<RankReport> ParkSurvivors(int64_t until_step);
  std::vector<ReplicaGroup> Groups() const;
  void RunDump(const DumpPlan& plan);
  failover::rpc::Dump DumpOrder(const DumpPlan& plan, const std::vector<ReplicaGroup>& groups,
                                const std::string& path, const failover::StepInfo& at,
                                int writer) const;
  void WriteFromSnapshot(failover::rpc::Dump d);
  int SnapshotReader(int rank) const;
  std::vector<failover::StepInfo> UsableSnapshots(int rank) const;
  failover::StepInfo StepOf(int rank, int64_t step, bool snapshot) const;
  Status MakeRunDir();
  void RemoveRunDir() {
    if (!run_dir_.empty()) DefaultFileSystem()->RemoveAll(run_dir_).IgnoreError();
  }
  std::string DumpPath(const failover::StepInfo& at) const;
  void ExitAll(Status why);
  void End(Status s) {
    std::lock_guard lock(mu_);
    ended_ = std::move(s);
    done_ = true;
    cv_.notify_all();
  }

  const ControllerOptions o_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::thread driver_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  bool failed_ = false;     // a rank was declared dead
  bool preempt_ = false;    // a rank asked for a preemption checkpoint
  bool gen_over_ = false;   // the generation's failure is handled: its ranks' exits are expected
  int64_t generation_ = 0;  // the generation served
  bool next_ok_ = true;     // registration of a (newer) generation is open
  int restarts_ = 0;        // generations served after the first
  JobOutcome last_;         // the outcome of the last generation that ended (while the next
                            // one registers)
  // The dump under way; shared with the Collective calls waiting in it, which may outlive it
  // (a writer declared dead while it waits, then the next generation).
  std::shared_ptr<DumpRounds> dump_;
  std::string host_;     // this host's name
  std::string run_dir_;  // this job's snapshot directory ("" = no snapshots)
  std::vector<std::optional<Status>> dump_done_;  // per writer of the dump: its DumpDone
  JobOutcome outcome_;
  Status ended_;
  bool done_ = false;
  bool shutdown_ = false;  // the destructor runs: the driver gives up
};

Status Controller::MakeRunDir() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) host_ = host;
  if (o_.snapshot_dir.empty()) return Status::OK();
  const std::string dir = o_.snapshot_dir + "/savepoint-snapshots-" + RandomId();
  SP_RETURN_IF_ERROR(failover::MakePrivateDir(dir));
  run_dir_ = dir;
  return Status::OK();
}

Status Controller::Listen() {
  SP_RETURN_IF_ERROR(MakeRunDir());
  grpc::ServerBuilder b;
  b.AddListeningPort(o_.listen, grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(this);
  server_ = b.BuildAndStart();
  if (!server_ || port_ == 0) return IOError(fmt::format("cannot listen on {}", o_.listen));
  driver_ = std::thread([this] { Drive(); });
  return Status::OK();
}

grpc::Status Controller::Session(grpc::ServerContext* ctx, ServerStream* stream) {
  if (!failover::HasToken(*ctx, o_.token)) return Refuse();
  AgentMessage m;
  if (!stream->Read(&m) || !m.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected a hello");
  }
  const int rank = m.hello().rank();
  if (grpc::Status s = Admit(m.hello(), stream); !s.ok()) return s;
  while (stream->Read(&m)) {
    if (Status bad = failover::CheckAgentMessage(m); !bad.ok()) {
      std::lock_guard lock(mu_);
      if (slots_[rank].stream == stream) {
        DeclareDead(rank, "it sent a malformed message: " + bad.message());
      }
      break;  // Detach finds it dead already
    }
    Absorb(rank, stream, m);
  }
  Detach(rank, stream);
  return grpc::Status::OK;
}

grpc::Status Controller::Admit(const failover::rpc::Hello& h, ServerStream* stream) {
  std::unique_lock lock(mu_);
  const int rank = h.rank();
  if (Status bad = failover::CheckHello(h, o_.world); !bad.ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, bad.message());
  }
  if (grpc::Status g = AdmitGeneration(lock, h.generation()); !g.ok()) return g;
  Slot& s = slots_[rank];
  if (s.registered) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        fmt::format("rank {} is already registered{}", rank,
                                    s.healthy ? "" : " and was declared dead"));
  }
  s.registered = true;
  s.last_beat = Clock::now();
  s.state.set_step(-1);
  s.groups = failover::GroupsFromProto(h.groups());
  s.host = h.host();
  failover::Log().info("savepoint controller: rank {} of generation {} registered (pid {})", rank,
                       generation_, h.pid());
  std::lock_guard wlock(*s.write_mu);
  s.stream = stream;  // the Welcome follows once every rank registered (AwaitRegistration)
  cv_.notify_all();
  return grpc::Status::OK;
}

// Under mu_ (held by `lock`). A rank of `generation` may register into the generation served
// while it runs, and once the served one is over (next_ok_) as the first rank of the next (the
// launcher's restart count, or the same number when it does not count). A rank that comes while
// the served generation's failure is still being handled waits for it, at most register_timeout.
grpc::Status Controller::AdmitGeneration(std::unique_lock<std::mutex>& lock, int64_t generation) {
  const Clock::time_point give_up = Clock::now() + o_.register_timeout;
  for (;;) {
    if (generation < generation_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          fmt::format("generation {} is over: the job is at generation {}",
                                      generation, generation_));
    }
    if (next_ok_) {
      next_ok_ = false;
      generation_ = generation;
      outcome_.generation = static_cast<int>(generation);
      return grpc::Status::OK;
    }
    const bool ending = failed_ || preempt_ || gen_over_;
    if (generation == generation_ && !ending) return grpc::Status::OK;
    if (done_ || shutdown_ || Clock::now() >= give_up) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          fmt::format("generation {}: the job's generation {} is still ending, "
                                      "or the controller has no restart left",
                                      generation, generation_));
    }
    cv_.wait_until(lock, give_up);
  }
}

void Controller::Absorb(int rank, ServerStream* stream, const AgentMessage& m) {
  std::lock_guard lock(mu_);
  Slot& s = slots_[rank];
  if (s.stream != stream) {
    ++outcome_.late_messages;  // a rank of an earlier generation
    return;
  }
  if (!s.healthy) {
    ++outcome_.late_messages;  // a rank declared dead stays dead
    return;
  }
  s.last_beat = Clock::now();
  if (m.has_heartbeat()) s.state = m.heartbeat();
  if (m.has_paused()) {
    s.state = m.paused();
    s.paused = true;
  }
  const int w = m.dump_done().writer();
  if (m.has_dump_done() && dump_ && w >= 0 && static_cast<size_t>(w) < dump_done_.size() &&
      dump_->writers[w] == rank) {
    dump_done_[w] = failover::FromWire(m.dump_done().code(), m.dump_done().message());
  }
  if (m.has_finished()) s.finished = true;
  if (m.has_preempt()) Preempt(rank, m.preempt());
  cv_.notify_all();
}

// Under mu_.
void Controller::Preempt(int rank, int sig) {
  if (failed_ || preempt_ || gen_over_) return;  // already stopping
  preempt_ = true;
  outcome_.preempted = true;
  outcome_.preempted_by = rank;
  outcome_.reason = fmt::format("rank {} caught {}", rank, failover::SignalName(sig));
  outcome_.detected_unix_ns = UnixNowNs();
  outcome_.dump_status = FailedPreconditionError("preempted: " + outcome_.reason);
  failover::Log().warn(
      "savepoint controller: {}: checkpointing the current step, then ending the job",
      outcome_.reason);
}

void Controller::Detach(int rank, ServerStream* stream) {
  std::lock_guard lock(mu_);
  Slot& s = slots_[rank];
  if (s.stream != stream) return;  // a rank of an earlier generation
  {
    std::lock_guard wlock(*s.write_mu);
    s.stream = nullptr;
  }
  if (!s.finished && !done_ && !gen_over_) {
    DeclareDead(rank, "its connection dropped (the process exited or was killed)");
  }
}

void Controller::Send(int rank, const ControllerMessage& m) {
  Slot& s = slots_[rank];
  std::lock_guard wlock(*s.write_mu);
  if (s.stream != nullptr) s.stream->Write(m);
}

// Under mu_.
void Controller::DeclareDead(int rank, const std::string& why) {
  Slot& s = slots_[rank];
  if (!s.healthy) return;
  s.healthy = false;
  outcome_.dead.push_back(rank);
  failover::Log().error("savepoint controller: rank {} declared dead: {}", rank, why);
  if (!failed_) {
    failed_ = true;
    outcome_.failure = true;
    outcome_.failed_rank = rank;
    outcome_.detected_unix_ns = UnixNowNs();
    outcome_.reason = why;
    outcome_.dump_status = FailedPreconditionError(fmt::format("rank {} failed: {}", rank, why));
  }
  if (dump_) {
    for (int w : dump_->writers) {
      if (w == rank && dump_->broken.ok()) {
        dump_->broken =
            FailedPreconditionError(fmt::format("writer rank {} died during the dump", rank));
      }
    }
  }
  cv_.notify_all();
}

// Under mu_.
void Controller::CheckHeartbeats() {
  const Clock::time_point now = Clock::now();
  for (int r = 0; r < o_.world; ++r) {
    Slot& s = slots_[r];
    if (!s.registered || !s.healthy || s.finished) continue;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - s.last_beat);
    if (silent > o_.heartbeat_timeout) {
      DeclareDead(
          r, fmt::format("no heartbeat for {} ms (hung, stopped or partitioned)", silent.count()));
    }
  }
}

bool Controller::AllFinished() const {
  for (const Slot& s : slots_) {
    if (!s.finished) return false;
  }
  return true;
}

Status Controller::AwaitRegistration() {
  std::unique_lock lock(mu_);
  const Clock::time_point give_up = Clock::now() + o_.register_timeout;
  auto all = [&] {
    return std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.registered; });
  };
  while (!all() && !failed_) {
    if (shutdown_) return FailedPreconditionError("the controller was shut down");
    if (Clock::now() > give_up) {
      std::vector<int> missing;
      for (int r = 0; r < o_.world; ++r) {
        if (!slots_[r].registered) missing.push_back(r);
      }
      return DeadlineExceededError(fmt::format("ranks {} did not register within {} ms", missing,
                                               o_.register_timeout.count()));
    }
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  // The job starts together: every rank's Connect returns now, and heartbeats count from here.
  for (int r = 0; r < o_.world; ++r) {
    ControllerMessage welcome;
    welcome.mutable_welcome()->set_heartbeat_ms(o_.heartbeat_interval.count());
    if (!run_dir_.empty()) {
      welcome.mutable_welcome()->set_snapshot_dir(run_dir_);
      welcome.mutable_welcome()->set_snapshot_every(o_.snapshot_every);
    }
    slots_[r].last_beat = Clock::now();
    Send(r, welcome);
  }
  return Status::OK();
}

void Controller::Drive() {
  if (Status s = AwaitRegistration(); !s.ok()) {
    ExitAll(s);
    return End(s);
  }
  for (;;) {
    bool stopped = false;
    {
      std::unique_lock lock(mu_);
      while (!failed_ && !preempt_ && !AllFinished() && !shutdown_) {
        CheckHeartbeats();
        cv_.wait_for(lock, std::chrono::milliseconds(20));
      }
      stopped = failed_ || preempt_;
    }
    if (stopped) HandleFailure();
    EndGeneration();
    if (!NextGeneration()) break;
    if (Status s = AwaitRegistration(); !s.ok()) {
      failover::Log().info("savepoint controller: no restarted generation: {}; the job is over",
                           s.message());
      ExitAll(s);  // those that did register
      std::lock_guard lock(mu_);
      outcome_ = last_;
      break;
    }
  }
  RemoveRunDir();  // the dump is over (or the job ended): the snapshots' memory goes back
  End(Status::OK());
}

void Controller::EndGeneration() {
  JobOutcome out;
  {
    std::lock_guard lock(mu_);
    gen_over_ = true;  // the survivors' exits that follow are no failure
    out = last_ = outcome_;
  }
  if (o_.on_generation_end) o_.on_generation_end(out);
}

bool Controller::NextGeneration() {
  std::lock_guard lock(mu_);
  // A preemption ends the job, unless a rank also died (the launcher restarts for that).
  if (!failed_ || shutdown_ || restarts_ >= o_.max_restarts) return false;
  ++restarts_;
  for (Slot& s : slots_) {
    std::unique_ptr<std::mutex> write_mu = std::move(s.write_mu);
    std::lock_guard wlock(*write_mu);
    s = Slot();
    s.write_mu = std::move(write_mu);
  }
  failed_ = gen_over_ = false;
  dump_.reset();
  dump_done_.clear();
  outcome_ = JobOutcome{};
  next_ok_ = true;
  failover::Log().info(
      "savepoint controller: waiting for the ranks of the restarted job ({} of {})", restarts_,
      o_.max_restarts);
  cv_.notify_all();
  return true;
}

std::vector<ReplicaGroup> Controller::Groups() const {
  std::set<ReplicaGroup> all;
  for (const Slot& s : slots_) all.insert(s.groups.begin(), s.groups.end());
  if (all.empty()) return DataParallelGroups(o_.world);
  return std::vector<ReplicaGroup>(all.begin(), all.end());
}

std::vector<RankReport> Controller::ParkSurvivors(int64_t until_step) {
  std::unique_lock lock(mu_);
  ControllerMessage stop;
  stop.mutable_stop()->set_reason(outcome_.dump_status.message());
  stop.mutable_stop()->set_grace_ms(o_.stop_grace.count());
  stop.mutable_stop()->set_until_step(until_step);
  for (int r = 0; r < o_.world; ++r) {
    slots_[r].paused = false;
    if (slots_[r].healthy && !slots_[r].finished) Send(r, stop);
  }
  const Clock::time_point give_up = Clock::now() + o_.stop_grace + o_.heartbeat_interval * 2;
  auto parked = [&] {
    for (const Slot& s : slots_) {
      if (s.healthy && !s.finished && !s.paused) return false;
    }
    return true;
  };
  while (!parked() && Clock::now() < give_up) {
    CheckHeartbeats();
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  std::vector<RankReport> reports;
  for (int r = 0; r < o_.world; ++r) {
    Slot& s = slots_[r];
    // A survivor that did not park may still be changing its state: never a source.
    reports.push_back(
        {r, s.healthy && !s.finished, s.state.step(), s.state.updating() || !s.paused});
    s.snapshots = UsableSnapshots(r);
    for (const failover::StepInfo& at : s.snapshots) reports.back().snapshots.push_back(at.step);
  }
  return reports;
}

std::string Controller::DumpPath(const failover::StepInfo& at) const {
  std::string name = o_.naming == DumpNaming::kManager
                         ? FailureDumpName(o_.prefix, at.epoch, at.step_in_epoch)
                         : MindSporeDumpName(at.step);
  return JoinPath(o_.directory, name);  // a URI ("s3://...") stays one
}

// Under mu_. The step a dump source holds: its live state's, or its snapshot's of `step`.
failover::StepInfo Controller::StepOf(int rank, int64_t step, bool snapshot) const {
  const Slot& s = slots_[rank];
  if (!snapshot) return {s.state.step(), s.state.epoch(), s.state.step_in_epoch()};
  for (const failover::StepInfo& at : s.snapshots) {
    if (at.step == step) return at;
  }
  return {step, 1, step};
}

// Under mu_. The order for writer `writer` (index into the plan's live, then snapshot sources).
failover::rpc::Dump Controller::DumpOrder(const DumpPlan& plan,
                                          const std::vector<ReplicaGroup>& groups,
                                          const std::string& path, const failover::StepInfo& at,
                                          int writer) const {
  const size_t live = plan.dumpers.size();
  const bool snapshot = static_cast<size_t>(writer) >= live;
  const int rank = snapshot ? plan.snapshot_dumpers[writer - live] : plan.dumpers[writer];
  failover::rpc::Dump d;
  d.set_dump_id(dump_->id);
  d.set_path(path);
  d.set_step(plan.step);
  d.set_writer(writer);
  d.set_writers(static_cast<int>(live + plan.snapshot_dumpers.size()));
  d.set_timeout_ms(o_.dump_timeout.count());
  d.set_mindspore_ckpt(o_.naming == DumpNaming::kMindSporeCkpt);
  d.set_epoch(at.epoch);
  d.set_step_in_epoch(at.step_in_epoch);
  std::vector<ReplicaGroup> mine;
  for (size_t g = 0; g < groups.size() && g < plan.source_of_group.size(); ++g) {
    if (plan.source_of_group[g] == rank && plan.from_snapshot[g] == snapshot) {
      mine.push_back(groups[g]);
    }
  }
  failover::GroupsToProto(mine, d.mutable_groups());
  return d;
}

// Under mu_. Where `rank`'s snapshots can be read: -1 here (this host), else the lowest parked
// survivor on its host; -2 nowhere.
int Controller::SnapshotReader(int rank) const {
  if (slots_[rank].host == host_) return -1;
  for (int r = 0; r < o_.world; ++r) {
    const Slot& s = slots_[r];
    if (s.host == slots_[rank].host && s.healthy && !s.finished && s.paused) return r;
  }
  return -2;
}

// Under mu_. The snapshots of `rank` a dump can use: on this host, those committed in its
// directory; elsewhere, those it last reported, when a survivor of its host can read them.
std::vector<failover::StepInfo> Controller::UsableSnapshots(int rank) const {
  std::vector<failover::StepInfo> out;
  const int reader = run_dir_.empty() ? -2 : SnapshotReader(rank);
  if (reader == -1) return failover::ListSnapshots(run_dir_, rank, nullptr);
  if (reader < 0) return out;
  for (const failover::rpc::SnapshotStep& p : slots_[rank].state.snapshots()) {
    out.push_back({p.step(), p.epoch(), p.step_in_epoch()});
  }
  return out;
}

// On its own thread: the part of a snapshot of this host, as writer d.writer() of the dump.
void Controller::WriteFromSnapshot(failover::rpc::Dump d) {
  auto stub = failover::rpc::Failover::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  auto comm =
      failover::NewRelayCommunicator(stub.get(), o_.token, d.dump_id(), d.writer(), d.writers());
  Status s = failover::WriteSnapshotPart(d, run_dir_, o_.world, *comm, o_.snapshot_save, {});
  if (!s.ok()) {
    failover::Log().error("savepoint controller: rank {}'s part from its snapshot: {}",
                          d.snapshot_rank(), s.ToString());
  }
  std::lock_guard lock(mu_);
  dump_done_[d.writer()] = s;
  cv_.notify_all();
}

void Controller::RunDump(const DumpPlan& plan) {
  std::unique_lock lock(mu_);
  const std::vector<ReplicaGroup> groups = Groups();
  const bool ckpt = o_.naming == DumpNaming::kMindSporeCkpt;
  if (Status s = ckpt ? CheckMindSporeDumpGroups(groups, o_.world) : Status::OK(); !s.ok()) {
    outcome_.dump_status = s.WithContext("no dump");
    return;
  }
  const size_t live = plan.dumpers.size();
  // The dump is named for its first writer's step (writer 0: a live source when there is one).
  const failover::StepInfo at = live > 0 ? StepOf(plan.dumpers[0], plan.step, false)
                                         : StepOf(plan.snapshot_dumpers[0], plan.step, true);
  const std::string path = DumpPath(at);
  std::vector<int> writers = plan.dumpers;  // where each writer runs
  for (int r : plan.snapshot_dumpers) writers.push_back(SnapshotReader(r));
  dump_ = std::make_shared<DumpRounds>(DumpRounds{RandomId(), writers, Status::OK(), {}});
  dump_done_.assign(writers.size(), std::nullopt);
  std::vector<std::thread> here;
  for (size_t w = 0; w < writers.size(); ++w) {
    ControllerMessage m;
    *m.mutable_dump() = DumpOrder(plan, groups, path, at, static_cast<int>(w));
    if (w >= live) m.mutable_dump()->set_snapshot_rank(plan.snapshot_dumpers[w - live]);
    if (writers[w] >= 0) {
      Send(writers[w], m);
    } else {
      here.emplace_back([this, d = m.dump()] { WriteFromSnapshot(d); });
    }
  }
  failover::Log().info(
      "savepoint controller: dumping step {} from ranks {} and the snapshots of ranks {} into {}",
      plan.step, plan.dumpers, plan.snapshot_dumpers, path);
  auto answered = [&] {
    for (size_t w = 0; w < writers.size(); ++w) {
      const bool gone = writers[w] >= 0 && !slots_[writers[w]].healthy;
      if (!dump_done_[w] && !gone) return false;
    }
    return true;
  };
  while (!answered() && !shutdown_) {
    CheckHeartbeats();
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  lock.unlock();
  for (std::thread& t : here) t.join();  // each has answered (or fails at its timeout)
  lock.lock();
  Status s = dump_done_[0].value_or(dump_->broken);
  // A coordinator that died after its commit: the commit is atomic, so the MANIFEST (or, for
  // the .ckpt layout, the directory itself) tells; in a bucket as on a disk.
  if (!dump_done_[0] && DefaultFileSystem()->Exists(ckpt ? path : JoinPath(path, "MANIFEST"))) {
    s = Status::OK();
  }
  outcome_.dumped = s.ok();
  outcome_.dump_path = s.ok() ? path : "";
  outcome_.dump_step = plan.step;
  outcome_.writers = plan.dumpers;
  outcome_.snapshot_writers = plan.snapshot_dumpers;
  if (!s.ok()) outcome_.dump_status = s.WithContext("no dump: the dump failed");
}

std::optional<int64_t> Controller::CatchUpStep(const std::vector<RankReport>& reports) {
  std::lock_guard lock(mu_);
  return failover::CatchUpStep(reports, Groups());
}

void Controller::HandleFailure() {
  const Clock::time_point t0 = Clock::now();
  std::vector<RankReport> reports = ParkSurvivors(-1);
  Result<DumpPlan> plan = Decide(reports);
  if (!plan.ok()) {
    // Ranks parked at different steps (no collective keeps them in step): once, let those behind
    // catch up with the newest, then decide again.
    if (std::optional<int64_t> newest = CatchUpStep(reports)) {
      failover::Log().info(
          "savepoint controller: survivors at different steps; catching up to step {}", *newest);
      reports = ParkSurvivors(*newest);
      plan = Decide(reports);
    }
  }
  if (plan.ok()) {
    RunDump(*plan);
  } else {
    std::lock_guard lock(mu_);
    outcome_.dump_status = plan.status();
  }
  Status why;
  {
    std::lock_guard lock(mu_);
    outcome_.detect_to_commit_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const std::string what = outcome_.failure ? fmt::format("rank {} failed", outcome_.failed_rank)
                                              : fmt::format("preempted ({})", outcome_.reason);
    const std::string done = outcome_.failure ? "dump" : "checkpoint";
    why = FailedPreconditionError(fmt::format("{}; {}", what,
                                              outcome_.dumped
                                                  ? done + " committed at " + outcome_.dump_path
                                                  : outcome_.dump_status.message()));
  }
  failover::Log().info("savepoint controller: {}", why.message());
  ExitAll(why);
}

void Controller::ExitAll(Status why) {
  std::lock_guard lock(mu_);
  gen_over_ = true;  // the exits that follow are no failure
  ControllerMessage m;
  m.mutable_exit()->set_code(static_cast<int32_t>(why.code()));
  m.mutable_exit()->set_reason(why.message());
  for (int r = 0; r < o_.world; ++r) Send(r, m);
}

grpc::Status Controller::Collective(grpc::ServerContext* ctx,
                                    const failover::rpc::CollectiveRequest* req,
                                    failover::rpc::CollectiveReply* reply) {
  if (!failover::HasToken(*ctx, o_.token)) return Refuse();
  std::unique_lock lock(mu_);
  auto fail = [&](const Status& s) {
    reply->set_code(static_cast<int32_t>(s.code()));
    reply->set_message(s.message());
    return grpc::Status::OK;
  };
  const std::shared_ptr<DumpRounds> dump = dump_;  // alive while this call waits in it
  if (!dump || dump->id != req->dump_id()) return fail(FailedPreconditionError("no such dump"));
  const int n = static_cast<int>(dump->writers.size());
  if (Status bad = failover::CheckCollective(*req, n); !bad.ok()) return fail(bad);
  if (req->abort()) {
    if (dump->broken.ok()) {
      dump->broken = FailedPreconditionError(
          fmt::format("writer {} aborted the dump: {}", req->writer(), req->abort_reason()));
    }
    cv_.notify_all();
    return fail(dump->broken);
  }
  if (!dump->rounds.contains(req->seq()) && dump->rounds.size() >= failover::kMaxOpenRounds) {
    return fail(InvalidArgumentError(fmt::format(
        "dump collective {}: {} collectives are open already", req->seq(), dump->rounds.size())));
  }
  DumpRounds::Round& round = dump->rounds[req->seq()];
  if (round.in.empty()) round.in.resize(n), round.sent.resize(n);
  if (round.sent[req->writer()]) {
    return fail(InvalidArgumentError(
        fmt::format("dump collective {}: writer {} sent it twice", req->seq(), req->writer())));
  }
  round.sent[req->writer()] = true;
  round.in[req->writer()] = req->data();
  ++round.arrived;
  cv_.notify_all();
  const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(req->timeout_ms());
  cv_.wait_until(lock, give_up, [&] { return round.arrived == n || !dump->broken.ok(); });
  if (dump->broken.ok() && round.arrived < n) {
    dump->broken = DeadlineExceededError(
        fmt::format("dump collective {}: {} of {} writers arrived", req->seq(), round.arrived, n));
    cv_.notify_all();
  }
  if (!dump->broken.ok()) return fail(dump->broken);
  for (const std::string& b : round.in) reply->add_data(b);
  if (++round.left == n) dump->rounds.erase(req->seq());
  return grpc::Status::OK;
}

}  // namespace

Result<std::unique_ptr<FailoverController>> FailoverController::Start(ControllerOptions o) {
  SP_RETURN_IF_ERROR(failover::CheckToken(o.token));
  if (o.world < 1) return InvalidArgumentError(fmt::format("world {}: must be >= 1", o.world));
  if (o.directory.empty()) return InvalidArgumentError("no dump directory");
  if (o.naming == DumpNaming::kMindSporeCkpt && DefaultFileSystem()->IsObjectStore(o.directory)) {
    return InvalidArgumentError(fmt::format(
        "dump directory {}: the MindSpore layout commits a directory of .ckpt files by renaming "
        "it, which object storage cannot do; dump there with the manager naming (a checkpoint "
        "committed by its MANIFEST)",
        o.directory));
  }
  if (o.heartbeat_interval.count() <= 0 || o.heartbeat_timeout <= o.heartbeat_interval) {
    return InvalidArgumentError("heartbeat_timeout must exceed heartbeat_interval (> 0)");
  }
  if (o.max_restarts < 0) {
    return InvalidArgumentError(fmt::format("max_restarts {}: must be >= 0", o.max_restarts));
  }
  if (o.snapshot_every < 1) {
    return InvalidArgumentError(fmt::format("snapshot_every {}: must be >= 1", o.snapshot_every));
  }
  auto c = std::make_unique<Controller>(std::move(o));
  SP_RETURN_IF_ERROR(c->Listen());
  return std::unique_ptr<FailoverController>(std::move(c));
}

}  // namespace savepoint
