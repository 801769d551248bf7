// `savepoint inspect FILE.safetensors [--json]`: describes a safetensors file from its header alone
// (no tensor data is read): tensors with their byte ranges, `__metadata__` as stored, and totals.
// cmd_inspect.cc hands a path that is a file (not a checkpoint directory) over to this one.
#include <fmt/format.h>

#include <string>

#include "commands.h"
#include "common.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

uint64_t TensorBytes(const SafetensorsInfo& info) {
  uint64_t n = 0;
  for (const SafetensorsTensorInfo& t : info.tensors) n += t.nbytes();
  return n;
}

void PrintHuman(const SafetensorsInfo& info) {
  fmt::print("safetensors file {} ({} header, {} in all)\n", info.path,
             HumanBytes(info.header_bytes), HumanBytes(info.file_bytes));
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
    for (const auto& [k, v] : info.raw_metadata) table.AddRow({k, CompactJson(Json(v))});
    fmt::print("\n__metadata__:\n");
    table.Print(stdout);
  }
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
              {"tensors", tensors},
              {"__metadata__", info.raw_metadata},
              {"metadata", info.values.metadata()},
              {"totals", {{"tensors", info.tensors.size()}, {"tensor_bytes", TensorBytes(info)}}}};
  PrintJson(out);
}

}  // namespace

int RunInspectSafetensors(std::string_view command, const std::string& path, bool json) {
  Result<SafetensorsInfo> info = InspectSafetensors(path);
  if (!info.ok()) return Fail(command, info.status());
  if (json) {
    PrintJsonReport(*info);
  } else {
    PrintHuman(*info);
  }
  return kExitOk;
}

}  // namespace savepoint::cli
