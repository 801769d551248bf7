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
  Result<VersionedFile> ReadVersioned(const std::string& p, uint64_t max_bytes) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->ReadVersioned(p, max_bytes);
  }
  Result<std::string> WriteIfVersion(const std::string& p, std::string_view contents,
                                     const std::string& version) override {
    SP_ASSIGN_OR_RETURN(FileSystem * fs, For(p));
    return fs->WriteIfVersion(p, contents, version);
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

 public:
  // The S3 file system if it was made, else nullptr.
  FileSystem* S3IfMade() {
    std::lock_guard<std::mutex> lock(mu_);
    return s3_.get();
  }
};

}  // namespace
}  // namespace savepoint::io

namespace savepoint {

FileSystem* DefaultFileSystem() {
  static FileSystem* const fs = new io::SchemeRouter();  // never destroyed
  return fs;
}

Result<S3RequestCounts> S3Requests(FileSystem* fs) {
  if (fs == nullptr) {
    fs = static_cast<io::SchemeRouter*>(DefaultFileSystem())->S3IfMade();
    if (fs == nullptr) return S3RequestCounts{};
  }
  auto* s3 = dynamic_cast<io::S3FileSystem*>(fs);
  if (s3 == nullptr) {
    return InvalidArgumentError("S3Requests: the file system is not one NewS3FileSystem made");
  }
  const io::S3Counters& c = s3->client()->counters();
  return S3RequestCounts{c.get.load(),     c.put.load(),        c.head.load(),
                         c.list.load(),    c.del.load(),        c.post.load(),
                         c.retries.load(), c.bytes_sent.load(), c.bytes_received.load()};
}

}  // namespace savepoint
