// Fuzz target for the MindSpore `.ckpt` reader (src/interop/ckpt_*), which parses files written by
// anyone. The input is a whole `.ckpt` file. Any input must give OK or a clean error: no crash, no
// sanitizer report, no huge allocation. A file that loads is written back with
// SaveMindSporeCheckpoint and must load again to the same tensors, values and metadata, and write
// again to the same bytes. An
// encrypted file (MindSpore's block framing) is loaded with the corpus key kKey: headers, padding,
// sequence and tags all meet untrusted bytes; with the right key it must load or fail cleanly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
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
  Result<MindSporeCheckpointInfo> info = InspectMindSporeCheckpoint("/in.ckpt", &fs);
  if (!info.ok()) return 0;
  // The key the encrypted corpus files were written with (AES-128, AES-CBC-128 and SM4).
  const EncryptionKey key = EncryptionKey::FromBytes(std::string("fuzz-key-16bytes"));
  Result<State> state = LoadMindSporeCheckpoint(
      "/in.ckpt", {.dec_key = info->cipher.empty() ? EncryptionKey() : key}, io);
  if (!state.ok()) return 0;
  if (!SaveMindSporeCheckpoint(*state, "/out.ckpt", {.crc_check = (size & 1) != 0}, io).ok()) {
    std::abort();
  }
  Result<State> again = LoadMindSporeCheckpoint("/out.ckpt", {}, io);
  if (!again.ok() || !fuzz::SameState(*state, *again)) std::abort();
  if (!SaveMindSporeCheckpoint(*again, "/out2.ckpt", {.crc_check = (size & 1) != 0}, io).ok() ||
      !fuzz::SameBytes(fs, "/out.ckpt", "/out2.ckpt")) {
    std::abort();
  }
  return 0;
}
