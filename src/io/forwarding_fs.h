// ForwardingFileSystem: a FileSystem that passes every call to a base file system (not owned).
// Derive from it to change a few calls and keep the rest (the failover snapshots' recycling file
// system, tests' write hooks).
// Thread safety: as the base's.
#ifndef SAVEPOINT_IO_FORWARDING_FS_H_
#define SAVEPOINT_IO_FORWARDING_FS_H_

#include <memory>
#include <string>
#include <vector>

#include "savepoint/filesystem.h"

namespace savepoint {

class ForwardingFileSystem : public FileSystem {
 public:
  explicit ForwardingFileSystem(FileSystem* base) : base_(base) {}

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const FileOptions& o) override {
    return base_->NewWritableFile(p, o);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const FileOptions& o) override {
    return base_->NewRandomAccessFile(p, o);
  }
  Status CreateDir(const std::string& p) override { return base_->CreateDir(p); }
  Result<std::vector<FileInfo>> ListDir(const std::string& p) override { return base_->ListDir(p); }
  Result<FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  Status RemoveFile(const std::string& p) override { return base_->RemoveFile(p); }
  Status RemoveDir(const std::string& p) override { return base_->RemoveDir(p); }
  Status Rename(const std::string& a, const std::string& b) override { return base_->Rename(a, b); }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  Result<std::shared_ptr<const MappedFile>> MapFile(const std::string& p, MapMode m) override {
    return base_->MapFile(p, m);
  }

 protected:
  FileSystem* base() const { return base_; }

 private:
  FileSystem* base_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_IO_FORWARDING_FS_H_
