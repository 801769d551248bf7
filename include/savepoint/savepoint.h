// Umbrella header: everything in libsavepoint. (The OpenMPI communicator, savepoint/mpi.h, lives
// in the separate library savepoint_mpi and is included on its own.)
#ifndef SAVEPOINT_SAVEPOINT_H_
#define SAVEPOINT_SAVEPOINT_H_

#include "savepoint/async.h"        // IWYU pragma: export
#include "savepoint/catalog.h"      // IWYU pragma: export
#include "savepoint/checkpoint.h"   // IWYU pragma: export
#include "savepoint/comm.h"         // IWYU pragma: export
#include "savepoint/cuda.h"         // IWYU pragma: export
#include "savepoint/dcp.h"          // IWYU pragma: export
#include "savepoint/distributed.h"  // IWYU pragma: export
#include "savepoint/dtype.h"        // IWYU pragma: export
#include "savepoint/durable.h"      // IWYU pragma: export
#include "savepoint/encryption.h"   // IWYU pragma: export
#include "savepoint/export.h"
#include "savepoint/filesystem.h"          // IWYU pragma: export
#include "savepoint/io_options.h"          // IWYU pragma: export
#include "savepoint/job_runner.h"          // IWYU pragma: export
#include "savepoint/logging.h"             // IWYU pragma: export
#include "savepoint/manager.h"             // IWYU pragma: export
#include "savepoint/mindspore.h"           // IWYU pragma: export
#include "savepoint/mindspore_strategy.h"  // IWYU pragma: export
#include "savepoint/recis.h"               // IWYU pragma: export
#include "savepoint/safetensors.h"         // IWYU pragma: export
#include "savepoint/sparse.h"              // IWYU pragma: export
#include "savepoint/state.h"               // IWYU pragma: export
#include "savepoint/stateful.h"            // IWYU pragma: export
#include "savepoint/status.h"              // IWYU pragma: export
#include "savepoint/tensor.h"              // IWYU pragma: export
#include "savepoint/value.h"               // IWYU pragma: export

namespace savepoint {
// Library version, e.g. "0.1.0".
SAVEPOINT_API const char* Version();
}  // namespace savepoint

#endif  // SAVEPOINT_SAVEPOINT_H_
