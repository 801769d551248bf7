// The names of the checkpoint formats (savepoint/format.h). Detection, which looks at files, is
// the store's (src/store/detect.cc).
#include "savepoint/format.h"

#include <fmt/format.h>

#include <array>
#include <utility>

namespace savepoint {
namespace {

constexpr std::array<std::pair<Format, std::string_view>, 6> kNames = {{
    {Format::kAuto, "auto"},
    {Format::kNative, "native"},
    {Format::kSafetensors, "safetensors"},
    {Format::kMindSporeCkpt, "ckpt"},
    {Format::kDcp, "dcp"},
    {Format::kRecis, "recis"},
}};

}  // namespace

std::string_view FormatName(Format format) {
  for (const auto& [f, name] : kNames) {
    if (f == format) return name;
  }
  return "unknown";
}

Result<Format> ParseFormat(std::string_view name) {
  for (const auto& [f, n] : kNames) {
    if (n == name) return f;
  }
  return InvalidArgumentError(fmt::format(
      "format {:?}: must be \"auto\", \"native\", \"safetensors\", \"ckpt\", \"dcp\" or \"recis\"",
      name));
}

bool IsWritableFormat(Format format) {
  return format == Format::kNative || format == Format::kSafetensors ||
         format == Format::kMindSporeCkpt;
}

Format TargetFormat(const std::string& path) {
  if (path.ends_with(".ckpt")) return Format::kMindSporeCkpt;
  if (path.ends_with(".safetensors")) return Format::kSafetensors;
  return Format::kNative;
}

}  // namespace savepoint
