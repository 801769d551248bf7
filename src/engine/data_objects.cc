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

// Data object `i` of `m` is there with its size and this save's header.
Status CheckDataObject(const SaveTarget& t, const format::Manifest& m, uint32_t i) {
  const format::FileRecord& rec = m.files[i];
  const std::string p = JoinPath(t.tmp, rec.name);
  Result<std::unique_ptr<RandomAccessFile>> f = t.fs->NewRandomAccessFile(p, FileOptions{});
  if (!f.ok()) return NotOurObject(t, p, f.status().ToString());
  if ((*f)->size() != rec.bytes) {
    return NotOurObject(t, p, fmt::format("{} bytes, not {}", (*f)->size(), rec.bytes));
  }
  std::string header(std::min(rec.bytes, format::kDataHeaderBytes), '\0');
  Status read = (*f)->ReadAt(0, std::as_writable_bytes(std::span(header.data(), header.size())));
  if (!read.ok()) return NotOurObject(t, p, fmt::format("unreadable ({})", read.ToString()));
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
  Result<std::unique_ptr<RandomAccessFile>> f = fs->NewRandomAccessFile(path, FileOptions{});
  if (!f.ok() || (*f)->size() < header.size()) return;
  std::string now(header.size(), '\0');
  if (!(*f)->ReadAt(0, std::as_writable_bytes(std::span(now.data(), now.size()))).ok()) return;
  f->reset();
  if (now == header) fs->RemoveFile(path).IgnoreError();
}

}  // namespace savepoint::engine
