// io::PosixFileSystemInstance() (io/default_fs.h): the POSIX (Linux) implementation of
// savepoint/filesystem.h, which DefaultFileSystem() serves local paths with.
//
// Files are opened with O_CLOEXEC, and with O_DIRECT when FileOptions::direct_io asks for it and
// the file system supports it (tmpfs does not: the open then falls back to buffered I/O and the
// file reports direct() == false). Writes use pwrite and reads pread, looping over short
// transfers and EINTR. WriteAtMany / ReadAtMany submit the whole batch through this thread's
// io_uring (src/io/uring.h) when the file's backend resolved to kUring, else loop over
// pwrite/pread. Rename uses renameat2(RENAME_NOREPLACE); on file systems without it, it
// falls back to "stat the target, then rename(2)", which cannot replace a target that exists
// before the call but can race with a concurrent creator of the same target.
//
// MapFile maps the whole file with mmap (read-only: PROT_READ, MAP_SHARED; copy-on-write:
// PROT_READ | PROT_WRITE, MAP_PRIVATE) and closes the fd right away (the mapping keeps the file
// referenced). No madvise: pages are read lazily, on first access. An
// empty file maps to an empty span without calling mmap (mmap of length 0 is EINVAL).
//
// Symbolic links: Stat follows them; ListDir does not (a link is listed as a non-directory), so
// RemoveAll on a tree never descends through a link.
//
// Thread safety: the file system object is stateless and thread-safe. A PosixWritableFile accepts
// concurrent WriteAt calls (pwrite is positional); Sync/Close must not race with writes.
// PosixRandomAccessFile::ReadAt is thread-safe. A PosixMappedFile is immutable.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // renameat2, O_DIRECT
#endif

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/debris.h"
#include "io/default_fs.h"
#include "io/uring.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {
namespace {

// Largest single pread/pwrite request; Linux transfers at most ~2 GiB per call anyway.
constexpr size_t kMaxTransfer = size_t{1} << 30;

bool Aligned(uint64_t value) { return value % kDirectIOAlignment == 0; }

// InvalidArgument unless offset, size and address all satisfy the direct I/O alignment.
Status CheckDirectAlignment(const char* op, const std::string& path, uint64_t offset, size_t size,
                            const void* addr) {
  if (Aligned(offset) && Aligned(size) && Aligned(reinterpret_cast<uintptr_t>(addr))) {
    return Status::OK();
  }
  return InvalidArgumentError(fmt::format(
      "{} {} at offset {} ({} bytes, buffer {}): direct I/O needs offset, size and buffer "
      "address aligned to {} bytes",
      op, path, offset, size, addr, kDirectIOAlignment));
}

// Opens `path` with `flags`, adding O_DIRECT if asked; falls back to a buffered open when the
// file system rejects O_DIRECT with EINVAL. Returns the fd (or -1 with errno set).
int OpenMaybeDirect(const std::string& path, int flags, bool want_direct, bool* direct) {
  *direct = false;
  if (want_direct) {
    int fd;
    do {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0 || errno != EINVAL) {
      *direct = fd >= 0;
      return fd;
    }
  }
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// Opens an existing regular file read-only (O_DIRECT when asked and possible) and stats it.
// `what` names the purpose in error messages ("reading", "mapping").
Result<int> OpenRegularForRead(const std::string& path, bool want_direct, bool* direct,
                               struct stat* st, std::string_view what) {
  const int fd = OpenMaybeDirect(path, O_RDONLY | O_CLOEXEC, want_direct, direct);
  if (fd < 0) return ErrnoToStatus(errno, fmt::format("open {} for {}", path, what));
  if (::fstat(fd, st) != 0) {
    Status status = ErrnoToStatus(errno, fmt::format("stat {}", path));
    ::close(fd);
    return status;
  }
  if (S_ISDIR(st->st_mode)) {
    ::close(fd);
    return ErrnoToStatus(EISDIR, fmt::format("open {} for {}", path, what));
  }
  return fd;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

FileInfo InfoFromStat(std::string name, const struct stat& st) {
  FileInfo info;
  info.name = std::move(name);
  info.is_dir = S_ISDIR(st.st_mode);
  info.size = info.is_dir ? 0 : static_cast<uint64_t>(st.st_size);
  info.mtime_ns = MtimeNs(st);
  return info;
}

// A file open for writing. Owns its fd.
class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, bool direct, IoBackend backend)
      : path_(std::move(path)), fd_(fd), direct_(direct), backend_(backend) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    if (fd_ < 0) return FailedPreconditionError(fmt::format("write {}: file is closed", path_));
    if (direct_) {
      SP_RETURN_IF_ERROR(CheckDirectAlignment("write", path_, offset, data.size(), data.data()));
    }
    while (!data.empty()) {
      const size_t want = std::min(data.size(), kMaxTransfer);
      const ssize_t n = ::pwrite(fd_, data.data(), want, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, fmt::format("write {} at offset {}", path_, offset));
      }
      if (n == 0) {
        return IOError(fmt::format("write {} at offset {}: pwrite wrote nothing", path_, offset));
      }
      data = data.subspan(static_cast<size_t>(n));
      offset += static_cast<uint64_t>(n);
    }
    return Status::OK();
  }

  Status WriteAtMany(std::span<const WriteOp> ops) override {
    if (fd_ < 0) return FailedPreconditionError(fmt::format("write {}: file is closed", path_));
    if (backend_ != IoBackend::kUring || !UringThreadAvailable()) {
      return WritableFile::WriteAtMany(ops);
    }
    if (direct_) SP_RETURN_IF_ERROR(CheckWriteBatchAlignment(path_, ops));
    return UringWriteMany(fd_, path_, ops);
  }

  Status Preallocate(uint64_t bytes) override {
    if (fd_ < 0)
      return FailedPreconditionError(fmt::format("preallocate {}: file is closed", path_));
    if (bytes == 0 || ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes)) == 0) return Status::OK();
    if (errno == EOPNOTSUPP || errno == ENOSYS) return Status::OK();  // e.g. some network FSs
    return ErrnoToStatus(errno, fmt::format("preallocate {} bytes for {}", bytes, path_));
  }

  Status Sync() override {
    if (fd_ < 0) return FailedPreconditionError(fmt::format("sync {}: file is closed", path_));
    if (::fdatasync(fd_) != 0) return ErrnoToStatus(errno, fmt::format("sync {}", path_));
    return Status::OK();
  }

  Status Close() override {
    if (fd_ < 0) return FailedPreconditionError(fmt::format("close {}: file is closed", path_));
    const int fd = std::exchange(fd_, -1);
    // Linux releases the fd even when close fails (EINTR included), so never retry.
    if (::close(fd) != 0) return ErrnoToStatus(errno, fmt::format("close {}", path_));
    return Status::OK();
  }

  bool direct() const override { return direct_; }
  IoBackend io_backend() const override { return backend_; }
  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  int fd_;
  const bool direct_;
  const IoBackend backend_;
};

// A file open for reading. Owns its fd.
class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, bool direct, uint64_t size, IoBackend backend)
      : path_(std::move(path)), fd_(fd), direct_(direct), size_(size), backend_(backend) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Status ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    if (direct_) {
      SP_RETURN_IF_ERROR(CheckDirectAlignment("read", path_, offset, dst.size(), dst.data()));
    }
    uint64_t pos = offset;
    std::span<std::byte> rest = dst;
    while (!rest.empty()) {
      const size_t want = std::min(rest.size(), kMaxTransfer);
      const ssize_t n = ::pread(fd_, rest.data(), want, static_cast<off_t>(pos));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoToStatus(errno, fmt::format("read {} at offset {}", path_, pos));
      }
      // A direct read that is short by a non-multiple of the alignment has hit end of file.
      const bool eof = n == 0 || (direct_ && !Aligned(static_cast<uint64_t>(n)));
      rest = rest.subspan(static_cast<size_t>(n));
      pos += static_cast<uint64_t>(n);
      if (eof && !rest.empty()) return PastEnd(offset, dst.size(), pos);
    }
    return Status::OK();
  }

  Status ReadAtMany(std::span<const ReadOp> ops) const override {
    if (backend_ != IoBackend::kUring || !UringThreadAvailable()) {
      return RandomAccessFile::ReadAtMany(ops);
    }
    if (direct_) SP_RETURN_IF_ERROR(CheckReadBatchAlignment(path_, ops));
    return UringReadMany(fd_, path_, direct_, ops);
  }

  uint64_t size() const override { return size_; }
  bool direct() const override { return direct_; }
  IoBackend io_backend() const override { return backend_; }
  const std::string& path() const override { return path_; }

 private:
  Status PastEnd(uint64_t offset, size_t size, uint64_t end) const {
    return OutOfRangeError(
        fmt::format("read {} at offset {} ({} bytes): past end of file, which ends at byte {}",
                    path_, offset, size, end));
  }

  const std::string path_;
  const int fd_;
  const bool direct_;
  const uint64_t size_;
  const IoBackend backend_;
};

// A read-only mapping of a whole file. Owns the mapping (munmap on destruction), not an fd.
class PosixMappedFile final : public MappedFile {
 public:
  // `addr` is the mmap result for `size` bytes, or nullptr when size == 0 (nothing mapped).
  PosixMappedFile(std::string path, void* addr, size_t size, MapMode mode)
      : path_(std::move(path)), addr_(addr), size_(size), mode_(mode) {}
  ~PosixMappedFile() override {
    if (addr_ != nullptr) ::munmap(addr_, size_);
  }
  PosixMappedFile(const PosixMappedFile&) = delete;
  PosixMappedFile& operator=(const PosixMappedFile&) = delete;

  std::span<const std::byte> data() const override {
    return {static_cast<const std::byte*>(addr_), size_};
  }
  const std::string& path() const override { return path_; }
  MapMode mode() const override { return mode_; }

 private:
  const std::string path_;
  void* const addr_;
  const size_t size_;
  const MapMode mode_;
};

// Closes a DIR* on scope exit.
struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override {
    bool direct = false;
    const int fd =
        OpenMaybeDirect(path,
                        O_WRONLY | O_CREAT | O_CLOEXEC | (options.truncate ? O_TRUNC : 0) |
                            (options.exclusive ? O_EXCL : 0),
                        options.direct_io, &direct);
    if (fd < 0) return ErrnoToStatus(errno, fmt::format("open {} for writing", path));
    return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(
        path, fd, direct, ResolveIoBackend(options.io_backend)));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const FileOptions& options) override {
    bool direct = false;
    struct stat st;
    SP_ASSIGN_OR_RETURN(const int fd,
                        OpenRegularForRead(path, options.direct_io, &direct, &st, "reading"));
    // A hint: a failure costs only read-ahead.
    if (options.random_access) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    return std::unique_ptr<RandomAccessFile>(std::make_unique<PosixRandomAccessFile>(
        path, fd, direct, static_cast<uint64_t>(st.st_size), ResolveIoBackend(options.io_backend)));
  }

  Result<std::shared_ptr<const MappedFile>> MapFile(const std::string& path,
                                                    MapMode mode) override {
    bool direct = false;
    struct stat st;
    SP_ASSIGN_OR_RETURN(const int fd, OpenRegularForRead(path, false, &direct, &st, "mapping"));
    const size_t size = static_cast<size_t>(st.st_size);  // 64-bit Linux: size_t holds off_t
    void* addr = nullptr;
    if (size > 0) {
      const bool cow = mode == MapMode::kCopyOnWrite;
      addr = ::mmap(nullptr, size, cow ? PROT_READ | PROT_WRITE : PROT_READ,
                    cow ? MAP_PRIVATE : MAP_SHARED, fd, 0);
      if (addr == MAP_FAILED) {
        Status status = ErrnoToStatus(errno, fmt::format("map {} ({} bytes)", path, size));
        ::close(fd);
        return status;
      }
    }
    ::close(fd);  // the mapping keeps its own reference to the file
    return std::shared_ptr<const MappedFile>(
        std::make_shared<PosixMappedFile>(path, addr, size, mode));
  }

  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) {
      return ErrnoToStatus(errno, fmt::format("create directory {}", path));
    }
    return Status::OK();
  }

  Result<std::vector<FileInfo>> ListDir(const std::string& path) override {
    std::unique_ptr<DIR, DirCloser> dir(::opendir(path.c_str()));
    if (dir == nullptr) return ErrnoToStatus(errno, fmt::format("list directory {}", path));
    std::vector<FileInfo> entries;
    while (true) {
      errno = 0;
      const struct dirent* entry = ::readdir(dir.get());
      if (entry == nullptr) {
        if (errno != 0) return ErrnoToStatus(errno, fmt::format("list directory {}", path));
        break;
      }
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      struct stat st;
      if (::fstatat(::dirfd(dir.get()), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed since readdir returned it
        return ErrnoToStatus(errno, fmt::format("stat {}", JoinPath(path, name)));
      }
      entries.push_back(InfoFromStat(name, st));
    }
    return entries;
  }

  Result<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, fmt::format("stat {}", path));
    return InfoFromStat(Basename(path), st);
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) {
      return ErrnoToStatus(errno, fmt::format("remove file {}", path));
    }
    return Status::OK();
  }

  Status RemoveDir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) {
      return ErrnoToStatus(errno, fmt::format("remove directory {}", path));
    }
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    const std::string context = fmt::format("rename {} to {}", from, to);
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      return Status::OK();
    }
    if (errno != EINVAL && errno != ENOSYS) return ErrnoToStatus(errno, context);
    // No RENAME_NOREPLACE on this file system: check, then rename.
    struct stat st;
    if (::lstat(to.c_str(), &st) == 0) return ErrnoToStatus(EEXIST, context);
    if (errno != ENOENT) return ErrnoToStatus(errno, context);
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoToStatus(errno, context);
    return Status::OK();
  }

  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override;

  Status SyncDir(const std::string& path) override {
    const std::string context = fmt::format("sync directory {}", path);
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoToStatus(errno, context);
    Status status;
    if (::fsync(fd) != 0) status = ErrnoToStatus(errno, context);
    ::close(fd);
    return status;
  }
};

// An flock(2) lock on an open file; closing the descriptor releases it.
class PosixFileLock final : public FileSystem::FileLock {
 public:
  PosixFileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFileLock() override { ::close(fd_); }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
};

Result<std::unique_ptr<FileSystem::FileLock>> PosixFileSystem::LockFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, fmt::format("open lock file {}", path));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) return ErrnoToStatus(err, fmt::format("lock {}", path));
    const std::string_view contents(holder, n > 0 ? static_cast<size_t>(n) : 0);
    return FailedPreconditionError(fmt::format("lock {} is held by another holder ({})", path,
                                               io::DescribeLockHolder(contents)));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    Status status = ErrnoToStatus(errno, fmt::format("write lock file {}", path));
    ::close(fd);
    return status;
  }
  return std::unique_ptr<FileLock>(std::make_unique<PosixFileLock>(path, fd));
}

}  // namespace

namespace io {

FileSystem* PosixFileSystemInstance() {
  static FileSystem* const fs = new PosixFileSystem();  // never destroyed
  return fs;
}

}  // namespace io
}  // namespace savepoint
