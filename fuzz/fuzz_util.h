// Helpers shared by the fuzz targets.
#ifndef SAVEPOINT_FUZZ_FUZZ_UTIL_H_
#define SAVEPOINT_FUZZ_FUZZ_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "savepoint/filesystem.h"
#include "savepoint/state.h"

namespace savepoint::fuzz {

// Same kind; tensors: same dtype, shape and bytes; values: equal.
inline bool SameEntry(const State::Entry& a, const State::Entry& b) {
  if (a.is_tensor() != b.is_tensor()) return false;
  if (!a.is_tensor()) return a.value() == b.value();
  const TensorView& x = a.tensor();
  const TensorView& y = b.tensor();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         (x.nbytes() == 0 || std::memcmp(x.data(), y.data(), x.nbytes()) == 0);
}

// The same entries and metadata.
inline bool SameState(const State& a, const State& b) {
  if (a.size() != b.size() || a.metadata() != b.metadata()) return false;
  for (const auto& [name, e] : a.entries()) {
    const State::Entry* other = b.Find(name);
    if (other == nullptr || !SameEntry(e, *other)) return false;
  }
  return true;
}

// Both files read and hold the same bytes (a writer is deterministic: what decodes, re-encoded
// twice, gives the same file).
inline bool SameBytes(FileSystem& fs, const std::string& a, const std::string& b) {
  Result<std::string> x = fs.ReadFile(a, uint64_t{1} << 30);
  Result<std::string> y = fs.ReadFile(b, uint64_t{1} << 30);
  return x.ok() && y.ok() && *x == *y;
}

}  // namespace savepoint::fuzz

#endif  // SAVEPOINT_FUZZ_FUZZ_UTIL_H_
