// Object storage's checks of a save's commit (see data_objects.h).
#include "engine/data_objects.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <span>

#include "util/parallel.h"

namespace savepoint::engine {
namespace {

constexpr int kCheckThreads = 16;  // (each check waits on two requests to the store)

// The error for data object `p` of the save to `t` when it is not the one the save wrote.
Status NotOurObject(const SaveTarget& t, const std::string& p, const std::string& what) {
  return IOError(
      fmt::format("commit {}: data object {} is {} (another process removed or replaced it?); the "
                  "checkpoint is not committed",
                  t.path, p, what));
}

// The first `n` bytes of the file at `path` (fewer when it is shorter) into *front, and its size
// into *size: one open (a HEAD in a bucket) and one ranged read.
Status ReadFront(FileSystem* fs, const std::string& path, uint64_t n, std::string* front,
                 uint64_t* size) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f,
                      fs->NewRandomAccessFile(path, FileOptions{}));
  *size = f->size();
  front->assign(std::min(n, *size), '\0');
  return f->ReadAt(0, std::as_writable_bytes(std::span(front->data(), front->size())));
}

// Data object `i` of `m` is there with its size and this save's header.
Status CheckDataObject(const SaveTarget& t, const format::Manifest& m, uint32_t i) {
  const format::FileRecord& rec = m.files[i];
  const std::string p = JoinPath(t.tmp, rec.name);
  std::string header;
  uint64_t size = 0;
  Status read = ReadFront(t.fs, p, format::kDataHeaderBytes, &header, &size);
  if (!read.ok()) return NotOurObject(t, p, read.ToString());
  if (size != rec.bytes)
    return NotOurObject(t, p, fmt::format("{} bytes, not {}", size, rec.bytes));
  read = format::CheckDataHeader(header, m.checkpoint_id, i, m.version, "its header");
  if (!read.ok()) return NotOurObject(t, p, fmt::format("not this save's ({})", read.message()));
  return Status::OK();
}

}  // namespace

Status CheckDataObjects(const SaveTarget& t, const format::Manifest& m) {
  const int threads = static_cast<int>(std::clamp<size_t>(m.files.size(), 1, kCheckThreads));
  return ParallelFor(m.files.size(), threads, [&](size_t i, int) {
    return CheckDataObject(t, m, static_cast<uint32_t>(i));
  });
}

void RemoveOwnManifest(FileSystem* fs, const std::string& path, std::string_view header) {
  std::string now;
  uint64_t size = 0;
  if (ReadFront(fs, path, header.size(), &now, &size).ok() && now == header) {
    fs->RemoveFile(path).IgnoreError();
  }
}

}  // namespace savepoint::engine
