// CompactSparse: a delta chain folded into one full checkpoint, in parts of slices
// (sparse/compact.h), or, when the result is compressed, loaded whole (LoadSparse) and saved with
// SaveSparse, since distributed writes (which the parts are) do not compress yet.
#include "sparse/compact.h"

#include <fmt/format.h>

#include "savepoint/sparse.h"

namespace savepoint {
namespace {

// InvalidArgument when `dst` is a link of src's chain other than src itself: replacing it would
// break the links above it (src itself may be replaced: the manager compacts in place).
Status RefuseLowerLink(const std::string& src, const std::string& dst, const IoOptions& io) {
  if (dst == src || !FileSystemOf(io)->Exists(dst)) return Status::OK();
  Result<std::vector<SparseChainLink>> chain = SparseChain(src, io);
  if (!chain.ok()) return Status::OK();  // the compaction reports it
  for (size_t i = 1; i < chain->size(); ++i) {
    if ((*chain)[i].path == dst) {
      return InvalidArgumentError(fmt::format(
          "dst is link {} of src's chain: replacing it would break the deltas above it; compact "
          "into a new path",
          i));
    }
  }
  return Status::OK();
}

}  // namespace

Status CompactSparse(const std::string& src, const std::string& dst, const SparseSaveOptions& o,
                     const LoadOptions& load, const IoOptions& io, uint64_t batch_bytes) {
  const std::string context = fmt::format("compact {} into {}", src, dst);
  if (!o.base.empty()) {
    return InvalidArgumentError(
        context + ": SparseSaveOptions.base must be empty (the result is a full save)");
  }
  if (o.shard_id != -1 || o.shard_num != 0) {
    return InvalidArgumentError(
        context + ": SparseSaveOptions.shard_id / shard_num are for distributed saves");
  }
  SP_RETURN_IF_ERROR(RefuseLowerLink(src, dst, io).WithContext(context));
  if (o.save.compression.codec == Compression::Codec::kNone) {
    return sparse::CompactInParts(src, dst, o, load, io, batch_bytes).WithContext(context);
  }
  SP_ASSIGN_OR_RETURN(State state, LoadSparse(src, {.load = load}, io));
  return SaveSparse(state, dst, o, io);
}

}  // namespace savepoint
