// FaultInjectionFileSystem: wraps another FileSystem (a ForwardingFileSystem) and makes chosen
// calls fail.
//
// It counts calls per operation kind (Op) and "mutating operations" (everything except kRead and
// the pass-through calls ListDir, Stat, NewRandomAccessFile and MapFile):
//   NewWritableFile (kCreate), WritableFile::WriteAt (kWrite), WritableFile::Sync (kSync),
//   WritableFile::Close (kClose), CreateDir, RemoveFile, RemoveDir, Rename, SyncDir.
// Faults:
//  - FailNth(op, n, err): the n-th call of `op` (1-based, counted since construction or the last
//    Reset) fails with ErrnoToStatus(err, "<operation> <path>") and does not reach the base.
//  - ShortWriteNth(n, err): the n-th WriteAt writes only the first half of its bytes to the base
//    (rounded down to kDirectIOAlignment when the base file is direct), then fails with err: a
//    torn write. FailNth(kWrite, n) takes precedence over it.
//  - CrashAfter(n): once n mutating operations have succeeded, every later mutating operation
//    fails with IOError "<operation> <path>: injected crash" without reaching the base, as if the
//    process had died there. Reads and pass-through calls keep working. While a crash point is
//    armed, mutating operations are serialised so that exactly n get through.
// Batched transfers (WriteAtMany / ReadAtMany) are not overridden: the defaults call WriteAt /
// ReadAt once per op, so each op is counted and faulted on its own (a batch stops at its first
// failing op), and the base's own batching (io_uring) is not used under fault injection.
// MapFile goes straight to the base: it is neither counted nor faulted, and reads through the
// mapping bypass the kRead fault.
// A call counts in count(op) whether or not it fails. mutation_count() is the number of mutating
// operations that reached the base and succeeded; running a workload once without faults and
// reading mutation_count() gives the crash points 0..N to sweep with CrashAfter.
//
// Ownership: `base` is not owned and must outlive this object. Files returned by this object
// refer back to it, so it must outlive them too.
//
// Thread safety: all methods are thread-safe. Fault setup (FailNth, ShortWriteNth, CrashAfter,
// Reset) may run concurrently with operations, but a call already in flight may see the old or
// new setup.
#ifndef SAVEPOINT_IO_FAULT_FS_H_
#define SAVEPOINT_IO_FAULT_FS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

class FaultInjectionFileSystem : public ForwardingFileSystem {
 public:
  enum class Op {
    kCreate,
    kWrite,
    kSync,
    kClose,
    kCreateDir,
    kRemoveFile,
    kRemoveDir,
    kRename,
    kSyncDir,
    kRead,  // RandomAccessFile::ReadAt; not a mutation
  };
  static constexpr size_t kNumOps = static_cast<size_t>(Op::kRead) + 1;

  explicit FaultInjectionFileSystem(FileSystem* base);
  ~FaultInjectionFileSystem() override;
  FaultInjectionFileSystem(const FaultInjectionFileSystem&) = delete;
  FaultInjectionFileSystem& operator=(const FaultInjectionFileSystem&) = delete;

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const FileOptions& options) override;
  Status CreateDir(const std::string& path) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveDir(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& path) override;

  // Fault setup; see the file comment. Several FailNth faults may be armed at once.
  void FailNth(Op op, uint64_t n, int err);
  void ShortWriteNth(uint64_t n, int err);
  void CrashAfter(uint64_t n);

  // Mutating operations that reached the base and succeeded.
  uint64_t mutation_count() const;
  // Calls of `op` (failed ones included).
  uint64_t count(Op op) const;
  // Clears all faults and counters.
  void Reset();

  // Name of an operation kind, e.g. "write". Stable; for messages.
  static const char* OpName(Op op);

 private:
  friend class FaultInjectionWritableFile;
  friend class FaultInjectionRandomAccessFile;

  struct Fault {
    Op op;
    uint64_t n;
    int err;
  };

  // Runs one mutating operation of kind `op` through the fault logic. `context` names it in
  // messages ("rename /a to /b"). `base_call(short_write_err)` performs it on the base;
  // short_write_err is non-zero when ShortWriteNth hits this call (kWrite only).
  template <typename BaseCall>
  Status Mutate(Op op, const std::string& context, BaseCall&& base_call);
  // Counts one ReadAt and returns the injected error, if any.
  Status BeforeRead(const std::string& context);
  // The FailNth fault armed for the n-th call of `op`, as a Status (OK if none).
  Status FailNthFault(Op op, uint64_t n, const std::string& context) const;

  std::array<std::atomic<uint64_t>, kNumOps> counts_{};
  std::atomic<uint64_t> mutations_{0};

  mutable std::mutex mu_;  // guards the fault setup below
  std::vector<Fault> fail_nth_;
  uint64_t short_write_n_ = 0;  // 0: none
  int short_write_err_ = 0;
  std::atomic<bool> crash_armed_{false};
  uint64_t crash_after_ = 0;

  std::mutex crash_mu_;  // serialises mutating operations while a crash point is armed
};

}  // namespace savepoint

#endif  // SAVEPOINT_IO_FAULT_FS_H_
