// Pieces shared by the failover controller and agent (src/failover/rpc/): the token metadata,
// conversions between savepoint and gRPC/proto types.
#ifndef SAVEPOINT_FAILOVER_RPC_COMMON_H_
#define SAVEPOINT_FAILOVER_RPC_COMMON_H_

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <string>
#include <string_view>
#include <vector>

#include "failover/rpc/failover.grpc.pb.h"
#include "savepoint/failover.h"
#include "savepoint/status.h"

namespace savepoint::failover {

// gRPC metadata key carrying the job token on every call.
inline constexpr const char* kTokenKey = "x-savepoint-token";
// Shortest accepted token.
inline constexpr size_t kMinTokenBytes = 16;

// Whether `context`'s metadata carries `token` (constant-time comparison).
bool HasToken(const grpc::ServerContext& context, std::string_view token);

// A savepoint Status from a gRPC status of `what` (a call's name).
Status FromGrpc(const grpc::Status& s, std::string_view what);

// A Status from a wire code and message (codes out of range become kInternal).
Status FromWire(int32_t code, std::string message);

std::vector<ReplicaGroup> GroupsFromProto(const google::protobuf::RepeatedPtrField<rpc::Group>& g);
void GroupsToProto(const std::vector<ReplicaGroup>& groups,
                   google::protobuf::RepeatedPtrField<rpc::Group>* out);

// The failover logger: stderr (stdout belongs to the program: `savepoint controller --json`), at
// the level of spdlog's default logger (SAVEPOINT_LOG_LEVEL, SetLogLevel).
spdlog::logger& Log();

// OK when `token` is long enough; InvalidArgument otherwise.
Status CheckToken(std::string_view token);

}  // namespace savepoint::failover

#endif  // SAVEPOINT_FAILOVER_RPC_COMMON_H_
