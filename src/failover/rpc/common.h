// Pieces shared by the failover controller and agent (src/failover/rpc/): the token metadata,
// conversions between savepoint and gRPC/proto types.
#ifndef SAVEPOINT_FAILOVER_RPC_COMMON_H_
#define SAVEPOINT_FAILOVER_RPC_COMMON_H_

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <optional>
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

// What an agent sends is checked before the controller uses it (the sender holds the job token,
// but may be broken): numbers that would index past the job's ranks or confuse the decision are
// refused with InvalidArgument naming the field.
// Most replica groups one Hello may list, and most snapshots one step state may list.
inline constexpr int kMaxHelloGroups = 1 << 16;
inline constexpr int kMaxReportedSnapshots = 64;
// A Hello in a job of `world` ranks: its world is the job's, its rank in [0, world), its
// generation >= 0, each group
// non-empty with distinct ranks in [0, world), this rank among them.
Status CheckHello(const rpc::Hello& hello, int world);
// A step state (heartbeat or paused): step >= -1, epoch and step_in_epoch >= 0, snapshots of steps
// >= 0 (at most kMaxReportedSnapshots).
Status CheckStepState(const rpc::StepState& state);
// Any message after the Hello: its step state, when it has one (a second Hello is refused).
Status CheckAgentMessage(const rpc::AgentMessage& message);

// A dump collective from a writer of a dump of `writers` writers: the writer in [0, writers), the
// timeout in [0, kMaxCollectiveTimeoutMs] (its deadline is computed in nanoseconds).
inline constexpr int64_t kMaxCollectiveTimeoutMs = int64_t{24} * 3600 * 1000;
// Most collectives of one dump open at once (each writer takes part in one at a time).
inline constexpr size_t kMaxOpenRounds = 64;
Status CheckCollective(const rpc::CollectiveRequest& request, int writers);

// When ranks parked at different steps: the newest step of the usable survivors (healthy, not
// mid-update) if some usable survivor is behind it and every group of `groups` has a usable member
// (so catching up could allow a dump); nullopt otherwise. `reports` holds ranks 0..world-1 in
// order; `groups` only ranks in [0, world) (CheckHello).
std::optional<int64_t> CatchUpStep(const std::vector<RankReport>& reports,
                                   const std::vector<ReplicaGroup>& groups);

// The failover logger: stderr (stdout belongs to the program: `savepoint controller --json`), at
// the level of spdlog's default logger (SAVEPOINT_LOG_LEVEL, SetLogLevel).
spdlog::logger& Log();

// OK when `token` is long enough; InvalidArgument otherwise.
Status CheckToken(std::string_view token);

}  // namespace savepoint::failover

#endif  // SAVEPOINT_FAILOVER_RPC_COMMON_H_
