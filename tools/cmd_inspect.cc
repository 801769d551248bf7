// `savepoint inspect PATH [--json [--manifest] | --tree]`: describes a checkpoint from its manifest
// alone (no tensor data is read): tensors, non-tensor values, user metadata and totals. Internal
// metadata (the Python structure tree, ...) is summarized in the human output; --tree prints the
// tree (python_tree.h).
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "inspect_sparse.h"
#include "python_tree.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "inspect";

struct InspectArgs {
  std::string path;
  bool json = false;
  bool manifest = false;
  bool tree = false;
  KeyFlags dec;
};

// Non-finite floats have no JSON number: they are written as "nan", "inf" or "-inf".
Json FloatJson(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// The value as JSON; bytes values as {"bytes": <length>}.
Json ValueJson(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kInt:
      return v.as_int();
    case ValueKind::kFloat:
      return FloatJson(v.as_float());
    case ValueKind::kBool:
      return v.as_bool();
    case ValueKind::kString:
      return v.as_string();
    case ValueKind::kBytes:
      return Json{{"bytes", v.as_bytes().data.size()}};
    case ValueKind::kJson:
      return v.as_json();
  }
  return nullptr;
}

// The value as one line of text: strings quoted, bytes as "<N bytes>", JSON compact.
std::string ValueText(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kInt:
      return fmt::format("{}", v.as_int());
    case ValueKind::kFloat:
      return fmt::format("{}", v.as_float());
    case ValueKind::kBool:
      return v.as_bool() ? "true" : "false";
    case ValueKind::kString:
      return CompactJson(Json(v.as_string()));
    case ValueKind::kBytes:
      return fmt::format("<{} bytes>", v.as_bytes().data.size());
    case ValueKind::kJson:
      return CompactJson(v.as_json());
  }
  return "?";
}

uint64_t TensorBytes(const CheckpointReader& r) {
  uint64_t n = 0;
  for (const TensorInfo& t : r.tensors()) n += t.nbytes;
  return n;
}

// Tensor bytes as stored (after compression).
uint64_t StoredBytes(const CheckpointReader& r) {
  uint64_t n = 0;
  for (const TensorInfo& t : r.tensors()) n += t.stored_bytes;
  return n;
}

bool AnyCompressed(const CheckpointReader& r) {
  for (const TensorInfo& t : r.tensors()) {
    if (t.codec != "none") return true;
  }
  return false;
}

// Tensor bytes / stored bytes (1 when nothing is stored).
double CompressionRatio(const CheckpointReader& r) {
  uint64_t stored = StoredBytes(r);
  return stored > 0 ? static_cast<double>(TensorBytes(r)) / stored : 1.0;
}

// Compressed checkpoints get two more columns: CODEC (codec+filter) and STORED.
void PrintTensorTable(const CheckpointReader& r) {
  if (r.tensors().empty()) return;
  const bool compressed = AnyCompressed(r);
  std::vector<std::string> head = {"NAME", "DTYPE", "SHAPE", "BYTES", "SHARDS", "CHUNKS"};
  std::vector<bool> right = {false, false, false, true, true, true};
  if (compressed) {
    head.insert(head.end(), {"CODEC", "STORED"});
    right.insert(right.end(), {false, true});
  }
  Table table(head, right);
  for (const TensorInfo& t : r.tensors()) {
    std::vector<std::string> row = {t.name,
                                    std::string(DTypeName(t.dtype)),
                                    ShapeToString(t.shape),
                                    HumanBytes(t.nbytes),
                                    std::to_string(t.num_shards),
                                    std::to_string(t.num_chunks)};
    if (compressed) {
      row.push_back(t.codec == "none" ? "none" : t.codec + "+" + t.filter);
      row.push_back(HumanBytes(t.stored_bytes));
    }
    table.AddRow(row);
  }
  fmt::print("\ntensors:\n");
  table.Print(stdout);
}

void PrintValueTable(const CheckpointReader& r) {
  Table table({"NAME", "KIND", "VALUE"});
  size_t rows = 0;
  for (const auto& [name, entry] : r.values().entries()) {
    if (entry.is_tensor() || name == "savepoint.sparse") continue;  // (PrintSparseTables)
    const Value& v = entry.value();
    table.AddRow({name, std::string(ValueKindName(v.kind())), ValueText(v)});
    ++rows;
  }
  if (rows == 0) return;
  fmt::print("\nvalues:\n");
  table.Print(stdout);
}

// What an entry of the Python structure tree names: "BF16 [2, 3]" for a tensor, "int 7" for a
// value, "" when the checkpoint has no such entry.
std::string DescribeEntry(const CheckpointReader& r, const std::string& name) {
  if (const TensorInfo* t = r.FindTensor(name); t != nullptr) {
    return fmt::format("{} {}", DTypeName(t->dtype), ShapeToString(t->shape));
  }
  if (const Value* v = r.values().FindValue(name); v != nullptr) {
    return fmt::format("{} {}", ValueKindName(v->kind()), Abbreviate(ValueText(*v), 40));
  }
  return "";
}

void PrintHuman(const CheckpointReader& r, bool tree, bool keyed) {
  fmt::print("checkpoint {} (format version {}, created {}, {} on disk)\n", r.path(),
             r.format_version(), IsoTimeUtc(r.created_ns()), HumanBytes(r.total_file_bytes()));
  if (r.encrypted()) {
    fmt::print("encrypted: AES-256-GCM chunks, authenticated manifest{}\n",
               keyed ? "" : " (not checked: no --dec-key-file; names and values shown unverified)");
  }
  PrintTensorTable(r);
  PrintValueTable(r);
  if (HasSparseTables(r)) PrintSparseTables(r);
  const Json& meta = r.values().metadata();
  fmt::print("\nmetadata: {}\n", meta.is_null() ? "none" : CompactJson(VisibleMetadata(meta)));
  PrintHiddenMetadata(meta, tree, [&](const std::string& name) { return DescribeEntry(r, name); });
  uint64_t bytes = TensorBytes(r);
  fmt::print("total: {} tensors, {} bytes ({})\n", r.tensors().size(), bytes, HumanBytes(bytes));
  if (AnyCompressed(r)) {
    fmt::print("stored: {} bytes ({}), compression ratio {:.2f}\n", StoredBytes(r),
               HumanBytes(StoredBytes(r)), CompressionRatio(r));
  }
}

Json TensorsJson(const CheckpointReader& r) {
  Json out = Json::array();
  for (const TensorInfo& t : r.tensors()) {
    out.push_back({{"name", t.name},
                   {"dtype", DTypeName(t.dtype)},
                   {"shape", t.shape},
                   {"bytes", t.nbytes},
                   {"shards", t.num_shards},
                   {"chunks", t.num_chunks},
                   {"codec", t.codec},
                   {"filter", t.filter},
                   {"stored_bytes", t.stored_bytes}});
  }
  return out;
}

Json ValuesJson(const CheckpointReader& r) {
  Json out = Json::array();
  for (const auto& [name, entry] : r.values().entries()) {
    if (entry.is_tensor()) continue;
    const Value& v = entry.value();
    out.push_back({{"name", name}, {"kind", ValueKindName(v.kind())}, {"value", ValueJson(v)}});
  }
  return out;
}

void PrintJsonReport(const CheckpointReader& r, bool with_manifest) {
  Json out = Json::object();
  out["path"] = r.path();
  out["format_version"] = r.format_version();
  out["encrypted"] = r.encrypted();
  out["created_ns"] = r.created_ns();
  out["total_file_bytes"] = r.total_file_bytes();
  out["tensors"] = TensorsJson(r);
  out["values"] = ValuesJson(r);
  out["metadata"] = r.values().metadata();
  out["totals"] = {{"tensors", r.tensors().size()},
                   {"tensor_bytes", TensorBytes(r)},
                   {"stored_bytes", StoredBytes(r)},
                   {"compression_ratio", CompressionRatio(r)}};
  if (HasSparseTables(r)) out["sparse"] = SparseTablesJson(r);
  if (with_manifest) out["manifest"] = r.manifest_json();
  PrintJson(out);
}

int RunInspect(const InspectArgs& args) {
  if (args.path.ends_with(".ckpt")) {
    return RunInspectCkpt(kCommand, args.path, args.json, args.dec);
  }
  Result<FileInfo> st = DefaultFileSystem()->Stat(args.path);
  if (st.ok() && !st->is_dir) {
    return RunInspectSafetensors(kCommand, args.path, args.json, args.tree);
  }
  if (!args.dec.mode.empty()) {
    return Fail(kCommand, InvalidArgumentError("--dec-mode applies to .ckpt files"));
  }
  LoadOptions options;
  options.key = KeyOf(args.dec);
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(args.path, options);
  if (!reader.ok()) return Fail(kCommand, reader.status());
  if (args.json) {
    PrintJsonReport(**reader, args.manifest);
  } else {
    PrintHuman(**reader, args.tree, !args.dec.key_file.empty());
  }
  return kExitOk;
}

}  // namespace

void RegisterInspect(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Describe a checkpoint (tensors, values, metadata) without reading tensor data");
  sub->add_option("PATH", args->path, "Checkpoint directory, .safetensors or .ckpt file")
      ->required();
  CLI::Option* json = sub->add_flag("--json", args->json, "Print one JSON object (docs/CLI.md)");
  sub->add_flag("--manifest", args->manifest, "With --json: also include the raw manifest")
      ->needs(json);
  sub->add_flag("--tree", args->tree, "Print the Python structure tree (savepoint.python)")
      ->excludes(json);
  AddKeyFlags(sub, &args->dec);
  sub->callback(
      [args, exit_code] { *exit_code = RunGuarded(kCommand, [&] { return RunInspect(*args); }); });
}

}  // namespace savepoint::cli
