// Finding, listing and cleaning up checkpoints under a root directory.
//
// Thread safety: functions are reentrant. GarbageCollect must not race with a save into the same
// root from another process unless `min_age_seconds` exceeds the longest save.
#ifndef SAVEPOINT_CATALOG_H_
#define SAVEPOINT_CATALOG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

struct SAVEPOINT_API CheckpointEntry {
  std::string name;        // directory name under the root
  std::string path;        // root/name
  bool committed = false;  // a valid, committed checkpoint (MANIFEST parses and checks out)
  std::string problem;     // why not committed: "temporary directory of an unfinished save", ...
  std::optional<int64_t> step;  // the int value named "step" (or metadata "step"), if any
  uint64_t bytes = 0;           // total file bytes in the directory
  int64_t created_ns = 0;       // manifest creation time, or directory mtime when not committed
  size_t num_tensors = 0;
};

// Lists checkpoint directories under `root` (not recursive): committed ones and debris of crashed
// saves (marked committed=false). Other files are ignored. Sorted by creation time, then name.
// `fs` nullptr = DefaultFileSystem().
SAVEPOINT_API Result<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& root,
                                                                   FileSystem* fs = nullptr);

struct SAVEPOINT_API GcOptions {
  FileSystem* fs = nullptr;  // Default: DefaultFileSystem()
  // Only remove debris whose modification time is at least this old. Default: 0.
  int64_t min_age_seconds = 0;
  // Report what would be removed without removing it. Default: false.
  bool dry_run = false;
};

// Removes debris of crashed saves under `root` (of any durable commit, docs/FORMAT.md §5:
// checkpoint directories, safetensors files, manager index files): temporaries of unfinished
// saves and leftovers of an overwrite. If a crash interrupted an overwrite after the old target
// was set aside but before the new one was committed, the old one is restored instead of removed.
// Committed checkpoints are never touched. Returns the paths removed (or restored).
// In object storage (an s3:// root) debris is a prefix holding data objects and no MANIFEST, none
// of them written in the last hour (or min_age_seconds, when longer: no process there can be
// asked whether it is still writing); its data objects are removed, other objects never.
SAVEPOINT_API Result<std::vector<std::string>> GarbageCollect(const std::string& root,
                                                              const GcOptions& options = {});

// Deletes a committed checkpoint crash-safely: it is first renamed to a hidden trash name (so
// it is never seen half-deleted), the rename is synced, then the files are removed. In object
// storage: its MANIFEST first (what is left is no checkpoint), then its own data objects.
SAVEPOINT_API Status DeleteCheckpoint(const std::string& path, FileSystem* fs = nullptr);

}  // namespace savepoint

#endif  // SAVEPOINT_CATALOG_H_
