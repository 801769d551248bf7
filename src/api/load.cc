// The public Load and Verify: the store of the checkpoint's format (LoadOptions::format; kAuto
// detects it) reads it (src/store/). A native checkpoint with sparse tables is read with every
// table whole, its delta chain applied.
#include <fmt/format.h>

#include <memory>

#include "savepoint/checkpoint.h"
#include "store/store.h"

namespace savepoint {

Result<State> Load(const std::string& path, const LoadOptions& options, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Reader> reader,
                      store::OpenRead(path, options.format, options, io));
  return reader->Read(options.names);
}

Status Verify(const std::string& path, const LoadOptions& options, const IoOptions& io) {
  if (!options.names.empty() || options.mmap || options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "verify {}: LoadOptions.names, mmap and map_mode do not apply (every entry is verified, "
        "by reading it)",
        path));
  }
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Reader> reader,
                      store::OpenRead(path, options.format, options, io));
  return reader->Verify(options.stats);
}

}  // namespace savepoint
