// The failover agent of one rank (savepoint/failover_rpc.h).
//
// One Session stream to the controller, three threads besides the training thread:
//  - the reader takes the controller's commands (Stop, Dump, Exit);
//  - the heartbeat thread sends the step state every heartbeat interval;
//  - a dump thread, started by a Dump command, writes this rank's part of the dump.
// The training thread only touches the step state under mu_ (BeginUpdate / EndUpdate), and parks
// in BeginUpdate once the controller has stopped the job.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include "failover/rpc/common.h"
#include "failover/rpc/relay_comm.h"
#include "savepoint/failover_rpc.h"

namespace savepoint {
namespace {

using failover::kTokenKey;
using Stream =
    grpc::ClientReaderWriter<failover::rpc::AgentMessage, failover::rpc::ControllerMessage>;

Result<int> EnvInt(std::initializer_list<const char*> names) {
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
  return InvalidArgumentError(fmt::format("{} is not set", *names.begin()));
}

Result<std::string> EnvString(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return InvalidArgumentError(fmt::format("{} is not set", name));
  return std::string(v);
}

// Marks a dump's state so that CheckpointManager indexes it and a user sees where it came from.
Status AddDumpRecord(State* share, int64_t step, int64_t epoch, int64_t step_in_epoch, int rank) {
  SP_RETURN_IF_ERROR(share->PutValue("failover.step", step));
  SP_RETURN_IF_ERROR(share->PutValue("failover.source_rank", int64_t{rank}));
  Json& meta = share->metadata();
  if (!meta.is_object()) meta = Json::object();
  meta["savepoint.manager"] = {{"step", step},
                               {"epoch", epoch},
                               {"step_in_epoch", step_in_epoch},
                               {"metrics", Json::object()},
                               {"breakpoint", false},
                               {"epoch_end", false},
                               {"failover", true}};
  meta["step"] = step;
  return Status::OK();
}

// What a writer puts in each .ckpt file of a DumpNaming::kMindSporeCkpt dump: its whole state,
// which must lie in the groups it was assigned (each rank's state in one group), with the dump
// record and MindSpore's "epoch_num" / "step_num" (unless the state has values of those names).
Result<State> CkptShare(const DumpSource& src, const failover::rpc::Dump& d, int rank, int world) {
  const std::vector<ReplicaGroup> assigned = failover::GroupsFromProto(d.groups());
  SP_ASSIGN_OR_RETURN(std::vector<ReplicaGroup> mine,
                      ReplicaGroupsOf(src.state, src.layout, rank, world));
  for (const ReplicaGroup& g : mine) {
    if (std::find(assigned.begin(), assigned.end(), g) == assigned.end()) {
      return FailedPreconditionError(fmt::format(
          "rank {} holds state of replica group {}, which it does not write: the MindSpore .ckpt "
          "dump layout needs each rank's whole state in one group; use the native layout",
          rank, fmt::join(g, ",")));
    }
  }
  ShardLayout unused;
  SP_ASSIGN_OR_RETURN(State share,
                      DumpShare(src.state, src.layout, rank, world, assigned, d.writer(), &unused));
  SP_RETURN_IF_ERROR(AddDumpRecord(&share, d.step(), d.epoch(), d.step_in_epoch(), rank));
  if (!share.FindValue("epoch_num")) SP_RETURN_IF_ERROR(share.PutValue("epoch_num", d.epoch()));
  if (!share.FindValue("step_num")) SP_RETURN_IF_ERROR(share.PutValue("step_num", d.step()));
  return share;
}

// Writes a DumpNaming::kMindSporeCkpt dump: the files of every rank of the assigned groups.
Status DumpCkpt(const failover::rpc::Dump& d, const DumpSource& src, int rank, int world,
                Communicator& comm, const IoOptions& io) {
  Result<State> share = CkptShare(src, d, rank, world);
  if (!share.ok()) {
    comm.Abort(share.status());  // the other writers fail now rather than at their timeout
    return share.status();
  }
  std::vector<int> ranks;
  for (const ReplicaGroup& g : failover::GroupsFromProto(d.groups())) {
    ranks.insert(ranks.end(), g.begin(), g.end());
  }
  return SaveMindSporeDump(comm, *share, ranks, d.path(), d.epoch(), d.step_in_epoch(),
                           std::chrono::milliseconds(d.timeout_ms()), io);
}

class Agent final : public FailoverAgent {
 public:
  explicit Agent(AgentOptions o) : o_(std::move(o)) {}
  ~Agent() override { Abandon(); }

  Status Open();

  Status BeginUpdate(int64_t step) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !stopping_ || exit_.has_value() || step <= stop_until_; });
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
    return s;
  }
  Status Register();
  void ReadLoop();
  void HeartbeatLoop();
  void OnStop(const failover::rpc::Stop& stop);
  void OnExit(const failover::rpc::Exit& exit);
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

  std::thread reader_, heartbeat_thread_, dump_thread_;
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
  reader_ = std::thread([this] { ReadLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
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
  failover::GroupsToProto(o_.groups, h->mutable_groups());
  failover::rpc::ControllerMessage welcome;
  if (!stream->Write(hello) || !stream->Read(&welcome) || !welcome.has_welcome()) {
    Status s = failover::FromGrpc(stream->Finish(), "register with the failover controller");
    return s.ok() ? IOError("the failover controller closed the session") : s;
  }
  heartbeat_ = std::chrono::milliseconds(std::max<int64_t>(welcome.welcome().heartbeat_ms(), 1));
  std::lock_guard lock(write_mu_);
  stream_ = std::move(stream);
  return Status::OK();
}

void Agent::ReadLoop() {
  failover::rpc::ControllerMessage m;
  while (stream_->Read(&m)) {
    if (m.has_stop()) OnStop(m.stop());
    if (m.has_exit()) OnExit(m.exit());
    if (m.has_dump() && !dump_thread_.joinable()) {
      dump_thread_ = std::thread([this, d = m.dump()] {
        Status s = Dump(d);
        if (!s.ok())
          failover::Log().error("savepoint failover: rank {}: dump: {}", o_.rank, s.ToString());
        failover::rpc::AgentMessage done;
        done.mutable_dump_done()->set_code(static_cast<int32_t>(s.code()));
        done.mutable_dump_done()->set_message(s.message());
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
                 [&] { return !updating_ && state_.step() >= stop_until_; });
    *m.mutable_paused() = CurrentState();
  }
  Send(m);
}

void Agent::OnExit(const failover::rpc::Exit& exit) {
  std::lock_guard lock(mu_);
  Status why = failover::FromWire(exit.code(), exit.reason());
  exit_ = why.ok() ? why : FailedPreconditionError("job stopped: " + exit.reason());
  cv_.notify_all();
}

Status Agent::Dump(const failover::rpc::Dump& d) {
  int64_t epoch, step_in_epoch;
  {
    std::lock_guard lock(mu_);
    if (state_.step() != d.step() || updating_) {
      return FailedPreconditionError(fmt::format("rank {} is not parked at step {} (at {})",
                                                 o_.rank, d.step(), state_.step()));
    }
    epoch = state_.epoch();
    step_in_epoch = state_.step_in_epoch();
  }
  if (!o_.source) return FailedPreconditionError("no dump source");
  SP_ASSIGN_OR_RETURN(DumpSource src, o_.source());
  auto comm =
      failover::NewRelayCommunicator(stub_.get(), o_.token, d.dump_id(), d.writer(), d.writers());
  if (d.mindspore_ckpt()) return DumpCkpt(d, src, o_.rank, o_.world, *comm, o_.io);
  ShardLayout layout;
  SP_ASSIGN_OR_RETURN(State share,
                      DumpShare(src.state, src.layout, o_.rank, o_.world,
                                failover::GroupsFromProto(d.groups()), d.writer(), &layout));
  SP_RETURN_IF_ERROR(AddDumpRecord(&share, d.step(), epoch, step_in_epoch, o_.rank));
  DistributedSaveOptions so;
  so.save = o_.save;
  so.save.overwrite = false;
  so.save.create_parents = true;
  so.timeout = std::chrono::milliseconds(d.timeout_ms());
  return SaveDistributed(*comm, share, layout, d.path(), so, o_.io);
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
}

void Agent::Join() {
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (reader_.joinable()) reader_.join();
  if (dump_thread_.joinable()) dump_thread_.join();
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
  auto agent = std::make_unique<Agent>(std::move(options));
  SP_RETURN_IF_ERROR(agent->Open());
  return std::unique_ptr<FailoverAgent>(std::move(agent));
}

}  // namespace savepoint
