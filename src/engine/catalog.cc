// Listing checkpoints under a root, garbage-collecting debris of crashed saves, crash-safe delete.
#include "savepoint/catalog.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>

#include "engine/paths.h"
#include "engine/reader.h"
#include "format/file_magic.h"
#include "format/manifest.h"
#include "io/debris.h"

namespace savepoint {
namespace {

FileSystem* Fs(FileSystem* fs) { return fs != nullptr ? fs : DefaultFileSystem(); }

// Sum of the sizes of the files directly inside `dir`.
uint64_t DirBytes(FileSystem* fs, const std::string& dir) {
  Result<std::vector<FileInfo>> entries = fs->ListDir(dir);
  uint64_t n = 0;
  if (entries.ok()) {
    for (const auto& e : *entries) n += e.is_dir ? 0 : e.size;
  }
  return n;
}

std::optional<int64_t> StepOf(const State& values) {
  if (const Value* v = values.FindValue("step"); v != nullptr && v->is_int()) return v->as_int();
  const Json& meta = values.metadata();
  if (meta.is_object() && meta.contains("step") && meta["step"].is_number_integer()) {
    return meta["step"].get<int64_t>();
  }
  return std::nullopt;
}

CheckpointEntry Describe(FileSystem* fs, const std::string& root, const FileInfo& info) {
  CheckpointEntry e;
  e.name = info.name;
  e.path = JoinPath(root, info.name);
  e.bytes = DirBytes(fs, e.path);
  e.created_ns = info.mtime_ns;
  std::string ckpt;
  int64_t pid;
  switch (io::ClassifyDebris(info.name, &ckpt, &pid)) {
    case io::DebrisKind::kTmp:
      e.problem = fmt::format("temporary directory of an unfinished save of {:?}", ckpt);
      return e;
    case io::DebrisKind::kOld:
      e.problem = fmt::format("set-aside copy of {:?} from an interrupted overwrite", ckpt);
      return e;
    case io::DebrisKind::kDeleted:
      e.problem = fmt::format("remains of an interrupted delete of {:?}", ckpt);
      return e;
    case io::DebrisKind::kNone:
      break;
  }
  Result<std::unique_ptr<engine::Reader>> r = engine::Reader::OpenImpl(e.path, {}, {.fs = fs});
  if (!r.ok()) {
    e.problem = r.status().ToString();
    return e;
  }
  e.committed = true;
  e.created_ns = (*r)->created_ns();
  e.num_tensors = (*r)->tensors().size();
  e.step = StepOf((*r)->values());
  return e;
}

bool ProcessAlive(int64_t pid) {
  return pid > 0 && pid != ::getpid() &&
         (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

}  // namespace

Result<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& root, FileSystem* fs) {
  fs = Fs(fs);
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(root));
  std::vector<CheckpointEntry> out;
  for (const FileInfo& info : entries) {
    if (info.is_dir) out.push_back(Describe(fs, root, info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.created_ns, a.name) < std::tie(b.created_ns, b.name);
  });
  return out;
}

namespace {

// No process can be asked whether it is still writing to a bucket: in object storage, debris is
// only what has been left alone this long at least.
constexpr int64_t kObjectStoreGraceSeconds = 3600;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// GarbageCollect in object storage (docs/FORMAT.md §5.1): a prefix under `root` holding data
// objects but no MANIFEST, none of them newer than the grace period, is an unfinished save; its
// data objects are removed. Objects that are not a checkpoint's are never touched.
Result<std::vector<std::string>> CollectObjects(FileSystem* fs, const std::string& root,
                                                const GcOptions& o) {
  // A prefix without objects lists as NotFound; abandoned uploads may still lie under it.
  Result<std::vector<FileInfo>> listed = fs->ListDir(root);
  if (!listed.ok() && listed.status().code() != StatusCode::kNotFound) return listed.status();
  const std::vector<FileInfo> entries = listed.ok() ? *listed : std::vector<FileInfo>{};
  const int64_t grace_ns = std::max(o.min_age_seconds, kObjectStoreGraceSeconds) * 1'000'000'000LL;
  const int64_t now = NowNs();
  std::vector<std::string> done;
  for (const FileInfo& dir : entries) {
    if (!dir.is_dir) continue;
    const std::string path = JoinPath(root, dir.name);
    Result<std::vector<FileInfo>> listed_objects = fs->ListDir(path);
    if (listed_objects.status().code() == StatusCode::kNotFound) continue;  // emptied meanwhile
    SP_RETURN_IF_ERROR(listed_objects.status());
    const std::vector<FileInfo>& objects = *listed_objects;
    bool unfinished = !objects.empty();
    for (const FileInfo& e : objects) {
      // (An object of unknown age counts as young.)
      if (e.is_dir || e.name == format::kManifestFileName || !engine::IsCheckpointEntry(e.name) ||
          e.mtime_ns <= 0 || now - e.mtime_ns < grace_ns) {
        unfinished = false;
      }
    }
    if (!unfinished) continue;
    done.push_back(path);
    if (o.dry_run) continue;
    for (const FileInfo& e : objects) SP_RETURN_IF_ERROR(fs->RemoveFile(JoinPath(path, e.name)));
  }
  // Multipart uploads of processes that died before publishing their object.
  SP_ASSIGN_OR_RETURN(std::vector<std::string> aborted,
                      fs->AbortAbandonedWrites(root, now - grace_ns, o.dry_run));
  done.insert(done.end(), aborted.begin(), aborted.end());
  return done;
}

}  // namespace

Result<std::vector<std::string>> GarbageCollect(const std::string& root, const GcOptions& o) {
  FileSystem* fs = Fs(o.fs);
  if (fs->IsObjectStore(root)) return CollectObjects(fs, root, o);
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(root));
  const int64_t now = NowNs();
  std::vector<std::string> done;
  for (const FileInfo& info : entries) {
    std::string ckpt;
    int64_t pid;
    io::DebrisKind kind = io::ClassifyDebris(info.name, &ckpt, &pid);
    if (kind == io::DebrisKind::kNone) continue;  // directories and files alike
    if (now - info.mtime_ns < o.min_age_seconds * 1'000'000'000LL) continue;
    if (kind == io::DebrisKind::kTmp && ProcessAlive(pid)) continue;  // a save in progress
    std::string path = JoinPath(root, info.name);
    std::string target = JoinPath(root, ckpt);
    done.push_back(path);
    if (o.dry_run) continue;
    if (kind == io::DebrisKind::kOld && !fs->Exists(target)) {
      SP_RETURN_IF_ERROR(fs->Rename(path, target));  // interrupted overwrite: restore the old one
    } else {
      SP_RETURN_IF_ERROR(fs->RemoveAll(path));
    }
  }
  if (!done.empty() && !o.dry_run) SP_RETURN_IF_ERROR(fs->SyncDir(root));
  return done;
}

namespace {

// DeleteCheckpoint in object storage (docs/FORMAT.md §5.1), or of a directory that holds files
// besides the checkpoint's: the MANIFEST first (synced), so that no reader takes what is left for
// a checkpoint, then the checkpoint's own data files; other files stay.
Status DeleteOwnEntries(FileSystem* fs, const std::string& path) {
  const std::string manifest = JoinPath(path, format::kManifestFileName);
  SP_RETURN_IF_ERROR(fs->Stat(manifest).status());
  SP_RETURN_IF_ERROR(fs->RemoveFile(manifest));
  SP_RETURN_IF_ERROR(fs->SyncDir(path));
  Result<std::vector<FileInfo>> entries = fs->ListDir(path);
  if (entries.status().code() == StatusCode::kNotFound) return Status::OK();
  SP_RETURN_IF_ERROR(entries.status());
  for (const FileInfo& e : *entries) {
    if (!e.is_dir && engine::IsCheckpointEntry(e.name)) {
      SP_RETURN_IF_ERROR(fs->RemoveFile(JoinPath(path, e.name)));
    }
  }
  return fs->SyncDir(path);
}

// Whether the directory `path` holds a MANIFEST (else NotFound: not a committed checkpoint, so
// nothing is deleted) and whether it holds anything but the checkpoint's own files.
Result<bool> HoldsOthers(FileSystem* fs, const std::string& path) {
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(path));
  bool committed = false, others = false;
  for (const FileInfo& e : entries) {
    committed |= e.name == format::kManifestFileName && !e.is_dir;
    others |= e.is_dir || !engine::IsCheckpointEntry(e.name);
  }
  if (!committed) {
    return NotFoundError(
        fmt::format("{} has no MANIFEST: it is not a committed checkpoint, so nothing of it was "
                    "deleted",
                    path));
  }
  return others;
}

// OK when the file at `path` (`size` bytes) looks like a safetensors or MindSpore .ckpt file
// (format/file_magic.h); FailedPrecondition otherwise: it is not a checkpoint of ours to delete.
Status CheckCheckpointFile(FileSystem* fs, const std::string& path, uint64_t size) {
  std::string head(std::min(size, format::kFileMagicBytes), '\0');
  if (!head.empty()) {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, fs->NewRandomAccessFile(path, {}));
    SP_RETURN_IF_ERROR(f->ReadAt(0, std::as_writable_bytes(std::span(head))));
  }
  const bool ckpt = path.ends_with(".ckpt");
  if (format::LooksLikeCheckpointFile(head, size, ckpt)) return Status::OK();
  return FailedPreconditionError(
      fmt::format("{} is not a {} file (its first bytes say otherwise); nothing deleted", path,
                  ckpt ? "MindSpore .ckpt" : "safetensors"));
}

}  // namespace

Status DeleteCheckpoint(const std::string& raw_path, FileSystem* fs) {
  fs = Fs(fs);
  SP_ASSIGN_OR_RETURN(std::string path, engine::NormalizeCheckpointPath(raw_path));
  std::string context = fmt::format("delete {}", path);
  if (fs->IsObjectStore(path)) return DeleteOwnEntries(fs, path).WithContext(context);
  Result<FileInfo> info = fs->Stat(path);
  if (!info.ok()) return info.status().WithContext(context);
  if (info->is_dir) {  // a directory is deleted whole only when it holds nothing but the checkpoint
    Result<bool> others = HoldsOthers(fs, path);
    if (!others.ok()) return others.status().WithContext(context);
    if (*others) return DeleteOwnEntries(fs, path).WithContext(context);
  } else {
    SP_RETURN_IF_ERROR(CheckCheckpointFile(fs, path, info->size).WithContext(context));
  }
  std::string old = io::DelPathFor(path);
  Status s = fs->Rename(path, old);
  if (s.ok()) s = fs->SyncDir(Dirname(path));
  if (s.ok()) s = fs->RemoveAll(old);
  return s.WithContext(context);
}

}  // namespace savepoint
