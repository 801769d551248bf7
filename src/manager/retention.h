// Internal: which committed checkpoints a retention policy deletes.
#ifndef SAVEPOINT_MANAGER_RETENTION_H_
#define SAVEPOINT_MANAGER_RETENTION_H_

#include <string>
#include <vector>

#include "manager/options.h"
#include "savepoint/manager.h"

namespace savepoint::manager {

// Names of the checkpoints in `records` (committed, oldest first) that `policy` does not keep.
// The newest record is always kept. A checkpoint is kept if any rule keeps it: the last
// keep_last_n; the first of every keep_per_minutes window (walking oldest first, a checkpoint is
// kept when it was created at least that long after the previously kept one); every step that is
// a multiple of keep_every_n_steps; the keep_best_n best by best_metric. Saves in flight are not
// in `records`, so they are never chosen.
std::vector<std::string> SelectForDeletion(const std::vector<CheckpointRecord>& records,
                                           const Policy& policy);

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_RETENTION_H_
