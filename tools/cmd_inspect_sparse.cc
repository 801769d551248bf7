// `savepoint inspect` of a checkpoint with sparse tables: the tables (rows, deleted ids, slots),
// the slice range and rows each data file holds (the shards of a table's ids tensor, and of its
// ranks tensor in description format 2 or its slice_rows tensor in format 1, FORMAT.md §11), and
// the delta chain (SparseChain), all from manifests.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "common.h"
#include "inspect_sparse.h"
#include "savepoint/sparse.h"

namespace savepoint::cli {
namespace {

constexpr char kDescription[] = "savepoint.sparse";

// The description value (FORMAT.md §11); null when absent or not JSON.
Json Description(const CheckpointReader& r) {
  const Value* v = r.values().FindValue(kDescription);
  if (v == nullptr || v->kind() != ValueKind::kJson) return nullptr;
  return v->as_json();
}

std::string Str(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

int64_t Rows(const CheckpointReader& r, const std::string& tensor) {
  const TensorInfo* t = r.FindTensor(tensor);
  return t == nullptr || t->shape.empty() ? 0 : t->shape[0];
}

// One data file's part of a table: its slices [begin, end) and rows.
struct FilePart {
  std::string file;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rows = 0;
};

// The shards of tensor `name` in the manifest: (file index, offset, size) along dim 0.
std::vector<std::tuple<int64_t, int64_t, int64_t>> Shards(const Json& manifest,
                                                          const std::string& name) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (const Json& t : manifest.value("tensors", Json::array())) {
    if (Str(t, "name") != name) continue;
    for (const Json& s : t.value("shards", Json::array())) {
      const Json& off = s.value("offsets", Json::array());
      const Json& size = s.value("sizes", Json::array());
      if (off.empty() || size.empty()) continue;
      out.emplace_back(s.value("file", int64_t{0}), off[0].get<int64_t>(), size[0].get<int64_t>());
    }
  }
  return out;
}

std::vector<FilePart> Files(const CheckpointReader& r, const Json& table) {
  const Json& manifest = r.manifest_json();
  const Json& files = manifest.value("files", Json::array());
  auto file_name = [&](int64_t i) {
    return i >= 0 && i < static_cast<int64_t>(files.size()) ? Str(files[i], "name")
                                                            : fmt::format("#{}", i);
  };
  std::vector<FilePart> out;
  // Format 2: the shard of rank r of N in the ranks tensor is in the file of its slices GenSlice.
  const std::string ranks = Str(table, "ranks");
  const int64_t n = Rows(r, ranks);
  for (const auto& [file, rank, size] : Shards(manifest, ranks)) {
    if (size != 1 || n > kNumSlices || rank < 0 || rank >= n) continue;
    const SliceRange range = *GenSlice(static_cast<int>(rank), static_cast<int>(n));
    out.push_back({file_name(file), range.begin, range.end, 0});
  }
  // Format 1: the shards of the dense counts are the slice ranges.
  for (const auto& [file, begin, size] : Shards(manifest, Str(table, "slice_rows"))) {
    out.push_back({file_name(file), begin, begin + size, 0});
  }
  for (const auto& [file, begin, size] : Shards(manifest, Str(table, "ids"))) {
    for (FilePart& p : out) {
      if (p.file == file_name(file)) p.rows += size;
    }
  }
  return out;
}

std::string SlotText(const CheckpointReader& r, const Json& slot) {
  const TensorInfo* t = r.FindTensor(Str(slot, "tensor"));
  if (t == nullptr) return Str(slot, "name") + " ?";
  Shape row(t->shape.begin() + (t->shape.empty() ? 0 : 1), t->shape.end());
  return fmt::format("{} {} {}", Str(slot, "name"), DTypeName(t->dtype), ShapeToString(row));
}

Json SlotJson(const CheckpointReader& r, const Json& slot) {
  Json out = {{"name", Str(slot, "name")}};
  if (const TensorInfo* t = r.FindTensor(Str(slot, "tensor")); t != nullptr) {
    out["dtype"] = DTypeName(t->dtype);
    out["row_shape"] = Shape(t->shape.begin() + (t->shape.empty() ? 0 : 1), t->shape.end());
  }
  return out;
}

}  // namespace

bool HasSparseTables(const CheckpointReader& r) { return !Description(r).is_null(); }

void PrintSparseTables(const CheckpointReader& r) {
  const Json desc = Description(r);
  const int64_t depth = desc.value("depth", int64_t{0});
  if (depth == 0) {
    fmt::print("\nsparse tables (full checkpoint):\n");
  } else {
    const Json& base = desc.value("base", Json::object());
    fmt::print("\nsparse tables (delta, depth {}, base {} {}):\n", depth, Str(base, "path"),
               Str(base, "checkpoint_id"));
  }
  Table tables({"TABLE", "ROWS", "DELETED", "SLOTS"}, {false, true, true, false});
  Table files({"TABLE", "FILE", "SLICES", "ROWS"}, {false, false, false, true});
  for (const Json& t : desc.value("tables", Json::array())) {
    std::string slots;
    for (const Json& s : t.value("slots", Json::array())) {
      slots += (slots.empty() ? "" : ", ") + SlotText(r, s);
    }
    const std::string deleted = Str(t, "deleted");
    tables.AddRow({Str(t, "name"), std::to_string(Rows(r, Str(t, "ids"))),
                   deleted.empty() ? "-" : std::to_string(Rows(r, deleted)), slots});
    for (const FilePart& p : Files(r, t)) {
      files.AddRow({Str(t, "name"), p.file, fmt::format("[{}, {})", p.begin, p.end),
                    std::to_string(p.rows)});
    }
  }
  tables.Print(stdout);
  fmt::print("\ntable files:\n");
  files.Print(stdout);
  Result<std::vector<SparseChainLink>> chain = SparseChain(r.path());
  fmt::print("\ndelta chain (newest first):\n");
  if (!chain.ok()) {
    fmt::print("broken: {}\n", chain.status().ToString());
    return;
  }
  Table links({"DEPTH", "CHECKPOINT ID", "PATH"}, {true, false, false});
  for (const SparseChainLink& l : *chain) {
    links.AddRow({std::to_string(l.depth), fmt::format("{:016x}", l.checkpoint_id), l.path});
  }
  links.Print(stdout);
}

Json SparseTablesJson(const CheckpointReader& r) {
  const Json desc = Description(r);
  Json out = Json::object();
  out["depth"] = desc.value("depth", int64_t{0});
  out["base"] = desc.contains("base") ? desc["base"] : Json(nullptr);
  out["tables"] = Json::array();
  for (const Json& t : desc.value("tables", Json::array())) {
    Json table = {{"name", Str(t, "name")}, {"rows", Rows(r, Str(t, "ids"))}};
    table["deleted"] = Str(t, "deleted").empty() ? 0 : Rows(r, Str(t, "deleted"));
    table["slots"] = Json::array();
    for (const Json& s : t.value("slots", Json::array())) table["slots"].push_back(SlotJson(r, s));
    table["files"] = Json::array();
    for (const FilePart& p : Files(r, t)) {
      table["files"].push_back({{"file", p.file}, {"slices", {p.begin, p.end}}, {"rows", p.rows}});
    }
    out["tables"].push_back(std::move(table));
  }
  Result<std::vector<SparseChainLink>> chain = SparseChain(r.path());
  if (chain.ok()) {
    out["chain"] = Json::array();
    for (const SparseChainLink& l : *chain) {
      out["chain"].push_back({{"path", l.path},
                              {"checkpoint_id", fmt::format("{:016x}", l.checkpoint_id)},
                              {"depth", l.depth}});
    }
  } else {
    out["chain_error"] = chain.status().ToString();
  }
  return out;
}

}  // namespace savepoint::cli
