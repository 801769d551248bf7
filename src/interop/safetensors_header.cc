// Decoder and encoder of safetensors headers. The decoder treats its input as hostile: it caps the
// header length and the JSON depth before parsing, rejects duplicate keys (which a plain JSON
// parser would silently collapse), type-checks every field, computes every size with checked
// arithmetic, and requires the tensors' byte ranges to tile the data buffer exactly, up to the end
// of the file. nlohmann::json exceptions are caught here and reported as Corruption.
#include "interop/safetensors_header.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>

#include "core/utf8.h"
#include "format/endian.h"
#include "format/manifest.h"
#include "interop/safetensors_crc.h"
#include "savepoint/filesystem.h"

namespace savepoint::interop {
namespace {

constexpr std::string_view kMetadataField = "__metadata__";

// safetensors dtype codes that savepoint has no type for (newer sub-byte and scale formats).
constexpr std::array<std::string_view, 6> kForeignDTypes = {"F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0",
                                                            "F6_E2M3",     "F6_E3M2",     "F4"};

Status Bad(std::string_view path, std::string_view what) {
  return CorruptionError(fmt::format("safetensors file {}: {}", path, what));
}

bool IsReservedKey(std::string_view key) {
  return key == kSafetensorsMetadataKey || key == kSafetensorsValuesKey;
}

// Parses JSON text that must not nest deeper than kMaxHeaderJsonDepth. With `unique_keys`, an
// object with a repeated key is rejected (the parser would keep only the last one).
Result<Json> ParseJson(std::string_view text, std::string_view path, std::string_view what) {
  SP_RETURN_IF_ERROR(format::CheckJsonDepth(text, kMaxHeaderJsonDepth,
                                            fmt::format("safetensors file {}: {}", path, what)));
  std::vector<std::set<std::string>> keys;  // one key set per open object
  std::string duplicate;
  auto track = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), track);
  } catch (const Json::exception& e) {
    return Bad(path, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
  if (!duplicate.empty()) return Bad(path, fmt::format("{} repeats the key {:?}", what, duplicate));
  return j;
}

Result<DType> ParseDType(const Json& j, std::string_view path, std::string_view name) {
  if (!j.is_string()) return Bad(path, fmt::format("tensor {:?}: dtype is not a string", name));
  const std::string& code = j.get_ref<const std::string&>();
  std::optional<DType> d = DTypeFromName(code);
  if (d && IsSafetensorsDType(*d)) return *d;
  if (std::find(kForeignDTypes.begin(), kForeignDTypes.end(), code) != kForeignDTypes.end()) {
    return UnimplementedError(fmt::format(
        "safetensors file {}: tensor {:?} has dtype {}, which savepoint does not support", path,
        name, code));
  }
  return Bad(path, fmt::format("tensor {:?} has unknown dtype {:?}", name, code.substr(0, 32)));
}

Result<Shape> ParseShape(const Json& j, std::string_view path, std::string_view name) {
  if (!j.is_array() || j.size() > kMaxRank) {
    return Bad(path, fmt::format("tensor {:?}: shape is not an array of at most {} sizes", name,
                                 kMaxRank));
  }
  Shape shape;
  for (const Json& d : j) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return Bad(path, fmt::format("tensor {:?}: shape {} has a bad dimension", name, j.dump()));
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// One tensor entry: {"dtype", "shape", "data_offsets"} (other fields are ignored, as the
// reference reader does), with end - begin == elements x element size.
Result<SafetensorsTensorInfo> ParseTensor(const std::string& name, const Json& j,
                                          std::string_view path) {
  Status name_ok = ValidateName(name);
  if (!name_ok.ok()) return Bad(path, fmt::format("tensor name: {}", name_ok.message()));
  if (!j.is_object()) return Bad(path, fmt::format("tensor {:?} is not a JSON object", name));
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(field)) return Bad(path, fmt::format("tensor {:?} lacks {:?}", name, field));
  }
  SafetensorsTensorInfo t;
  t.name = name;
  SP_ASSIGN_OR_RETURN(t.dtype, ParseDType(j["dtype"], path, name));
  SP_ASSIGN_OR_RETURN(t.shape, ParseShape(j["shape"], path, name));
  const Json& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned() || off[0].get<uint64_t>() > off[1].get<uint64_t>()) {
    return Bad(path, fmt::format("tensor {:?}: data_offsets {} is not [begin, end] with begin <= "
                                 "end",
                                 name, off.dump()));
  }
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  Result<uint64_t> nbytes = NumBytes(t.dtype, t.shape);
  if (!nbytes.ok())
    return Bad(path, fmt::format("tensor {:?}: {}", name, nbytes.status().message()));
  if (*nbytes != t.end - t.begin) {
    return Bad(
        path, fmt::format("tensor {:?}: {} {} needs {} bytes but data_offsets [{}, {}] span {}",
                          name, DTypeName(t.dtype), ShapeToString(t.shape), *nbytes, t.begin, t.end,
                          t.end - t.begin));
  }
  return t;
}

// The byte ranges must cover [0, buffer_bytes) exactly: sorted by offset, each tensor starts where
// the previous one ends (empty tensors may share an offset).
Status CheckTiling(std::vector<SafetensorsTensorInfo> tensors, uint64_t buffer_bytes,
                   std::string_view path) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t at = 0;
  const std::string* prev = nullptr;
  for (const SafetensorsTensorInfo& t : tensors) {
    if (t.begin < at) {
      return Bad(path, fmt::format("tensors {:?} and {:?} overlap (data_offsets [{}, {}] start "
                                   "before {})",
                                   *prev, t.name, t.begin, t.end, at));
    }
    if (t.begin > at) {
      return Bad(path, fmt::format("hole of {} bytes in the data buffer before tensor {:?} (at {})",
                                   t.begin - at, t.name, at));
    }
    at = t.end;
    prev = &t.name;
  }
  if (at != buffer_bytes) {
    return Bad(path,
               fmt::format("the tensors cover {} bytes of data but the file holds {} after "
                           "the header ({})",
                           at, buffer_bytes, at > buffer_bytes ? "truncated" : "trailing bytes"));
  }
  return Status::OK();
}

Result<std::map<std::string, std::string>> ParseRawMetadata(const Json& j, std::string_view path) {
  std::map<std::string, std::string> raw;
  if (j.is_null()) return raw;
  if (!j.is_object()) return Bad(path, "__metadata__ is not a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) return Bad(path, fmt::format("__metadata__[{:?}] is not a string", k));
    raw.emplace(k, v.get<std::string>());
  }
  return raw;
}

// Metadata members as they go into `__metadata__`: strings 1:1, the rest as one JSON object.
void SplitMetadata(const Json& md, std::map<std::string, std::string>* raw, Json* rest) {
  if (md.is_null()) return;
  if (!md.is_object()) {
    *rest = md;
    return;
  }
  for (const auto& [k, v] : md.items()) {
    if (v.is_string() && !IsReservedKey(k)) {
      (*raw)[k] = v.get<std::string>();
    } else {
      (*rest)[k] = v;
    }
  }
  if (md.empty()) *rest = Json::object();  // keeps {} apart from null
}

}  // namespace

Result<uint64_t> DecodeHeaderLength(std::string_view prefix, uint64_t file_bytes,
                                    std::string_view path) {
  if (prefix.size() < kLengthPrefixBytes || file_bytes < kLengthPrefixBytes) {
    return Bad(path, fmt::format("{} bytes is too short for the 8-byte header length", file_bytes));
  }
  uint64_t n = format::GetU64(prefix, 0);
  if (n > kMaxSafetensorsHeaderBytes) {
    return Bad(path, fmt::format("header length {} exceeds the limit of {} bytes", n,
                                 kMaxSafetensorsHeaderBytes));
  }
  if (n > file_bytes - kLengthPrefixBytes) {
    return Bad(path, fmt::format("header length {} runs past the end of the file ({} bytes)", n,
                                 file_bytes));
  }
  return n;
}

Result<SafetensorsInfo> DecodeHeader(std::string_view json, uint64_t file_bytes,
                                     std::string_view path) {
  if (!IsValidUtf8(json)) return Bad(path, "header is not valid UTF-8");
  SP_ASSIGN_OR_RETURN(Json root, ParseJson(json, path, "header"));
  if (!root.is_object()) return Bad(path, "header is not a JSON object");
  SafetensorsInfo info;
  info.path = std::string(path);
  info.file_bytes = file_bytes;
  info.header_bytes = json.size();
  info.data_offset = kLengthPrefixBytes + json.size();
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataField) {
      SP_ASSIGN_OR_RETURN(info.raw_metadata, ParseRawMetadata(entry, path));
      continue;
    }
    SP_ASSIGN_OR_RETURN(SafetensorsTensorInfo t, ParseTensor(name, entry, path));
    info.tensors.push_back(std::move(t));
  }
  SP_RETURN_IF_ERROR(CheckTiling(info.tensors, file_bytes - info.data_offset, path));
  SP_RETURN_IF_ERROR(DecodeMetadata(info.raw_metadata, path, &info.values));
  auto format = info.raw_metadata.find(kFormatKey);
  info.mindspore_format = format != info.raw_metadata.end() && format->second == kMindSporeFormat;
  auto crc = info.raw_metadata.find(kCrcNumKey);
  info.has_crc_num = crc != info.raw_metadata.end();
  if (info.has_crc_num) {
    Result<uint32_t> stored = ParseCrcNum(crc->second, path);
    if (stored.ok()) info.crc_num = *stored;
  }
  for (const auto& [name, e] : info.values.entries()) {
    if (std::any_of(info.tensors.begin(), info.tensors.end(),
                    [&](const auto& t) { return t.name == name; })) {
      return Bad(path, fmt::format("{:?} is both a tensor and a value", name));
    }
  }
  return info;
}

Result<std::map<std::string, std::string>> EncodeMetadata(const State& state) {
  std::map<std::string, std::string> raw;
  Json rest;
  SplitMetadata(state.metadata(), &raw, &rest);
  Json values = Json::array();
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) values.push_back(format::ValueToJson(name, e.value()));
  }
  try {  // dump() throws on strings that are not UTF-8
    if (!rest.is_null()) raw[kSafetensorsMetadataKey] = rest.dump();
    if (!values.empty()) raw[kSafetensorsValuesKey] = values.dump();
  } catch (const Json::exception& e) {
    return InvalidArgumentError(fmt::format("safetensors: cannot encode metadata: {}", e.what()));
  }
  for (const auto& [k, v] : raw) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      return InvalidArgumentError(
          fmt::format("safetensors: metadata entry {:?} is not valid UTF-8",
                      Json(k).dump(-1, ' ', false, Json::error_handler_t::replace)));
    }
  }
  return raw;
}

Status DecodeMetadata(const std::map<std::string, std::string>& raw, std::string_view path,
                      State* out) {
  Json md;
  for (const auto& [k, v] : raw) {
    if (!IsReservedKey(k)) md[k] = v;
  }
  auto it = raw.find(kSafetensorsMetadataKey);
  if (it != raw.end()) {
    SP_ASSIGN_OR_RETURN(Json rest, ParseJson(it->second, path, kSafetensorsMetadataKey));
    if (rest.is_object()) {
      if (md.is_null()) md = Json::object();
      for (const auto& [k, v] : rest.items()) md[k] = v;
    } else if (md.is_null()) {
      md = std::move(rest);
    } else {
      return Bad(path, fmt::format("{} is not a JSON object but other metadata keys exist",
                                   kSafetensorsMetadataKey));
    }
  }
  out->metadata() = std::move(md);
  it = raw.find(kSafetensorsValuesKey);
  if (it == raw.end()) return Status::OK();
  SP_ASSIGN_OR_RETURN(Json values, ParseJson(it->second, path, kSafetensorsValuesKey));
  return format::ValuesFromJson(
      values, fmt::format("safetensors file {}: {}", path, kSafetensorsValuesKey), out);
}

namespace {

// Where the reference writer (safetensors 0.8) puts a dtype: it sorts tensors by its Dtype enum,
// last first, so larger elements come first and, within a size, U64 I64 F64 C64, F32 U32 I32, BF16
// F16 U16 I16, F8_E4M3 F8_E5M2 I8 U8 BOOL.
int ReferenceRank(DType d) {
  static constexpr DType kOrder[] = {DType::kU64,    DType::kI64, DType::kF64, DType::kC64,
                                     DType::kF32,    DType::kU32, DType::kI32, DType::kBF16,
                                     DType::kF16,    DType::kU16, DType::kI16, DType::kF8E4M3,
                                     DType::kF8E5M2, DType::kI8,  DType::kU8,  DType::kBool};
  const auto* it = std::find(std::begin(kOrder), std::end(kOrder), d);
  return static_cast<int>(it - std::begin(kOrder));
}

// The tensors of `state` in file order: the reference writer's (ReferenceRank, then by name).
// Every size is a multiple of its element size, so each tensor starts at a multiple of its
// element size (the data buffer itself starts 8-byte aligned).
Result<std::vector<std::pair<const std::string*, const TensorView*>>> FileOrder(
    const State& state, std::string_view path) {
  std::vector<std::pair<const std::string*, const TensorView*>> order;
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    const TensorView& v = e.tensor();
    if (!IsSafetensorsDType(v.dtype())) {
      return InvalidArgumentError(fmt::format(
          "safetensors file {}: tensor {:?} has dtype {}, which safetensors cannot store", path,
          name, DTypeName(v.dtype())));
    }
    Status ok = v.Validate();
    if (!ok.ok()) {
      return ok.WithContext(fmt::format("safetensors file {}: tensor {:?}", path, name));
    }
    order.emplace_back(&name, &v);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return ReferenceRank(a.second->dtype()) < ReferenceRank(b.second->dtype());
  });
  return order;
}

// What MindSpore 2.10's load_checkpoint(format="safetensors") refuses: a dtype it has no numpy
// type for, and a `__metadata__` key named like a tensor (it reads such an entry as the tensor's
// MindSpore type, of which it knows only "Int4").
Status CheckMindSporeLoads(const std::vector<Layout::Item>& items,
                           const std::map<std::string, std::string>& raw, std::string_view path) {
  for (const Layout::Item& item : items) {
    const DType d = item.view->dtype();
    if (d == DType::kF8E4M3 || d == DType::kF8E5M2 || d == DType::kC64) {
      return InvalidArgumentError(
          fmt::format("safetensors file {}: tensor {:?} has dtype {}, which MindSpore cannot load "
                      "(mindspore_format)",
                      path, *item.name, DTypeName(d)));
    }
    auto it = raw.find(*item.name);
    if (it != raw.end() && it->second != "Int4") {
      return InvalidArgumentError(
          fmt::format("safetensors file {}: metadata key {:?} names a tensor, which MindSpore "
                      "would read as that tensor's type (mindspore_format; only \"Int4\" is one)",
                      path, *item.name));
    }
  }
  return Status::OK();
}

}  // namespace

Result<Layout> PlanLayout(const State& state, std::string_view path,
                          const SafetensorsSaveOptions& options) {
  Layout layout;
  uint64_t at = 0;
  SP_ASSIGN_OR_RETURN(auto order, FileOrder(state, path));
  for (const auto& [name, v] : order) {
    layout.items.push_back({name, v, at});
    at += v->nbytes();
  }
  SP_ASSIGN_OR_RETURN(auto raw, EncodeMetadata(state));
  raw.erase(kCrcNumKey);  // computed or absent, never copied: it would not match other data
  if (options.mindspore_format) {
    raw[kFormatKey] = kMindSporeFormat;
    SP_RETURN_IF_ERROR(CheckMindSporeLoads(layout.items, raw, path));
  }
  if (options.crc_check) raw[kCrcNumKey] = kCrcNumPlaceholder;
  // As the reference writer: `__metadata__` first, then the tensors in file order (readers such
  // as MindSpore's require the entries in offset order), each as {dtype, shape, data_offsets}.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!raw.empty()) header[kMetadataField] = raw;
  for (const Layout::Item& item : layout.items) {
    const TensorView& v = *item.view;
    header[*item.name] = {{"dtype", DTypeName(v.dtype())},
                          {"shape", v.shape()},
                          {"data_offsets", {item.offset, item.offset + v.nbytes()}}};
  }
  std::string json = header.dump();  // names are valid UTF-8 (ValidateName), metadata checked
  json.resize((json.size() + 7) / 8 * 8, ' ');
  if (at % 8 == 0) {  // a whole number of blocks, with the data still 8-aligned (see the header)
    const uint64_t tail = (kLengthPrefixBytes + json.size() + at) % kDirectIOAlignment;
    if (tail != 0) json.append(kDirectIOAlignment - tail, ' ');
  }
  if (json.size() > kMaxSafetensorsHeaderBytes) {
    return InvalidArgumentError(
        fmt::format("safetensors file {}: header of {} bytes exceeds the limit of {} bytes", path,
                    json.size(), kMaxSafetensorsHeaderBytes));
  }
  layout.header = std::string(kLengthPrefixBytes, '\0');
  format::PutU64(&layout.header, 0, json.size());
  layout.header += json;
  for (Layout::Item& item : layout.items) item.offset += layout.header.size();
  layout.file_bytes = layout.header.size() + at;
  return layout;
}

}  // namespace savepoint::interop

namespace savepoint {

bool IsSafetensorsDType(DType dtype) { return dtype != DType::kC128; }

}  // namespace savepoint
