// Fuzz target for the MAC sidecar of CBC-encrypted MindSpore .ckpt files (src/interop/
// ckpt_cipher.h, ReadMacSidecar): the JSON file "<file>.mac" beside an encrypted checkpoint, which
// anyone who can write the directory can replace. The first input byte picks the cipher (AES-CBC
// or SM4-CBC) and the number of blocks (0 to 7) of the file the sidecar must describe; the rest is
// the sidecar. Any input must give OK or a clean error: no crash, no sanitizer report, no
// allocation beyond the 16 MiB cap. A sidecar that reads gives one MAC per block, and the same
// MACs written again (EncodeMacSidecar) read back equal.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "interop/ckpt_cipher.h"
#include "io/mem_fs.h"

namespace {

using namespace savepoint;
using namespace savepoint::interop::ckpt;

constexpr uint64_t kFileBytes = 4096;
constexpr char kPath[] = "/m.ckpt";

Result<std::optional<std::vector<crypto::Sha256>>> ReadSidecar(MemFileSystem& fs,
                                                               const CipherIndex& index,
                                                               const std::string& sidecar) {
  if (!fs.WriteFileSynced(MacSidecarPath(kPath), sidecar).ok()) std::abort();
  return ReadMacSidecar(&fs, kPath, index, kFileBytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  CipherIndex index;
  index.mode = (data[0] & 1) != 0 ? MindSporeCipher::kSm4Cbc : MindSporeCipher::kAesCbc;
  index.blocks.resize((data[0] >> 1) & 7);
  const std::string sidecar(reinterpret_cast<const char*>(data) + 1, size - 1);
  MemFileSystem fs;
  auto macs = ReadSidecar(fs, index, sidecar);
  if (!macs.ok() || !macs->has_value()) return 0;
  if ((*macs)->size() != index.blocks.size()) std::abort();  // one MAC per block
  auto back = ReadSidecar(fs, index, EncodeMacSidecar(index.mode, kFileBytes, **macs));
  if (!back.ok() || !back->has_value() || **back != **macs) std::abort();
  return 0;
}
