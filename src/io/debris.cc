#include "io/debris.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <utility>

#include "savepoint/filesystem.h"
#include "util/random.h"

namespace savepoint::io {
namespace {

std::string HiddenSibling(const std::string& path, std::string_view marker) {
  return JoinPath(Dirname(path), fmt::format(".{}{}{:016x}", Basename(path), marker, RandomU64()));
}

}  // namespace

std::string TmpPathFor(const std::string& path) {
  return JoinPath(Dirname(path), fmt::format(".{}{}{}.{:016x}", Basename(path), kTmpMarker,
                                             ::getpid(), RandomU64()));
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

}  // namespace savepoint::io
