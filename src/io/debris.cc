#include "io/debris.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <limits>
#include <utility>

#include "savepoint/filesystem.h"
#include "util/random.h"

namespace savepoint::io {
namespace {

constexpr std::string_view kMarkers[] = {{}, kTmpMarker, kOldMarker, kDelMarker};

std::string_view MarkerOf(DebrisKind kind) { return kMarkers[static_cast<int>(kind)]; }

// A positive decimal number without sign or leading zeros that fits `max_digits`.
bool ParsePositive(std::string_view text, size_t max_digits, int64_t* out) {
  if (text.empty() || text.size() > max_digits || text[0] == '0') return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return std::from_chars(text.data(), text.data() + text.size(), *out).ec == std::errc();
}

bool IsNonce(std::string_view text) {
  if (text.size() != 16) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string SiblingFor(const std::string& path, DebrisKind kind) {
  return JoinPath(Dirname(path), DebrisEntryName(kind, Basename(path), ::getpid(), RandomU64()));
}

}  // namespace

std::string TmpPathFor(const std::string& path) { return SiblingFor(path, DebrisKind::kTmp); }
std::string OldPathFor(const std::string& path) { return SiblingFor(path, DebrisKind::kOld); }
std::string DelPathFor(const std::string& path) { return SiblingFor(path, DebrisKind::kDeleted); }

std::string DebrisEntryName(DebrisKind kind, std::string_view checkpoint, int64_t pid,
                            uint64_t nonce) {
  if (kind == DebrisKind::kTmp) {
    return fmt::format(".{}{}{}.{:016x}", checkpoint, kTmpMarker, pid, nonce);
  }
  return fmt::format(".{}{}{:016x}", checkpoint, MarkerOf(kind), nonce);
}

DebrisKind ClassifyDebris(std::string_view entry, std::string* checkpoint_name, int64_t* pid) {
  *pid = 0;
  if (entry.size() < 2 || entry[0] != '.') return DebrisKind::kNone;
  for (DebrisKind kind : {DebrisKind::kTmp, DebrisKind::kOld, DebrisKind::kDeleted}) {
    const size_t at = entry.rfind(MarkerOf(kind));
    if (at == std::string_view::npos || at < 2) continue;
    const std::string_view name = entry.substr(1, at - 1);
    std::string_view rest = entry.substr(at + MarkerOf(kind).size());
    if (name == "." || name == "..") continue;
    int64_t writer = 0;
    if (kind == DebrisKind::kTmp) {
      const size_t dot = rest.find('.');
      if (dot == std::string_view::npos || !ParsePositive(rest.substr(0, dot), 10, &writer) ||
          writer > std::numeric_limits<int32_t>::max()) {  // no pid_t
        continue;
      }
      rest.remove_prefix(dot + 1);
    }
    if (!IsNonce(rest)) continue;  // (a checkpoint's name may hold a marker itself)
    *checkpoint_name = std::string(name);
    *pid = writer;
    return kind;
  }
  return DebrisKind::kNone;
}

std::string DescribeLockHolder(std::string_view contents) {
  int64_t pid = 0;
  if (ParsePositive(contents, 10, &pid)) return fmt::format("pid {}", pid);
  return "unknown (the lock file holds no pid)";
}

}  // namespace savepoint::io
