// Durable commit: the one way savepoint makes a new file or directory appear at a path, all or
// nothing, so that it survives power loss once it has appeared. Every writer of a committed thing
// uses it: checkpoint directories (single-process, async and multi-rank saves), safetensors files,
// merged directories and the manager's index. docs/FORMAT.md §5 specifies the protocol with the
// same step numbers:
//
//   1. Create the target's parent and its missing ancestors, syncing each new directory's entry
//      in its parent (CommitOptions::create_parents). Refuse an existing target unless
//      overwriting; an empty directory is no target to refuse (it is replaced, overwrite or
//      not). Overwriting never removes what the writer did not write: a directory holding an
//      entry it does not own (CommitOptions::owns), a file where a directory goes and a
//      directory where a file goes are refused (FailedPrecondition naming them).
//   2. Choose the hidden temporary sibling "<parent>/.<name>.savepoint-tmp.<pid>.<hex16>"; for a
//      directory, create it.                                                    (steps 1-2: Begin)
//   3. The writer fills the temporary and syncs every file it writes there.   (the caller's part)
//   4. A directory: SyncDir(tmp), so its entries are durable.
//   5. The target is checked again as in step 1. An empty directory is removed (RemoveDir: only
//      while empty). Overwrite of an existing target: Rename(path,
//      "<parent>/.<name>.savepoint-old.<hex16>").
//   6. Rename(tmp, path): the commit point. Rename never replaces an existing path; if it fails,
//      the old target is renamed back.
//   7. SyncDir(parent): the commit is durable.
//   8. Overwrite: remove the old target and sync the parent (best effort; GarbageCollect finishes
//      it after a crash).                                                  (steps 4-8: Commit)
//
// A crash before step 6 leaves only hidden debris (removed by GarbageCollect); between 5 and 6 the
// old target sits under its hidden name and GarbageCollect renames it back.
//
// In object storage (FileSystem::IsObjectStore) there is no rename and no temporary: tmp() is the
// target itself. Begin refuses a prefix that holds a MANIFEST (AlreadyExists; with overwrite,
// FailedPrecondition: the old checkpoint would be gone before the new one commits) or any other
// object (FailedPrecondition naming them: an unfinished save, or not savepoint's). The writer
// publishes its data objects, each only if absent (FileOptions::exclusive), and the MANIFEST last,
// only if absent: that write is the commit point. A file target is one object, published whole
// (replacing an existing one whole under overwrite; WriteFileDurably writes it only if absent
// otherwise). Commit checks that a checkpoint's MANIFEST is there (commits whose options own
// entries); Abandon removes nothing (a save that failed may have lost a race to another writer of
// the same prefix, whose objects these may be).
//
// Thread safety: a DurableCommit is used by one thread at a time; different targets may be
// committed concurrently.
#ifndef SAVEPOINT_IO_COMMIT_H_
#define SAVEPOINT_IO_COMMIT_H_

#include <functional>
#include <string>
#include <string_view>

#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint::io {

// Creates `dir` and its missing ancestors so that they survive power loss: each new directory's
// entry is synced in its parent. OK if it exists (also when a concurrent creator made it).
Status CreateDirsDurably(FileSystem* fs, const std::string& dir);

struct CommitOptions {
  // Replace an existing target (steps 5 and 8). false: Begin fails with AlreadyExists when the
  // target exists. Default: false.
  bool overwrite = false;
  // Create missing parent directories durably (step 1). false: a missing parent fails Begin with
  // NotFound. Default: true.
  bool create_parents = true;
  // Overwrite of a directory: whether an entry name of the existing directory is one the writer
  // owns (one of a checkpoint's own files). An existing directory holding any other entry is
  // refused, so that overwriting removes only what the writer wrote. Empty: only an empty
  // directory may be replaced. Files ignore it. Default: empty.
  std::function<bool(std::string_view name)> owns;
};

// Whether `path` is a directory with no entries (false when absent or on error).
bool IsEmptyDirectory(FileSystem* fs, const std::string& path);

class DurableCommit {
 public:
  enum class Kind { kFile, kDirectory };

  // Steps 1-2 for the target `path` (a normalised path whose last component does not start with
  // '.'). For kDirectory the temporary directory exists when this returns; for kFile the caller
  // creates the file at tmp(). `fs` is not owned and must outlive the commit.
  static Result<DurableCommit> Begin(FileSystem* fs, std::string path, Kind kind,
                                     const CommitOptions& options);
  // A commit whose temporary was created by Begin elsewhere (e.g. the coordinator of a multi-rank
  // save hands `tmp` to every rank).
  static DurableCommit Adopt(FileSystem* fs, std::string path, std::string tmp, Kind kind,
                             const CommitOptions& options);

  FileSystem* fs() const { return fs_; }
  const std::string& path() const { return path_; }
  const std::string& tmp() const { return tmp_; }

  // Steps 4-8, after the caller has written and synced everything in tmp().
  Status Commit() const;
  // Removes the temporary after a failure (best effort; GarbageCollect removes what is left).
  void Abandon() const;

 private:
  DurableCommit(FileSystem* fs, std::string path, std::string tmp, Kind kind,
                const CommitOptions& options)
      : fs_(fs), path_(std::move(path)), tmp_(std::move(tmp)), kind_(kind), options_(options) {}

  FileSystem* fs_;
  std::string path_;
  std::string tmp_;
  Kind kind_;
  CommitOptions options_;
};

// A small file written whole through the protocol above: `contents` appear at `path` all or
// nothing, durably (steps 1-8 with one WriteFileSynced in between). The manager's index and the
// Python helpers' list files (savepoint.recis) are written this way.
Status WriteFileDurably(FileSystem* fs, const std::string& path, std::string_view contents,
                        const CommitOptions& options);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_COMMIT_H_
