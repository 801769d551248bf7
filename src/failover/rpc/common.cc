// Shared pieces of the failover controller and agent (common.h).
#include "failover/rpc/common.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace savepoint::failover {

bool HasToken(const grpc::ServerContext& context, std::string_view token) {
  const auto& md = context.client_metadata();
  auto it = md.find(kTokenKey);
  if (it == md.end() || it->second.size() != token.size()) return false;
  return CRYPTO_memcmp(it->second.data(), token.data(), token.size()) == 0;
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
