// DetectFormat (savepoint/format.h): what a path holds, from its name and a directory listing.
#include <fmt/format.h>

#include "savepoint/filesystem.h"
#include "savepoint/format.h"
#include "savepoint/recis.h"

namespace savepoint {

Result<Format> DetectFormat(const std::string& path, FileSystem* fs) {
  if (fs == nullptr) fs = DefaultFileSystem();
  // A committed native checkpoint costs one lookup (its MANIFEST), whatever else is there.
  if (fs->Exists(JoinPath(path, "MANIFEST"))) return Format::kNative;
  Result<FileInfo> info = fs->Stat(path);
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) {
      return NotFoundError(fmt::format("{}: no checkpoint there (nothing at that path)", path));
    }
    return info.status().WithContext(fmt::format("detect the format of {}", path));
  }
  if (!info->is_dir) {
    return path.ends_with(".ckpt") ? Format::kMindSporeCkpt : Format::kSafetensors;
  }
  if (IsRecisCheckpoint(path, fs)) return Format::kRecis;
  if (fs->Exists(JoinPath(path, ".metadata"))) return Format::kDcp;
  return Format::kNative;  // (not a committed one: the native reader says so)
}

}  // namespace savepoint
