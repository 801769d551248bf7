// Checkpoint formats: which container a path holds or should hold.
//
// savepoint reads and writes its own checkpoint directories (docs/FORMAT.md), safetensors files
// (savepoint/safetensors.h) and MindSpore `.ckpt` files (savepoint/mindspore.h), and reads PyTorch
// DCP directories (savepoint/dcp.h) and RecIS checkpoint directories (savepoint/recis.h). The
// verbs (Save, Load, Verify, Convert in savepoint/checkpoint.h) take the format as an option;
// Format::kAuto lets the path decide, by the rules of DetectFormat and TargetFormat below.
//
// Thread safety: all functions are reentrant.
#ifndef SAVEPOINT_FORMAT_H_
#define SAVEPOINT_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

enum class Format : uint8_t {
  kAuto,           // decided by the path (DetectFormat for reads, TargetFormat for writes)
  kNative,         // a savepoint checkpoint directory (docs/FORMAT.md)
  kSafetensors,    // one safetensors file
  kMindSporeCkpt,  // one MindSpore `.ckpt` file
  kDcp,            // a PyTorch DCP directory (`.metadata` + `*.distcp`); read only
  kRecis,          // a RecIS checkpoint directory (`index` + `model-*-of-*.safetensors`); read only
};

// "auto", "native", "safetensors", "ckpt", "dcp" or "recis" (the CLI's --from / --to names).
SAVEPOINT_API std::string_view FormatName(Format format);
// The inverse of FormatName; InvalidArgument naming the accepted names otherwise.
SAVEPOINT_API Result<Format> ParseFormat(std::string_view name);
// Whether savepoint can write `format` (kNative, kSafetensors, kMindSporeCkpt).
SAVEPOINT_API bool IsWritableFormat(Format format);

// The format of what is at `path` (through `fs`; nullptr = DefaultFileSystem()):
//  - a directory holding `MANIFEST` is kNative; else one holding `index` and
//    `model-*-of-*.safetensors` files is kRecis, one holding `.metadata` kDcp, any other kNative;
//  - a file whose name ends in ".ckpt" is kMindSporeCkpt, any other file kSafetensors (so a
//    directory named "x.ckpt" is read by what it holds, not by its name).
// Errors: NotFound when nothing is at `path`, and the file system's errors. Reads no file content.
SAVEPOINT_API Result<Format> DetectFormat(const std::string& path, FileSystem* fs = nullptr);

// The format a write to `path` produces when none is named: kMindSporeCkpt for a name ending in
// ".ckpt", kSafetensors for ".safetensors", else kNative. Looks at the name only.
SAVEPOINT_API Format TargetFormat(const std::string& path);

}  // namespace savepoint

#endif  // SAVEPOINT_FORMAT_H_
