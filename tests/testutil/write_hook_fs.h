// WriteHookFileSystem: a ForwardingFileSystem with a hook on data writes, for tests that count or
// interrupt what a save writes.
#ifndef SAVEPOINT_TESTS_TESTUTIL_WRITE_HOOK_FS_H_
#define SAVEPOINT_TESTS_TESTUTIL_WRITE_HOOK_FS_H_

#include <memory>
#include <string>

#include "savepoint/filesystem.h"

namespace savepoint::testing {

class WriteHookFileSystem : public ForwardingFileSystem {
 public:
  explicit WriteHookFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}

  // Called before every WriteAt on a file opened through this object (any thread).
  virtual void OnWrite(const std::string& path, uint64_t bytes) {
    (void)path;
    (void)bytes;
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const FileOptions& o) override {
    SP_ASSIGN_OR_RETURN(auto f, base()->NewWritableFile(p, o));
    return std::unique_ptr<WritableFile>(std::make_unique<File>(std::move(f), this));
  }

 private:
  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> f, WriteHookFileSystem* fs) : f_(std::move(f)), fs_(fs) {}
    Status WriteAt(uint64_t off, std::span<const std::byte> d) override {
      fs_->OnWrite(f_->path(), d.size());
      return f_->WriteAt(off, d);
    }
    Status Preallocate(uint64_t bytes) override { return f_->Preallocate(bytes); }
    Status Sync() override { return f_->Sync(); }
    Status Close() override { return f_->Close(); }
    bool direct() const override { return f_->direct(); }
    const std::string& path() const override { return f_->path(); }

   private:
    std::unique_ptr<WritableFile> f_;
    WriteHookFileSystem* fs_;
  };
};

}  // namespace savepoint::testing

#endif  // SAVEPOINT_TESTS_TESTUTIL_WRITE_HOOK_FS_H_
