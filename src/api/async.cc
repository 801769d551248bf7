// Checkpointer::Create: the engine's asynchronous Checkpointer, given the sparse layer's
// flattening so that its saves take states holding sparse tables (engine/checkpointer.h).
#include "engine/checkpointer.h"
#include "sparse/save.h"

namespace savepoint {

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(const CheckpointerOptions& options,
                                                           const IoOptions& io) {
  // Hash-ordered tables are staged into buffers kept from one save to the next (sparse/stage.h).
  auto buffers = std::make_shared<sparse::CopyBuffers>();
  auto flatten = [buffers](const engine::WriteRequest& in, const SparseSaveOptions& tables)
      -> Result<std::shared_ptr<const engine::WriteRequest>> {
    auto flat = std::make_shared<sparse::Flat>();
    flat->buffers = buffers;
    SP_RETURN_IF_ERROR(sparse::Flatten(in, tables, flat.get()));
    return std::shared_ptr<const engine::WriteRequest>(flat, &flat->request);
  };
  return engine::NewCheckpointer(options, io, flatten);
}

}  // namespace savepoint
