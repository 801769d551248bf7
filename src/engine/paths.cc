#include "engine/paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <random>

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

uint64_t RandomU64() {
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   (static_cast<uint64_t>(::getpid()) << 32)};
  return rng();
}

std::string TmpPathFor(const std::string& path) {
  return JoinPath(Dirname(path), fmt::format(".{}{}{}.{:016x}", Basename(path), kTmpMarker,
                                             ::getpid(), RandomU64()));
}

static std::string HiddenSibling(const std::string& path, std::string_view marker) {
  return JoinPath(Dirname(path), fmt::format(".{}{}{:016x}", Basename(path), marker, RandomU64()));
}

std::string OldPathFor(const std::string& path) { return HiddenSibling(path, kOldMarker); }
std::string DelPathFor(const std::string& path) { return HiddenSibling(path, kDelMarker); }

DebrisKind ClassifyDebris(std::string_view entry, std::string* checkpoint_name, int64_t* pid) {
  if (entry.empty() || entry[0] != '.') return DebrisKind::kNone;
  *pid = 0;
  size_t at = entry.rfind(kTmpMarker);
  if (at != std::string_view::npos && at > 1) {
    *checkpoint_name = std::string(entry.substr(1, at - 1));
    std::string_view rest = entry.substr(at + kTmpMarker.size());
    std::from_chars(rest.data(), rest.data() + rest.size(), *pid);
    return DebrisKind::kTmp;
  }
  for (auto [marker, kind] :
       {std::pair{kOldMarker, DebrisKind::kOld}, std::pair{kDelMarker, DebrisKind::kDeleted}}) {
    at = entry.rfind(marker);
    if (at != std::string_view::npos && at > 1) {
      *checkpoint_name = std::string(entry.substr(1, at - 1));
      return kind;
    }
  }
  return DebrisKind::kNone;
}

}  // namespace savepoint::engine
