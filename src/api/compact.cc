// CompactSparse: a delta chain folded into one full checkpoint, in parts of slices
// (sparse/compact.h), or, when the result is compressed, loaded whole (LoadSparse) and saved with
// SaveSparse, since distributed writes (which the parts are) do not compress yet.
#include "sparse/compact.h"

#include <fmt/format.h>

#include "savepoint/sparse.h"

namespace savepoint {

Status CompactSparse(const std::string& src, const std::string& dst, const SparseSaveOptions& o,
                     const LoadOptions& load, const IoOptions& io, uint64_t batch_bytes) {
  const std::string context = fmt::format("compact {} into {}", src, dst);
  if (!o.base.empty()) {
    return InvalidArgumentError(
        context + ": SparseSaveOptions.base must be empty (the result is a full save)");
  }
  if (o.save.compression.codec == Compression::Codec::kNone) {
    return sparse::CompactInParts(src, dst, o, load, io, batch_bytes).WithContext(context);
  }
  SP_ASSIGN_OR_RETURN(State state, LoadSparse(src, {.load = load}, io));
  return SaveSparse(state, dst, o, io);
}

}  // namespace savepoint
