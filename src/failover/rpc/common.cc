// Shared pieces of the failover controller and agent (common.h).
#include "failover/rpc/common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/crypto.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <algorithm>

namespace savepoint::failover {

bool HasToken(const grpc::ServerContext& context, std::string_view token) {
  const auto& md = context.client_metadata();
  auto it = md.find(kTokenKey);
  if (it == md.end() || it->second.size() != token.size()) return false;
  return CRYPTO_memcmp(it->second.data(), token.data(), token.size()) == 0;
}

Status CheckHello(const rpc::Hello& hello, int world) {
  const int rank = hello.rank();
  if (hello.world() != world || rank < 0 || rank >= world) {
    return InvalidArgumentError(
        fmt::format("hello of rank {} of {} in a job of {}", rank, hello.world(), world));
  }
  if (hello.generation() < 0) {
    return InvalidArgumentError(
        fmt::format("hello of rank {}: generation {}", rank, hello.generation()));
  }
  if (hello.groups_size() > kMaxHelloGroups) {
    return InvalidArgumentError(fmt::format("hello of rank {}: {} replica groups (at most {})",
                                            rank, hello.groups_size(), kMaxHelloGroups));
  }
  for (const rpc::Group& g : hello.groups()) {
    std::vector<int> members(g.ranks().begin(), g.ranks().end());
    std::sort(members.begin(), members.end());
    const bool bad = members.empty() || members.front() < 0 || members.back() >= world ||
                     std::adjacent_find(members.begin(), members.end()) != members.end() ||
                     !std::binary_search(members.begin(), members.end(), rank);
    if (bad) {
      return InvalidArgumentError(fmt::format(
          "hello of rank {}: replica group [{}] must hold distinct ranks in [0, {}) including {}",
          rank, fmt::join(g.ranks(), ", "), world, rank));
    }
  }
  return Status::OK();
}

Status CheckStepState(const rpc::StepState& s) {
  if (s.step() < -1 || s.epoch() < 0 || s.step_in_epoch() < 0) {
    return InvalidArgumentError(fmt::format("step state: step {}, epoch {}, step in epoch {}",
                                            s.step(), s.epoch(), s.step_in_epoch()));
  }
  if (s.snapshots_size() > kMaxReportedSnapshots) {
    return InvalidArgumentError(fmt::format("step state: {} snapshots (at most {})",
                                            s.snapshots_size(), kMaxReportedSnapshots));
  }
  for (const rpc::SnapshotStep& p : s.snapshots()) {
    if (p.step() < 0 || p.epoch() < 0 || p.step_in_epoch() < 0) {
      return InvalidArgumentError(
          fmt::format("step state: a snapshot of step {}, epoch {}, "
                      "step in epoch {}",
                      p.step(), p.epoch(), p.step_in_epoch()));
    }
  }
  return Status::OK();
}

Status CheckAgentMessage(const rpc::AgentMessage& m) {
  if (m.has_hello()) return InvalidArgumentError("a second hello");
  if (m.has_heartbeat()) return CheckStepState(m.heartbeat());
  if (m.has_paused()) return CheckStepState(m.paused());
  return Status::OK();
}

Status CheckCollective(const rpc::CollectiveRequest& r, int writers) {
  if (r.writer() < 0 || r.writer() >= writers) {
    return InvalidArgumentError(
        fmt::format("dump collective {}: writer {} of a dump of {}", r.seq(), r.writer(), writers));
  }
  if (r.timeout_ms() < 0 || r.timeout_ms() > kMaxCollectiveTimeoutMs) {
    return InvalidArgumentError(fmt::format("dump collective {}: timeout {} ms (at most {})",
                                            r.seq(), r.timeout_ms(), kMaxCollectiveTimeoutMs));
  }
  return Status::OK();
}

std::optional<int64_t> CatchUpStep(const std::vector<RankReport>& reports,
                                   const std::vector<ReplicaGroup>& groups) {
  auto usable = [&](int r) { return reports[r].healthy && !reports[r].updating; };
  int64_t newest = -1;
  bool behind = false;
  for (const RankReport& r : reports) {
    if (usable(r.rank)) newest = std::max(newest, r.step);
  }
  for (const RankReport& r : reports) behind |= usable(r.rank) && r.step < newest;
  for (const ReplicaGroup& g : groups) {
    if (std::none_of(g.begin(), g.end(), usable)) return std::nullopt;
  }
  if (!behind || newest < 0) return std::nullopt;
  return newest;
}

Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  std::string message = fmt::format("{}: {}", what, s.error_message());
  switch (s.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return UnauthenticatedError(std::move(message));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return DeadlineExceededError(std::move(message));
    case grpc::StatusCode::FAILED_PRECONDITION:
      return FailedPreconditionError(std::move(message));
    case grpc::StatusCode::INVALID_ARGUMENT:
      return InvalidArgumentError(std::move(message));
    default:
      return IOError(std::move(message));
  }
}

Status FromWire(int32_t code, std::string message) {
  if (code == 0) return Status::OK();
  if (code < 0 || code > static_cast<int32_t>(kLastStatusCode)) code = 12;  // kInternal
  return Status(static_cast<StatusCode>(code), std::move(message));
}

std::vector<ReplicaGroup> GroupsFromProto(
    const google::protobuf::RepeatedPtrField<rpc::Group>& groups) {
  std::vector<ReplicaGroup> out;
  for (const rpc::Group& g : groups) out.emplace_back(g.ranks().begin(), g.ranks().end());
  return out;
}

void GroupsToProto(const std::vector<ReplicaGroup>& groups,
                   google::protobuf::RepeatedPtrField<rpc::Group>* out) {
  for (const ReplicaGroup& g : groups) {
    rpc::Group* p = out->Add();
    for (int r : g) p->add_ranks(r);
  }
}

spdlog::logger& Log() {
  static const std::shared_ptr<spdlog::logger> logger = std::make_shared<spdlog::logger>(
      "savepoint.failover", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_level(spdlog::default_logger_raw()->level());
  return *logger;
}

Status CheckToken(std::string_view token) {
  if (token.size() < kMinTokenBytes) {
    return InvalidArgumentError(fmt::format(
        "the job token must have at least {} characters (SAVEPOINT_JOB_TOKEN)", kMinTokenBytes));
  }
  return Status::OK();
}

}  // namespace savepoint::failover
