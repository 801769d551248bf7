// Names savepoint gives to files and directories of a checkpoint and to debris of unfinished
// saves (docs/FORMAT.md, "Directory layout").
#ifndef SAVEPOINT_ENGINE_PATHS_H_
#define SAVEPOINT_ENGINE_PATHS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "savepoint/status.h"

namespace savepoint::engine {

// Marker inside hidden names of a save in progress: ".<name>.savepoint-tmp.<pid>.<hex>".
inline constexpr std::string_view kTmpMarker = ".savepoint-tmp.";
// Marker inside hidden names of a checkpoint being replaced or deleted:
// ".<name>.savepoint-old.<hex>".
inline constexpr std::string_view kOldMarker = ".savepoint-old.";

// "data-<rank:05>-<index:05>.spd".
std::string DataFileName(uint32_t rank, uint32_t index);

// Strips trailing slashes; rejects an empty path and final components that are ".", ".." or start
// with '.' (names starting with '.' are reserved for savepoint's hidden debris).
Result<std::string> NormalizeCheckpointPath(std::string_view path);

// Hidden sibling names for `path`.
std::string TmpPathFor(const std::string& path);
std::string OldPathFor(const std::string& path);
std::string DelPathFor(const std::string& path);

// Marker inside hidden names of a checkpoint being deleted: ".<name>.savepoint-del.<hex>".
inline constexpr std::string_view kDelMarker = ".savepoint-del.";

// A random 64-bit value (for checkpoint ids and unique names).
uint64_t RandomU64();

// For a debris entry name under a root, the checkpoint name it belongs to and its kind.
enum class DebrisKind { kNone, kTmp, kOld, kDeleted };
DebrisKind ClassifyDebris(std::string_view entry_name, std::string* checkpoint_name, int64_t* pid);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_PATHS_H_
