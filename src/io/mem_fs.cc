// MemFileSystem implementation. See mem_fs.h for the durability model.
//
// Every piece of state lives in MemFileSystem::State behind one mutex; file handles hold a
// shared_ptr to it and to their inode. File bytes are stored sparsely in copy-on-write blocks so
// that Sync() (durable := current) and power loss (current := durable) only copy pointers.
#include "io/mem_fs.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace savepoint {
namespace {

constexpr uint64_t kBlockSize = uint64_t{1} << 20;

// Bytes of one block; may be shorter than kBlockSize (the rest reads as zeros).
using Block = std::vector<std::byte>;

// A file's contents: a sparse map of shared, copy-on-write blocks.
struct FileData {
  uint64_t size = 0;
  std::map<uint64_t, std::shared_ptr<Block>> blocks;  // block index -> bytes
};

struct Inode {
  explicit Inode(bool dir) : is_dir(dir) {}
  const bool is_dir;
  int64_t mtime_ns = 0;
  FileData data;                                          // files: current bytes
  FileData durable_data;                                  // files: bytes as of the last Sync
  std::map<std::string, std::shared_ptr<Inode>> entries;  // dirs: current entries
  std::map<std::string, std::shared_ptr<Inode>> durable_entries;  // dirs: as of the last SyncDir
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void WriteData(FileData& file, uint64_t offset, std::span<const std::byte> src) {
  if (src.empty()) return;
  file.size = std::max(file.size, offset + src.size());
  while (!src.empty()) {
    const uint64_t index = offset / kBlockSize;
    const size_t in_block = static_cast<size_t>(offset % kBlockSize);
    const size_t n = std::min<size_t>(src.size(), kBlockSize - in_block);
    std::shared_ptr<Block>& block = file.blocks[index];
    if (block == nullptr) {
      block = std::make_shared<Block>();
    } else if (block.use_count() > 1) {
      block = std::make_shared<Block>(*block);  // shared with the durable copy: copy on write
    }
    if (block->size() < in_block + n) block->resize(in_block + n);
    std::memcpy(block->data() + in_block, src.data(), n);
    src = src.subspan(n);
    offset += n;
  }
}

// Fills dst from offset; the caller has checked that [offset, offset + dst.size()) is in range.
void ReadData(const FileData& file, uint64_t offset, std::span<std::byte> dst) {
  while (!dst.empty()) {
    const uint64_t index = offset / kBlockSize;
    const size_t in_block = static_cast<size_t>(offset % kBlockSize);
    const size_t n = std::min<size_t>(dst.size(), kBlockSize - in_block);
    size_t copied = 0;
    auto it = file.blocks.find(index);
    if (it != file.blocks.end() && it->second->size() > in_block) {
      copied = std::min(n, it->second->size() - in_block);
      std::memcpy(dst.data(), it->second->data() + in_block, copied);
    }
    std::memset(dst.data() + copied, 0, n - copied);
    dst = dst.subspan(n);
    offset += n;
  }
}

// Splits a path into components, dropping empty ones and "." and resolving "..".
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(std::move(part));
    }
    start = end + 1;
  }
  return parts;
}

FileInfo InfoOf(const std::string& name, const Inode& inode) {
  FileInfo info;
  info.name = name;
  info.is_dir = inode.is_dir;
  info.size = inode.is_dir ? 0 : inode.data.size;
  info.mtime_ns = inode.mtime_ns;
  return info;
}

Status StaleHandle(const char* op, const std::string& path) {
  return FailedPreconditionError(
      fmt::format("{} {}: file handle was opened before a simulated power loss", op, path));
}

}  // namespace

struct MemFileSystem::State {
  std::mutex mu;
  std::shared_ptr<Inode> root = std::make_shared<Inode>(/*dir=*/true);
  uint64_t epoch = 0;  // bumped by SimulatePowerLoss; guarded by mu
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> write_calls{0};

  // The inode at the first `count` components of `parts`, or null with *err set (ENOENT or
  // ENOTDIR). Requires mu.
  std::shared_ptr<Inode> Find(const std::vector<std::string>& parts, size_t count, int* err) {
    std::shared_ptr<Inode> node = root;
    for (size_t i = 0; i < count; ++i) {
      if (!node->is_dir) {
        *err = ENOTDIR;
        return nullptr;
      }
      auto it = node->entries.find(parts[i]);
      if (it == node->entries.end()) {
        *err = ENOENT;
        return nullptr;
      }
      node = it->second;
    }
    return node;
  }
  std::shared_ptr<Inode> Find(const std::vector<std::string>& parts, int* err) {
    return Find(parts, parts.size(), err);
  }

  // The directory that holds the last component of non-empty `parts`. Requires mu.
  Inode* FindParent(const std::vector<std::string>& parts, int* err) {
    std::shared_ptr<Inode> parent = Find(parts, parts.size() - 1, err);
    if (parent != nullptr && !parent->is_dir) {
      *err = ENOTDIR;
      return nullptr;
    }
    return parent.get();  // owned by the tree
  }
};

namespace {

using State = MemFileSystem::State;

class MemWritableFile final : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<State> state, std::shared_ptr<Inode> inode, std::string path,
                  uint64_t epoch)
      : state_(std::move(state)), inode_(std::move(inode)), path_(std::move(path)), epoch_(epoch) {}

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    SP_RETURN_IF_ERROR(Check("write"));
    if (offset + data.size() < offset) {
      return ErrnoToStatus(EFBIG, fmt::format("write {} at offset {}", path_, offset));
    }
    WriteData(inode_->data, offset, data);
    inode_->mtime_ns = NowNs();
    state_->bytes_written.fetch_add(data.size(), std::memory_order_relaxed);
    state_->write_calls.fetch_add(1, std::memory_order_relaxed);
    return Status::OK();
  }

  Status Sync() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    SP_RETURN_IF_ERROR(Check("sync"));
    inode_->durable_data = inode_->data;
    return Status::OK();
  }

  Status Close() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    SP_RETURN_IF_ERROR(Check("close"));
    closed_ = true;
    return Status::OK();
  }

  bool direct() const override { return false; }
  const std::string& path() const override { return path_; }

 private:
  // Requires state_->mu.
  Status Check(const char* op) const {
    if (closed_) return FailedPreconditionError(fmt::format("{} {}: file is closed", op, path_));
    if (epoch_ != state_->epoch) return StaleHandle(op, path_);
    return Status::OK();
  }

  const std::shared_ptr<State> state_;
  const std::shared_ptr<Inode> inode_;
  const std::string path_;
  const uint64_t epoch_;
  bool closed_ = false;  // guarded by state_->mu
};

class MemRandomAccessFile final : public RandomAccessFile {
 public:
  MemRandomAccessFile(std::shared_ptr<State> state, std::shared_ptr<Inode> inode, std::string path,
                      uint64_t epoch, uint64_t size)
      : state_(std::move(state)),
        inode_(std::move(inode)),
        path_(std::move(path)),
        epoch_(epoch),
        size_(size) {}

  Status ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (epoch_ != state_->epoch) return StaleHandle("read", path_);
    const uint64_t file_size = inode_->data.size;
    if (offset > file_size || dst.size() > file_size - offset) {
      return OutOfRangeError(
          fmt::format("read {} at offset {} ({} bytes): past end of file, which ends at byte {}",
                      path_, offset, dst.size(), file_size));
    }
    ReadData(inode_->data, offset, dst);
    return Status::OK();
  }

  uint64_t size() const override { return size_; }
  bool direct() const override { return false; }
  const std::string& path() const override { return path_; }

 private:
  const std::shared_ptr<State> state_;
  const std::shared_ptr<Inode> inode_;
  const std::string path_;
  const uint64_t epoch_;
  const uint64_t size_;
};

// A snapshot of a file's bytes in one aligned heap buffer (see "MapFile" in mem_fs.h).
class MemMappedFile final : public MappedFile {
 public:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  MemMappedFile(std::string path, std::unique_ptr<std::byte, Free> buffer, size_t size,
                MapMode mode)
      : path_(std::move(path)), buffer_(std::move(buffer)), size_(size), mode_(mode) {}

  std::span<const std::byte> data() const override { return {buffer_.get(), size_}; }
  const std::string& path() const override { return path_; }
  MapMode mode() const override { return mode_; }

 private:
  const std::string path_;
  const std::unique_ptr<std::byte, Free> buffer_;  // null when size_ == 0
  const size_t size_;
  const MapMode mode_;  // either way a private snapshot: writes never reach the file
};

// Alignment of a snapshot's buffer, like a page-aligned mapping.
constexpr size_t kMapAlignment = 4096;

}  // namespace

MemFileSystem::MemFileSystem() : state_(std::make_shared<State>()) {}
MemFileSystem::~MemFileSystem() = default;

Result<std::unique_ptr<WritableFile>> MemFileSystem::NewWritableFile(const std::string& path,
                                                                     const FileOptions& options) {
  const std::string context = fmt::format("open {} for writing", path);
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state_->mu);
  if (parts.empty()) return ErrnoToStatus(EISDIR, context);
  int err = 0;
  Inode* parent = state_->FindParent(parts, &err);
  if (parent == nullptr) return ErrnoToStatus(err, context);
  std::shared_ptr<Inode>& slot = parent->entries[parts.back()];
  if (slot == nullptr) {
    slot = std::make_shared<Inode>(/*dir=*/false);
  } else if (options.exclusive) {
    return ErrnoToStatus(EEXIST, context);
  } else if (slot->is_dir) {
    return ErrnoToStatus(EISDIR, context);
  } else if (options.truncate) {
    slot->data = FileData{};  // O_TRUNC; durable_data keeps the old bytes until the next Sync
  }
  slot->mtime_ns = NowNs();
  return std::unique_ptr<WritableFile>(
      std::make_unique<MemWritableFile>(state_, slot, path, state_->epoch));
}

Result<std::unique_ptr<RandomAccessFile>> MemFileSystem::NewRandomAccessFile(
    const std::string& path, const FileOptions&) {
  const std::string context = fmt::format("open {} for reading", path);
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state_->mu);
  int err = 0;
  std::shared_ptr<Inode> inode = state_->Find(parts, &err);
  if (inode == nullptr) return ErrnoToStatus(err, context);
  if (inode->is_dir) return ErrnoToStatus(EISDIR, context);
  const uint64_t size = inode->data.size;
  return std::unique_ptr<RandomAccessFile>(
      std::make_unique<MemRandomAccessFile>(state_, std::move(inode), path, state_->epoch, size));
}

Status MemFileSystem::CreateDir(const std::string& path) {
  const std::string context = fmt::format("create directory {}", path);
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state_->mu);
  if (parts.empty()) return ErrnoToStatus(EEXIST, context);
  int err = 0;
  Inode* parent = state_->FindParent(parts, &err);
  if (parent == nullptr) return ErrnoToStatus(err, context);
  auto [it, inserted] = parent->entries.try_emplace(parts.back());
  if (!inserted) return ErrnoToStatus(EEXIST, context);
  it->second = std::make_shared<Inode>(/*dir=*/true);
  it->second->mtime_ns = NowNs();
  return Status::OK();
}

Result<std::vector<FileInfo>> MemFileSystem::ListDir(const std::string& path) {
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state_->mu);
  int err = 0;
  std::shared_ptr<Inode> dir = state_->Find(parts, &err);
  if (dir != nullptr && !dir->is_dir) err = ENOTDIR;
  if (err != 0) return ErrnoToStatus(err, fmt::format("list directory {}", path));
  std::vector<FileInfo> entries;
  entries.reserve(dir->entries.size());
  for (const auto& [name, inode] : dir->entries) entries.push_back(InfoOf(name, *inode));
  return entries;
}

Result<FileInfo> MemFileSystem::Stat(const std::string& path) {
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state_->mu);
  int err = 0;
  std::shared_ptr<Inode> inode = state_->Find(parts, &err);
  if (inode == nullptr) return ErrnoToStatus(err, fmt::format("stat {}", path));
  return InfoOf(parts.empty() ? "/" : parts.back(), *inode);
}

namespace {

// Removes the entry `path` names: a file (`dir` false) or an empty directory (`dir` true), with
// the errno values POSIX unlink(2) / rmdir(2) give.
Status RemoveEntry(MemFileSystem::State& state, const std::string& path, bool dir) {
  const std::string context = fmt::format("remove {} {}", dir ? "directory" : "file", path);
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state.mu);
  if (parts.empty()) return ErrnoToStatus(dir ? EBUSY : EISDIR, context);
  int err = 0;
  Inode* parent = state.FindParent(parts, &err);
  if (parent == nullptr) return ErrnoToStatus(err, context);
  auto it = parent->entries.find(parts.back());
  if (it == parent->entries.end()) return ErrnoToStatus(ENOENT, context);
  if (it->second->is_dir != dir) return ErrnoToStatus(dir ? ENOTDIR : EISDIR, context);
  if (dir && !it->second->entries.empty()) return ErrnoToStatus(ENOTEMPTY, context);
  parent->entries.erase(it);
  return Status::OK();
}

}  // namespace

Status MemFileSystem::RemoveFile(const std::string& path) {
  return RemoveEntry(*state_, path, /*dir=*/false);
}

Status MemFileSystem::RemoveDir(const std::string& path) {
  return RemoveEntry(*state_, path, /*dir=*/true);
}

Status MemFileSystem::Rename(const std::string& from, const std::string& to) {
  const std::string context = fmt::format("rename {} to {}", from, to);
  const std::vector<std::string> src = Components(from);
  const std::vector<std::string> dst = Components(to);
  std::lock_guard<std::mutex> lock(state_->mu);
  if (src.empty()) return ErrnoToStatus(EBUSY, context);
  int err = 0;
  Inode* src_parent = state_->FindParent(src, &err);
  if (src_parent == nullptr) return ErrnoToStatus(err, context);
  auto it = src_parent->entries.find(src.back());
  if (it == src_parent->entries.end()) return ErrnoToStatus(ENOENT, context);
  if (dst.empty()) return ErrnoToStatus(EEXIST, context);
  Inode* dst_parent = state_->FindParent(dst, &err);
  if (dst_parent == nullptr) return ErrnoToStatus(err, context);
  if (dst_parent->entries.contains(dst.back())) return ErrnoToStatus(EEXIST, context);
  // A directory cannot move into its own subtree.
  if (it->second->is_dir && dst.size() > src.size() &&
      std::equal(src.begin(), src.end(), dst.begin())) {
    return ErrnoToStatus(EINVAL, context);
  }
  dst_parent->entries.emplace(dst.back(), std::move(it->second));
  src_parent->entries.erase(it);
  return Status::OK();
}

Status MemFileSystem::SyncDir(const std::string& path) {
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state_->mu);
  int err = 0;
  std::shared_ptr<Inode> dir = state_->Find(parts, &err);
  if (dir != nullptr && !dir->is_dir) err = ENOTDIR;
  if (err != 0) return ErrnoToStatus(err, fmt::format("sync directory {}", path));
  dir->durable_entries = dir->entries;
  return Status::OK();
}

Result<std::shared_ptr<const MappedFile>> MemFileSystem::MapFile(const std::string& path,
                                                                 MapMode mode) {
  const std::string context = fmt::format("open {} for mapping", path);
  const std::vector<std::string> parts = Components(path);
  std::lock_guard<std::mutex> lock(state_->mu);
  int err = 0;
  std::shared_ptr<Inode> inode = state_->Find(parts, &err);
  if (inode == nullptr) return ErrnoToStatus(err, context);
  if (inode->is_dir) return ErrnoToStatus(EISDIR, context);
  const uint64_t size = inode->data.size;
  std::unique_ptr<std::byte, MemMappedFile::Free> buffer;
  if (size > 0) {
    const uint64_t capacity = (size + kMapAlignment - 1) / kMapAlignment * kMapAlignment;
    buffer.reset(static_cast<std::byte*>(std::aligned_alloc(kMapAlignment, capacity)));
    if (buffer == nullptr) {
      return ErrnoToStatus(ENOMEM, fmt::format("map {} ({} bytes)", path, size));
    }
    ReadData(inode->data, 0, {buffer.get(), static_cast<size_t>(size)});
  }
  return std::shared_ptr<const MappedFile>(
      std::make_shared<MemMappedFile>(path, std::move(buffer), static_cast<size_t>(size), mode));
}

void MemFileSystem::SimulatePowerLoss() {
  std::lock_guard<std::mutex> lock(state_->mu);
  ++state_->epoch;
  std::unordered_set<const Inode*> seen;
  std::deque<Inode*> queue = {state_->root.get()};
  seen.insert(state_->root.get());
  while (!queue.empty()) {
    Inode* dir = queue.front();
    queue.pop_front();
    dir->entries = dir->durable_entries;
    for (auto it = dir->entries.begin(); it != dir->entries.end();) {
      Inode* child = it->second.get();
      const bool first_visit = seen.insert(child).second;
      if (child->is_dir && !first_visit) {
        it = dir->entries.erase(it);  // keep the tree a tree
        continue;
      }
      if (child->is_dir) {
        queue.push_back(child);
      } else if (first_visit) {
        child->data = child->durable_data;
      }
      ++it;
    }
    dir->durable_entries = dir->entries;
  }
}

uint64_t MemFileSystem::bytes_written() const {
  return state_->bytes_written.load(std::memory_order_relaxed);
}

uint64_t MemFileSystem::write_calls() const {
  return state_->write_calls.load(std::memory_order_relaxed);
}

}  // namespace savepoint
