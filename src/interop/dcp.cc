// LoadDcpCheckpoint (savepoint/dcp.h): DCP's `.metadata` read with the restricted pickle reader,
// every tensor assembled from its chunks, every non-tensor value kept as DCP's bytes.
//
// The metadata pickle builds (as Object nodes, nothing run) Metadata{state_dict_metadata: {fqn:
// TensorStorageMetadata{properties: TensorProperties (state: (dtype, layout, requires_grad,
// memory_format, pin_memory)), size: torch.Size, chunks: [ChunkStorageMetadata{offsets, sizes}]}
// | BytesStorageMetadata}, planner_data, storage_data: {MetadataIndex{fqn, offset, index}:
// _StorageInfo{relative_path, offset, length, transform_descriptors}}}.
#include "savepoint/dcp.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/box.h"
#include "format/manifest.h"
#include "interop/dcp_chunk.h"
#include "interop/pickle.h"
#include "savepoint/filesystem.h"
#include "util/progress.h"

namespace savepoint {
namespace {

using interop::GlobalRole;
using interop::Pickle;
using Kind = Pickle::Kind;

constexpr char kMetadataFile[] = ".metadata";
constexpr char kMd[] = "torch.distributed.checkpoint.metadata.";

interop::PickleOptions MetadataPickleOptions(uint64_t max_bytes) {
  interop::PickleOptions o{.max_bytes = max_bytes};
  for (const char* c :
       {"Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "BytesStorageMetadata", "MetadataIndex", "StorageMeta"}) {
    o.globals.emplace(std::string(kMd) + c, GlobalRole::kClass);
  }
  o.globals.emplace("torch.distributed.checkpoint.filesystem._StorageInfo", GlobalRole::kClass);
  o.globals.emplace(std::string(kMd) + "_MEM_FORMAT_ENCODING", GlobalRole::kCallable);
  o.globals.emplace("torch.Size", GlobalRole::kCallable);
  o.globals.emplace("torch.serialization._get_layout", GlobalRole::kCallable);
  o.globals.emplace("collections.OrderedDict", GlobalRole::kCallable);
  o.globals.emplace("pathlib.PosixPath", GlobalRole::kCallable);  // StorageMeta.checkpoint_id
  interop::AllowTorchDTypes(&o);
  return o;
}

// Where a chunk or a value lies.
struct Extent {
  std::string file;
  uint64_t offset = 0, length = 0;
};

// How errors name a chunk of tensor `fqn`.
std::string ChunkName(std::string_view fqn, const Shape& offsets) {
  return fmt::format("tensor {:?} chunk at {}", fqn, ShapeToString(offsets));
}

// The reading side: the parsed metadata and the open data files.
class DcpReader {
 public:
  DcpReader(std::string dir, FileSystem* fs) : dir_(std::move(dir)), fs_(fs) {}

  Status ReadMetadata(uint64_t max_bytes) {
    SP_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(kMetadataFile, max_bytes));
    what_ = JoinPath(dir_, kMetadataFile);
    metadata_bytes_ = bytes.size();
    SP_ASSIGN_OR_RETURN(meta_, Pickle::Parse(bytes, MetadataPickleOptions(max_bytes), what_));
    if (!IsObject(meta_.root(), "Metadata")) return Bad("not DCP Metadata");
    return IndexStorage();
  }

  Result<State> Load(const DcpLoadOptions& o);

 private:
  Status Bad(std::string_view why) const {
    return CorruptionError(fmt::format("{}: {}", what_, why));
  }
  bool IsObject(const Pickle::Node& n, std::string_view cls) const {
    return n.kind == Kind::kObject && n.s == std::string(kMd) + std::string(cls);
  }
  // The dims of a torch.Size node (nullopt when it is not one, or has more than kMaxRank dims).
  std::optional<Shape> Dims(const Pickle::Node* n) const {
    if (n == nullptr || n->kind != Kind::kObject || n->s != "torch.Size" ||
        meta_.Args(*n).size() != 1) {
      return std::nullopt;
    }
    const Pickle::Node& t = meta_.at(meta_.Args(*n)[0]);
    if (t.kind != Kind::kTuple || t.items.size() > kMaxRank) return std::nullopt;
    Shape out;
    for (Pickle::Id i : t.items) {
      if (meta_.at(i).kind != Kind::kInt) return std::nullopt;
      out.push_back(meta_.at(i).i);
    }
    return out;
  }

  Result<std::string> ReadWhole(const std::string& name, uint64_t max_bytes);
  Result<RandomAccessFile*> DataFile(const std::string& name);
  // Checks that `e`, the bytes of `item`, lies inside its data file.
  Status CheckExtent(const Extent& e, std::string_view item);
  Result<std::string> ReadExtent(const Extent& e, std::string_view item);
  Status IndexStorage();
  Status CheckExtentsDisjoint() const;
  Result<Extent> ExtentOf(const std::string& fqn, const Shape* offsets) const;
  Status AddTensor(const std::string& fqn, const Pickle::Node& md, State* out, Progress* p);
  Status CheckChunksFit(const format::TensorRecord& rec);
  Result<DType> DTypeOf(const std::string& fqn, const Pickle::Node& md) const;
  Status AddChunk(const std::string& fqn, const Pickle::Node& chunk, Tensor* whole, Progress* p);
  Result<Json> PlannerData() const;

  std::string dir_, what_;
  FileSystem* fs_;
  uint64_t metadata_bytes_ = 0;  // the size of `.metadata`
  Pickle meta_;
  std::map<std::pair<std::string, Shape>, Extent> tensors_;  // (fqn, chunk offsets) -> extent
  std::map<std::string, Extent, std::less<>> bytes_;         // fqn -> extent of a value
  std::map<std::string, std::unique_ptr<RandomAccessFile>, std::less<>> files_;
};

Result<std::string> DcpReader::ReadWhole(const std::string& name, uint64_t max_bytes) {
  const std::string path = JoinPath(dir_, name);
  SP_ASSIGN_OR_RETURN(auto f, fs_->NewRandomAccessFile(path, {}));
  if (f->size() > max_bytes) {
    return InvalidArgumentError(
        fmt::format("{}: {} bytes, above the cap of {}", path, f->size(), max_bytes));
  }
  std::string out(f->size(), '\0');
  SP_RETURN_IF_ERROR(f->ReadAt(0, std::as_writable_bytes(std::span(out.data(), out.size()))));
  return out;
}

// The data file `name` of the directory, opened once.
Result<RandomAccessFile*> DcpReader::DataFile(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    SP_ASSIGN_OR_RETURN(auto f, fs_->NewRandomAccessFile(JoinPath(dir_, name), {}));
    it = files_.emplace(name, std::move(f)).first;
  }
  return it->second.get();
}

Status DcpReader::CheckExtent(const Extent& e, std::string_view item) {
  SP_ASSIGN_OR_RETURN(RandomAccessFile * f, DataFile(e.file));
  const uint64_t size = f->size();
  if (e.offset > size || e.length > size - e.offset) {
    return Bad(fmt::format("{}: bytes [{}, +{}) beyond the end of {} ({} bytes)", item, e.offset,
                           e.length, e.file, size));
  }
  return Status::OK();
}

Result<std::string> DcpReader::ReadExtent(const Extent& e, std::string_view item) {
  SP_RETURN_IF_ERROR(CheckExtent(e, item));
  SP_ASSIGN_OR_RETURN(RandomAccessFile * f, DataFile(e.file));
  std::string out(e.length, '\0');
  SP_RETURN_IF_ERROR(
      f->ReadAt(e.offset, std::as_writable_bytes(std::span(out.data(), out.size()))));
  return out;
}

// Indexes storage_data: MetadataIndex -> _StorageInfo.
Status DcpReader::IndexStorage() {
  const Pickle::Node* sd = meta_.Field(meta_.root(), "storage_data");
  if (sd == nullptr || sd->kind != Kind::kDict) return Bad("no storage_data");
  for (const auto& [k, v] : sd->dict) {
    const Pickle::Node& index = meta_.at(k);
    const Pickle::Node& info = meta_.at(v);
    const Pickle::Node* fqn = meta_.Field(index, "fqn");
    const Pickle::Node* path = meta_.Field(info, "relative_path");
    const Pickle::Node* off = meta_.Field(info, "offset");
    const Pickle::Node* len = meta_.Field(info, "length");
    const Pickle::Node* transforms = meta_.Field(info, "transform_descriptors");
    if (!IsObject(index, "MetadataIndex") || fqn == nullptr || fqn->kind != Kind::kString ||
        path == nullptr || path->kind != Kind::kString || off == nullptr ||
        off->kind != Kind::kInt || off->i < 0 || len == nullptr || len->kind != Kind::kInt ||
        len->i < 0) {
      return Bad("malformed storage_data entry");
    }
    if (path->s.empty() || path->s.find('/') != std::string::npos || path->s == "." ||
        path->s == "..") {
      return Bad(
          fmt::format("storage_data names file {:?}: not a file of this directory", path->s));
    }
    if (transforms != nullptr && transforms->kind != Kind::kNone && !transforms->items.empty()) {
      return InvalidArgumentError(fmt::format(
          "{}: {:?} is stored with DCP storage transforms (e.g. compression): not supported", what_,
          fqn->s));
    }
    Extent e{path->s, static_cast<uint64_t>(off->i), static_cast<uint64_t>(len->i)};
    std::optional<Shape> offsets = Dims(meta_.Field(index, "offset"));
    if (offsets) {
      tensors_[{fqn->s, *offsets}] = e;
    } else {
      bytes_[fqn->s] = e;
    }
  }
  return CheckExtentsDisjoint();
}

// DCP writes every item once, at bytes of its own: extents that share bytes would let a small data
// file stand for any number of chunks (and the tensors allocated for them). Empty ones may touch.
Status DcpReader::CheckExtentsDisjoint() const {
  std::vector<std::pair<const Extent*, std::string>> placed;  // sorted by (file, offset) below
  for (const auto& [key, e] : tensors_) {
    if (e.length > 0) placed.emplace_back(&e, ChunkName(key.first, key.second));
  }
  for (const auto& [fqn, e] : bytes_) {
    if (e.length > 0) placed.emplace_back(&e, fmt::format("value {:?}", fqn));
  }
  std::stable_sort(placed.begin(), placed.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first->file, a.first->offset) < std::tie(b.first->file, b.first->offset);
  });
  for (size_t i = 1; i < placed.size(); ++i) {
    const Extent &a = *placed[i - 1].first, &b = *placed[i].first;
    if (a.file == b.file && b.offset - a.offset < a.length) {  // offsets and lengths < 2^63
      return Bad(fmt::format(
          "storage_data: {} (bytes [{}, +{})) and {} (bytes [{}, +{})) overlap in {}",
          placed[i - 1].second, a.offset, a.length, placed[i].second, b.offset, b.length, a.file));
    }
  }
  return Status::OK();
}

Result<Extent> DcpReader::ExtentOf(const std::string& fqn, const Shape* offsets) const {
  if (offsets != nullptr) {
    auto it = tensors_.find({fqn, *offsets});
    if (it != tensors_.end()) return it->second;
  } else if (auto it = bytes_.find(fqn); it != bytes_.end()) {
    return it->second;
  }
  return Bad(fmt::format("no storage entry for {:?}{}", fqn,
                         offsets ? " chunk at " + ShapeToString(*offsets) : ""));
}

Result<DType> DcpReader::DTypeOf(const std::string& fqn, const Pickle::Node& md) const {
  const Pickle::Node* props = meta_.Field(md, "properties");
  const Pickle::Node* dtype = nullptr;
  if (props != nullptr && props->kind == Kind::kObject && props->state != 0) {
    const Pickle::Node& state = meta_.at(props->state);
    dtype = state.kind == Kind::kTuple && !state.items.empty() ? &meta_.at(state.items[0])
                                                               : meta_.Field(*props, "dtype");
  }
  std::optional<DType> d;
  if (dtype != nullptr && dtype->kind == Kind::kGlobal) d = interop::DTypeOfTorchGlobal(dtype->s);
  if (!d) {
    return InvalidArgumentError(fmt::format("{}: tensor {:?}: dtype {} is not supported", what_,
                                            fqn, dtype && !dtype->s.empty() ? dtype->s : "?"));
  }
  return *d;
}

Status DcpReader::AddChunk(const std::string& fqn, const Pickle::Node& chunk, Tensor* whole,
                           Progress* p) {
  std::optional<Shape> offsets = Dims(meta_.Field(chunk, "offsets"));
  std::optional<Shape> sizes = Dims(meta_.Field(chunk, "sizes"));
  if (!IsObject(chunk, "ChunkStorageMetadata") || !offsets || !sizes) {
    return Bad(fmt::format("tensor {:?}: malformed chunk", fqn));
  }
  const std::string chunk_name = ChunkName(fqn, *offsets);
  SP_ASSIGN_OR_RETURN(Extent e, ExtentOf(fqn, &*offsets));
  SP_ASSIGN_OR_RETURN(std::string bytes, ReadExtent(e, chunk_name));
  const std::string what =
      fmt::format("{} ({} bytes {}+{})", chunk_name, e.file, e.offset, e.length);
  SP_ASSIGN_OR_RETURN(Tensor box, Tensor::Empty(whole->dtype(), *sizes));
  SP_RETURN_IF_ERROR(interop::DecodeTensorChunk(bytes, whole->dtype(), *sizes, box.data(), what));
  const Shape zero(sizes->size(), 0);
  engine::CopyRegion({box.data(), *sizes, zero}, {whole->data(), whole->shape(), *offsets}, *sizes,
                     DTypeSize(whole->dtype()));
  p->Add(e.length);
  return Status::OK();
}

Status DcpReader::AddTensor(const std::string& fqn, const Pickle::Node& md, State* out,
                            Progress* p) {
  SP_ASSIGN_OR_RETURN(DType dtype, DTypeOf(fqn, md));
  std::optional<Shape> shape = Dims(meta_.Field(md, "size"));
  const Pickle::Node* chunks = meta_.Field(md, "chunks");
  if (!shape || chunks == nullptr || chunks->kind != Kind::kList) {
    return Bad(fmt::format("tensor {:?}: malformed TensorStorageMetadata", fqn));
  }
  format::TensorRecord rec;
  rec.name = fqn;
  rec.dtype = dtype;
  rec.shape = *shape;
  for (Pickle::Id c : chunks->items) {  // the chunks must tile the tensor before any is copied
    std::optional<Shape> o = Dims(meta_.Field(meta_.at(c), "offsets"));
    std::optional<Shape> s = Dims(meta_.Field(meta_.at(c), "sizes"));
    if (!o || !s || o->size() != shape->size() || s->size() != shape->size()) {
      return Bad(fmt::format("tensor {:?}: malformed chunk", fqn));
    }
    rec.shards.emplace_back();
    rec.shards.back().offsets = *o;
    rec.shards.back().sizes = *s;
  }
  Status tiled = format::CheckTensorTiling(rec, what_);
  if (!tiled.ok()) return CorruptionError(tiled.message());
  SP_RETURN_IF_ERROR(CheckChunksFit(rec));
  SP_ASSIGN_OR_RETURN(Tensor whole, Tensor::Empty(dtype, *shape));
  for (Pickle::Id c : chunks->items) SP_RETURN_IF_ERROR(AddChunk(fqn, meta_.at(c), &whole, p));
  return out->Put(fqn, std::move(whole));
}

// Checks, before the tensor or any chunk is allocated, that the data files hold its bytes: every
// chunk's extent lies inside its file, the extents (disjoint: IndexStorage) add up to at least the
// tensor's bytes, and each is at least its chunk's bytes (a chunk is stored as its raw bytes or as
// a torch.save archive of a compact copy of it: DCP clones views before saving them). `rec` tiles.
Status DcpReader::CheckChunksFit(const format::TensorRecord& rec) {
  // OK when `have` bytes (held by `holder`) can hold `item`, of `sizes` (valid: `rec` tiles).
  auto held = [&](std::string_view item, const Shape& sizes, uint64_t have,
                  std::string_view holder) -> Status {
    SP_ASSIGN_OR_RETURN(uint64_t need, NumBytes(rec.dtype, sizes));
    if (need <= have) return Status::OK();
    return Bad(fmt::format("{} ({} {}) needs {} bytes, but {} only {}", item, DTypeName(rec.dtype),
                           ShapeToString(sizes), need, holder, have));
  };
  std::vector<Extent> extents;
  uint64_t total = 0;
  for (const format::ShardRecord& c : rec.shards) {
    SP_ASSIGN_OR_RETURN(Extent e, ExtentOf(rec.name, &c.offsets));
    SP_RETURN_IF_ERROR(CheckExtent(e, ChunkName(rec.name, c.offsets)));
    if (__builtin_add_overflow(total, e.length, &total)) total = UINT64_MAX;
    extents.push_back(std::move(e));
  }
  SP_RETURN_IF_ERROR(held(fmt::format("tensor {:?}", rec.name), rec.shape, total,
                          "the extents of its chunks in the data files hold"));
  for (size_t k = 0; k < extents.size(); ++k) {
    const Extent& e = extents[k];
    SP_RETURN_IF_ERROR(held(ChunkName(rec.name, rec.shards[k].offsets), rec.shards[k].sizes,
                            e.length,
                            fmt::format("its extent at byte {} of {} holds", e.offset, e.file)));
  }
  return Status::OK();
}

// Caps on the JSON made of a pickle's plain data. Memo references let a few bytes of pickle repeat
// a subtree any number of times; DCP's own planner_data (fqn -> key path: nothing shared but
// strings) costs at least a byte of pickle per value and a few per copy of a shared string. So
// what is made is capped in proportion to the pickle's size, and absolutely.
struct JsonBudget {
  uint64_t values = 0, string_bytes = 0;
};
constexpr JsonBudget kMaxJson = {.values = uint64_t{1} << 22, .string_bytes = uint64_t{64} << 20};

JsonBudget JsonBudgetFor(uint64_t pickle_bytes) {
  return {.values = std::min(kMaxJson.values, 4 * pickle_bytes + 4096),
          .string_bytes = std::min(kMaxJson.string_bytes, 64 * pickle_bytes + 65536)};
}

// JSON of plain data (None, bools, ints, floats, strings, tuples, lists, dicts with string keys),
// at most `depth` levels; discarded for anything else. Past the budget (JsonBudgetFor the pickle's
// size), InvalidArgument naming `what` and the cap.
class PlainJson {
 public:
  PlainJson(const Pickle& p, uint64_t pickle_bytes, std::string_view what)
      : p_(p), pickle_bytes_(pickle_bytes), cap_(JsonBudgetFor(pickle_bytes)), what_(what) {}

  Result<Json> Expand(const Pickle::Node& n, int depth) {
    if (depth == 0) return Json(Json::value_t::discarded);
    SP_RETURN_IF_ERROR(Charge(n.kind == Kind::kString ? n.s.size() : 0));
    switch (n.kind) {
      case Kind::kNone:
        return Json(nullptr);
      case Kind::kBool:
        return Json(n.i != 0);
      case Kind::kInt:
        return Json(n.i);
      case Kind::kFloat:
        return Json(n.f);
      case Kind::kString:
        return Json(n.s);
      case Kind::kTuple:
      case Kind::kList:
        return Array(n, depth);
      case Kind::kDict:
        return Object(n, depth);
      default:
        return Json(Json::value_t::discarded);
    }
  }

 private:
  Result<Json> Array(const Pickle::Node& n, int depth) {
    Json a = Json::array();
    for (Pickle::Id i : n.items) {
      SP_ASSIGN_OR_RETURN(Json j, Expand(p_.at(i), depth - 1));
      if (j.is_discarded()) return j;
      a.push_back(std::move(j));
    }
    return a;
  }
  Result<Json> Object(const Pickle::Node& n, int depth) {
    Json o = Json::object();
    for (const auto& [k, v] : n.dict) {
      const Pickle::Node& key = p_.at(k);
      if (key.kind != Kind::kString) return Json(Json::value_t::discarded);
      SP_RETURN_IF_ERROR(Charge(key.s.size()));
      SP_ASSIGN_OR_RETURN(Json j, Expand(p_.at(v), depth - 1));
      if (j.is_discarded()) return j;
      o[key.s] = std::move(j);
    }
    return o;
  }
  // Charges one value (or key) of `string_bytes` bytes.
  Status Charge(uint64_t string_bytes) {
    used_.values += 1;
    used_.string_bytes += string_bytes;
    if (used_.values <= cap_.values && used_.string_bytes <= cap_.string_bytes) {
      return Status::OK();
    }
    const bool values = used_.values > cap_.values;
    return InvalidArgumentError(fmt::format(
        "{} expands to more than {} {} of JSON, the cap for a {}-byte pickle (memo references "
        "repeat parts of it)",
        what_, values ? cap_.values : cap_.string_bytes, values ? "values" : "string bytes",
        pickle_bytes_));
  }

  const Pickle& p_;
  const uint64_t pickle_bytes_;
  const JsonBudget cap_;
  const std::string_view what_;
  JsonBudget used_;
};

// DCP's planner_data as JSON; null when it is absent or not plain data.
Result<Json> DcpReader::PlannerData() const {
  const Pickle::Node* pd = meta_.Field(meta_.root(), "planner_data");
  if (pd == nullptr) return Json(nullptr);
  const std::string what = fmt::format("{}: planner_data", what_);
  SP_ASSIGN_OR_RETURN(Json j, PlainJson(meta_, metadata_bytes_, what).Expand(*pd, 8));
  return j.is_discarded() ? Json(nullptr) : j;
}

Result<State> DcpReader::Load(const DcpLoadOptions& o) {
  const Pickle::Node* sdm = meta_.Field(meta_.root(), "state_dict_metadata");
  if (sdm == nullptr || sdm->kind != Kind::kDict) return Bad("no state_dict_metadata");
  SP_ASSIGN_OR_RETURN(Json planner_data, PlannerData());  // before any tensor is read
  uint64_t total = 0;
  for (const auto& [k, e] : tensors_) total += e.length;
  Progress progress(o.progress, total);
  State out;
  Json byte_io = Json::array();
  for (const auto& [k, v] : sdm->dict) {
    const Pickle::Node& md = meta_.at(v);
    if (meta_.at(k).kind != Kind::kString) return Bad("a state_dict_metadata key is not a string");
    const std::string& fqn = meta_.at(k).s;
    if (IsObject(md, "TensorStorageMetadata")) {
      SP_RETURN_IF_ERROR(AddTensor(fqn, md, &out, &progress));
    } else if (IsObject(md, "BytesStorageMetadata")) {
      SP_ASSIGN_OR_RETURN(Extent e, ExtentOf(fqn, nullptr));
      SP_ASSIGN_OR_RETURN(std::string bytes, ReadExtent(e, fmt::format("value {:?}", fqn)));
      const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
      SP_RETURN_IF_ERROR(
          out.PutValue(fqn, Value(Bytes{std::vector<uint8_t>(b, b + bytes.size())})));
      byte_io.push_back(fqn);
    } else {
      return Bad(fmt::format("{:?}: unknown storage metadata", fqn));
    }
  }
  progress.Finish();
  out.metadata()[kDcpMetadataKey] = {{"byte_io", byte_io}, {"planner_data", planner_data}};
  return out;
}

}  // namespace

Result<State> LoadDcpCheckpoint(const std::string& dir, const DcpLoadOptions& options,
                                const IoOptions& io) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, "DCP load"));
  DcpReader r(dir, FileSystemOf(io));
  Status s = r.ReadMetadata(options.max_metadata_bytes);
  if (s.ok()) {
    Result<State> out = r.Load(options);
    if (out.ok()) return out;
    s = out.status();
  }
  return s.WithContext(fmt::format("DCP checkpoint {}", dir));
}

}  // namespace savepoint
