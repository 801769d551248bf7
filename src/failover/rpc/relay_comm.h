// A Communicator among the writers of one failure dump whose collectives the controller relays
// (rpc Collective): every collective is an all-gather of the writers' bytes through the
// controller, which fails it on every writer when a writer dies, aborts or times out. The dead
// rank and MPI take no part, so SaveDistributed runs unchanged over it.
//
// Thread safety: one thread at a time (as any Communicator). The stub must outlive it.
#ifndef SAVEPOINT_FAILOVER_RPC_RELAY_COMM_H_
#define SAVEPOINT_FAILOVER_RPC_RELAY_COMM_H_

#include <memory>
#include <string>

#include "failover/rpc/failover.grpc.pb.h"
#include "savepoint/comm.h"

namespace savepoint::failover {

std::unique_ptr<Communicator> NewRelayCommunicator(rpc::Failover::Stub* stub, std::string token,
                                                   std::string dump_id, int writer, int writers);

}  // namespace savepoint::failover

#endif  // SAVEPOINT_FAILOVER_RPC_RELAY_COMM_H_
