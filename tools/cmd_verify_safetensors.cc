// `savepoint verify FILE.safetensors`: validates the header as untrusted input
// (InspectSafetensors: lengths, dtypes, shapes, offsets tiling the data buffer up to the end of the
// file, ...) and reads every tensor byte back, in 8 MiB pieces on several threads
// (VerifySafetensors). A plain safetensors file has no checksums; one with MindSpore's `crc_num`
// (its crc_check) has one CRC-32 over all tensors, which is then checked (counted as one chunk).
// cmd_verify.cc hands a path that is a file over to this one and prints the report.
#include <string>

#include "commands.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {

VerifyReport VerifySafetensorsFile(const std::string& path, int threads,
                                   const ProgressFn& progress) {
  VerifyReport out;
  out.path = path;
  out.format = "safetensors";
  out.checksums = false;
  Result<SafetensorsInfo> info = InspectSafetensors(path);
  if (!info.ok()) {
    out.status = info.status();
    return out;
  }
  out.tensors = info->tensors.size();
  out.checksums = info->has_crc_num;
  out.status =
      VerifySafetensors(path, {.stats = &out.stats, .progress = progress}, {.io_threads = threads});
  return out;
}

}  // namespace savepoint::cli
