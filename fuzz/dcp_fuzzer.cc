// Fuzz target for the import of PyTorch DCP directories (src/interop/dcp.cc, pickle.cc,
// dcp_chunk.cc): `.metadata` is a pickle from anywhere and the data files hold torch.save zip
// archives. Any input must give OK or a clean error: no crash, no sanitizer report, no code run,
// no huge allocation or loop. The input is one directory in an in-memory file system: its first 4
// bytes (little-endian) are the length of `.metadata`, which follows; the rest is `__0_0.distcp`.
// Inputs shorter than 4 bytes are the whole `.metadata`.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "io/mem_fs.h"
#include "savepoint/dcp.h"

namespace {

using namespace savepoint;

void Write(FileSystem& fs, const std::string& path, std::string_view bytes) {
  auto f = fs.NewWritableFile(path, {});
  if (!f.ok()) return;
  (*f)->WriteAt(0, std::as_bytes(std::span(bytes.data(), bytes.size()))).IgnoreError();
  (*f)->Close().IgnoreError();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view metadata = input, distcp;
  if (size >= 4) {
    const uint32_t n = data[0] | data[1] << 8 | data[2] << 16 | uint32_t{data[3]} << 24;
    input.remove_prefix(4);
    metadata = input.substr(0, n);
    distcp = input.substr(metadata.size());
  }
  MemFileSystem fs;
  if (!fs.CreateDir("/d").ok()) return 0;
  Write(fs, "/d/.metadata", metadata);
  Write(fs, "/d/__0_0.distcp", distcp);
  LoadDcpCheckpoint("/d", {.max_metadata_bytes = 1 << 20}, {.fs = &fs}).status().IgnoreError();
  return 0;
}
