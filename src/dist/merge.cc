// MergeCheckpoint: a sharded checkpoint rewritten with every tensor whole (single-rank layout).
#include <fmt/format.h>

#include "savepoint/distributed.h"

namespace savepoint {

Status MergeCheckpoint(const std::string& src, const std::string& dst,
                       const MergeOptions& options) {
  // Load assembles multi-shard tensors into whole ones, verifying every chunk it reads; Save
  // writes each as one shard and commits atomically.
  LoadOptions load = options.load;
  load.mmap = false;
  Result<State> state = Load(src, load);
  if (!state.ok()) return state.status().WithContext(fmt::format("merge {} into {}", src, dst));
  Status s = Save(*state, dst, options.save);
  return s.ok() ? s : s.WithContext(fmt::format("merge {} into {}", src, dst));
}

}  // namespace savepoint
