// Decoding of a DCP tensor chunk (see dcp_chunk.h). A torch.save archive is a zip whose entries
// are stored (never compressed): "<archive>/data.pkl" (protocol 2 pickle: a call of
// torch._utils._rebuild_tensor_v2 on a persistent id ("storage", <storage type>, key, location,
// numel), the storage offset, sizes, strides, ...), "<archive>/byteorder" and
// "<archive>/data/<key>" (the storage's raw bytes). Only the central directory's entries are
// trusted after bounds checks; no zip64 (chunks over 4 GiB).
#include "interop/dcp_chunk.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace savepoint::interop {
namespace {

struct TorchName {
  const char* dtype;
  const char* storage;
  DType value;
};

constexpr std::array<TorchName, 17> kTorchNames = {{
    {"float32", "FloatStorage", DType::kF32},
    {"float64", "DoubleStorage", DType::kF64},
    {"float16", "HalfStorage", DType::kF16},
    {"bfloat16", "BFloat16Storage", DType::kBF16},
    {"int64", "LongStorage", DType::kI64},
    {"int32", "IntStorage", DType::kI32},
    {"int16", "ShortStorage", DType::kI16},
    {"int8", "CharStorage", DType::kI8},
    {"uint8", "ByteStorage", DType::kU8},
    {"uint16", "UInt16Storage", DType::kU16},
    {"uint32", "UInt32Storage", DType::kU32},
    {"uint64", "UInt64Storage", DType::kU64},
    {"bool", "BoolStorage", DType::kBool},
    {"complex64", "ComplexFloatStorage", DType::kC64},
    {"complex128", "ComplexDoubleStorage", DType::kC128},
    {"float8_e4m3fn", "Float8_e4m3fnStorage", DType::kF8E4M3},
    {"float8_e5m2", "Float8_e5m2Storage", DType::kF8E5M2},
}};

uint64_t Le(std::string_view b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(b[at + i])} << (8 * i);
  return v;
}

// The stored entries of a zip archive: name -> bytes (views into `zip`).
Result<std::map<std::string, std::string_view, std::less<>>> ZipEntries(std::string_view zip,
                                                                        std::string_view what) {
  auto bad = [&](size_t at, std::string_view why) {
    return CorruptionError(fmt::format("{}: torch.save archive at byte {}: {}", what, at, why));
  };
  if (zip.size() < 22) return bad(0, "too short for a zip archive");
  size_t eocd = zip.size() - 22;
  const size_t stop = zip.size() > 22 + 65535 ? zip.size() - 22 - 65535 : 0;
  while (Le(zip, eocd, 4) != 0x06054b50) {
    if (eocd == stop) return bad(zip.size(), "no end of central directory");
    --eocd;
  }
  const uint64_t count = Le(zip, eocd + 10, 2), cd_size = Le(zip, eocd + 12, 4);
  uint64_t at = Le(zip, eocd + 16, 4);
  if (count == 0xffff || at == 0xffffffff) {
    return UnimplementedError(fmt::format("{}: zip64 archives (chunks over 4 GiB)", what));
  }
  if (at > eocd || cd_size > eocd - at) return bad(eocd, "central directory out of bounds");
  std::map<std::string, std::string_view, std::less<>> out;
  for (uint64_t i = 0; i < count; ++i) {
    if (eocd - at < 46 || Le(zip, at, 4) != 0x02014b50) return bad(at, "bad central entry");
    const uint64_t method = Le(zip, at + 10, 2), csize = Le(zip, at + 20, 4);
    const uint64_t size = Le(zip, at + 24, 4), nlen = Le(zip, at + 28, 2);
    const uint64_t skip = nlen + Le(zip, at + 30, 2) + Le(zip, at + 32, 2);
    const uint64_t local = Le(zip, at + 42, 4);
    if (eocd - at - 46 < skip) return bad(at, "central entry out of bounds");
    std::string name(zip.substr(at + 46, nlen));
    if (method != 0 || csize != size) return bad(at, "compressed entry " + name);
    if (local > zip.size() - 30 || Le(zip, local, 4) != 0x04034b50)
      return bad(local, "bad local header");
    const uint64_t data = local + 30 + Le(zip, local + 26, 2) + Le(zip, local + 28, 2);
    if (data > zip.size() || size > zip.size() - data) return bad(local, "entry out of bounds");
    out.emplace(std::move(name), zip.substr(data, size));
    at += 46 + skip;
  }
  return out;
}

// The entry whose name ends with `suffix` ("/data.pkl"); nullopt when none.
std::optional<std::string_view> Find(const std::map<std::string, std::string_view, std::less<>>& e,
                                     std::string_view suffix) {
  for (const auto& [name, bytes] : e) {
    if (name.ends_with(suffix)) return bytes;
  }
  return std::nullopt;
}

// The ints of a tuple node; nullopt when it is something else.
std::optional<Shape> Ints(const Pickle& p, const Pickle::Node& n) {
  if (n.kind != Pickle::Kind::kTuple) return std::nullopt;
  Shape out;
  for (Pickle::Id i : n.items) {
    if (p.at(i).kind != Pickle::Kind::kInt) return std::nullopt;
    out.push_back(p.at(i).i);
  }
  return out;
}

// What data.pkl says: the storage entry's key and dtype, the view's offset, sizes and strides.
struct TensorRef {
  std::string key;
  DType dtype;
  int64_t offset = 0;
  Shape sizes, strides;
};

// The dtype of a data.pkl: _rebuild_tensor_v2 takes it from the typed storage, _rebuild_tensor_v3
// (dtypes without a typed storage class: uint16, float8 ...) from its 7th argument.
std::optional<DType> DTypeOfPkl(const Pickle& p, const Pickle::Node& root,
                                const Pickle::Node& type) {
  if (type.kind != Pickle::Kind::kGlobal) return std::nullopt;
  if (root.s == "torch._utils._rebuild_tensor_v2") return DTypeOfTorchGlobal(type.s);
  const std::vector<Pickle::Id>& args = p.Args(root);
  if (args.size() < 7 || type.s != "torch.storage.UntypedStorage") return std::nullopt;
  const Pickle::Node& dtype = p.at(args[6]);
  if (dtype.kind != Pickle::Kind::kGlobal) return std::nullopt;
  return DTypeOfTorchGlobal(dtype.s);
}

Result<TensorRef> ParseDataPkl(std::string_view pkl, std::string_view what) {
  PickleOptions o{.globals = {{"torch._utils._rebuild_tensor_v2", GlobalRole::kCallable},
                              {"torch._utils._rebuild_tensor_v3", GlobalRole::kCallable},
                              {"torch.storage.UntypedStorage", GlobalRole::kConstant},
                              {"collections.OrderedDict", GlobalRole::kCallable}},
                  .allow_persistent_id = true};
  AllowTorchDTypes(&o);
  SP_ASSIGN_OR_RETURN(Pickle p, Pickle::Parse(pkl, o, what));
  auto bad = [&](std::string_view why) {
    return CorruptionError(fmt::format("{}: data.pkl: {}", what, why));
  };
  const Pickle::Node& root = p.root();
  const std::vector<Pickle::Id>& args = p.Args(root);
  if (root.kind != Pickle::Kind::kObject || args.size() < 4 ||
      p.at(args[0]).kind != Pickle::Kind::kPersistent) {
    return bad("not a tensor");
  }
  const Pickle::Node& pid = p.at(p.at(args[0]).items[0]);
  if (pid.kind != Pickle::Kind::kTuple || pid.items.size() != 5) return bad("bad storage id");
  const Pickle::Node& key = p.at(pid.items[2]);
  std::optional<DType> dtype = DTypeOfPkl(p, root, p.at(pid.items[1]));
  if (!dtype || key.kind != Pickle::Kind::kString) return bad("bad storage type, dtype or key");
  const Pickle::Node& offset = p.at(args[1]);
  std::optional<Shape> sizes = Ints(p, p.at(args[2]));
  std::optional<Shape> strides = Ints(p, p.at(args[3]));
  if (offset.kind != Pickle::Kind::kInt || !sizes || !strides || sizes->size() != strides->size()) {
    return bad("bad offset, sizes or strides");
  }
  return TensorRef{key.s, *dtype, offset.i, std::move(*sizes), std::move(*strides)};
}

// Checks that every element of the view lies inside a storage of `elems` elements.
Status CheckBounds(const TensorRef& t, uint64_t elems, std::string_view what) {
  bool invalid = t.offset < 0;
  unsigned __int128 last = invalid ? 0 : static_cast<uint64_t>(t.offset);  // no overflow: < 2^113
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0 || t.strides[d] < 0 || t.strides[d] > (int64_t{1} << 48)) invalid = true;
    if (t.sizes[d] == 0) return Status::OK();  // nothing is read
    if (!invalid) last += static_cast<unsigned __int128>(t.sizes[d] - 1) * t.strides[d];
  }
  if (invalid || last >= elems) {
    return CorruptionError(
        fmt::format("{}: tensor view (offset {}, sizes {}, strides {}) outside "
                    "its storage of {} elements",
                    what, t.offset, ShapeToString(t.sizes), ShapeToString(t.strides), elems));
  }
  return Status::OK();
}

// Copies the strided view out of `storage` into C order at `out`.
void Gather(const TensorRef& t, const std::byte* storage, size_t elem, std::byte* out) {
  const size_t rank = t.sizes.size();
  const int64_t inner = rank == 0 ? 1 : t.sizes[rank - 1];
  const int64_t inner_stride = rank == 0 ? 1 : t.strides[rank - 1];
  std::vector<int64_t> idx(rank == 0 ? 0 : rank - 1, 0);
  while (true) {
    int64_t base = t.offset;
    for (size_t d = 0; d + 1 < rank; ++d) base += idx[d] * t.strides[d];
    if (inner_stride == 1) {
      std::memcpy(out, storage + base * elem, inner * elem);
    } else {
      for (int64_t k = 0; k < inner; ++k) {
        std::memcpy(out + k * elem, storage + (base + k * inner_stride) * elem, elem);
      }
    }
    out += inner * elem;
    size_t d = idx.size();
    while (d > 0 && ++idx[d - 1] == t.sizes[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace

std::optional<DType> DTypeOfTorchGlobal(std::string_view global) {
  if (!global.starts_with("torch.")) return std::nullopt;
  global.remove_prefix(6);
  for (const TorchName& n : kTorchNames) {
    if (global == n.dtype || global == n.storage) return n.value;
  }
  return std::nullopt;
}

void AllowTorchDTypes(PickleOptions* o) {
  for (const TorchName& n : kTorchNames) {
    o->globals.emplace(std::string("torch.") + n.dtype, GlobalRole::kConstant);
    o->globals.emplace(std::string("torch.") + n.storage, GlobalRole::kConstant);
  }
}

Status DecodeTensorChunk(std::string_view bytes, DType dtype, const Shape& sizes, std::byte* out,
                         std::string_view what) {
  SP_ASSIGN_OR_RETURN(uint64_t nbytes, NumBytes(dtype, sizes));
  if (!bytes.starts_with("PK\x03\x04")) {  // raw bytes (DCP's safetensors serialization)
    if (bytes.size() != nbytes) {
      return CorruptionError(
          fmt::format("{}: {} bytes, neither a torch.save archive nor the {} "
                      "raw bytes of {} {}",
                      what, bytes.size(), nbytes, DTypeName(dtype), ShapeToString(sizes)));
    }
    std::memcpy(out, bytes.data(), nbytes);
    return Status::OK();
  }
  SP_ASSIGN_OR_RETURN(auto entries, ZipEntries(bytes, what));
  std::optional<std::string_view> pkl = Find(entries, "/data.pkl");
  std::optional<std::string_view> order = Find(entries, "/byteorder");
  if (!pkl) return CorruptionError(fmt::format("{}: torch.save archive without data.pkl", what));
  if (order && *order != "little") {
    return UnimplementedError(fmt::format("{}: byte order {:?}", what, *order));
  }
  SP_ASSIGN_OR_RETURN(TensorRef t, ParseDataPkl(*pkl, what));
  if (t.dtype != dtype || t.sizes != sizes) {
    return CorruptionError(fmt::format("{}: the archive holds {} {}, the metadata says {} {}", what,
                                       DTypeName(t.dtype), ShapeToString(t.sizes), DTypeName(dtype),
                                       ShapeToString(sizes)));
  }
  std::optional<std::string_view> storage = Find(entries, "/data/" + t.key);
  if (!storage) return CorruptionError(fmt::format("{}: no storage data/{}", what, t.key));
  const size_t elem = DTypeSize(dtype);
  if (storage->size() % elem != 0) {
    return CorruptionError(fmt::format("{}: storage of {} bytes", what, storage->size()));
  }
  SP_RETURN_IF_ERROR(CheckBounds(t, storage->size() / elem, what));
  if (nbytes > 0) Gather(t, reinterpret_cast<const std::byte*>(storage->data()), elem, out);
  return Status::OK();
}

}  // namespace savepoint::interop
