// The asynchronous Checkpointer's constructor (async_saver.cc). The public Checkpointer::Create
// (src/api/async.cc) calls it with the sparse layer's flattening, so that engine/ writes states
// holding sparse tables without calling up into sparse/ (docs/ARCHITECTURE.md).
#ifndef SAVEPOINT_ENGINE_CHECKPOINTER_H_
#define SAVEPOINT_ENGINE_CHECKPOINTER_H_

#include <functional>
#include <memory>

#include "engine/request.h"
#include "savepoint/async.h"
#include "savepoint/sparse.h"

namespace savepoint::engine {

// Turns `in` (one process; its state holds sparse tables) into the request the engine writes: the
// tables' rows as tensors (views, or row gathers into storage order) plus their description
// (src/sparse/save.h). The returned request owns what it points to. Called on the caller's thread
// of SaveAsync; its errors are SaveAsync's.
using FlattenTables = std::function<Result<std::shared_ptr<const WriteRequest>>(
    const WriteRequest& in, const SparseSaveOptions& tables)>;

// Checkpointer::Create's checks, then a Checkpointer that writes tables through `flatten`.
Result<std::unique_ptr<Checkpointer>> NewCheckpointer(const CheckpointerOptions& options,
                                                      const IoOptions& io, FlattenTables flatten);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_CHECKPOINTER_H_
