// Fuzz target for what a checkpoint directory holds besides checkpoints (src/io/debris.h): the
// names of its entries, which `gc` and a checkpoint manager classify as debris of crashed saves
// (and remove), and the contents of a manager's lock file (savepoint.lock), echoed in errors.
// Input: the lock file's contents, a NUL byte, then directory entry names, one per line.
// Properties (std::abort on violation):
//  - a lock holder is described as "pid <the file's exact digits>" or as unknown;
//  - a name classified as debris is exactly the name savepoint writes for that checkpoint, kind,
//    pid and nonce (DebrisEntryName): classification and naming are inverses;
//  - GarbageCollect of a directory holding those entries removes (or restores) debris only:
//    every other entry is still there, with its contents, and every path it reports is debris.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "io/debris.h"
#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/filesystem.h"

namespace {

using namespace savepoint;

void CheckLockHolder(std::string_view contents) {
  const std::string said = io::DescribeLockHolder(contents);
  if (said != "pid " + std::string(contents) && said != "unknown (the lock file holds no pid)") {
    std::abort();
  }
}

// Classifies `entry`; aborts unless debris round-trips through DebrisEntryName.
io::DebrisKind Classify(std::string_view entry) {
  std::string ckpt;
  int64_t pid = -1;
  const io::DebrisKind kind = io::ClassifyDebris(entry, &ckpt, &pid);
  if (kind == io::DebrisKind::kNone) return kind;
  uint64_t nonce = 0;
  const std::string_view hex = entry.substr(entry.size() < 16 ? 0 : entry.size() - 16);
  if (std::from_chars(hex.data(), hex.data() + hex.size(), nonce, 16).ec != std::errc() ||
      io::DebrisEntryName(kind, ckpt, pid, nonce) != entry) {
    std::abort();
  }
  return kind;
}

// The entries of the input: plain names, each once, at most 64.
std::vector<std::string> Entries(std::string_view names) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  while (!names.empty() && out.size() < 64) {
    const size_t nl = names.find('\n');
    const std::string name(names.substr(0, nl));
    names.remove_prefix(nl == std::string_view::npos ? names.size() : nl + 1);
    if (name.empty() || name == "." || name == ".." || name.size() > 255 ||
        name.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
      continue;
    }
    if (seen.insert(name).second) out.push_back(name);
  }
  return out;
}

void CheckGc(const std::vector<std::string>& entries) {
  MemFileSystem fs;
  if (!fs.CreateDir("/r").ok()) std::abort();
  for (const std::string& e : entries) {
    // A file with its own name as contents (or a directory holding one, when the name is debris).
    const bool dir = Classify(e) != io::DebrisKind::kNone;
    const std::string path = "/r/" + e;
    if (dir && !fs.CreateDir(path).ok()) std::abort();
    if (!fs.WriteFileSynced(dir ? path + "/f" : path, e).ok()) std::abort();
  }
  Result<std::vector<std::string>> removed = GarbageCollect("/r", GcOptions{.fs = &fs});
  if (!removed.ok()) std::abort();
  for (const std::string& p : *removed) {
    if (Classify(Basename(p)) == io::DebrisKind::kNone) std::abort();  // not ours
  }
  for (const std::string& e : entries) {
    if (Classify(e) != io::DebrisKind::kNone) continue;
    Result<std::string> kept = fs.ReadFile("/r/" + e, 1024);
    // A restored checkpoint (`.x.savepoint-old.*` -> `x`) may have taken the name of a plain
    // entry only if that entry did not exist; it existed, so it must hold what it held.
    if (!kept.ok() || *kept != e) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  CheckLockHolder(input.substr(0, nul));
  if (nul == std::string_view::npos) return 0;
  const std::vector<std::string> entries = Entries(input.substr(nul + 1));
  for (const std::string& e : entries) Classify(e);
  CheckGc(entries);
  return 0;
}
