// The distributed write: the engine's WriteRequest run by every rank of its topology's
// Communicator (protocol at the top of save.cc; docs/DISTRIBUTED.md).
#ifndef SAVEPOINT_DISTRIBUTED_WRITE_H_
#define SAVEPOINT_DISTRIBUTED_WRITE_H_

#include "engine/request.h"
#include "savepoint/status.h"

namespace savepoint::dist {

// Called by every rank of request.topology.comm with its own state and layout; returns the same
// result on every rank (OK once the checkpoint is committed). Fills options.stats with this
// rank's bytes and chunks when set.
Status Write(const engine::WriteRequest& request);

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_WRITE_H_
