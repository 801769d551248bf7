#include "io/direct_file.h"

#include <utility>

namespace savepoint::io {

Result<DirectFile> DirectFile::Create(FileSystem* fs, const std::string& path, bool direct_io,
                                      uint64_t size) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                      fs->NewWritableFile(path, {.direct_io = direct_io}));
  SP_RETURN_IF_ERROR(f->Preallocate(size));
  std::unique_ptr<WritableFile> tail;
  if (f->direct() && size % kDirectIOAlignment != 0) {
    SP_ASSIGN_OR_RETURN(tail, fs->NewWritableFile(path, {.direct_io = false, .truncate = false}));
  }
  return DirectFile(std::move(f), std::move(tail));
}

Status DirectFile::WriteAt(uint64_t offset, std::span<const std::byte> bytes) {
  const uint64_t whole =
      tail_ != nullptr ? bytes.size() / kDirectIOAlignment * kDirectIOAlignment : bytes.size();
  if (whole > 0) SP_RETURN_IF_ERROR(f_->WriteAt(offset, bytes.first(whole)));
  if (whole < bytes.size()) return tail_->WriteAt(offset + whole, bytes.subspan(whole));
  return Status::OK();
}

Status DirectFile::Finish() {
  if (tail_ != nullptr) {
    SP_RETURN_IF_ERROR(tail_->Sync());
    SP_RETURN_IF_ERROR(tail_->Close());
  }
  SP_RETURN_IF_ERROR(f_->Sync());
  return f_->Close();
}

}  // namespace savepoint::io
