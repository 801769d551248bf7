// DefaultFileSystem(): one face for every path a caller may give (io/default_fs.h).
#include "io/default_fs.h"

#include <fmt/format.h>

#include <cctype>
#include <memory>
#include <mutex>

#include "io/s3_fs.h"
#include "savepoint/s3.h"

namespace savepoint::io {

std::string_view SchemeOf(std::string_view path) {
  const size_t sep = path.find("://");
  if (sep == std::string_view::npos || sep == 0 ||
      !std::isalpha(static_cast<unsigned char>(path[0]))) {
    return {};
  }
  for (size_t i = 1; i < sep; ++i) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return {};
  }
  return path.substr(0, sep);
}

namespace {

// Sends each call to the file system that serves its path.
class SchemeRouter final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const FileOptions& o) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->NewWritableFile(p, o);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const FileOptions& o) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->NewRandomAccessFile(p, o);
  }
  Status CreateDir(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->CreateDir(p);
  }
  Result<std::vector<FileInfo>> ListDir(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->ListDir(p);
  }
  Result<FileInfo> Stat(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->Stat(p);
  }
  Status RemoveFile(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->RemoveFile(p);
  }
  Status RemoveDir(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->RemoveDir(p);
  }
  Status Rename(const std::string& a, const std::string& b) override {
    if (SchemeOf(a) != SchemeOf(b)) {
      return InvalidArgumentError(fmt::format("rename {} to {}: not one file system", a, b));
    }
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(a));
    return fs->Rename(a, b);
  }
  Status SyncDir(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->SyncDir(p);
  }
  Result<std::shared_ptr<const MappedFile>> MapFile(const std::string& p, MapMode m) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->MapFile(p, m);
  }
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->LockFile(p);
  }
  bool IsObjectStore(const std::string& p) override { return SchemeOf(p) == "s3"; }
  Result<std::vector<std::string>> AbortAbandonedWrites(const std::string& p, int64_t before_ns,
                                                        bool dry_run) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->AbortAbandonedWrites(p, before_ns, dry_run);
  }

 private:
  Result<FileSystem*> For(const std::string& path) {
    const std::string_view scheme = SchemeOf(path);
    if (scheme.empty()) return PosixFileSystemInstance();
    if (scheme == "s3") return S3();
    return InvalidArgumentError(fmt::format(
        "{}: savepoint serves local paths and s3:// URIs, not the scheme {:?}", path, scheme));
  }

  // Built on first use from the environment; a failure is returned and tried again next time
  // (the environment may be fixed in between).
  Result<FileSystem*> S3() {
    std::lock_guard<std::mutex> lock(mu_);
    if (s3_ == nullptr) {
      Result<std::unique_ptr<FileSystem>> fs = NewS3FileSystem(S3Options{});
      if (!fs.ok()) return fs.status().WithContext("the S3 settings of the environment");
      s3_ = std::move(*fs);
    }
    return s3_.get();
  }

  std::mutex mu_;
  std::unique_ptr<FileSystem> s3_;
};

}  // namespace
}  // namespace savepoint::io

namespace savepoint {

FileSystem* DefaultFileSystem() {
  static FileSystem* const fs = new io::SchemeRouter();  // never destroyed
  return fs;
}

}  // namespace savepoint
