// Strategy files <-> MindSporeStrategy (savepoint/mindspore_strategy.h): the protobuf form
// (mindspore_strategy/strategy.proto, parsed partially and checked field by field) and the JSON
// form (nlohmann, depth checked before parsing). Both are untrusted: sizes, counts and depths are
// capped, every number is range-checked, and errors name the file and the parameter.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "core/utf8.h"
#include "format/manifest.h"
#include "interop/byte_layout.h"
#include "mindspore_strategy/strategy.pb.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint {
namespace {

namespace pb = ::savepoint::mindspore_strategy;
using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxFileBytes = uint64_t{256} << 20;
constexpr size_t kMaxItems = size_t{1} << 20;
constexpr size_t kMaxDims = 64;
constexpr size_t kMaxNameBytes = size_t{1} << 16;
constexpr size_t kMaxJsonDepth = 16;

Status Bad(const std::string& file, std::string_view param, std::string_view why) {
  if (param.empty()) return CorruptionError(fmt::format("strategy file {}: {}", file, why));
  return CorruptionError(fmt::format("strategy file {}: parameter {:?}: {}", file, param, why));
}

// A dev_matrix entry is a device count that the protobuf form (uint32) holds exactly; whether the
// counts make sense together (>= 1, their product at most the world cap) is checked where the
// layout is used (ResolveMindSporeStrategy), as for a strategy built in memory.
std::string DevMatrixProblem(const std::vector<int64_t>& dev) {
  for (int64_t d : dev) {
    if (d < 0 || d > int64_t{UINT32_MAX}) {
      return fmt::format("dev_matrix [{}] holds {}, not a device count (0 to {})",
                         fmt::join(dev, ", "), d, UINT32_MAX);
    }
  }
  return {};
}

Status CheckDevMatrix(const std::vector<int64_t>& dev, const std::string& file,
                      std::string_view param) {
  const std::string problem = DevMatrixProblem(dev);
  return problem.empty() ? Status::OK() : Bad(file, param, problem);
}

// A nested map of one dim split over one axis is the flat map of that axis (MindSpore reads one
// TensorMap message as the flat form): both readers give the flat form, so that every encoding
// of a layout decodes to the same value.
void NormalizeTensorMap(MindSporeParamLayout* l) {
  // (Likewise a nested map whose entries were all empty and dropped: the map of a scalar.)
  if (l->nested_tensor_map &&
      (l->tensor_map.empty() || (l->tensor_map.size() == 1 && l->tensor_map[0].size() == 1))) {
    l->nested_tensor_map = false;
  }
}

// --- protobuf ---

template <typename Field>
Status CheckCount(const Field& f, size_t cap, const std::string& file, std::string_view param,
                  std::string_view what) {
  if (static_cast<size_t>(f.size()) <= cap) return Status::OK();
  return Bad(file, param, fmt::format("{} has {} entries (limit {})", what, f.size(), cap));
}

Result<MindSporeParamLayout> FromProto(const pb::ParallelLayouts& p, const std::string& file,
                                       std::string_view param) {
  MindSporeParamLayout l;
  SP_RETURN_IF_ERROR(CheckCount(p.tensor_map(), kMaxDims, file, param, "tensor_map"));
  if (p.dev_matrix_size() < 1) return Bad(file, param, "no dev_matrix");
  SP_RETURN_IF_ERROR(CheckCount(p.dev_matrix(0).dim(), kMaxDims, file, param, "dev_matrix"));
  l.dev_matrix.assign(p.dev_matrix(0).dim().begin(), p.dev_matrix(0).dim().end());
  SP_RETURN_IF_ERROR(CheckDevMatrix(l.dev_matrix, file, param));
  // MindSpore's reading: several TensorMap messages are the nested form (empty ones dropped).
  l.nested_tensor_map = p.tensor_map_size() > 1;
  for (const pb::TensorMap& m : p.tensor_map()) {
    SP_RETURN_IF_ERROR(CheckCount(m.dim(), kMaxDims, file, param, "tensor_map"));
    if (!l.nested_tensor_map) {
      for (int32_t k : m.dim()) l.tensor_map.push_back({k});
    } else if (m.dim_size() > 0) {
      l.tensor_map.emplace_back(m.dim().begin(), m.dim().end());
    }
  }
  NormalizeTensorMap(&l);
  if (p.param_split_shape_size() > 0) {
    const auto& d = p.param_split_shape(0).dim();
    SP_RETURN_IF_ERROR(CheckCount(d, kMaxItems, file, param, "param_split_shape"));
    l.param_split_shape.assign(d.begin(), d.end());
  }
  if (p.indices_offset_size() > 0) {
    const auto& d = p.indices_offset(0).dim();
    SP_RETURN_IF_ERROR(CheckCount(d, kMaxItems, file, param, "indices_offset"));
    l.indices_offset.assign(d.begin(), d.end());
  }
  l.field = p.field();
  l.opt_weight_shard_step = p.opt_weight_shard_step();
  l.opt_weight_shard_size = p.opt_weight_shard_size();
  return l;
}

Result<MindSporeStrategy> ParseProto(std::string_view bytes, const std::string& file) {
  pb::ParallelStrategyMap m;
  if (!m.ParsePartialFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Bad(file, "", "not a protobuf ParallelStrategyMap (nor JSON)");
  }
  SP_RETURN_IF_ERROR(CheckCount(m.parallel_layout_item(), kMaxItems, file, "", "layouts"));
  SP_RETURN_IF_ERROR(CheckCount(m.parallel_strategy_item(), kMaxItems, file, "", "nodes"));
  MindSporeStrategy s;
  s.current_stage = m.current_stage();
  for (const pb::ParallelStrategyItem& item : m.parallel_strategy_item()) {
    MindSporeNodeStrategy n{item.node_name(), item.parallel_strategys().stage(), {}};
    // (JSON has no form for other bytes: such a name would not round-trip.)
    if (!IsValidUtf8(n.node_name)) return Bad(file, "", "a node name is not UTF-8");
    const auto& strategies = item.parallel_strategys().parallel_strategy();
    SP_RETURN_IF_ERROR(CheckCount(strategies, kMaxDims, file, n.node_name, "parallel_strategy"));
    for (const pb::ParallelStrategy& st : strategies) {
      SP_RETURN_IF_ERROR(CheckCount(st.dim(), kMaxDims, file, n.node_name, "parallel_strategy"));
      n.strategy.emplace_back(st.dim().begin(), st.dim().end());
    }
    s.nodes.push_back(std::move(n));
  }
  for (const pb::ParallelLayoutItem& item : m.parallel_layout_item()) {
    if (item.param_name().size() > kMaxNameBytes) return Bad(file, "", "parameter name too long");
    if (!IsValidUtf8(item.param_name())) return Bad(file, "", "a parameter name is not UTF-8");
    SP_ASSIGN_OR_RETURN(MindSporeParamLayout l,
                        FromProto(item.parallel_layouts(), file, item.param_name()));
    s.layouts.emplace_back(item.param_name(), std::move(l));
  }
  return s;
}

std::string EncodeProto(const MindSporeStrategy& s) {
  pb::ParallelStrategyMap m;
  m.set_current_stage(s.current_stage);
  for (const MindSporeNodeStrategy& n : s.nodes) {
    pb::ParallelStrategyItem* item = m.add_parallel_strategy_item();
    item->set_node_name(n.node_name);
    item->mutable_parallel_strategys()->set_stage(n.stage);
    for (const auto& st : n.strategy) {
      auto* dims = item->mutable_parallel_strategys()->add_parallel_strategy()->mutable_dim();
      dims->Add(st.begin(), st.end());
    }
  }
  for (const auto& [name, l] : s.layouts) {
    pb::ParallelLayoutItem* item = m.add_parallel_layout_item();
    item->set_param_name(name);
    pb::ParallelLayouts* p = item->mutable_parallel_layouts();
    auto* dev = p->add_dev_matrix()->mutable_dim();
    for (int64_t d : l.dev_matrix) dev->Add(static_cast<uint32_t>(d));
    if (l.nested_tensor_map) {
      for (const auto& axes : l.tensor_map) {
        p->add_tensor_map()->mutable_dim()->Add(axes.begin(), axes.end());
      }
    } else {
      auto* flat = p->add_tensor_map()->mutable_dim();
      for (const auto& axes : l.tensor_map) flat->Add(axes.empty() ? -1 : axes[0]);
    }
    p->add_param_split_shape()->mutable_dim()->Add(l.param_split_shape.begin(),
                                                   l.param_split_shape.end());
    p->add_indices_offset()->mutable_dim()->Add(l.indices_offset.begin(), l.indices_offset.end());
    p->set_field(l.field);
    p->set_opt_weight_shard_step(l.opt_weight_shard_step);
    p->set_opt_weight_shard_size(l.opt_weight_shard_size);
  }
  return m.SerializePartialAsString();
}

// --- JSON ---

// An integer member in [lo, hi] (absent: `dflt`).
template <typename T>
Result<T> JsonInt(const Json& j, const char* key, T dflt, const std::string& file,
                  std::string_view param) {
  auto it = j.find(key);
  if (it == j.end()) return dflt;
  if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX)) {
    return Bad(file, param, fmt::format("{} is not an integer", key));
  }
  const int64_t v = it->get<int64_t>();
  if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
    return Bad(file, param, fmt::format("{} = {} is out of range", key, v));
  }
  return static_cast<T>(v);
}

Result<std::vector<int64_t>> JsonInts(const Json& j, const char* key, size_t cap,
                                      const std::string& file, std::string_view param) {
  std::vector<int64_t> out;
  auto it = j.find(key);
  if (it == j.end()) return out;
  if (!it->is_array() || it->size() > cap) {
    return Bad(file, param, fmt::format("{} is not an array of at most {} integers", key, cap));
  }
  for (const Json& v : *it) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
      return Bad(file, param, fmt::format("{} holds something other than an integer", key));
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// tensor_map: integers (flat) or arrays of integers (nested, one per tensor dim).
Status JsonTensorMap(const Json& j, const std::string& file, std::string_view param,
                     MindSporeParamLayout* l) {
  auto it = j.find("tensor_map");
  if (it == j.end()) return Bad(file, param, "no tensor_map");
  if (!it->is_array() || it->size() > kMaxDims) return Bad(file, param, "tensor_map is not a list");
  for (const Json& e : *it) {
    std::vector<int32_t> axes;
    const bool nested = e.is_array();
    if (nested && e.empty()) {
      return Bad(file, param,
                 fmt::format("tensor_map entry {} is empty (a dim is split over one axis or more; "
                             "-1 leaves it whole)",
                             l->tensor_map.size()));
    }
    l->nested_tensor_map = l->nested_tensor_map || nested;
    for (const Json& v : nested ? e : Json::array({e})) {
      // (An unsigned number past INT64_MAX would read as a negative int64, 2^64 - 1 as -1.)
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX) ||
          v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX || axes.size() >= kMaxDims) {
        return Bad(file, param, "tensor_map entries must be 32-bit integers");
      }
      axes.push_back(v.get<int32_t>());
    }
    l->tensor_map.push_back(std::move(axes));
  }
  NormalizeTensorMap(l);
  return Status::OK();
}

Result<MindSporeParamLayout> FromJson(const Json& j, const std::string& file,
                                      std::string_view param) {
  if (!j.is_object()) return Bad(file, param, "layout is not an object");
  MindSporeParamLayout l;
  SP_ASSIGN_OR_RETURN(l.dev_matrix, JsonInts(j, "dev_matrix", kMaxDims, file, param));
  if (!j.contains("dev_matrix")) return Bad(file, param, "no dev_matrix");
  SP_RETURN_IF_ERROR(CheckDevMatrix(l.dev_matrix, file, param));
  SP_RETURN_IF_ERROR(JsonTensorMap(j, file, param, &l));
  SP_ASSIGN_OR_RETURN(l.tensor_shape, JsonInts(j, "tensor_shape", kMaxDims, file, param));
  SP_ASSIGN_OR_RETURN(l.param_split_shape,
                      JsonInts(j, "param_split_shape", kMaxItems, file, param));
  SP_ASSIGN_OR_RETURN(l.indices_offset, JsonInts(j, "indices_offset", kMaxItems, file, param));
  SP_ASSIGN_OR_RETURN(l.field, JsonInt<int32_t>(j, "field", 0, file, param));
  SP_ASSIGN_OR_RETURN(l.opt_weight_shard_step,
                      JsonInt<int32_t>(j, "opt_weight_shard_step", 0, file, param));
  SP_ASSIGN_OR_RETURN(l.opt_weight_shard_size,
                      JsonInt<int32_t>(j, "opt_weight_shard_size", 0, file, param));
  return l;
}

Result<MindSporeNodeStrategy> NodeFromJson(const std::string& name, const Json& j,
                                           const std::string& file) {
  if (!j.is_object()) return Bad(file, name, "node strategy is not an object");
  MindSporeNodeStrategy n{name, 0, {}};
  SP_ASSIGN_OR_RETURN(n.stage, JsonInt<uint32_t>(j, "stage", 0, file, name));
  auto it = j.find("parallel_strategy");
  if (it == j.end()) return n;
  if (!it->is_array() || it->size() > kMaxDims) return Bad(file, name, "bad parallel_strategy");
  for (const Json& st : *it) {
    SP_ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                        JsonInts(Json{{"d", st}}, "d", kMaxDims, file, name));
    std::vector<uint32_t> u;
    for (int64_t d : dims) {
      if (d < 0 || d > UINT32_MAX) return Bad(file, name, "parallel_strategy out of range");
      u.push_back(static_cast<uint32_t>(d));
    }
    n.strategy.push_back(std::move(u));
  }
  return n;
}

Result<MindSporeStrategy> ParseJson(std::string_view bytes, const std::string& file) {
  SP_RETURN_IF_ERROR(format::CheckJsonDepth(bytes, kMaxJsonDepth, "strategy file " + file));
  const Json j = Json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(file, "", "not a JSON object");
  MindSporeStrategy s;
  SP_ASSIGN_OR_RETURN(s.current_stage, JsonInt<uint32_t>(j, "current_stage", 0, file, ""));
  for (const bool nodes : {true, false}) {
    const char* key = nodes ? "parallel_strategy_item" : "parallel_layout_item";
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (!it->is_object() || it->size() > kMaxItems) {
      return Bad(file, "", fmt::format("{} is not an object of at most {} items", key, kMaxItems));
    }
    for (const auto& [name, item] : it->items()) {
      if (name.size() > kMaxNameBytes) return Bad(file, "", "name too long");
      if (nodes) {
        SP_ASSIGN_OR_RETURN(MindSporeNodeStrategy n, NodeFromJson(name, item, file));
        s.nodes.push_back(std::move(n));
      } else {
        SP_ASSIGN_OR_RETURN(MindSporeParamLayout l, FromJson(item, file, name));
        s.layouts.emplace_back(name, std::move(l));
      }
    }
  }
  return s;
}

Json LayoutToJson(const MindSporeParamLayout& l) {
  Json j = Json::object();
  j["dev_matrix"] = l.dev_matrix;
  Json map = Json::array();
  for (const auto& axes : l.tensor_map) {
    if (l.nested_tensor_map) {
      map.push_back(axes);
    } else {
      map.push_back(axes.empty() ? -1 : axes[0]);
    }
  }
  j["tensor_map"] = std::move(map);
  if (!l.tensor_shape.empty()) j["tensor_shape"] = l.tensor_shape;
  if (!l.param_split_shape.empty()) j["param_split_shape"] = l.param_split_shape;
  if (!l.indices_offset.empty()) j["indices_offset"] = l.indices_offset;
  j["field"] = l.field;
  j["opt_weight_shard_step"] = l.opt_weight_shard_step;
  j["opt_weight_shard_size"] = l.opt_weight_shard_size;
  return j;
}

std::string EncodeJson(const MindSporeStrategy& s) {
  Json j = Json::object();
  j["current_stage"] = s.current_stage;
  Json nodes = Json::object();
  for (const MindSporeNodeStrategy& n : s.nodes) {
    nodes[n.node_name] = Json{{"stage", n.stage}, {"parallel_strategy", n.strategy}};
  }
  j["parallel_strategy_item"] = std::move(nodes);
  Json layouts = Json::object();
  for (const auto& [name, l] : s.layouts) layouts[name] = LayoutToJson(l);
  j["parallel_layout_item"] = std::move(layouts);
  // Names that are not UTF-8 (protobuf strings are not checked) are written with U+FFFD.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

bool LooksLikeJson(std::string_view bytes) {
  const size_t at = bytes.find_first_not_of(" \t\r\n");
  return at != std::string_view::npos && bytes[at] == '{';
}

}  // namespace

Result<MindSporeStrategy> ParseMindSporeStrategy(std::string_view bytes, const std::string& file) {
  if (bytes.size() > kMaxFileBytes) {
    return Bad(file, "", fmt::format("{} bytes (limit {})", bytes.size(), kMaxFileBytes));
  }
  if (bytes.empty()) return Bad(file, "", "the file is empty");
  return LooksLikeJson(bytes) ? ParseJson(bytes, file) : ParseProto(bytes, file);
}

Result<MindSporeStrategy> ReadMindSporeStrategy(const std::string& path, FileSystem* fs) {
  fs = FileSystemOf({.fs = fs});
  SP_ASSIGN_OR_RETURN(auto file, fs->NewRandomAccessFile(path, {}));
  if (file->size() > kMaxFileBytes) {
    return Bad(path, "", fmt::format("{} bytes (limit {})", file->size(), kMaxFileBytes));
  }
  std::string bytes(file->size(), '\0');
  SP_RETURN_IF_ERROR(file->ReadAt(0, std::as_writable_bytes(std::span(bytes)))
                         .WithContext("strategy file " + path));
  return ParseMindSporeStrategy(bytes, path);
}

std::string EncodeMindSporeStrategy(const MindSporeStrategy& strategy,
                                    MindSporeStrategyFormat format) {
  return format == MindSporeStrategyFormat::kJson ? EncodeJson(strategy) : EncodeProto(strategy);
}

Status CheckMindSporeStrategyEncodable(const MindSporeStrategy& strategy,
                                       MindSporeStrategyFormat format) {
  const bool proto = format == MindSporeStrategyFormat::kProtobuf;
  for (const auto& [name, l] : strategy.layouts) {
    if (const std::string problem = DevMatrixProblem(l.dev_matrix); !problem.empty()) {
      return InvalidArgumentError(fmt::format("strategy layout {:?}: {}", name, problem));
    }
    for (size_t d = 0; d < l.tensor_map.size(); ++d) {
      const size_t axes = l.tensor_map[d].size();
      if (axes == 0 || (!l.nested_tensor_map && axes != 1)) {
        return InvalidArgumentError(fmt::format(
            "strategy layout {:?}: tensor_map entry {} has {} axes ({} map: {})", name, d, axes,
            l.nested_tensor_map ? "a nested" : "a flat",
            l.nested_tensor_map ? "one axis or more, -1 leaves the dim whole" : "exactly one"));
      }
    }
    if (proto && l.nested_tensor_map && l.tensor_map.size() == 1 && l.tensor_map[0].size() > 1) {
      return InvalidArgumentError(
          fmt::format("strategy layout {:?}: a tensor of one dim split over {} axes has no "
                      "protobuf form (MindSpore reads one TensorMap as the flat map of as many "
                      "dims); write it as JSON",
                      name, l.tensor_map[0].size()));
    }
  }
  return Status::OK();
}

Status WriteMindSporeStrategy(const MindSporeStrategy& strategy, const std::string& path,
                              MindSporeStrategyFormat format, const IoOptions& io) {
  const std::string context = "write strategy file " + path;
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, context));
  SP_RETURN_IF_ERROR(CheckMindSporeStrategyEncodable(strategy, format).WithContext(context));
  interop::ByteLayout layout;
  layout.AddOwned(EncodeMindSporeStrategy(strategy, format));
  return interop::CommitFile(io, path, layout, {.overwrite = true}, context,
                             std::chrono::steady_clock::now());
}

}  // namespace savepoint
