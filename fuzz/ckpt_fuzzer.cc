// Fuzz target for the MindSpore `.ckpt` reader (src/interop/ckpt_*), which parses files written by
// anyone. The input is a whole `.ckpt` file. Any input must give OK or a clean error: no crash, no
// sanitizer report, no huge allocation. A file that loads is written back with
// SaveMindSporeCheckpoint and must load again to the same tensors, values and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_util.h"
#include "io/mem_fs.h"
#include "savepoint/mindspore.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace savepoint;
  MemFileSystem fs;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (!fs.WriteFileSynced("/in.ckpt", input).ok()) std::abort();
  const IoOptions io{.fs = &fs, .io_threads = 2};
  if (!InspectMindSporeCheckpoint("/in.ckpt", &fs).ok()) return 0;
  Result<State> state = LoadMindSporeCheckpoint("/in.ckpt", {}, io);
  if (!state.ok()) return 0;
  if (!SaveMindSporeCheckpoint(*state, "/out.ckpt", {.crc_check = (size & 1) != 0}, io).ok()) {
    std::abort();
  }
  Result<State> again = LoadMindSporeCheckpoint("/out.ckpt", {}, io);
  if (!again.ok() || !fuzz::SameState(*state, *again)) std::abort();
  return 0;
}
