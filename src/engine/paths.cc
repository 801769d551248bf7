#include "engine/paths.h"

#include <fmt/format.h>

#include "format/manifest.h"
#include "savepoint/filesystem.h"

namespace savepoint::engine {

std::string DataFileName(uint32_t rank, uint32_t index) {
  return fmt::format("data-{:05}-{:05}.spd", rank, index);
}

bool IsCheckpointEntry(std::string_view name) {
  if (name == format::kManifestFileName) return true;
  if (!name.starts_with("data-") || !name.ends_with(".spd")) return false;
  std::string_view mid = name.substr(5, name.size() - 9);  // "<digits>-<digits>"
  const size_t dash = mid.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == mid.size()) return false;
  for (size_t i = 0; i < mid.size(); ++i) {
    if (i != dash && (mid[i] < '0' || mid[i] > '9')) return false;
  }
  return true;
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
