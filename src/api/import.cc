// ImportRecis (savepoint/recis.h): a RecIS checkpoint read (src/interop/recis.cc) and saved as a
// native checkpoint with its sparse tables (SaveSparse), a composition of the public calls.
#include "savepoint/recis.h"
#include "savepoint/sparse.h"

namespace savepoint {

Result<RecisCheckpoint> ImportRecis(const std::string& src_dir, const std::string& dst,
                                    const RecisImportOptions& options, const IoOptions& io) {
  if (!options.save.base.empty()) {
    return InvalidArgumentError("ImportRecis: save.base must be empty (an import is a full save)");
  }
  SP_ASSIGN_OR_RETURN(RecisCheckpoint ckpt, LoadRecisCheckpoint(src_dir, options.load, io));
  SP_RETURN_IF_ERROR(SaveSparse(ckpt.state, dst, options.save, io));
  ckpt.state = State();
  return ckpt;
}

}  // namespace savepoint
