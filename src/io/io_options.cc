// IoOptions (savepoint/io_options.h): its one validity check and the file-system default.
#include "savepoint/io_options.h"

#include <fmt/format.h>

#include <string>

namespace savepoint {

Status ValidateIoOptions(const IoOptions& io, const std::string& what) {
  if (io.io_threads < 1 || io.io_threads > 64) {
    return InvalidArgumentError(
        fmt::format("{}: IoOptions.io_threads = {}: must be in [1, 64]", what, io.io_threads));
  }
  return Status::OK();
}

FileSystem* FileSystemOf(const IoOptions& io) {
  return io.fs != nullptr ? io.fs : DefaultFileSystem();
}

}  // namespace savepoint
