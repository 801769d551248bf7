// The durable commit protocol (io/commit.h; docs/FORMAT.md §5, same step numbers).
#include "io/commit.h"

#include <fmt/format.h>

#include "io/debris.h"
#include "savepoint/durable.h"

namespace savepoint::io {

Status CreateDirsDurably(FileSystem* fs, const std::string& dir) {
  if (dir.empty() || dir == "/" || dir == "." || fs->Exists(dir)) return Status::OK();
  std::string parent = Dirname(dir);
  SP_RETURN_IF_ERROR(CreateDirsDurably(fs, parent));
  Status s = fs->CreateDir(dir);
  if (s.code() == StatusCode::kAlreadyExists) return Status::OK();  // a concurrent creator
  SP_RETURN_IF_ERROR(s);
  return fs->SyncDir(parent);
}

Result<DurableCommit> DurableCommit::Begin(FileSystem* fs, std::string path, Kind kind,
                                           const CommitOptions& options) {
  // Step 1.
  if (options.create_parents) SP_RETURN_IF_ERROR(CreateDirsDurably(fs, Dirname(path)));
  if (!options.overwrite && fs->Exists(path)) {
    return AlreadyExistsError(fmt::format("{} already exists (overwrite to replace it)", path));
  }
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
  const std::string parent = Dirname(path_);
  if (kind_ == Kind::kDirectory) SP_RETURN_IF_ERROR(fs_->SyncDir(tmp_));  // step 4
  std::string old;
  if (options_.overwrite && fs_->Exists(path_)) {  // step 5
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

void DurableCommit::Abandon() const { fs_->RemoveAll(tmp_).IgnoreError(); }

Status WriteFileDurably(FileSystem* fs, const std::string& path, std::string_view contents,
                        const CommitOptions& options) {
  SP_ASSIGN_OR_RETURN(DurableCommit commit,
                      DurableCommit::Begin(fs, path, DurableCommit::Kind::kFile, options));
  Status s = fs->WriteFileSynced(commit.tmp(), contents);
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
