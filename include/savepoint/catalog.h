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

#include "savepoint/checkpoint.h"
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
// asked whether it is still writing); its data objects are removed, other objects never. Multipart
// uploads under the root begun before that and never completed (FileSystem::AbortAbandonedWrites)
// are aborted and returned as "<uri> (upload <id>)".
SAVEPOINT_API Result<std::vector<std::string>> GarbageCollect(const std::string& root,
                                                              const GcOptions& options = {});

// Deletes a committed checkpoint crash-safely: it is first renamed to a hidden trash name (so
// it is never seen half-deleted), the rename is synced, then the files are removed. A directory
// without a MANIFEST is not a committed checkpoint: NotFound, nothing deleted. A directory that
// also holds files that are not the checkpoint's (a user's notes), and a checkpoint in object
// storage: its MANIFEST first (what is left is no checkpoint), then its own data files; the
// others stay. A single-file checkpoint (safetensors, .ckpt) is renamed and removed; a file
// whose first bytes are not those of one (format/file_magic.h) is FailedPrecondition, nothing
// deleted.
SAVEPOINT_API Status DeleteCheckpoint(const std::string& path, FileSystem* fs = nullptr);

// How CopyCheckpoint copies (every field is honoured).
struct SAVEPOINT_API CopyOptions {
  // File systems of the source and of the target. Default: nullptr = DefaultFileSystem(), which
  // routes s3:// paths to object storage and the rest to POSIX.
  FileSystem* source_fs = nullptr;
  FileSystem* target_fs = nullptr;
  // Replace a committed checkpoint at the target (only the target's own files are removed, as an
  // overwriting save does). In object storage: FailedPrecondition (delete it first). Default:
  // false (AlreadyExists when the target holds a checkpoint).
  bool overwrite = false;
  // Blocks copied at the same time (of one file or of several), 1..64. Default: 4.
  int threads = 4;
  // Bytes read and written per request, 1 MiB..1 GiB. Default: 16 MiB.
  uint64_t block_bytes = 16ull << 20;
  // Upper bound on the bytes copied per second, all threads together; 0 = no bound. Default: 0.
  uint64_t max_bytes_per_second = 0;
  // Progress of the copy in bytes, as for saves (ProgressFn, savepoint/checkpoint.h: at most ~10
  // calls a second from the copying threads, one at a time, and a last one with done == total).
  // Default: none.
  ProgressFn progress = nullptr;
};

struct SAVEPOINT_API CopyStats {
  uint64_t files = 0;  // files copied, the MANIFEST included
  uint64_t bytes = 0;  // bytes copied
  double seconds = 0;  // wall time of the whole copy
};

// Copies the committed checkpoint directory `source` to `target` (docs/FORMAT.md §5 and §5.1):
// its data files first, then its MANIFEST, then the commit, so the target appears whole or not at
// all (in object storage: the MANIFEST written only if absent is the commit point). Between a disk
// and a bucket in either direction, or between two places of one kind. Each data file's size is
// checked against the source after it is written. NotFound when the source is not a committed
// checkpoint; the target's parent is created. Files that are not the checkpoint's (by name) are
// not copied. Thread safety: reentrant; the source must not be deleted or overwritten meanwhile.
SAVEPOINT_API Result<CopyStats> CopyCheckpoint(const std::string& source, const std::string& target,
                                               const CopyOptions& options = {});

}  // namespace savepoint

#endif  // SAVEPOINT_CATALOG_H_
