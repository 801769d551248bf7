// FaultInjectionFileSystem implementation. See fault_fs.h for the fault model.
#include "io/fault_fs.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace savepoint {

using Op = FaultInjectionFileSystem::Op;

namespace {

size_t Index(Op op) { return static_cast<size_t>(op); }

}  // namespace

// A writable file whose mutating calls go through the owning FaultInjectionFileSystem.
class FaultInjectionWritableFile final : public WritableFile {
 public:
  FaultInjectionWritableFile(FaultInjectionFileSystem* fs, std::unique_ptr<WritableFile> base)
      : fs_(fs), base_(std::move(base)) {}

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    const std::string context = fmt::format("write {} at offset {}", path(), offset);
    return fs_->Mutate(Op::kWrite, context, [&](int short_write_err) {
      if (short_write_err == 0) return base_->WriteAt(offset, data);
      size_t half = data.size() / 2;
      if (base_->direct()) half -= half % kDirectIOAlignment;
      if (half > 0) SP_RETURN_IF_ERROR(base_->WriteAt(offset, data.first(half)));
      return ErrnoToStatus(short_write_err, fmt::format("{} (torn write: {} of {} bytes written)",
                                                        context, half, data.size()));
    });
  }

  Status Sync() override {
    return fs_->Mutate(Op::kSync, fmt::format("sync {}", path()),
                       [&](int) { return base_->Sync(); });
  }

  Status Close() override {
    return fs_->Mutate(Op::kClose, fmt::format("close {}", path()),
                       [&](int) { return base_->Close(); });
  }

  bool direct() const override { return base_->direct(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::unique_ptr<WritableFile> base_;
};

// A readable file whose ReadAt calls are counted (and may fail) as Op::kRead.
class FaultInjectionRandomAccessFile final : public RandomAccessFile {
 public:
  FaultInjectionRandomAccessFile(FaultInjectionFileSystem* fs,
                                 std::unique_ptr<RandomAccessFile> base)
      : fs_(fs), base_(std::move(base)) {}

  Status ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    SP_RETURN_IF_ERROR(fs_->BeforeRead(fmt::format("read {} at offset {}", path(), offset)));
    return base_->ReadAt(offset, dst);
  }

  uint64_t size() const override { return base_->size(); }
  bool direct() const override { return base_->direct(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::unique_ptr<RandomAccessFile> base_;
};

FaultInjectionFileSystem::FaultInjectionFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}
FaultInjectionFileSystem::~FaultInjectionFileSystem() = default;

template <typename BaseCall>
Status FaultInjectionFileSystem::Mutate(Op op, const std::string& context, BaseCall&& base_call) {
  const uint64_t n = counts_[Index(op)].fetch_add(1) + 1;
  std::unique_lock<std::mutex> crash_lock;
  if (crash_armed_.load()) {
    crash_lock = std::unique_lock<std::mutex>(crash_mu_);
    uint64_t crash_after;
    {
      std::lock_guard<std::mutex> lock(mu_);
      crash_after = crash_after_;
    }
    if (crash_armed_.load() && mutations_.load() >= crash_after) {
      return IOError(fmt::format("{}: injected crash", context));
    }
  }
  SP_RETURN_IF_ERROR(FailNthFault(op, n, context));
  int short_write_err = 0;
  if (op == Op::kWrite) {
    std::lock_guard<std::mutex> lock(mu_);
    if (short_write_n_ == n) short_write_err = short_write_err_;
  }
  Status status = base_call(short_write_err);
  if (status.ok()) mutations_.fetch_add(1);
  return status;
}

Status FaultInjectionFileSystem::BeforeRead(const std::string& context) {
  const uint64_t n = counts_[Index(Op::kRead)].fetch_add(1) + 1;
  return FailNthFault(Op::kRead, n, context);
}

Status FaultInjectionFileSystem::FailNthFault(Op op, uint64_t n, const std::string& context) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Fault& fault : fail_nth_) {
    if (fault.op == op && fault.n == n) return ErrnoToStatus(fault.err, context);
  }
  return Status::OK();
}

Result<std::unique_ptr<WritableFile>> FaultInjectionFileSystem::NewWritableFile(
    const std::string& path, const FileOptions& options) {
  std::unique_ptr<WritableFile> file;
  SP_RETURN_IF_ERROR(Mutate(Op::kCreate, fmt::format("open {} for writing", path), [&](int) {
    Result<std::unique_ptr<WritableFile>> base_file = base()->NewWritableFile(path, options);
    if (!base_file.ok()) return base_file.status();
    file = std::make_unique<FaultInjectionWritableFile>(this, std::move(base_file).value());
    return Status::OK();
  }));
  return file;
}

Result<std::unique_ptr<RandomAccessFile>> FaultInjectionFileSystem::NewRandomAccessFile(
    const std::string& path, const FileOptions& options) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> base_file,
                      base()->NewRandomAccessFile(path, options));
  return std::unique_ptr<RandomAccessFile>(
      std::make_unique<FaultInjectionRandomAccessFile>(this, std::move(base_file)));
}

Status FaultInjectionFileSystem::CreateDir(const std::string& path) {
  return Mutate(Op::kCreateDir, fmt::format("create directory {}", path),
                [&](int) { return base()->CreateDir(path); });
}

Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  return Mutate(Op::kRemoveFile, fmt::format("remove file {}", path),
                [&](int) { return base()->RemoveFile(path); });
}

Status FaultInjectionFileSystem::RemoveDir(const std::string& path) {
  return Mutate(Op::kRemoveDir, fmt::format("remove directory {}", path),
                [&](int) { return base()->RemoveDir(path); });
}

Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to) {
  return Mutate(Op::kRename, fmt::format("rename {} to {}", from, to),
                [&](int) { return base()->Rename(from, to); });
}

Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  return Mutate(Op::kSyncDir, fmt::format("sync directory {}", path),
                [&](int) { return base()->SyncDir(path); });
}

void FaultInjectionFileSystem::FailNth(Op op, uint64_t n, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_nth_.push_back(Fault{op, n, err});
}

void FaultInjectionFileSystem::ShortWriteNth(uint64_t n, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  short_write_n_ = n;
  short_write_err_ = err;
}

void FaultInjectionFileSystem::CrashAfter(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  crash_after_ = n;
  crash_armed_.store(true);
}

uint64_t FaultInjectionFileSystem::mutation_count() const { return mutations_.load(); }

uint64_t FaultInjectionFileSystem::count(Op op) const { return counts_[Index(op)].load(); }

void FaultInjectionFileSystem::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  fail_nth_.clear();
  short_write_n_ = 0;
  short_write_err_ = 0;
  crash_armed_.store(false);
  crash_after_ = 0;
  for (std::atomic<uint64_t>& c : counts_) c.store(0);
  mutations_.store(0);
}

const char* FaultInjectionFileSystem::OpName(Op op) {
  switch (op) {
    case Op::kCreate:
      return "create";
    case Op::kWrite:
      return "write";
    case Op::kSync:
      return "sync";
    case Op::kClose:
      return "close";
    case Op::kCreateDir:
      return "create_dir";
    case Op::kRemoveFile:
      return "remove_file";
    case Op::kRemoveDir:
      return "remove_dir";
    case Op::kRename:
      return "rename";
    case Op::kSyncDir:
      return "sync_dir";
    case Op::kRead:
      return "read";
  }
  return "unknown";
}

}  // namespace savepoint
