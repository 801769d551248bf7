// CompactSparse: a delta chain loaded whole (LoadSparse) and saved as one full checkpoint
// (SaveSparse). A composition of two public entry points, so it lives beside them.
#include <fmt/format.h>

#include "savepoint/sparse.h"

namespace savepoint {

Status CompactSparse(const std::string& src, const std::string& dst, const SparseSaveOptions& o,
                     const LoadOptions& load, const IoOptions& io) {
  if (!o.base.empty()) {
    return InvalidArgumentError(fmt::format(
        "compact {} into {}: SparseSaveOptions.base must be empty (the result is a full save)", src,
        dst));
  }
  SP_ASSIGN_OR_RETURN(State state, LoadSparse(src, {.load = load}, io));
  return SaveSparse(state, dst, o, io);
}

}  // namespace savepoint
