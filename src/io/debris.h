// Names of the hidden siblings the durable commit (io/commit.h) creates next to a checkpoint while
// it is written, replaced or deleted, and their recognition by `gc` and the catalog
// (docs/FORMAT.md, "Directory layout"). Only entries with these names are ever removed as debris.
#ifndef SAVEPOINT_IO_DEBRIS_H_
#define SAVEPOINT_IO_DEBRIS_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace savepoint::io {

// Marker inside hidden names of a save in progress: ".<name>.savepoint-tmp.<pid>.<hex>".
inline constexpr std::string_view kTmpMarker = ".savepoint-tmp.";
// Marker inside hidden names of a checkpoint being replaced: ".<name>.savepoint-old.<hex>".
inline constexpr std::string_view kOldMarker = ".savepoint-old.";
// Marker inside hidden names of a checkpoint being deleted: ".<name>.savepoint-del.<hex>".
inline constexpr std::string_view kDelMarker = ".savepoint-del.";

// Fresh hidden sibling names for `path` (random suffix; the temporary name carries our pid).
std::string TmpPathFor(const std::string& path);
std::string OldPathFor(const std::string& path);
std::string DelPathFor(const std::string& path);

// What a directory entry named `entry_name` is: not debris, or the debris of the checkpoint whose
// name is stored into *checkpoint_name (for kTmp, *pid is the writer's process id, 0 if absent).
enum class DebrisKind { kNone, kTmp, kOld, kDeleted };
DebrisKind ClassifyDebris(std::string_view entry_name, std::string* checkpoint_name, int64_t* pid);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_DEBRIS_H_
