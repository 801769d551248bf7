// Shared fixtures of the safetensors unit tests.
#ifndef SAVEPOINT_INTEROP_SAFETENSORS_TESTUTIL_H_
#define SAVEPOINT_INTEROP_SAFETENSORS_TESTUTIL_H_

#include <string>
#include <utility>
#include <vector>

#include "savepoint/safetensors.h"

namespace savepoint::testing {

// Options of a LoadSafetensors call; the file system goes in the call's IoOptions.
inline SafetensorsLoadOptions LoadWith(bool mmap = false, std::vector<std::string> names = {}) {
  SafetensorsLoadOptions o;
  o.mmap = mmap;
  o.names = std::move(names);
  return o;
}

}  // namespace savepoint::testing

#endif  // SAVEPOINT_INTEROP_SAFETENSORS_TESTUTIL_H_
