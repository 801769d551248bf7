// Fuzz target for the checkpoint manager's index (src/manager/index.cc): JSON that a manager reads
// back from its directory (savepoint-index-<generation>.json) or, for a remote tier, from a bucket
// (savepoint-index.json, written by whoever can write there). Each input is read both ways.
// Any input must give OK or a clean error: no crash, no sanitizer report, no record whose name
// escapes the directory. An index that reads is written again and must read back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/mem_fs.h"
#include "manager/index.h"

namespace {

using namespace savepoint;

// An object store that reads the index object with a version, as a bucket does.
class VersionedMem : public ForwardingFileSystem {
 public:
  explicit VersionedMem(FileSystem* base) : ForwardingFileSystem(base) {}
  bool IsObjectStore(const std::string&) override { return true; }
  Result<VersionedFile> ReadVersioned(const std::string& path, uint64_t max_bytes) override {
    SP_ASSIGN_OR_RETURN(std::string contents, base()->ReadFile(path, max_bytes));
    return VersionedFile{std::move(contents), "\"v1\""};
  }
  Result<std::string> WriteIfVersion(const std::string& path, std::string_view contents,
                                     const std::string&) override {
    SP_RETURN_IF_ERROR(base()->WriteFileSynced(path, contents));
    return std::string("\"v2\"");
  }
};

std::vector<std::string> Names(const manager::Index& index) {
  std::vector<std::string> out;
  for (const CheckpointRecord& r : index.records) {
    if (r.name.empty() || r.name[0] == '.' || r.name.find('/') != std::string::npos ||
        r.path != "/d/" + r.name) {
      std::abort();  // a name that escapes the directory was accepted
    }
    out.push_back(r.name);
  }
  return out;
}

// Writes `index` again and reads it back: the same records, in order.
void RoundTrip(FileSystem* fs, manager::Index index, bool object) {
  const std::vector<std::string> names = Names(index);
  Status written =
      object ? manager::WriteIndexObject(fs, "/d", index) : manager::WriteIndex(fs, "/d", index);
  if (!written.ok()) std::abort();
  Result<manager::Index> back =
      object ? manager::ReadIndexObject(fs, "/d") : manager::ReadIndex(fs, "/d");
  if (!back.ok() || Names(*back) != names) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  {
    MemFileSystem mem;
    if (!mem.CreateDir("/d").ok()) std::abort();
    if (!mem.WriteFileSynced("/d/savepoint-index-00000000000000000007.json", text).ok()) {
      std::abort();
    }
    Result<manager::Index> index = manager::ReadIndex(&mem, "/d");
    if (!index.ok()) std::abort();  // an invalid generation is skipped, never an error
    if (index->generation != 0) RoundTrip(&mem, std::move(index).value(), false);
  }
  MemFileSystem mem;
  VersionedMem bucket(&mem);
  if (!mem.CreateDir("/d").ok() || !mem.WriteFileSynced("/d/savepoint-index.json", text).ok()) {
    std::abort();
  }
  Result<manager::Index> index = manager::ReadIndexObject(&bucket, "/d");
  if (!index.ok()) std::abort();  // a damaged object reads as generation 0, to be rebuilt
  if (index->generation != 0) RoundTrip(&bucket, std::move(index).value(), true);
  return 0;
}
