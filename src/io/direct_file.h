// DirectFile: a file written with O_DIRECT where it can be, for writers whose file ends in a
// partial 4 KiB block (MindSpore .ckpt files, safetensors files). O_DIRECT writes whole blocks
// only, so the bytes after the last whole block go through a second, buffered handle on the same
// file. Without O_DIRECT (asked for or granted), or when `size` is a whole number of blocks, there
// is one handle.
//
// Ownership: owns its handles. Thread safety: WriteAt may run on several threads at once for
// disjoint ranges; Finish runs alone, after every write.
#ifndef SAVEPOINT_IO_DIRECT_FILE_H_
#define SAVEPOINT_IO_DIRECT_FILE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint::io {

class DirectFile {
 public:
  // Creates (truncates) `path` on `fs`, with O_DIRECT when `direct_io` and the file system grants
  // it, and preallocates `size` bytes, the file's final size.
  static Result<DirectFile> Create(FileSystem* fs, const std::string& path, bool direct_io,
                                   uint64_t size);

  // Writes `bytes` at `offset` (4 KiB-aligned with O_DIRECT): the whole blocks through the direct
  // handle, a partial last block (only at the end of the file) through the buffered one.
  Status WriteAt(uint64_t offset, std::span<const std::byte> bytes);

  // Syncs and closes both handles.
  Status Finish();

  bool direct() const { return f_->direct(); }

 private:
  DirectFile(std::unique_ptr<WritableFile> f, std::unique_ptr<WritableFile> tail)
      : f_(std::move(f)), tail_(std::move(tail)) {}
  std::unique_ptr<WritableFile> f_;
  std::unique_ptr<WritableFile> tail_;  // null unless f_ is direct and the file ends mid-block
};

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_DIRECT_FILE_H_
