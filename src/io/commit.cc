// The durable commit protocol (io/commit.h; docs/FORMAT.md §5, same step numbers).
#include "io/commit.h"

#include <fmt/format.h>

#include <memory>
#include <span>
#include <vector>

#include "io/debris.h"
#include "savepoint/durable.h"

namespace savepoint::io {

Status CreateDirsDurably(FileSystem* fs, const std::string& dir) {
  if (dir.empty() || dir == "/" || dir == "." || fs->IsObjectStore(dir)) return Status::OK();
  if (fs->Exists(dir)) return Status::OK();
  std::string parent = Dirname(dir);
  SP_RETURN_IF_ERROR(CreateDirsDurably(fs, parent));
  Status s = fs->CreateDir(dir);
  if (s.code() == StatusCode::kAlreadyExists) return Status::OK();  // a concurrent creator
  SP_RETURN_IF_ERROR(s);
  return fs->SyncDir(parent);
}

namespace {

// What stands at a commit's target, as far as replacing it goes.
enum class Target { kAbsent, kEmptyDirectory, kReplaceable };

// Up to three names of `entries` that `owns` does not claim, and how many there are.
std::string Foreign(const std::vector<FileInfo>& entries, const CommitOptions& o, size_t* n) {
  std::string names;
  *n = 0;
  for (const FileInfo& e : entries) {
    if (o.owns && o.owns(e.name)) continue;
    if (++*n <= 3) names += fmt::format("{}{:?}", names.empty() ? "" : ", ", e.name);
  }
  return names;
}

// Steps 1 and 5: whether the commit may replace what stands at `path` (see commit.h).
Result<Target> CheckTarget(FileSystem* fs, const std::string& path, DurableCommit::Kind kind,
                           const CommitOptions& o) {
  Result<FileInfo> st = fs->Stat(path);
  if (st.status().code() == StatusCode::kNotFound) return Target::kAbsent;
  SP_RETURN_IF_ERROR(st.status());
  const bool dir_target = kind == DurableCommit::Kind::kDirectory;
  std::vector<FileInfo> entries;
  if (st->is_dir) {
    SP_ASSIGN_OR_RETURN(entries, fs->ListDir(path));
  }
  if (st->is_dir && entries.empty() && dir_target) return Target::kEmptyDirectory;
  if (!o.overwrite) {
    return AlreadyExistsError(fmt::format("{} already exists (overwrite to replace it)", path));
  }
  if (st->is_dir != dir_target) {
    return FailedPreconditionError(fmt::format(
        "{} is a {}, not the {} this writes: overwrite replaces only what savepoint wrote "
        "(nothing was changed)",
        path, st->is_dir ? "directory" : "file", dir_target ? "directory" : "file"));
  }
  size_t n = 0;
  std::string foreign = dir_target ? Foreign(entries, o, &n) : std::string();
  if (n > 0) {
    return FailedPreconditionError(fmt::format(
        "{} holds {} entr{} savepoint did not write ({}{}): overwrite replaces only a "
        "checkpoint's own files; move them away or choose another path (nothing was changed)",
        path, n, n == 1 ? "y" : "ies", foreign, n > 3 ? ", ..." : ""));
  }
  return Target::kReplaceable;
}

// Object stores (commit.h, "In object storage"): what may stand at `path` when a commit begins.
Status CheckObjectTarget(FileSystem* fs, const std::string& path, DurableCommit::Kind kind,
                         const CommitOptions& o) {
  Result<FileInfo> st = fs->Stat(path);
  if (st.status().code() == StatusCode::kNotFound) return Status::OK();
  SP_RETURN_IF_ERROR(st.status());
  const bool dir_target = kind == DurableCommit::Kind::kDirectory;
  if (st->is_dir != dir_target) {
    return FailedPreconditionError(fmt::format(
        "{} is a {}, not the {} this writes (nothing was changed)", path,
        st->is_dir ? "prefix holding objects" : "object", dir_target ? "prefix" : "object"));
  }
  if (!dir_target) {  // one PUT replaces an object whole
    return o.overwrite ? Status::OK()
                       : AlreadyExistsError(
                             fmt::format("{} already exists (overwrite to replace it)", path));
  }
  SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs->ListDir(path));
  if (entries.empty()) return Status::OK();  // a prefix without objects is no target
  for (const FileInfo& e : entries) {
    if (e.name != "MANIFEST") continue;
    if (!o.overwrite) return AlreadyExistsError(fmt::format("{} already exists", path));
    return FailedPreconditionError(fmt::format(
        "{} already exists, and object storage cannot replace a checkpoint without losing it "
        "before the new one commits: delete it first, or save under another name",
        path));
  }
  size_t n = 0;
  CommitOptions none;  // every entry counts
  const std::string names = Foreign(entries, none, &n);
  return FailedPreconditionError(fmt::format(
      "{} holds {} object{} but no MANIFEST ({}{}): an unfinished save, or not savepoint's; "
      "remove them or save under another name (nothing was changed)",
      path, n, n == 1 ? "" : "s", names, n > 3 ? ", ..." : ""));
}

}  // namespace

bool IsEmptyDirectory(FileSystem* fs, const std::string& path) {
  Result<FileInfo> st = fs->Stat(path);
  if (!st.ok() || !st->is_dir) return false;
  Result<std::vector<FileInfo>> entries = fs->ListDir(path);
  return entries.ok() && entries->empty();
}

Result<DurableCommit> DurableCommit::Begin(FileSystem* fs, std::string path, Kind kind,
                                           const CommitOptions& options) {
  if (fs->IsObjectStore(path)) {  // written in place, published last
    SP_RETURN_IF_ERROR(CheckObjectTarget(fs, path, kind, options));
    std::string tmp = path;
    return DurableCommit(fs, std::move(path), std::move(tmp), kind, options);
  }
  // Step 1.
  if (options.create_parents) SP_RETURN_IF_ERROR(CreateDirsDurably(fs, Dirname(path)));
  SP_RETURN_IF_ERROR(CheckTarget(fs, path, kind, options).status());
  // Step 2.
  std::string tmp = TmpPathFor(path);
  if (kind == Kind::kDirectory) SP_RETURN_IF_ERROR(fs->CreateDir(tmp));
  return DurableCommit(fs, std::move(path), std::move(tmp), kind, options);
}

DurableCommit DurableCommit::Adopt(FileSystem* fs, std::string path, std::string tmp, Kind kind,
                                   const CommitOptions& options) {
  return DurableCommit(fs, std::move(path), std::move(tmp), kind, options);
}

Status DurableCommit::Commit() const {
  if (tmp_ == path_) {  // object storage: the writer's last object was the commit point
    // A checkpoint's (the writer owns its entries) is its MANIFEST.
    if (kind_ == Kind::kFile || !options_.owns) return Status::OK();
    if (fs_->Exists(JoinPath(path_, "MANIFEST"))) return Status::OK();
    return InternalError(fmt::format("commit {}: no MANIFEST was published", path_));
  }
  const std::string parent = Dirname(path_);
  if (kind_ == Kind::kDirectory) SP_RETURN_IF_ERROR(fs_->SyncDir(tmp_));  // step 4
  std::string old;
  SP_ASSIGN_OR_RETURN(Target target, CheckTarget(fs_, path_, kind_, options_));  // step 5
  if (target == Target::kEmptyDirectory) SP_RETURN_IF_ERROR(fs_->RemoveDir(path_));
  if (target == Target::kReplaceable) {
    old = OldPathFor(path_);
    SP_RETURN_IF_ERROR(fs_->Rename(path_, old));
  }
  if (Status s = fs_->Rename(tmp_, path_); !s.ok()) {         // step 6
    if (!old.empty()) fs_->Rename(old, path_).IgnoreError();  // put the old one back
    return s;
  }
  SP_RETURN_IF_ERROR(fs_->SyncDir(parent));  // step 7
  if (!old.empty()) {                        // step 8
    fs_->RemoveAll(old).IgnoreError();
    fs_->SyncDir(parent).IgnoreError();
  }
  return Status::OK();
}

void DurableCommit::Abandon() const {
  if (tmp_ != path_) fs_->RemoveAll(tmp_).IgnoreError();
}

Status WriteFileDurably(FileSystem* fs, const std::string& path, std::string_view contents,
                        const CommitOptions& options) {
  SP_ASSIGN_OR_RETURN(DurableCommit commit,
                      DurableCommit::Begin(fs, path, DurableCommit::Kind::kFile, options));
  Status s;
  if (commit.tmp() == path && !options.overwrite) {  // object storage: only if still absent
    Result<std::unique_ptr<WritableFile>> f =
        fs->NewWritableFile(path, FileOptions{.exclusive = true});
    s = f.status();
    if (s.ok()) s = (*f)->WriteAt(0, std::as_bytes(std::span(contents)));
    if (s.ok()) s = (*f)->Close();
  } else {
    s = fs->WriteFileSynced(commit.tmp(), contents);
  }
  if (s.ok()) s = commit.Commit();
  if (!s.ok()) commit.Abandon();
  return s;
}

}  // namespace savepoint::io

namespace savepoint {

Status WriteFileDurably(FileSystem* fs, const std::string& path, std::string_view contents,
                        bool overwrite) {
  io::CommitOptions co;
  co.overwrite = overwrite;
  return io::WriteFileDurably(fs, path, contents, co);
}

}  // namespace savepoint
