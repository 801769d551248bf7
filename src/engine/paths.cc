#include "engine/paths.h"

#include <fmt/format.h>

#include "savepoint/filesystem.h"

namespace savepoint::engine {

std::string DataFileName(uint32_t rank, uint32_t index) {
  return fmt::format("data-{:05}-{:05}.spd", rank, index);
}

Result<std::string> NormalizeCheckpointPath(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  std::string base = Basename(path);
  if (path.empty() || base.empty() || base == "/" || base[0] == '.') {
    return InvalidArgumentError(fmt::format(
        "checkpoint path {:?}: the last component must be a name not starting with '.'", path));
  }
  if (path.find('\0') != std::string_view::npos) {
    return InvalidArgumentError("checkpoint path contains NUL");
  }
  return std::string(path);
}

}  // namespace savepoint::engine
