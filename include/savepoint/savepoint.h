// Umbrella header: everything in libsavepoint. (The OpenMPI communicator, savepoint/mpi.h, lives
// in the separate library savepoint_mpi and is included on its own.)
#ifndef SAVEPOINT_SAVEPOINT_H_
#define SAVEPOINT_SAVEPOINT_H_

#include "savepoint/export.h"

// Core: tensors, states and the verbs (Save, Load, LoadInto, Verify, Convert; their options,
// with the format and the topology), errors, storage (local and S3) and I/O.
#include "savepoint/checkpoint.h"  // IWYU pragma: export
#include "savepoint/dtype.h"       // IWYU pragma: export
#include "savepoint/durable.h"     // IWYU pragma: export
#include "savepoint/encryption.h"  // IWYU pragma: export
#include "savepoint/filesystem.h"  // IWYU pragma: export
#include "savepoint/format.h"      // IWYU pragma: export
#include "savepoint/io_options.h"  // IWYU pragma: export
#include "savepoint/logging.h"     // IWYU pragma: export
#include "savepoint/s3.h"          // IWYU pragma: export
#include "savepoint/state.h"       // IWYU pragma: export
#include "savepoint/status.h"      // IWYU pragma: export
#include "savepoint/tensor.h"      // IWYU pragma: export
#include "savepoint/value.h"       // IWYU pragma: export

// Training loops: asynchronous saves, GPU snapshots, the checkpoint manager, the catalog of a
// directory, epoch jobs, Stateful objects.
#include "savepoint/async.h"       // IWYU pragma: export
#include "savepoint/catalog.h"     // IWYU pragma: export
#include "savepoint/cuda.h"        // IWYU pragma: export
#include "savepoint/job_runner.h"  // IWYU pragma: export
#include "savepoint/manager.h"     // IWYU pragma: export
#include "savepoint/stateful.h"    // IWYU pragma: export

// Many ranks: communicators, layouts and the distributed protocol's steps, merges, sparse
// embedding tables.
#include "savepoint/comm.h"         // IWYU pragma: export
#include "savepoint/distributed.h"  // IWYU pragma: export
#include "savepoint/sparse.h"       // IWYU pragma: export

// Other formats: safetensors, MindSpore files and strategies, PyTorch DCP, RecIS.
#include "savepoint/dcp.h"                 // IWYU pragma: export
#include "savepoint/mindspore.h"           // IWYU pragma: export
#include "savepoint/mindspore_strategy.h"  // IWYU pragma: export
#include "savepoint/recis.h"               // IWYU pragma: export
#include "savepoint/safetensors.h"         // IWYU pragma: export

namespace savepoint {
// Library version, e.g. "0.1.0".
SAVEPOINT_API const char* Version();
}  // namespace savepoint

#endif  // SAVEPOINT_SAVEPOINT_H_
