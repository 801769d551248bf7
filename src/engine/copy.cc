// CopyCheckpoint (savepoint/catalog.h): a committed checkpoint directory copied through the durable
// commit, between any two file systems (a disk and a bucket, in either direction).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/paths.h"
#include "format/manifest.h"
#include "io/commit.h"
#include "savepoint/catalog.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint {
namespace {

constexpr uint64_t kMinBlock = 1ull << 20;
constexpr uint64_t kMaxBlock = 1ull << 30;

Status ValidateCopyOptions(const CopyOptions& o, const std::string& what) {
  if (o.threads < 1 || o.threads > 64) {
    return InvalidArgumentError(
        fmt::format("{}: CopyOptions::threads {} is outside 1..64", what, o.threads));
  }
  if (o.block_bytes < kMinBlock || o.block_bytes > kMaxBlock) {
    return InvalidArgumentError(fmt::format(
        "{}: CopyOptions::block_bytes {} is outside 1 MiB..1 GiB", what, o.block_bytes));
  }
  return Status::OK();
}

// Paces the copying threads to at most `rate` bytes per second, all together (0: no bound).
class Pacer {
 public:
  explicit Pacer(uint64_t rate) : rate_(rate), next_(std::chrono::steady_clock::now()) {}
  // Blocks until `bytes` more may be moved.
  void Take(uint64_t bytes) {
    if (rate_ == 0) return;
    std::chrono::steady_clock::time_point at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      at = std::max(next_, std::chrono::steady_clock::now());
      next_ = at + std::chrono::nanoseconds(bytes * 1'000'000'000ull / rate_);
    }
    std::this_thread::sleep_until(at);
  }

 private:
  const uint64_t rate_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point next_;  // guarded by mu_
};

struct Copier {
  Copier(FileSystem* f, FileSystem* t, const CopyOptions& o, uint64_t total)
      : from(f), to(t), options(o), pacer(o.max_bytes_per_second), progress(o.progress, total) {
    buffers.resize(o.threads);
  }

  FileSystem* from;
  FileSystem* to;
  const CopyOptions& options;
  Pacer pacer;
  Progress progress;
  std::vector<std::vector<std::byte>> buffers;  // one per worker
  std::vector<std::string> written;             // files this copy published at the target

  // Copies the files `names` of directory `src` into directory `dst` (each written only if
  // absent), their blocks in parallel on options.threads threads (several parts of one object in
  // flight), and checks the size of each file written.
  Status CopyFiles(const std::string& src, const std::string& dst,
                   const std::vector<std::string>& names) {
    struct Block {
      size_t file;
      uint64_t offset;
      uint64_t bytes;
    };
    std::vector<std::unique_ptr<RandomAccessFile>> ins;
    std::vector<std::unique_ptr<WritableFile>> outs;
    std::vector<Block> blocks;
    FileOptions fo;
    fo.exclusive = true;
    for (const std::string& name : names) {
      SP_ASSIGN_OR_RETURN(ins.emplace_back(), from->NewRandomAccessFile(JoinPath(src, name), {}));
      SP_ASSIGN_OR_RETURN(outs.emplace_back(), to->NewWritableFile(JoinPath(dst, name), fo));
      const uint64_t size = ins.back()->size();
      SP_RETURN_IF_ERROR(outs.back()->Preallocate(size));
      for (uint64_t off = 0; off < size; off += options.block_bytes) {
        blocks.push_back({ins.size() - 1, off, std::min(options.block_bytes, size - off)});
      }
    }
    SP_RETURN_IF_ERROR(ParallelFor(blocks.size(), options.threads, [&](size_t i, int worker) {
      const Block& b = blocks[i];
      std::vector<std::byte>& buf = buffers[worker];
      buf.resize(options.block_bytes);
      std::span<std::byte> bytes(buf.data(), b.bytes);
      pacer.Take(b.bytes);
      SP_RETURN_IF_ERROR(ins[b.file]->ReadAt(b.offset, bytes));
      SP_RETURN_IF_ERROR(outs[b.file]->WriteAt(b.offset, bytes));
      progress.Add(b.bytes);
      return Status::OK();
    }));
    for (size_t f = 0; f < names.size(); ++f) {
      SP_RETURN_IF_ERROR(outs[f]->Sync());
      SP_RETURN_IF_ERROR(outs[f]->Close());
      // Published only if absent: ours. (An object whose conditional write failed is another
      // writer's, and is never in this list.)
      written.push_back(outs[f]->path());
      SP_ASSIGN_OR_RETURN(FileInfo info, to->Stat(outs[f]->path()));
      if (info.size != ins[f]->size()) {
        return IOError(fmt::format("copy of {} to {}: {} bytes written, the source has {}",
                                   ins[f]->path(), outs[f]->path(), info.size, ins[f]->size()));
      }
    }
    return Status::OK();
  }
};

// The files of the committed checkpoint at `path`: its data files, then its MANIFEST (last).
Result<std::vector<FileInfo>> CheckpointFiles(FileSystem* fs, const std::string& path) {
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(path));
  std::vector<FileInfo> files;
  std::optional<FileInfo> manifest;
  for (const FileInfo& e : entries) {
    if (e.is_dir || !engine::IsCheckpointEntry(e.name)) continue;
    if (e.name == format::kManifestFileName) {
      manifest = e;
    } else {
      files.push_back(e);
    }
  }
  if (!manifest) {
    return NotFoundError(
        fmt::format("{} is not a committed checkpoint (no {})", path, format::kManifestFileName));
  }
  std::sort(files.begin(), files.end(),
            [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
  files.push_back(*manifest);
  return files;
}

FileSystem* Fs(FileSystem* fs) { return fs != nullptr ? fs : DefaultFileSystem(); }

}  // namespace

Result<CopyStats> CopyCheckpoint(const std::string& raw_source, const std::string& raw_target,
                                 const CopyOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  SP_ASSIGN_OR_RETURN(std::string source, engine::NormalizeCheckpointPath(raw_source));
  SP_ASSIGN_OR_RETURN(std::string target, engine::NormalizeCheckpointPath(raw_target));
  const std::string what = fmt::format("copy {} to {}", source, target);
  SP_RETURN_IF_ERROR(ValidateCopyOptions(options, what));
  FileSystem* from = Fs(options.source_fs);
  FileSystem* to = Fs(options.target_fs);
  Result<std::vector<FileInfo>> listed = CheckpointFiles(from, source);
  if (!listed.ok()) return listed.status().WithContext(what);
  const std::vector<FileInfo> files = std::move(listed).value();
  uint64_t total = 0;
  for (const FileInfo& f : files) total += f.size;

  io::CommitOptions co;
  co.overwrite = options.overwrite;
  co.owns = [](std::string_view name) { return engine::IsCheckpointEntry(name); };
  Result<io::DurableCommit> begun =
      io::DurableCommit::Begin(to, target, io::DurableCommit::Kind::kDirectory, co);
  if (!begun.ok()) return begun.status().WithContext(what);
  const io::DurableCommit commit = std::move(begun).value();
  Copier copier(from, to, options, total);
  // The data files, then the MANIFEST alone, once every data file is in place.
  std::vector<std::string> data;
  for (size_t i = 0; i + 1 < files.size(); ++i) data.push_back(files[i].name);
  Status s = copier.CopyFiles(source, commit.tmp(), data);
  if (s.ok()) s = copier.CopyFiles(source, commit.tmp(), {files.back().name});
  if (s.ok()) s = commit.Commit();
  if (!s.ok()) {
    commit.Abandon();
    // In object storage nothing is temporary: remove the objects this copy published (each only
    // if absent, so they are ours), so that the prefix can be written again.
    if (to->IsObjectStore(target)) {
      for (const std::string& path : copier.written) to->RemoveFile(path).IgnoreError();
    }
    return s.WithContext(what);
  }
  copier.progress.Finish();
  CopyStats stats;
  stats.files = files.size();
  stats.bytes = total;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace savepoint
