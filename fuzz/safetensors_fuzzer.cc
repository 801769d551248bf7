// Fuzz target for the safetensors reader (src/interop/), which parses files written by anyone.
// The input is a whole .safetensors file. Any input must give OK or a clean error: no crash, no
// sanitizer report, no huge allocation. A file that loads is written back with SaveSafetensors and
// must load again to the same tensors, values and metadata, and write again to the same bytes (the
// writer/reader round trip).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "io/mem_fs.h"
#include "savepoint/safetensors.h"

namespace {

using namespace savepoint;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemFileSystem fs;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (!fs.WriteFileSynced("/in.safetensors", input).ok()) std::abort();
  const IoOptions io{.fs = &fs};
  SafetensorsLoadOptions load;
  load.mmap = (size & 1) != 0;  // both paths, on about half the inputs each
  Result<State> state = LoadSafetensors("/in.safetensors", load, io);
  if (!state.ok()) return 0;
  if (!SaveSafetensors(*state, "/out.safetensors", {}, io).ok()) std::abort();
  Result<State> again = LoadSafetensors("/out.safetensors", load, io);
  if (!again.ok() || !savepoint::fuzz::SameState(*state, *again)) std::abort();
  if (!SaveSafetensors(*again, "/out2.safetensors", {}, io).ok() ||
      !fuzz::SameBytes(fs, "/out.safetensors", "/out2.safetensors")) {
    std::abort();
  }
  return 0;
}
