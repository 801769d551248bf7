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

enum class DebrisKind { kNone, kTmp, kOld, kDeleted };

// The entry name of debris of `kind` (not kNone) of the checkpoint named `checkpoint`:
// ".<checkpoint><marker>[<pid>.]<nonce as 16 lowercase hex digits>" (the pid for kTmp only).
std::string DebrisEntryName(DebrisKind kind, std::string_view checkpoint, int64_t pid,
                            uint64_t nonce);

// What a directory entry named `entry_name` (untrusted: any bytes) is: not debris, or the debris
// of the checkpoint whose name is stored into *checkpoint_name (for kTmp, *pid is the writer's
// process id, else 0). Only the exact form DebrisEntryName writes is debris (a positive pid without
// leading zeros, 16 lowercase hex digits, a checkpoint name that is not "." or ".."), so `gc`
// never takes a user's file that merely contains a marker for savepoint's.
DebrisKind ClassifyDebris(std::string_view entry_name, std::string* checkpoint_name, int64_t* pid);

// The holder a lock file's contents (untrusted; FileSystem::LockFile writes the holder's pid)
// name, for error messages: "pid <n>", or "unknown (the lock file holds no pid)".
std::string DescribeLockHolder(std::string_view contents);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_DEBRIS_H_
