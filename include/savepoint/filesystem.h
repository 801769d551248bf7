// FileSystem: the only way savepoint touches storage.
//
// Every byte savepoint reads or writes goes through this interface, so tests can swap in an
// in-memory file system that models power loss, or a wrapper that fails the n-th call. Shaped
// after LevelDB's Env and RocksDB's FileSystem.
//
// Paths are '/'-separated strings. Implementations:
//  - DefaultFileSystem(): POSIX (open/pwrite/pread/fsync/renameat2/mmap), with optional O_DIRECT;
//    "s3://bucket/key" URIs go to an object store (savepoint/s3.h), other schemes are refused.
//  - NewS3FileSystem() (savepoint/s3.h): S3-compatible object storage, paths "s3://bucket/key".
//  - src/io/mem_fs.h: MemFileSystem, in memory, with a durability model (see there).
//  - src/io/fault_fs.h: FaultInjectionFileSystem, wraps another and injects failures.
//
// Thread safety: FileSystem methods are thread-safe. A WritableFile may receive concurrent WriteAt
// calls for non-overlapping ranges; Sync/Close must not race with writes. RandomAccessFile::ReadAt
// is thread-safe. A MappedFile is immutable and may be read from any number of threads.
#ifndef SAVEPOINT_FILESYSTEM_H_
#define SAVEPOINT_FILESYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/export.h"
#include "savepoint/status.h"

namespace savepoint {

// Alignment that offsets, sizes and buffer addresses must have when a file is in direct mode.
inline constexpr size_t kDirectIOAlignment = 4096;

struct SAVEPOINT_API FileInfo {
  std::string name;  // last path component
  bool is_dir = false;
  uint64_t size = 0;     // bytes (files only)
  int64_t mtime_ns = 0;  // modification time, ns since the Unix epoch (0 if unknown)
};

// How a file submits batched transfers (WriteAtMany / ReadAtMany).
enum class IoBackend {
  // io_uring when the kernel allows it, else pwrite/pread; the environment variable
  // SAVEPOINT_IO_BACKEND=auto|uring|pwrite, when set, decides instead.
  kAuto,
  // io_uring (liburing): a batch is submitted at once and its transfers run concurrently. Falls
  // back to kPwrite (with a warning, logged once) when io_uring is unavailable.
  kUring,
  // One synchronous pwrite/pread per transfer, in order, on the calling thread.
  kPwrite,
};

// "auto", "uring" or "pwrite".
SAVEPOINT_API const char* IoBackendName(IoBackend backend);

struct SAVEPOINT_API FileOptions {
  // Ask for O_DIRECT (bypass the page cache). Implementations that cannot do it open the file
  // normally; check `direct()` on the opened file. Default: false.
  bool direct_io = false;
  // NewWritableFile: empty an existing file (O_TRUNC). false opens it as it is, to write part of
  // it in place (e.g. the unaligned end of a file whose blocks another handle writes with
  // O_DIRECT). Default: true.
  bool truncate = true;
  // Backend for WriteAtMany / ReadAtMany. Only the POSIX file system has a choice; the others
  // ignore it. kAuto defers to SAVEPOINT_IO_BACKEND, then to run-time detection: the first file
  // opened logs at info level which backend is in use ("savepoint: I/O backend io_uring", or
  // "... pwrite (io_uring unavailable: <reason>)"). Check `io_backend()` on the opened file.
  // Default: kAuto.
  IoBackend io_backend = IoBackend::kAuto;
  // NewRandomAccessFile: the file will be read in scattered byte ranges, not scanned, so the POSIX
  // file system turns the kernel's read-ahead off for it (posix_fadvise RANDOM): a read then
  // fetches its own pages from the disk and no more (read-ahead windows reach megabytes). Others
  // ignore it. Default: false.
  bool random_access = false;
  // NewWritableFile: fail with AlreadyExists if the file exists (POSIX O_EXCL). In object storage
  // the check is the conditional write of the object when it is published (If-None-Match: *), so
  // the AlreadyExists may come from Sync or Close. Default: false.
  bool exclusive = false;
};

// One transfer of a batched write: `data` goes to the file at `offset`. The bytes must stay valid
// and unmodified until WriteAtMany returns.
struct SAVEPOINT_API WriteOp {
  uint64_t offset = 0;
  std::span<const std::byte> data;
};

// One transfer of a batched read: `dst` is filled from the file at `offset`.
struct SAVEPOINT_API ReadOp {
  uint64_t offset = 0;
  std::span<std::byte> dst;
};

// Batched transfers (WritableFile::WriteAtMany, RandomAccessFile::ReadAtMany):
//  - All or error: OK means every op transferred all of its bytes (short transfers are resumed).
//    On error the returned Status is the first failure seen (naming file and offset); other ops
//    of the batch may or may not have completed, so the file's bytes in every op's range (or the
//    destination buffers) are unspecified. No op is still in flight when the call returns.
//  - Order is not guaranteed: ops may run concurrently and complete in any order, so their ranges
//    must not overlap (reads may overlap each other; destination buffers must not).
//  - Direct mode: every op's offset, size and buffer address must be multiples of
//    kDirectIOAlignment, checked before anything is submitted (else InvalidArgument, nothing done).
//  - An empty batch is OK and does nothing.
//  - The default implementations call WriteAt / ReadAt once per op, in order, stopping at the first
//    error, so wrappers that override only WriteAt / ReadAt (fault injection) see every op.

// A file being written. Positional writes, so several threads can fill disjoint ranges.
class SAVEPOINT_API WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `data` at `offset` (looping over short writes), growing the file as needed.
  // In direct mode offset, size and the address of `data` must be multiples of
  // kDirectIOAlignment, else InvalidArgument.
  virtual Status WriteAt(uint64_t offset, std::span<const std::byte> data) = 0;
  // Writes a batch of non-overlapping ranges (see "Batched transfers" above). May be called
  // concurrently with other WriteAt / WriteAtMany calls for disjoint ranges.
  virtual Status WriteAtMany(std::span<const WriteOp> ops);
  // Reserves space for bytes [0, bytes) (fallocate), so later writes do not extend the file (which
  // lets parallel direct writes proceed concurrently on ext4/xfs), fail midway with ENOSPC, or
  // fragment it. A no-op where unsupported. Default implementation: no-op.
  virtual Status Preallocate(uint64_t bytes) {
    (void)bytes;
    return Status::OK();
  }
  // Makes the written data durable (fsync). Not the directory entry: see FileSystem::SyncDir.
  virtual Status Sync() = 0;
  // Closes the file. Further calls fail with FailedPrecondition. The destructor closes silently.
  virtual Status Close() = 0;
  // Whether writes bypass the page cache.
  virtual bool direct() const = 0;
  // How WriteAtMany submits its batch: kUring or kPwrite (never kAuto). Default: kPwrite.
  virtual IoBackend io_backend() const { return IoBackend::kPwrite; }
  virtual const std::string& path() const = 0;
};

// A file being read.
class SAVEPOINT_API RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Fills all of `dst` from `offset`. Reading past end of file fails with OutOfRange naming the
  // file, offset and size. In direct mode the alignment rules of WriteAt apply.
  virtual Status ReadAt(uint64_t offset, std::span<std::byte> dst) const = 0;
  // Fills a batch of destinations (see "Batched transfers" above). Thread-safe. An op reaching
  // past end of file fails with OutOfRange, as ReadAt does.
  virtual Status ReadAtMany(std::span<const ReadOp> ops) const;
  // File size when opened.
  virtual uint64_t size() const = 0;
  virtual bool direct() const = 0;
  // How ReadAtMany submits its batch: kUring or kPwrite (never kAuto). Default: kPwrite.
  virtual IoBackend io_backend() const { return IoBackend::kPwrite; }
  virtual const std::string& path() const = 0;
};

// How FileSystem::MapFile maps a file.
enum class MapMode : uint8_t {
  // Read-only (POSIX: PROT_READ, MAP_SHARED): writing through a const_cast pointer crashes with
  // SIGSEGV; later writes to the file show through.
  kReadOnly,
  // Copy-on-write (POSIX: PROT_READ | PROT_WRITE, MAP_PRIVATE): the memory is writable, and a
  // written page becomes a private copy of this process; the file never changes. Pages not yet
  // written may still show later writes to the file.
  kCopyOnWrite,
};

// A view of a whole file's bytes in memory (a memory mapping, or a snapshot copy on file systems
// that cannot map). Obtained from FileSystem::MapFile, usually held by shared_ptr.
//
// Ownership: the object owns the mapping; data() is valid until it is destroyed. With
// MapMode::kReadOnly the memory is read-only; with kCopyOnWrite it may be written through a
// const_cast pointer, and the writes stay private to the mapping. With the POSIX file system,
// pages are read lazily on first access, and truncating the file while it is mapped makes access
// to the lost pages raise SIGBUS (savepoint never truncates a committed checkpoint's files).
//
// Thread safety: data() may be read concurrently; writers of a copy-on-write mapping synchronise
// among themselves.
class SAVEPOINT_API MappedFile {
 public:
  virtual ~MappedFile() = default;
  // The file's bytes; the size is the file's size at MapFile time (empty for an empty file).
  // Whether later writes to the file show through depends on the file system and the mode (POSIX
  // read-only: yes, the mapping is MAP_SHARED; MemFileSystem: no, it is a snapshot).
  virtual std::span<const std::byte> data() const = 0;
  virtual const std::string& path() const = 0;
  // The mode it was mapped with.
  virtual MapMode mode() const = 0;
};

// A small file read whole with its version (FileSystem::ReadVersioned).
struct SAVEPOINT_API VersionedFile {
  std::string contents;
  std::string version;  // opaque; changes whenever the file is replaced
};

class SAVEPOINT_API FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates (or truncates) a file for writing. The parent directory must exist.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                const FileOptions& options) = 0;
  // Opens an existing file for reading. NotFound if absent.
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const FileOptions& options) = 0;
  // Creates one directory. AlreadyExists if the path exists; NotFound if the parent does not.
  virtual Status CreateDir(const std::string& path) = 0;
  // Entries of a directory (no "." or ".."), in unspecified order.
  virtual Result<std::vector<FileInfo>> ListDir(const std::string& path) = 0;
  // Information about one path. NotFound if absent.
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // Removes a file.
  virtual Status RemoveFile(const std::string& path) = 0;
  // Removes an empty directory.
  virtual Status RemoveDir(const std::string& path) = 0;
  // Atomically renames a file or directory. Fails with AlreadyExists if `to` exists (never
  // replaces). Durable only after SyncDir of both parents.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames, removals in it) durable.
  virtual Status SyncDir(const std::string& path) = 0;
  // Maps a whole existing file into memory (see MapMode and MappedFile). NotFound if absent. The
  // default fails with Unimplemented naming the path; file systems that can map override it.
  virtual Result<std::shared_ptr<const MappedFile>> MapFile(const std::string& path, MapMode mode) {
    (void)mode;
    return UnimplementedError("map " + path + ": this file system does not support mapping files");
  }
  // Whether `path` lies in an object store: directories are key prefixes, a file appears whole when
  // its writer publishes it (Sync or Close) and not before, and there is no atomic Rename. Commits
  // there write in place and publish the MANIFEST last (docs/FORMAT.md §5). Default: false.
  virtual bool IsObjectStore(const std::string& path) {
    (void)path;
    return false;
  }
  // Writes under `root` that were begun before `before_ns` (ns since the Unix epoch) and never
  // published: in an object store, multipart uploads a process left behind when it died (they
  // hold storage until aborted). Aborts them, unless `dry_run`, and returns them as
  // "<path> (upload <id>)". GarbageCollect calls it. Default: none (a file system without such
  // writes).
  virtual Result<std::vector<std::string>> AbortAbandonedWrites(const std::string& root,
                                                                int64_t before_ns, bool dry_run) {
    (void)root;
    (void)before_ns;
    (void)dry_run;
    return std::vector<std::string>{};
  }

  // Compare-and-swap of a small whole file, for a record several writers may update (the
  // checkpoint manager's index in a bucket): ReadVersioned returns the contents with a version tag
  // (an object store's ETag); WriteIfVersion replaces the file with `contents` in one atomic step
  // only if its version is still `version` (empty `version`: only if the file is absent) and
  // returns the new version. ReadVersioned: NotFound if absent, ResourceExhausted if larger than
  // `max_bytes`. WriteIfVersion: FailedPrecondition naming the path when the file changed since
  // it was read (or, with an empty `version`, exists). The defaults fail with Unimplemented: only
  // object stores offer it (S3: If-Match / If-None-Match on PUT).
  virtual Result<VersionedFile> ReadVersioned(const std::string& path, uint64_t max_bytes);
  virtual Result<std::string> WriteIfVersion(const std::string& path, std::string_view contents,
                                             const std::string& version);

  // --- Helpers built on the calls above (not virtual). ---
  // True if the path exists (errors other than NotFound count as "exists").
  bool Exists(const std::string& path);
  // Removes a file, or a directory and everything under it. OK if absent.
  Status RemoveAll(const std::string& path);
  // Creates the directory and missing parents. OK if it already exists as a directory.
  Status CreateDirs(const std::string& path);
  // Reads a whole file, failing with ResourceExhausted if it is larger than `max_bytes`.
  Result<std::string> ReadFile(const std::string& path, uint64_t max_bytes);
  // Writes a whole file (buffered) and syncs it.
  Status WriteFileSynced(const std::string& path, std::string_view contents);

  // --- Advisory locks. ---
  // An exclusive lock on a lock file, held until the returned object is destroyed. Takes the lock
  // without waiting: FailedPrecondition "lock <path> is held by <holder>" when another holder has
  // it (another process, or another FileLock in this process). The lock file is created if absent
  // (its parent must exist) and left in place on release. POSIX: flock(2) on the file (released by
  // the kernel when the process dies, so a SIGKILLed holder never leaves a stale lock); it records
  // the holder's pid in the file for the message. The default implementation (used by MemFileSystem
  // and wrappers) is a process-local table keyed by (file system, path): it excludes holders within
  // this process only.
  class FileLock {
   public:
    virtual ~FileLock() = default;
    virtual const std::string& path() const = 0;
  };
  virtual Result<std::unique_ptr<FileLock>> LockFile(const std::string& path);
};

// A FileSystem that passes every call to a base file system, LockFile included. Derive from it to
// change a few calls and keep the rest (the fault-injecting file system, the failover snapshots'
// recycling file system, tests' write hooks).
// Ownership: `base` is not owned and must outlive this object. Thread safety: as the base's.
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
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& p) override {
    return base_->LockFile(p);
  }
  bool IsObjectStore(const std::string& p) override { return base_->IsObjectStore(p); }
  Result<std::vector<std::string>> AbortAbandonedWrites(const std::string& p, int64_t before_ns,
                                                        bool dry_run) override {
    return base_->AbortAbandonedWrites(p, before_ns, dry_run);
  }
  Result<VersionedFile> ReadVersioned(const std::string& p, uint64_t max_bytes) override {
    return base_->ReadVersioned(p, max_bytes);
  }
  Result<std::string> WriteIfVersion(const std::string& p, std::string_view contents,
                                     const std::string& version) override {
    return base_->WriteIfVersion(p, contents, version);
  }

 protected:
  FileSystem* base() const { return base_; }

 private:
  FileSystem* const base_;
};

// The process-wide default file system: POSIX for local paths; "s3://" URIs go to an S3 file
// system configured from the environment on first use (savepoint/s3.h, S3Options); a path with any
// other scheme ("gs://...", "hdfs://...") is refused with InvalidArgument naming the scheme. Never
// null; lives for the whole process.
SAVEPOINT_API FileSystem* DefaultFileSystem();

// Path helpers: JoinPath("a", "b") == "a/b"; Dirname("a/b") == "a"; Basename("a/b") == "b".
SAVEPOINT_API std::string JoinPath(std::string_view a, std::string_view b);
SAVEPOINT_API std::string Dirname(std::string_view path);
SAVEPOINT_API std::string Basename(std::string_view path);

}  // namespace savepoint

#endif  // SAVEPOINT_FILESYSTEM_H_
