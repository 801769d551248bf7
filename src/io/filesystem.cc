// Implementation-independent parts of savepoint/filesystem.h: the non-virtual FileSystem helpers
// (built only on the virtual calls, so they work for every implementation) and the path helpers.
//
// Thread safety: the helpers are as thread-safe as the FileSystem they run on; the path helpers
// are pure functions.
#include "savepoint/filesystem.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/uring.h"
#include "savepoint/status.h"

namespace savepoint {
namespace {

// Removes trailing slashes, keeping a lone "/".
std::string_view StripTrailingSlashes(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return path;
}

bool IsNotFound(const Status& status) { return status.code() == StatusCode::kNotFound; }

bool DirectAligned(uint64_t offset, size_t size, const void* addr) {
  return offset % kDirectIOAlignment == 0 && size % kDirectIOAlignment == 0 &&
         reinterpret_cast<uintptr_t>(addr) % kDirectIOAlignment == 0;
}

// InvalidArgument naming the first op of a direct-mode batch that is not aligned.
template <typename Op>
Status CheckBatchAlignment(const char* what, const std::string& path, std::span<const Op> ops,
                           std::span<const std::byte> (*bytes)(const Op&)) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::span<const std::byte> b = bytes(ops[i]);
    if (!DirectAligned(ops[i].offset, b.size(), b.data())) {
      return InvalidArgumentError(fmt::format(
          "{} {} at offset {} ({} bytes, buffer {}, op {} of {}): direct I/O needs offset, size "
          "and buffer address aligned to {} bytes",
          what, path, ops[i].offset, b.size(), static_cast<const void*>(b.data()), i, ops.size(),
          kDirectIOAlignment));
    }
  }
  return Status::OK();
}

std::span<const std::byte> WriteBytes(const WriteOp& op) { return op.data; }
std::span<const std::byte> ReadBytes(const ReadOp& op) { return op.dst; }

}  // namespace

const char* IoBackendName(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "uring";
    case IoBackend::kPwrite:
      return "pwrite";
  }
  return "unknown";
}

Status CheckWriteBatchAlignment(const std::string& path, std::span<const WriteOp> ops) {
  return CheckBatchAlignment<WriteOp>("write", path, ops, &WriteBytes);
}

Status CheckReadBatchAlignment(const std::string& path, std::span<const ReadOp> ops) {
  return CheckBatchAlignment<ReadOp>("read", path, ops, &ReadBytes);
}

Status WritableFile::WriteAtMany(std::span<const WriteOp> ops) {
  if (direct()) SP_RETURN_IF_ERROR(CheckWriteBatchAlignment(path(), ops));
  for (const WriteOp& op : ops) SP_RETURN_IF_ERROR(WriteAt(op.offset, op.data));
  return Status::OK();
}

Status RandomAccessFile::ReadAtMany(std::span<const ReadOp> ops) const {
  if (direct()) SP_RETURN_IF_ERROR(CheckReadBatchAlignment(path(), ops));
  for (const ReadOp& op : ops) SP_RETURN_IF_ERROR(ReadAt(op.offset, op.dst));
  return Status::OK();
}

Result<VersionedFile> FileSystem::ReadVersioned(const std::string& path, uint64_t max_bytes) {
  (void)max_bytes;
  return UnimplementedError("read " + path + " with its version: this file system has no " +
                            "compare-and-swap (object stores have)");
}

Result<std::string> FileSystem::WriteIfVersion(const std::string& path, std::string_view contents,
                                               const std::string& version) {
  (void)contents;
  (void)version;
  return UnimplementedError("replace " + path + " if unchanged: this file system has no " +
                            "compare-and-swap (object stores have)");
}

bool FileSystem::Exists(const std::string& path) {
  Result<FileInfo> info = Stat(path);
  return info.ok() || !IsNotFound(info.status());
}

Status FileSystem::RemoveAll(const std::string& path) {
  Result<FileInfo> info = Stat(path);
  if (!info.ok()) return IsNotFound(info.status()) ? Status::OK() : info.status();
  if (!info->is_dir) {
    Status status = RemoveFile(path);
    return IsNotFound(status) ? Status::OK() : status;
  }
  Result<std::vector<FileInfo>> entries = ListDir(path);
  if (!entries.ok()) return IsNotFound(entries.status()) ? Status::OK() : entries.status();
  for (const FileInfo& entry : *entries) {
    SP_RETURN_IF_ERROR(RemoveAll(JoinPath(path, entry.name)));
  }
  Status status = RemoveDir(path);
  return IsNotFound(status) ? Status::OK() : status;
}

Status FileSystem::CreateDirs(const std::string& path) {
  Result<FileInfo> info = Stat(path);
  if (info.ok()) {
    if (info->is_dir) return Status::OK();
    return AlreadyExistsError(
        fmt::format("create directory {}: exists and is not a directory", path));
  }
  if (!IsNotFound(info.status())) return info.status();
  const std::string parent = Dirname(path);
  if (parent != path && parent != "." && parent != "/") SP_RETURN_IF_ERROR(CreateDirs(parent));
  Status status = CreateDir(path);
  if (status.code() == StatusCode::kAlreadyExists) {
    // Lost a race with another creator: fine if the winner made a directory.
    Result<FileInfo> again = Stat(path);
    if (again.ok() && again->is_dir) return Status::OK();
  }
  return status;
}

Result<std::string> FileSystem::ReadFile(const std::string& path, uint64_t max_bytes) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                      NewRandomAccessFile(path, FileOptions{}));
  const uint64_t size = file->size();
  if (size > max_bytes) {
    return ResourceExhaustedError(fmt::format(
        "read {}: file is {} bytes, larger than the limit of {} bytes", path, size, max_bytes));
  }
  std::string contents(static_cast<size_t>(size), '\0');
  std::span<std::byte> dst(reinterpret_cast<std::byte*>(contents.data()), contents.size());
  SP_RETURN_IF_ERROR(file->ReadAt(0, dst));
  return contents;
}

Status FileSystem::WriteFileSynced(const std::string& path, std::string_view contents) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, NewWritableFile(path, FileOptions{}));
  SP_RETURN_IF_ERROR(file->WriteAt(0, std::as_bytes(std::span(contents.data(), contents.size()))));
  SP_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

namespace {

// The default FileLock: an entry in a process-wide table of (file system, path) pairs.
class TableLock final : public FileSystem::FileLock {
 public:
  static std::mutex& Mu() {
    static std::mutex mu;
    return mu;
  }
  static std::set<std::pair<const FileSystem*, std::string>>& Held() {
    static auto* held = new std::set<std::pair<const FileSystem*, std::string>>();
    return *held;
  }
  TableLock(const FileSystem* fs, std::string path) : fs_(fs), path_(std::move(path)) {}
  ~TableLock() override {
    std::lock_guard<std::mutex> lock(Mu());
    Held().erase({fs_, path_});
  }
  const std::string& path() const override { return path_; }

 private:
  const FileSystem* fs_;
  std::string path_;
};

}  // namespace

Result<std::unique_ptr<FileSystem::FileLock>> FileSystem::LockFile(const std::string& path) {
  if (!Exists(path)) SP_RETURN_IF_ERROR(WriteFileSynced(path, ""));
  std::lock_guard<std::mutex> lock(TableLock::Mu());
  if (!TableLock::Held().insert({this, path}).second) {
    return FailedPreconditionError(
        fmt::format("lock {} is held by another holder in this process", path));
  }
  return std::unique_ptr<FileLock>(std::make_unique<TableLock>(this, path));
}

std::string JoinPath(std::string_view a, std::string_view b) {
  a = StripTrailingSlashes(a);
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  if (a == "/") return fmt::format("/{}", b);
  return fmt::format("{}/{}", a, b);
}

std::string Dirname(std::string_view path) {
  path = StripTrailingSlashes(path);
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  std::string_view dir = StripTrailingSlashes(path.substr(0, slash));
  return dir.empty() ? "/" : std::string(dir);
}

std::string Basename(std::string_view path) {
  path = StripTrailingSlashes(path);
  if (path == "/") return "/";
  const size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

}  // namespace savepoint
