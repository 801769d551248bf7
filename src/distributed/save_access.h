// Internal entry points into RankSave (savepoint/distributed.h) that the public API does not
// offer: planning with the row gathers of sparse tables, and the scale harness's dry report.
#ifndef SAVEPOINT_DISTRIBUTED_SAVE_ACCESS_H_
#define SAVEPOINT_DISTRIBUTED_SAVE_ACCESS_H_

#include <string>

#include "engine/request.h"
#include "savepoint/distributed.h"

namespace savepoint {

struct RankSaveAccess {
  // RankSave::Plan with the row gathers of a WriteRequest (sparse tables); `gathers` may be null.
  static std::string Plan(RankSave& save, const State& local, const ShardLayout& layout,
                          const SaveOptions& o, const IoOptions& io,
                          const engine::RowGathers* gathers);
  // The report bytes RankSave::Write would return after a successful write of this rank's plan,
  // with every CRC32C zero, and nothing written (bench/scale_bench: the coordinator's cost without
  // the data). Unencrypted plans only; the plan's error when planning failed.
  static std::string DryReport(RankSave& save);
};

}  // namespace savepoint

#endif  // SAVEPOINT_DISTRIBUTED_SAVE_ACCESS_H_
