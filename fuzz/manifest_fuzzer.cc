// Fuzz target for the MANIFEST decoder (src/format/manifest_decode.cc), the first thing savepoint
// parses from an untrusted checkpoint. Two modes per input:
//  - the input as a whole MANIFEST file (header + body), and
//  - the input as a JSON body, re-framed with a valid header and CRCs (checkpoint id 42, i.e.
//    "000000000000002a" in the body) as format versions 1 to 4 (for versions 3 and 4 the input is
//    the head, with no sections after it), so mutations reach the validator of each version's
//    rules instead of stopping at the checksum. Whole indexed files (corpus/manifest/v3_*, v4_*)
//    reach the binary sections (src/format/manifest_index.cc), whole and read in parts as a
//    distributed load reads them (the head, then each section keeping the shards that meet a
//    box); read in parts a second time with every checksum made right, and whole with the
//    sections' checksums in the head made right too, so that mutated records (version 4's varints)
//    reach the record decoder and the re-encoding check.
// Any input must give OK or a clean error: no crash, no sanitizer report, no huge allocation.
// A decoded manifest is re-encoded and must decode again to the same JSON. The head of an indexed
// input (whole, and each input framed as a head of versions 3 and 4) is also decoded both ways,
// by the SAX fast path and by the DOM alone, which must agree: the same error, or the same
// manifest and sections.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "format/endian.h"
#include "format/manifest.h"
#include "format/manifest_checks.h"
#include "format/manifest_index.h"
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

// An indexed input read in parts: the head, then each section with a box made of input bytes
// (with `refit`: the header's and head's CRC32Cs set right first, and each section's in the head).
void CheckParts(std::string_view bytes, bool refit) {
  Result<uint64_t> head = format::IndexedHeadBytes(bytes, "fuzz");
  if (!head.ok() || *head == 0 || *head > bytes.size()) return;
  Result<format::ManifestHead> h =
      format::DecodeManifestHead(bytes.substr(0, *head), bytes.size(), "fuzz");
  if (!h.ok()) return;
  for (size_t i = 0; i < h->sections.size(); ++i) {
    const size_t nd = h->manifest.tensors[i].shape.size();
    format::Box box{Shape(nd), Shape(nd)};
    for (size_t d = 0; d < nd; ++d) {
      box.offsets[d] = static_cast<uint8_t>(bytes[d % bytes.size()]);
      box.sizes[d] = 1 + static_cast<uint8_t>(bytes[(d + 1) % bytes.size()]);
    }
    const std::vector<format::Box> keep{box};
    format::SectionRef& r = h->sections[i];
    const std::string_view section = bytes.substr(r.offset, r.bytes);
    if (refit) r.crc32c = Crc32c(section);
    (void)format::DecodeTensorSection(section, &*h, i, &keep, "fuzz");
    if (refit) (void)format::DecodeTensorSection(section, &*h, i, nullptr, "fuzz");
  }
}

// An indexed MANIFEST's head (`bytes` from the header on) decoded with and without the fast path.
void CheckHeadPaths(std::string_view bytes) {
  const format::internal::Ctx ctx{"fuzz"};
  format::Manifest fast, dom;
  if (!format::internal::CheckHeader(bytes, ctx, &fast).ok() ||
      !format::internal::CheckHeader(bytes, ctx, &dom).ok() ||
      fast.version < format::kIndexedFormatVersion) {
    return;
  }
  const uint64_t n = format::GetU64(bytes, 16);
  if (n > bytes.size() - format::kManifestHeaderBytes) return;
  const std::string_view head = bytes.substr(format::kManifestHeaderBytes, n);
  std::vector<format::SectionRef> a, b;
  const Status sa = format::internal::DecodeHeadBody(head, ctx, &fast, &a, true);
  const Status sb = format::internal::DecodeHeadBody(head, ctx, &dom, &b, false);
  if (sa.ToString() != sb.ToString()) std::abort();
  if (!sa.ok()) return;
  if (format::ManifestToJson(fast) != format::ManifestToJson(dom) || a.size() != b.size()) {
    std::abort();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].bytes != b[i].bytes || a[i].crc32c != b[i].crc32c || a[i].shards != b[i].shards ||
        a[i].chunks != b[i].chunks || a[i].stored != b[i].stored) {
      std::abort();
    }
  }
}

// `bytes` with the header's body CRC (of the head, when the header's body size fits) and the
// header's own CRC recomputed.
std::string Refit(std::string_view bytes) {
  std::string out(bytes);
  if (out.size() < format::kManifestHeaderBytes) return out;
  const uint64_t body = format::GetU64(out, 16);
  if (body <= out.size() - format::kManifestHeaderBytes) {
    format::PutU32(&out, 32,
                   Crc32c(std::string_view(out).substr(format::kManifestHeaderBytes, body)));
  }
  format::PutU32(&out, 60, Crc32c(std::string_view(out).substr(0, 60)));
  return out;
}

// An indexed input (already Refit) with each section's CRC32C in its head set to the section's,
// so that a whole decode reaches the records (and the re-encoding check covers them); empty when
// its head does not decode.
std::string RefitSections(std::string_view bytes) {
  Result<uint64_t> head = format::IndexedHeadBytes(bytes, "fuzz");
  if (!head.ok() || *head == 0 || *head > bytes.size()) return {};
  Result<format::ManifestHead> h =
      format::DecodeManifestHead(bytes.substr(0, *head), bytes.size(), "fuzz");
  if (!h.ok()) return {};
  const uint64_t header = format::kManifestHeaderBytes;
  Json j = Json::parse(bytes.substr(header, *head - header), nullptr, false);
  if (j.is_discarded() || !j.contains("tensors")) return {};
  for (size_t i = 0; i < h->sections.size() && i < j["tensors"].size(); ++i) {
    const format::SectionRef& r = h->sections[i];
    j["tensors"][i]["section_crc32c"] = Crc32c(bytes.substr(r.offset, r.bytes));
  }
  const std::string body = j.dump();
  std::string out(bytes.substr(0, header));
  format::PutU64(&out, 16, body.size());
  return Refit(out + body + std::string(bytes.substr(*head)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  Check(input);
  CheckParts(input, false);
  const std::string refit = Refit(input);
  CheckParts(refit, true);
  CheckHeadPaths(refit);
  if (const std::string whole = RefitSections(refit); !whole.empty()) Check(whole);
  for (uint32_t v = format::kMinFormatVersion; v <= format::kMaxFormatVersion; ++v) {
    const std::string framed = Frame(input, v);
    Check(framed);
    if (v >= format::kIndexedFormatVersion) CheckHeadPaths(framed);
  }
  return 0;
}
