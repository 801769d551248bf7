// MindSpore `.ckpt` entries <-> a State (interop/ckpt_entries.h).
#include "interop/ckpt_entries.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "core/utf8.h"
#include "engine/select.h"
#include "format/manifest.h"
#include "savepoint/mindspore.h"

namespace savepoint::interop::ckpt {
namespace {

struct TypeName {
  std::string_view ms;     // MindSpore's name in a TensorProto
  std::string_view numpy;  // numpy's name (map tensors)
  DType dtype;
};
constexpr std::array<TypeName, 13> kTypes = {{
    {"Int8", "int8", DType::kI8},
    {"UInt8", "uint8", DType::kU8},
    {"Int16", "int16", DType::kI16},
    {"UInt16", "uint16", DType::kU16},
    {"Int32", "int32", DType::kI32},
    {"UInt32", "uint32", DType::kU32},
    {"Int64", "int64", DType::kI64},
    {"UInt64", "uint64", DType::kU64},
    {"Float16", "float16", DType::kF16},
    {"Float32", "float32", DType::kF32},
    {"Float64", "float64", DType::kF64},
    {"Bool", "bool", DType::kBool},
    {"BFloat16", "bfloat16", DType::kBF16},
}};
constexpr std::string_view kInt4 = "Int4";
constexpr std::string_view kString = "str";
constexpr std::array<std::string_view, 3> kMapParts = {"keys", "values", "status"};

std::optional<DType> DTypeOf(std::string_view type, bool map) {
  if (type == kInt4 && !map) return DType::kI8;
  for (const TypeName& t : kTypes) {
    if (type == (map ? t.numpy : t.ms)) return t.dtype;
  }
  return std::nullopt;
}

std::optional<std::string_view> TypeOf(DType dtype, bool map) {
  for (const TypeName& t : kTypes) {
    if (t.dtype == dtype) return map ? t.numpy : t.ms;
  }
  return std::nullopt;
}

Status Bad(const std::string& path, const std::string& entry, std::string_view what) {
  return CorruptionError(fmt::format("MindSpore checkpoint {}: entry {:?}: {}", path, entry, what));
}

// The shape of a tensor entry stored as `dims` with `bytes` content bytes of `dtype` elements.
// Scalars: dims [] or (older files) [0] with one element's bytes. The dims must make a valid
// savepoint shape: none negative, and element and byte counts (products taken left to right, as
// NumBytes does) within int64, so a zero-element entry such as [2^63-1, 0] is one, while
// [2^63-1, 2, 0] is Corruption even though it holds no bytes.
Result<Shape> ShapeOf(const std::vector<int64_t>& dims, uint64_t bytes, DType dtype,
                      const std::string& path, const std::string& name) {
  const uint64_t elem = DTypeSize(dtype);
  if (dims.size() == 1 && dims[0] == 0 && bytes == elem) return Shape{};
  Shape shape(dims.begin(), dims.end());
  Result<uint64_t> need = NumBytes(dtype, shape);
  if (!need.ok()) {
    return Bad(path, name,
               fmt::format("dims are negative or overflow ({})", need.status().message()));
  }
  if (*need != bytes) {
    return Bad(path, name,
               fmt::format("shape {} of {}-byte elements needs {} bytes, the file "
                           "holds {}",
                           ShapeToString(shape), elem, *need, bytes));
  }
  return shape;
}

uint64_t ContentBytes(const Entry& e, size_t part) {
  uint64_t n = 0;
  for (const ValueRecord* v : e.values) n += v->tensors[part].content_bytes;
  return n;
}

void AddReads(const Entry& e, size_t part, std::byte* dst, const std::string* name,
              LoadPlan* plan) {
  for (const ValueRecord* v : e.values) {
    const TensorRecord& t = v->tensors[part];
    if (t.content_bytes > 0) plan->reads.push_back({dst, t.content_offset, t.content_bytes, name});
    dst += t.content_bytes;
  }
}

}  // namespace

Result<std::pair<DType, Shape>> TensorEntryInfo(const Entry& e, const std::string& path) {
  const TensorRecord& first = e.values[0]->tensors[0];
  std::optional<DType> dtype = e.map ? std::nullopt : DTypeOf(first.type, false);
  if (!dtype) {
    return InvalidArgumentError(fmt::format(
        "MindSpore checkpoint {}: entry {:?} has type {:?}, which savepoint does not know", path,
        e.name, e.map ? "map" : first.type));
  }
  SP_ASSIGN_OR_RETURN(Shape shape, ShapeOf(first.dims, ContentBytes(e, 0), *dtype, path, e.name));
  return std::pair{*dtype, std::move(shape)};
}

namespace {

// A tensor entry (possibly in pieces).
Status PlanTensor(const Entry& e, const std::string& path, LoadPlan* plan, Json* int4) {
  const TensorRecord& first = e.values[0]->tensors[0];
  SP_ASSIGN_OR_RETURN(auto info, TensorEntryInfo(e, path));
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info.first, info.second));
  if (first.type == kInt4) int4->push_back(e.name);
  plan->names.push_back(e.name);
  AddReads(e, 0, t.data(), &plan->names.back(), plan);
  plan->tensor_bytes += t.nbytes();
  return plan->state.Put(e.name, std::move(t));
}

// A hash map: three tensors, each the concatenation of its slices along dimension 0.
Status PlanMap(const Entry& e, const std::string& path, LoadPlan* plan) {
  for (size_t part = 0; part < kMapParts.size(); ++part) {
    const std::string name = fmt::format("{}.{}", e.name, kMapParts[part]);
    const TensorRecord& first = e.values[0]->tensors[part];
    std::optional<DType> dtype = DTypeOf(first.type, true);
    if (!dtype) return Bad(path, name, fmt::format("unknown map tensor type {:?}", first.type));
    Shape shape = first.dims;
    if (shape.empty()) return Bad(path, name, "a map tensor without dims");
    shape[0] = 0;
    for (const ValueRecord* v : e.values) {
      const TensorRecord& t = v->tensors[part];
      SP_ASSIGN_OR_RETURN(Shape s, ShapeOf(t.dims, t.content_bytes, *dtype, path, name));
      if (s.empty() || !std::equal(s.begin() + 1, s.end(), shape.begin() + 1, shape.end())) {
        return Bad(path, name, "map slices of different shapes");
      }
      if (__builtin_add_overflow(shape[0], s[0], &shape[0])) {
        return Bad(path, name, "the map slices' first dimensions add up past 2^63");
      }
    }
    // Slices of valid shapes may add up to an invalid one: [2^61, 2, 0] twice is [2^62, 2, 0].
    Result<uint64_t> whole = NumBytes(*dtype, shape);
    if (!whole.ok()) {
      return Bad(
          path, name,
          fmt::format("the map slices add up to an invalid shape ({})", whole.status().message()));
    }
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(*dtype, shape));
    plan->names.push_back(name);
    AddReads(e, part, t.data(), &plan->names.back(), plan);
    plan->tensor_bytes += t.nbytes();
    SP_RETURN_IF_ERROR(plan->state.Put(name, std::move(t)));
  }
  return Status::OK();
}

// UCS-4 (little-endian code points) to UTF-8.
Result<std::string> FromUcs4(std::span<const std::byte> bytes, const std::string& path,
                             const std::string& name) {
  if (bytes.size() % 4 != 0) return Bad(path, name, "a string whose size is not a multiple of 4");
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 4) {
    uint32_t c = 0;
    std::memcpy(&c, bytes.data() + i, 4);
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
      return Bad(path, name, fmt::format("invalid code point U+{:X} in a string", c));
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// UTF-8 (valid) to UCS-4.
std::string ToUcs4(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t c = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
    for (int k = 1; k < len; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += len;
    char le[4];
    std::memcpy(le, &c, 4);
    out.append(le, 4);
  }
  return out;
}

std::vector<std::string> MetadataList(const Json& meta, const char* key) {
  std::vector<std::string> out;
  if (!meta.is_object() || !meta.contains(kMindSporeMetadataKey)) return out;
  const Json& ms = meta[kMindSporeMetadataKey];
  if (!ms.is_object() || !ms.contains(key) || !ms[key].is_array()) return out;
  for (const Json& j : ms[key]) {
    if (j.is_string()) out.push_back(j.get<std::string>());
  }
  return out;
}

// Appends one value (with its pieces) to `layout`.
void AddValue(const std::string& name, bool map, const std::vector<TensorRecord>& heads,
              const std::vector<std::span<const std::byte>>& contents, bool owned,
              ByteLayout* layout) {
  std::vector<std::string> pre = EncodeValue(name, map, heads);
  for (size_t i = 0; i < heads.size(); ++i) {
    layout->AddOwned(std::move(pre[i]));
    if (owned) {
      layout->AddOwned(
          std::string(reinterpret_cast<const char*>(contents[i].data()), contents[i].size()));
    } else {
      layout->AddBorrowed(contents[i]);
    }
  }
}

// A tensor; one over kSplitBytes is written as consecutive pieces of kSplitBytes (the last
// shorter), each repeating the full dims, as MindSpore 2.10 writes a Tensor's bytes.
void AddTensor(const std::string& name, std::string_view type, const TensorView& v,
               ByteLayout* layout) {
  const std::vector<int64_t> dims(v.shape().begin(), v.shape().end());
  const uint64_t n = v.nbytes();
  const std::byte* at = static_cast<const std::byte*>(v.data());
  for (uint64_t done = 0; done == 0 || done < n;) {
    const uint64_t bytes = std::min(kSplitBytes, n - done);
    TensorRecord head{std::string(type), dims, 0, bytes, 0};
    AddValue(name, false, {head}, {std::span(at + done, bytes)}, false, layout);
    done += bytes;
    if (bytes == 0) break;  // an empty tensor: one empty piece
  }
}

Status AddScalarValue(const std::string& name, const Value& value, ByteLayout* layout) {
  std::string content, type;
  std::vector<int64_t> dims;
  if (value.is_int()) {
    const int64_t x = value.as_int();
    content.assign(reinterpret_cast<const char*>(&x), 8);
    type = "Int64";
  } else if (value.kind() == ValueKind::kFloat) {
    const double x = value.as_float();
    content.assign(reinterpret_cast<const char*>(&x), 8);
    type = "Float64";
  } else if (value.kind() == ValueKind::kBool) {
    content.assign(1, value.as_bool() ? 1 : 0);
    type = "Bool";
  } else if (value.kind() == ValueKind::kString) {
    content = ToUcs4(value.as_string());
    type = std::string(kString);
    dims = {0};
  } else {
    // bytes and JSON values travel in the savepoint.metadata entry (PlanSave)
    return InternalError(
        fmt::format("value {:?} of kind {} has no .ckpt type", name, ValueKindName(value.kind())));
  }
  TensorRecord head{type, dims, 0, content.size(), 0};
  AddValue(name, false, {head}, {std::as_bytes(std::span(content))}, true, layout);
  return Status::OK();
}

Status AddMap(const State& state, const std::string& name, ByteLayout* layout,
              std::set<std::string>* done) {
  std::vector<TensorRecord> heads;
  std::vector<std::span<const std::byte>> contents;
  for (std::string_view part : kMapParts) {
    const std::string part_name = fmt::format("{}.{}", name, part);
    const TensorView* v = state.FindTensor(part_name);
    if (v == nullptr) {
      return InvalidArgumentError(
          fmt::format("hash map {:?} (listed in the metadata under {:?}) has no tensor {:?}", name,
                      kMindSporeMetadataKey, part_name));
    }
    std::optional<std::string_view> type = TypeOf(v->dtype(), true);
    if (!type) {
      return InvalidArgumentError(
          fmt::format("tensor {:?}: MindSpore has no dtype {}", part_name, DTypeName(v->dtype())));
    }
    heads.push_back(
        {std::string(*type), {v->shape().begin(), v->shape().end()}, 0, v->nbytes(), 0});
    contents.emplace_back(static_cast<const std::byte*>(v->data()), v->nbytes());
    done->insert(part_name);
  }
  AddValue(name, true, heads, contents, false, layout);
  return Status::OK();
}

// The text of the string entry `e`.
Result<std::string> ReadText(const RandomAccessFile& file, const Entry& e,
                             const std::string& path) {
  if (ContentBytes(e, 0) > kMaxStringBytes) {
    return Bad(path, e.name, fmt::format("a string of over {} bytes", kMaxStringBytes));
  }
  std::string bytes(ContentBytes(e, 0), '\0');
  uint64_t at = 0;
  for (const ValueRecord* v : e.values) {
    const TensorRecord& t = v->tensors[0];
    SP_RETURN_IF_ERROR(file.ReadAt(
        t.content_offset, std::as_writable_bytes(std::span(bytes.data() + at, t.content_bytes))));
    at += t.content_bytes;
  }
  return FromUcs4(std::as_bytes(std::span(bytes)), path, e.name);
}

bool IsString(const Entry& e) { return !e.map && e.values[0]->tensors[0].type == kString; }

}  // namespace

// The savepoint.metadata entry, when the file has one: {"metadata": <the State's metadata>,
// "values": [bytes and JSON values as the manifest writes values]}, either member absent when
// empty. Decoded into `out` (metadata and values).
Status ReadSavepointEntry(const RandomAccessFile& file, const std::vector<Entry>& entries,
                          const std::string& path, State* out) {
  auto it = std::find_if(entries.begin(), entries.end(), [](const Entry& e) {
    return IsString(e) && e.name == kMindSporeSavepointMetadataEntry;
  });
  if (it == entries.end()) return Status::OK();
  SP_ASSIGN_OR_RETURN(std::string text, ReadText(file, *it, path));
  // Capped as the manifest's JSON is: copying, comparing or writing a JSON tree recurses.
  if (!format::CheckJsonDepth(text, format::kMaxJsonDepth, path).ok()) {
    return Bad(path, kMindSporeSavepointMetadataEntry,
               fmt::format("JSON nested deeper than {} levels", format::kMaxJsonDepth));
  }
  Json entry = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (entry.is_discarded() || !entry.is_object()) {
    return Bad(path, kMindSporeSavepointMetadataEntry, "not a JSON object");
  }
  if (entry.contains("metadata")) out->metadata() = std::move(entry["metadata"]);
  // The reader's own key (which entries are Int4, which are hash maps) describes the file's
  // entries as read, never what a file says of itself: PlanLoad sets it from the entries.
  if (out->metadata().is_object()) out->metadata().erase(kMindSporeMetadataKey);
  if (!entry.contains("values")) return Status::OK();
  return format::ValuesFromJson(
      entry["values"],
      fmt::format("MindSpore checkpoint {}: {}", path, kMindSporeSavepointMetadataEntry), out);
}

Result<std::vector<Entry>> GroupEntries(const Scan& scan, const std::string& path) {
  std::vector<Entry> out;
  std::set<std::string_view> seen;
  for (const ValueRecord& v : scan.values) {
    if (!out.empty() && out.back().name == v.tag) {
      const ValueRecord& first = *out.back().values[0];
      bool same = first.map == v.map && first.tensors.size() == v.tensors.size();
      for (size_t i = 0; same && i < v.tensors.size(); ++i) {
        same = first.tensors[i].type == v.tensors[i].type &&
               (v.map || first.tensors[i].dims == v.tensors[i].dims);
      }
      if (!same)
        return Bad(path, v.tag, fmt::format("piece at byte {} differs from the first", v.offset));
      out.back().values.push_back(&v);
      continue;
    }
    if (!seen.insert(v.tag).second) {
      return Bad(path, v.tag, fmt::format("appears again at byte {}", v.offset));
    }
    if (v.map && v.tensors.size() != kMapParts.size()) {
      return Bad(path, v.tag,
                 fmt::format("a hash map of {} tensors (keys, values, status expected)",
                             v.tensors.size()));
    }
    out.push_back({v.tag, v.map, {&v}});
  }
  return out;
}

Result<LoadPlan> PlanLoad(const Scan& scan, const RandomAccessFile& file,
                          const std::vector<std::string>& names, const std::string& path) {
  SP_ASSIGN_OR_RETURN(std::vector<Entry> entries, GroupEntries(scan, path));
  State extra;  // the savepoint.metadata entry's metadata and values
  SP_RETURN_IF_ERROR(ReadSavepointEntry(file, entries, path, &extra));
  std::vector<std::string> tensors;
  State values;  // names of the values (string entries and the extra values), for the selection
  for (const Entry& e : entries) {
    if (e.map) {
      for (std::string_view part : kMapParts) tensors.push_back(fmt::format("{}.{}", e.name, part));
    } else if (IsString(e)) {
      if (e.name != kMindSporeSavepointMetadataEntry)
        SP_RETURN_IF_ERROR(values.PutValue(e.name, ""));
    } else {
      tensors.push_back(e.name);
    }
  }
  for (const auto& [name, e] : extra.entries()) SP_RETURN_IF_ERROR(values.PutValue(name, ""));
  SP_ASSIGN_OR_RETURN(
      std::vector<bool> keep,
      engine::SelectTensors(names, tensors, values, fmt::format("MindSpore checkpoint {}", path)));
  LoadPlan plan;
  SP_RETURN_IF_ERROR(engine::CopyValues(extra, &plan.state, names));  // and the metadata
  Json int4 = Json::array(), maps = Json::array();
  size_t k = 0;
  for (const Entry& e : entries) {
    if (e.map) {
      const bool any = keep[k] || keep[k + 1] || keep[k + 2];
      k += 3;
      if (!any) continue;
      SP_RETURN_IF_ERROR(PlanMap(e, path, &plan));
      maps.push_back(e.name);
    } else if (IsString(e)) {
      if (e.name != kMindSporeSavepointMetadataEntry && engine::Selected(names, e.name)) {
        plan.strings.push_back(e);
      }
    } else if (keep[k++]) {
      SP_RETURN_IF_ERROR(PlanTensor(e, path, &plan, &int4));
    }
  }
  if (!int4.empty() || !maps.empty()) {
    Json& ms = plan.state.metadata()[kMindSporeMetadataKey];
    if (!int4.empty()) ms["int4"] = int4;
    if (!maps.empty()) ms["map_tensors"] = maps;
  }
  return plan;
}

Status FinishLoad(const RandomAccessFile& file, const std::string& path, LoadPlan* plan) {
  for (const Entry& e : plan->strings) {
    SP_ASSIGN_OR_RETURN(std::string text, ReadText(file, e, path));
    SP_RETURN_IF_ERROR(plan->state.PutValue(e.name, std::move(text)));
  }
  return Status::OK();
}

Status PlanSave(const State& state, ByteLayout* layout) {
  const std::vector<std::string> int4 = MetadataList(state.metadata(), "int4");
  Json extra = Json::array();  // values a .ckpt type cannot hold
  std::set<std::string> done;
  for (const std::string& name : MetadataList(state.metadata(), "map_tensors")) {
    SP_RETURN_IF_ERROR(AddMap(state, name, layout, &done));
  }
  for (const auto& [name, e] : state.entries()) {
    if (done.count(name) > 0) continue;
    if (!e.is_tensor()) {
      if (name == kMindSporeSavepointMetadataEntry) {
        return InvalidArgumentError(fmt::format("value {:?}: the name is reserved", name));
      }
      const ValueKind kind = e.value().kind();
      if (kind == ValueKind::kBytes || kind == ValueKind::kJson) {
        extra.push_back(format::ValueToJson(name, e.value()));
      } else {
        SP_RETURN_IF_ERROR(AddScalarValue(name, e.value(), layout));
      }
      continue;
    }
    const TensorView& v = e.tensor();
    const bool is_int4 = std::find(int4.begin(), int4.end(), name) != int4.end();
    if (is_int4 && v.dtype() != DType::kI8) {
      return InvalidArgumentError(
          fmt::format("tensor {:?} is listed as Int4 but is {}", name, DTypeName(v.dtype())));
    }
    std::optional<std::string_view> type = is_int4 ? kInt4 : TypeOf(v.dtype(), false);
    if (!type) {
      return InvalidArgumentError(
          fmt::format("tensor {:?}: MindSpore has no dtype {}", name, DTypeName(v.dtype())));
    }
    AddTensor(name, *type, v, layout);
  }
  Json meta = state.metadata();
  if (meta.is_object()) meta.erase(kMindSporeMetadataKey);
  Json entry = Json::object();
  if (!meta.is_null() && !(meta.is_object() && meta.empty())) entry["metadata"] = std::move(meta);
  if (!extra.empty()) entry["values"] = std::move(extra);
  if (entry.empty()) return Status::OK();
  return AddScalarValue(kMindSporeSavepointMetadataEntry, entry.dump(), layout);
}

}  // namespace savepoint::interop::ckpt
