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
  std::mutex mu;
  std::vector<std::string> written;  // guarded by mu: files this copy created at the target

  // Copies the file `src` to `dst` (written only if absent) and checks the size written.
  Status CopyFile(const std::string& src, const std::string& dst, int worker) {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, from->NewRandomAccessFile(src, {}));
    const uint64_t size = in->size();
    FileOptions fo;
    fo.exclusive = true;
    SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, to->NewWritableFile(dst, fo));
    {
      std::lock_guard<std::mutex> lock(mu);
      written.push_back(dst);
    }
    SP_RETURN_IF_ERROR(out->Preallocate(size));
    std::vector<std::byte>& buf = buffers[worker];
    buf.resize(std::min<uint64_t>(options.block_bytes, std::max<uint64_t>(size, 1)));
    for (uint64_t off = 0; off < size;) {
      const uint64_t n = std::min<uint64_t>(buf.size(), size - off);
      pacer.Take(n);
      std::span<std::byte> block(buf.data(), n);
      SP_RETURN_IF_ERROR(in->ReadAt(off, block));
      SP_RETURN_IF_ERROR(out->WriteAt(off, block));
      off += n;
      progress.Add(n);
    }
    SP_RETURN_IF_ERROR(out->Sync());
    SP_RETURN_IF_ERROR(out->Close());
    SP_ASSIGN_OR_RETURN(FileInfo written, to->Stat(dst));
    if (written.size != size) {
      return IOError(fmt::format("copy of {} to {}: {} bytes written, the source has {}", src, dst,
                                 written.size, size));
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
  auto copy = [&](size_t i, int worker) {
    return copier.CopyFile(JoinPath(source, files[i].name), JoinPath(commit.tmp(), files[i].name),
                           worker);
  };
  // Data files in parallel; the MANIFEST alone and last, once every data file is in place.
  Status s = ParallelFor(files.size() - 1, options.threads, copy);
  if (s.ok()) s = copy(files.size() - 1, 0);
  if (s.ok()) s = commit.Commit();
  if (!s.ok()) {
    commit.Abandon();
    // In object storage nothing is temporary: remove the objects this copy created (each was
    // written only if absent, so they are ours), so that the prefix can be written again.
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
