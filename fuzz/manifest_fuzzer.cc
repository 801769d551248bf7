// Fuzz target for the MANIFEST decoder (src/format/manifest_decode.cc), the first thing savepoint
// parses from an untrusted checkpoint. Two modes per input:
//  - the input as a whole MANIFEST file (header + body), and
//  - the input as a JSON body, re-framed with a valid header and CRCs (checkpoint id 42, i.e.
//    "000000000000002a" in the body) as format versions 1, 2 and 3 (for version 3 the input is the
//    head, with no sections after it), so mutations reach the validator of each version's rules
//    instead of stopping at the checksum. Whole version 3 files (corpus/manifest/v3_*) reach the
//    binary sections (src/format/manifest_index.cc).
// Any input must give OK or a clean error: no crash, no sanitizer report, no huge allocation.
// A decoded manifest is re-encoded and must decode again to the same JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "format/endian.h"
#include "format/manifest.h"
#include "util/crc32c.h"

namespace {

using namespace savepoint;

std::string Frame(std::string_view body, uint32_t version) {
  std::string h(format::kManifestHeaderBytes, '\0');
  h.replace(0, 8, format::kManifestMagic);
  format::PutU32(&h, 8, version);
  format::PutU32(&h, 12, static_cast<uint32_t>(format::kManifestHeaderBytes));
  format::PutU64(&h, 16, body.size());
  format::PutU64(&h, 24, 42);
  format::PutU32(&h, 32, Crc32c(body));
  format::PutU32(&h, 60, Crc32c(std::string_view(h).substr(0, 60)));
  return h + std::string(body);
}

void Check(std::string_view bytes) {
  Result<format::Manifest> m = format::DecodeManifest(bytes, "fuzz");
  if (!m.ok()) return;
  std::string again = format::EncodeManifest(*m);
  Result<format::Manifest> m2 = format::DecodeManifest(again, "fuzz-reencoded");
  if (!m2.ok() || format::ManifestToJson(*m2) != format::ManifestToJson(*m)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  Check(input);
  for (uint32_t v = format::kMinFormatVersion; v <= format::kMaxFormatVersion; ++v) {
    Check(Frame(input, v));
  }
  return 0;
}
