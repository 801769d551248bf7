// MemFileSystem: an in-memory FileSystem with a precise durability model, for power-loss tests.
//
// Model (inode based, like a POSIX file system):
//  - A directory maps names to inodes; a file inode holds bytes. The root "/" always exists and
//    is durable. Paths are absolute ("/a/b"); repeated slashes and "." are ignored, ".." goes up
//    one level (never above "/"), and a relative path is taken relative to "/".
//  - A file's bytes become durable when WritableFile::Sync() is called on it (durable bytes :=
//    current bytes). NewWritableFile on an existing file truncates it in place (same inode); the
//    truncation is not durable until the next Sync.
//  - A directory's entry set (creations, removals, renames into or out of it) becomes durable
//    when SyncDir(dir) is called (durable entries := current entries).
//  - SimulatePowerLoss(): starting at "/", every reachable directory's entries revert to its
//    durable entries and every reachable file's bytes revert to its durable bytes (a never-synced
//    file becomes empty). Because directories are synced independently, a file moved between
//    two directories may end up durable in both (like a hard link) or in neither. A directory
//    that would end up in two places (or inside itself) is kept only at the first place met in
//    a breadth-first walk in name order, so the result is always a tree.
//  - Handles opened before SimulatePowerLoss() belong to the "dead" process: every later call on
//    them (WriteAt, Sync, Close, ReadAt) fails with FailedPrecondition and changes nothing.
//  - MapFile returns a snapshot (in either MapMode): a contiguous, private, 4096-aligned copy of
//  the file's current
//    bytes, made at the call (it costs the file's size in memory). Later writes, truncations and
//    power loss do not change it; it stays valid for as long as it is held, even after the file or
//    the MemFileSystem is gone.
//  - FileOptions::direct_io is accepted; files report direct() == false and have no alignment
//    rules.
//  - Storage is sparse and copy-on-write in 1 MiB blocks: holes read as zeros, a file far larger
//    than 4 GiB costs only the blocks written, and Sync() shares blocks instead of copying them.
//
// Errors use ErrnoToStatus with the errno a Linux file system would report (ENOENT, EEXIST,
// ENOTDIR, EISDIR, ENOTEMPTY, ...), so codes and messages match DefaultFileSystem().
//
// Thread safety: fully thread-safe; one mutex guards the whole tree. Handles share ownership of
// the internal state, so they may outlive the MemFileSystem (they then keep working on the
// orphaned state harmlessly).
#ifndef SAVEPOINT_IO_MEM_FS_H_
#define SAVEPOINT_IO_MEM_FS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

class MemFileSystem : public FileSystem {
 public:
  MemFileSystem();
  ~MemFileSystem() override;
  MemFileSystem(const MemFileSystem&) = delete;
  MemFileSystem& operator=(const MemFileSystem&) = delete;

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const FileOptions& options) override;
  Status CreateDir(const std::string& path) override;
  Result<std::vector<FileInfo>> ListDir(const std::string& path) override;
  Result<FileInfo> Stat(const std::string& path) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveDir(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& path) override;
  Result<std::shared_ptr<const MappedFile>> MapFile(const std::string& path, MapMode mode) override;

  // Reverts everything to its durable state (see the model above) and invalidates open handles.
  void SimulatePowerLoss();

  // Total bytes passed to WritableFile::WriteAt, and the number of WriteAt calls, since
  // construction (power loss does not reset them). Failed calls are not counted.
  uint64_t bytes_written() const;
  uint64_t write_calls() const;

  struct State;  // internal; public only so the file handle classes in mem_fs.cc can name it

 private:
  std::shared_ptr<State> state_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_IO_MEM_FS_H_
