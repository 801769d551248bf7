// `savepoint inspect FILE.safetensors [--json | --tree]`: describes a safetensors file from its
// header alone (no tensor data is read): tensors with their byte ranges, `__metadata__` as stored
// (large internal entries abbreviated in human output), and totals. cmd_inspect.cc hands a path
// that is a file (not a checkpoint directory) over to this one.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "python_tree.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

uint64_t TensorBytes(const SafetensorsInfo& info) {
  uint64_t n = 0;
  for (const SafetensorsTensorInfo& t : info.tensors) n += t.nbytes();
  return n;
}

// A `__metadata__` entry for the human table, as stored; but the members of "savepoint.metadata"
// that inspect hides (the Python structure tree, ...) are left out and named instead.
std::string RawMetadataText(const std::string& key, const std::string& value) {
  if (key != kSafetensorsMetadataKey) return CompactJson(Json(value));
  Json meta = Json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object()) return CompactJson(Json(value));
  std::vector<std::string> hidden;
  for (const auto& [k, v] : meta.items()) {
    if (IsHiddenMetadataKey(k, v)) hidden.push_back(k);
  }
  if (hidden.empty()) return CompactJson(Json(value));
  return fmt::format("{} (not shown: {})", CompactJson(Json(CompactJson(VisibleMetadata(meta)))),
                     CompactJson(Json(hidden)));
}

// What an entry of the Python structure tree names: "BF16 [2, 3]" for a tensor, the kind of a
// value, "" when the file has no such entry.
std::string DescribeEntry(const SafetensorsInfo& info, const std::string& name) {
  for (const SafetensorsTensorInfo& t : info.tensors) {
    if (t.name == name) return fmt::format("{} {}", DTypeName(t.dtype), ShapeToString(t.shape));
  }
  const Value* v = info.values.FindValue(name);
  return v != nullptr ? std::string(ValueKindName(v->kind())) : "";
}

// What the header says of MindSpore's flavour ("" for none), for the human output.
std::string MindSporeText(const SafetensorsInfo& info) {
  std::string out = info.mindspore_format ? "MindSpore flavour (format: ms)" : "";
  if (info.has_crc_num) {
    out += fmt::format("{}crc_num {} (MindSpore's CRC-32, checked by verify and load)",
                       out.empty() ? "" : "; ", CompactJson(Json(info.raw_metadata.at("crc_num"))));
  }
  return out;
}

void PrintHuman(const SafetensorsInfo& info, bool tree) {
  fmt::print("safetensors file {} ({} header, {} in all)\n", info.path,
             HumanBytes(info.header_bytes), HumanBytes(info.file_bytes));
  if (std::string ms = MindSporeText(info); !ms.empty()) fmt::print("{}\n", ms);
  if (!info.tensors.empty()) {
    Table table({"NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"}, {false, false, false, true, true});
    for (const SafetensorsTensorInfo& t : info.tensors) {
      table.AddRow({t.name, std::string(DTypeName(t.dtype)), ShapeToString(t.shape),
                    HumanBytes(t.nbytes()), std::to_string(info.data_offset + t.begin)});
    }
    fmt::print("\ntensors:\n");
    table.Print(stdout);
  }
  if (!info.raw_metadata.empty()) {
    Table table({"KEY", "VALUE"});
    for (const auto& [k, v] : info.raw_metadata) table.AddRow({k, RawMetadataText(k, v)});
    fmt::print("\n__metadata__:\n");
    table.Print(stdout);
  }
  PrintHiddenMetadata(info.values.metadata(), tree,
                      [&](const std::string& name) { return DescribeEntry(info, name); });
  uint64_t bytes = TensorBytes(info);
  fmt::print("total: {} tensors, {} bytes ({})\n", info.tensors.size(), bytes, HumanBytes(bytes));
}

void PrintJsonReport(const SafetensorsInfo& info) {
  Json tensors = Json::array();
  for (const SafetensorsTensorInfo& t : info.tensors) {
    tensors.push_back({{"name", t.name},
                       {"dtype", DTypeName(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.nbytes()},
                       {"data_offsets", {t.begin, t.end}}});
  }
  Json out = {{"path", info.path},
              {"format", "safetensors"},
              {"file_bytes", info.file_bytes},
              {"header_bytes", info.header_bytes},
              {"mindspore_format", info.mindspore_format},
              {"crc_num", info.has_crc_num ? Json(info.raw_metadata.at("crc_num")) : Json(nullptr)},
              {"tensors", tensors},
              {"__metadata__", info.raw_metadata},
              {"metadata", info.values.metadata()},
              {"totals", {{"tensors", info.tensors.size()}, {"tensor_bytes", TensorBytes(info)}}}};
  PrintJson(out);
}

}  // namespace

int RunInspectSafetensors(std::string_view command, const std::string& path, bool json, bool tree) {
  Result<SafetensorsInfo> info = InspectSafetensors(path);
  if (!info.ok()) return Fail(command, info.status());
  if (json) {
    PrintJsonReport(*info);
  } else {
    PrintHuman(*info, tree);
  }
  return kExitOk;
}

}  // namespace savepoint::cli
