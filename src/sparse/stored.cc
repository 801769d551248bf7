// The sparse description (docs/FORMAT.md §11): names, encoding, validation; the storage-order sort.
#include "sparse/stored.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "util/parallel.h"

namespace savepoint::sparse {

StoredNames NamesFor(size_t index, std::string_view table, const std::vector<std::string>& slots,
                     bool delta) {
  const std::string prefix = fmt::format("{}{}.{}/", kTensorPrefix, index, table);
  StoredNames n;
  n.ids = prefix + "ids";
  n.counts = prefix + "slices";
  n.ranks = prefix + "ranks";
  if (delta) {
    n.deleted = prefix + "deleted";
    n.deleted_counts = prefix + "deleted_slices";
  }
  for (const std::string& s : slots) n.slots.emplace_back(s, prefix + "slot/" + s);
  return n;
}

int64_t SavingRankOf(int64_t slice, int64_t n) {
  const int64_t each = kNumSlices / n, extra = kNumSlices % n, wide = extra * (each + 1);
  return slice < wide ? slice / (each + 1) : extra + (slice - wide) / each;
}

namespace {
// The description's member names of a table's slice index in `format`.
const char* CountsKey(int64_t format) { return format == 1 ? "slice_rows" : "slices"; }
const char* DeletedCountsKey(int64_t format) {
  return format == 1 ? "deleted_slice_rows" : "deleted_slices";
}
}  // namespace

Json EncodeDesc(const Desc& d) {
  Json tables = Json::array();
  for (const StoredTable& t : d.tables) {
    Json slots = Json::array();
    for (const auto& [slot, tensor] : t.names.slots) {
      slots.push_back({{"name", slot}, {"tensor", tensor}});
    }
    Json j = {{"name", t.name},
              {"ids", t.names.ids},
              {CountsKey(d.format), t.names.counts},
              {"slots", std::move(slots)}};
    if (d.format >= 2) j["ranks"] = t.names.ranks;
    if (d.delta()) {
      j["deleted"] = t.names.deleted;
      j[DeletedCountsKey(d.format)] = t.names.deleted_counts;
    }
    tables.push_back(std::move(j));
  }
  Json base = nullptr;
  if (d.delta()) base = {{"path", d.base}, {"checkpoint_id", fmt::format("{:016x}", d.base_id)}};
  return {{"format", d.format}, {"depth", d.depth}, {"base", base}, {"tables", tables}};
}

namespace {

// Decoding context: every error is Corruption "<where>: savepoint.sparse: <what>".
struct Ctx {
  std::string where;
  Status Bad(std::string_view what) const {
    return CorruptionError(fmt::format("{}: {}: {}", where, format::kSparseValueName, what));
  }
};

Result<std::string> Str(const Json& j, const char* key, const Ctx& ctx, std::string_view in) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    return ctx.Bad(fmt::format("{}.{} is not a string", in, key));
  return it->get<std::string>();
}

const format::TensorRecord* FindRecord(const format::Manifest& m, std::string_view name) {
  auto it = std::lower_bound(m.tensors.begin(), m.tensors.end(), name,
                             [](const auto& t, std::string_view n) { return t.name < n; });
  return it != m.tensors.end() && it->name == name ? &*it : nullptr;
}

// The shape a table tensor must have: `dims` dimensions, the first of length `len` (`len` < 0:
// any length) or at most `max_len`, the second (when dims is 2) `cols`.
struct ShapeRule {
  int64_t len = -1;
  int64_t max_len = INT64_MAX;
  size_t dims = 1;
  int64_t cols = 0;
  bool Admits(const Shape& s) const {
    if (s.size() != dims || (len >= 0 && s[0] != len) || s[0] > max_len) return false;
    return dims == 1 || s[1] == cols;
  }
};

// The record of tensor `key` of `j` (a table), which must be I64 of the shape `rule` admits.
Result<const format::TensorRecord*> IdRecord(const Json& j, const char* key, ShapeRule rule,
                                             const format::Manifest& m, const Ctx& ctx,
                                             std::string_view in) {
  SP_ASSIGN_OR_RETURN(std::string name, Str(j, key, ctx, in));
  const format::TensorRecord* t = FindRecord(m, name);
  if (t == nullptr || !name.starts_with(kTensorPrefix)) {
    return ctx.Bad(fmt::format("{}.{}: no tensor {:?}", in, key, name.substr(0, 256)));
  }
  if (t->dtype != DType::kI64 || !rule.Admits(t->shape)) {
    return ctx.Bad(fmt::format("{}.{}: tensor {:?} is {} {}", in, key, name, DTypeName(t->dtype),
                               ShapeToString(t->shape)));
  }
  return t;
}

// The slice index of a table: the rule for its counts tensors in `format`.
ShapeRule CountsRule(int64_t format) {
  return format == 1 ? ShapeRule{.len = kNumSlices} : ShapeRule{.max_len = kNumSlices};
}

Status DecodeSlots(const Json& j, int64_t rows, const format::Manifest& m, const Ctx& ctx,
                   const std::string& in, StoredNames* n) {
  auto slots = j.find("slots");
  if (slots == j.end() || !slots->is_array() || slots->size() > kMaxSlots) {
    return ctx.Bad(fmt::format("{}.slots is not an array of at most {}", in, kMaxSlots));
  }
  for (size_t k = 0; k < slots->size(); ++k) {
    const Json& s = (*slots)[k];
    const std::string sin = fmt::format("{}.slots[{}]", in, k);
    if (!s.is_object()) return ctx.Bad(sin + " is not an object");
    SP_ASSIGN_OR_RETURN(std::string slot, Str(s, "name", ctx, sin));
    SP_ASSIGN_OR_RETURN(std::string tensor, Str(s, "tensor", ctx, sin));
    const format::TensorRecord* t = FindRecord(m, tensor);
    if (!ValidateName(slot).ok() || t == nullptr || !tensor.starts_with(kTensorPrefix)) {
      return ctx.Bad(
          fmt::format("{}: bad slot name or no tensor {:?}", sin, tensor.substr(0, 256)));
    }
    if (t->shape.empty() || t->shape[0] != rows) {
      return ctx.Bad(fmt::format("{}: slot {:?} has shape {}, but the table has {} ids", sin, slot,
                                 ShapeToString(t->shape), rows));
    }
    for (const auto& [other, unused] : n->slots) {
      if (other == slot) return ctx.Bad(fmt::format("{}: slot {:?} appears twice", sin, slot));
    }
    n->slots.emplace_back(slot, tensor);
  }
  return Status::OK();
}

Result<StoredTable> DecodeTable(const Json& j, const Desc& d, const format::Manifest& m,
                                const Ctx& ctx, size_t i) {
  const std::string in = fmt::format("tables[{}]", i);
  if (!j.is_object()) return ctx.Bad(in + " is not an object");
  StoredTable t;
  SP_ASSIGN_OR_RETURN(t.name, Str(j, "name", ctx, in));
  if (!ValidateName(t.name).ok()) return ctx.Bad(in + ".name is not a valid name");
  SP_ASSIGN_OR_RETURN(const format::TensorRecord* ids, IdRecord(j, "ids", {}, m, ctx, in));
  SP_ASSIGN_OR_RETURN(const format::TensorRecord* rows,
                      IdRecord(j, CountsKey(d.format), CountsRule(d.format), m, ctx, in));
  t.names.ids = ids->name;
  t.names.counts = rows->name;
  if (d.format >= 2) {
    const ShapeRule rule{.max_len = kNumSlices, .dims = 2, .cols = RankColumns(d.delta())};
    SP_ASSIGN_OR_RETURN(const format::TensorRecord* ranks, IdRecord(j, "ranks", rule, m, ctx, in));
    if (ranks->shape[0] < 1) return ctx.Bad(in + ".ranks: no saving rank");
    t.names.ranks = ranks->name;
  }
  if (d.delta()) {
    SP_ASSIGN_OR_RETURN(const format::TensorRecord* del, IdRecord(j, "deleted", {}, m, ctx, in));
    SP_ASSIGN_OR_RETURN(const format::TensorRecord* drows,
                        IdRecord(j, DeletedCountsKey(d.format), CountsRule(d.format), m, ctx, in));
    t.names.deleted = del->name;
    t.names.deleted_counts = drows->name;
  } else if (j.contains("deleted")) {
    return ctx.Bad(in + ": deleted ids in a full checkpoint");
  }
  SP_RETURN_IF_ERROR(DecodeSlots(j, ids->shape[0], m, ctx, in, &t.names));
  return t;
}

// A delta's base: `path` a sibling's name or an absolute path, `id` 16 lower-case hex digits.
Status CheckBase(const std::string& path, const std::string& id, const Ctx& ctx) {
  // "." and ".." name the delta's own directory and its parent, never a sibling checkpoint.
  if (path == "." || path == "..") {
    return ctx.Bad(fmt::format("base.path {:?} is not a sibling's name", path));
  }
  const bool plain = !path.empty() && path.size() <= 4096 && path.find('\0') == std::string::npos &&
                     (path[0] == '/' || path.find('/') == std::string::npos);
  if (!plain || id.size() != 16 || id.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return ctx.Bad(
        "base.path must be a sibling's name or an absolute path and base.checkpoint_id "
        "16 lower-case hex digits");
  }
  return Status::OK();
}

Status DecodeBaseLink(const Json& root, const Ctx& ctx, Desc* d) {
  auto depth = root.find("depth");
  if (depth == root.end() || !depth->is_number_integer() || depth->get<int64_t>() < 0 ||
      depth->get<int64_t>() > kMaxChainDepth) {
    return ctx.Bad(fmt::format("depth is not an integer in [0, {}]", kMaxChainDepth));
  }
  d->depth = depth->get<int64_t>();
  auto base = root.find("base");
  if (base == root.end() || (d->delta() != base->is_object()) ||
      (!d->delta() && !base->is_null())) {
    return ctx.Bad("base must be an object in a delta (depth > 0), null otherwise");
  }
  if (!d->delta()) return Status::OK();
  SP_ASSIGN_OR_RETURN(d->base, Str(*base, "path", ctx, "base"));
  SP_ASSIGN_OR_RETURN(std::string id, Str(*base, "checkpoint_id", ctx, "base"));
  SP_RETURN_IF_ERROR(CheckBase(d->base, id, ctx));
  d->base_id = std::stoull(id, nullptr, 16);
  return Status::OK();
}

}  // namespace

Result<Desc> DecodeDesc(const format::Manifest& m, std::string_view where, bool* found) {
  const Value* v = m.values.FindValue(format::kSparseValueName);
  *found = v != nullptr && v->kind() == ValueKind::kJson;
  if (!*found) return Desc{};
  const Ctx ctx{std::string(where)};
  const Json& root = v->as_json();
  if (!root.is_object()) return ctx.Bad("not a JSON object");
  auto f = root.find("format");
  if (f == root.end() || !f->is_number_integer() || f->get<int64_t>() < kOldestDescFormat ||
      f->get<int64_t>() > kDescFormat) {
    return UnimplementedError(fmt::format("{}: {}: format is not {} to {} (this build's)", where,
                                          format::kSparseValueName, kOldestDescFormat,
                                          kDescFormat));
  }
  Desc d;
  d.format = f->get<int64_t>();
  SP_RETURN_IF_ERROR(DecodeBaseLink(root, ctx, &d));
  auto tables = root.find("tables");
  if (tables == root.end() || !tables->is_array() || tables->size() > kMaxTables) {
    return ctx.Bad(fmt::format("tables is not an array of at most {}", kMaxTables));
  }
  for (size_t i = 0; i < tables->size(); ++i) {
    SP_ASSIGN_OR_RETURN(StoredTable t, DecodeTable((*tables)[i], d, m, ctx, i));
    for (const StoredTable& other : d.tables) {
      if (other.name == t.name) return ctx.Bad(fmt::format("table {:?} appears twice", t.name));
    }
    d.tables.push_back(std::move(t));
  }
  return d;
}

namespace {
std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}
}  // namespace

std::string ResolveBase(const std::string& path, const std::string& base) {
  return base.starts_with('/') ? base : Parent(path) + base;
}

Result<std::string> RecordBase(const std::string& path, const std::string& base_path) {
  const std::string parent = Parent(base_path);
  if (parent == Parent(path)) return base_path.substr(parent.size());
  if (base_path.starts_with('/')) return base_path;
  return InvalidArgumentError(
      fmt::format("base {:?} of {:?}: must be a sibling of the checkpoint or an absolute path",
                  base_path, path));
}

namespace {

std::span<const int64_t> IdsOf(const TensorView& v) {
  return {reinterpret_cast<const int64_t*>(v.data()), static_cast<size_t>(v.shape()[0])};
}

}  // namespace

bool InStorageOrder(std::span<const int64_t> ids) {
  return std::adjacent_find(ids.begin(), ids.end(),
                            [](int64_t a, int64_t b) { return !KeyLess(a, b); }) == ids.end();
}

Status CheckRange(std::span<const int64_t> ids, SliceRange range, std::string_view what) {
  for (int64_t id : ids) {
    if (!range.Contains(SliceOf(id))) {
      return InvalidArgumentError(
          fmt::format("{} {} (slice {}) lies outside this shard's slices [{}, {})", what, id,
                      SliceOf(id), range.begin, range.end));
    }
  }
  return Status::OK();
}

// A counting sort by slice that moves (id, row) pairs, then each slice's pairs sorted where they
// lie (a few rows each, for tables much larger than 65536 rows), so no step reads the ids at
// random.
Status Order(std::span<const int64_t> ids, SliceRange range, std::span<int64_t> sorted,
             std::span<int64_t> perm) {
  if (sorted.size() != ids.size() || perm.size() != ids.size()) {
    return InternalError("sparse::Order: output lengths differ from the ids'");
  }
  const size_t width = static_cast<size_t>(range.end - range.begin);
  std::vector<int64_t> start(width + 1, 0);
  for (int64_t id : ids) ++start[static_cast<size_t>(SliceOf(id) - range.begin) + 1];
  for (size_t s = 0; s < width; ++s) start[s + 1] += start[s];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  std::vector<std::pair<int64_t, int64_t>> pairs(ids.size());  // (id, row)
  for (size_t i = 0; i < ids.size(); ++i) {
    pairs[next[static_cast<size_t>(SliceOf(ids[i]) - range.begin)]++] = {ids[i],
                                                                         static_cast<int64_t>(i)};
  }
  for (size_t s = 0; s < width; ++s) {
    if (start[s + 1] - start[s] < 2) continue;
    const auto first = pairs.begin() + start[s], last = pairs.begin() + start[s + 1];
    std::sort(first, last);
    const auto twice = std::adjacent_find(
        first, last, [](const auto& a, const auto& b) { return a.first == b.first; });
    if (twice != last) {
      return InvalidArgumentError(fmt::format("ids: id {} appears twice", twice->first));
    }
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    sorted[i] = pairs[i].first;
    perm[i] = pairs[i].second;
  }
  return Status::OK();
}

namespace {

// A copy of `v` with rows in the order `perm`, copied on `threads` threads.
Result<Tensor> Gather(const TensorView& v, std::span<const int64_t> perm, int threads) {
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(v.dtype(), v.shape()));
  const uint64_t rb = SparseTable::RowBytes(v);
  constexpr size_t kBlock = 4096;
  const size_t blocks = (perm.size() + kBlock - 1) / kBlock;
  SP_RETURN_IF_ERROR(ParallelFor(blocks, threads, [&](size_t b, int) -> Status {
    const size_t end = std::min(perm.size(), (b + 1) * kBlock);
    for (size_t i = b * kBlock; i < end; ++i) {
      std::memcpy(t.data() + i * rb, v.data() + perm[i] * rb, rb);
    }
    return Status::OK();
  }));
  return t;
}

}  // namespace

Result<TensorView> SortedIds(const TensorView& v, std::span<const int64_t> ids,
                             std::vector<Tensor>* owned) {
  if (std::is_sorted(ids.begin(), ids.end(), KeyLess)) return v;
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::CopyOf(v));
  std::span<int64_t> s = t.as<int64_t>();
  std::sort(s.begin(), s.end(), KeyLess);
  owned->push_back(std::move(t));
  return owned->back().view();
}

Result<Tensor> PackedIndex(std::span<const std::pair<int64_t, int64_t>> slice_rows) {
  std::vector<int64_t> packed;
  packed.reserve(slice_rows.size());
  for (const auto& [slice, rows] : slice_rows) {
    if (rows > kMaxSliceRows) {
      return InvalidArgumentError(
          fmt::format("slice {} holds {} rows, more than the {} a slice of a checkpoint holds",
                      slice, rows, kMaxSliceRows));
    }
    packed.push_back(PackSlice(slice, rows));
  }
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, {static_cast<int64_t>(packed.size())}));
  if (!packed.empty()) std::memcpy(t.data(), packed.data(), packed.size() * sizeof(int64_t));
  return t;
}

Result<Tensor> PackSlices(std::span<const int64_t> ids) {
  std::vector<std::pair<int64_t, int64_t>> slice_rows;
  for (size_t i = 0; i < ids.size();) {
    const int64_t slice = SliceOf(ids[i]);
    size_t j = i + 1;
    while (j < ids.size() && SliceOf(ids[j]) == slice) ++j;
    slice_rows.emplace_back(slice, static_cast<int64_t>(j - i));
    i = j;
  }
  return PackedIndex(slice_rows);
}

Result<SortedTable> SortTable(const SparseTable& t, SliceRange range, int threads,
                              bool known_in_order) {
  SP_RETURN_IF_ERROR(CheckRange(t.ids(), range, "id"));
  SP_RETURN_IF_ERROR(CheckRange(t.deleted(), range, "deleted id"));
  SortedTable s;
  std::span<const int64_t> ids = t.ids();
  if (known_in_order || InStorageOrder(ids)) {  // no copy
    s.ids = t.ids_view();
    for (const SparseTable::Slot& slot : t.slots()) s.slots.push_back(slot.view);
  } else {
    const int64_t n = static_cast<int64_t>(ids.size());
    SP_ASSIGN_OR_RETURN(Tensor sorted, Tensor::Empty(DType::kI64, {n}));
    SP_ASSIGN_OR_RETURN(Tensor perm, Tensor::Empty(DType::kI64, {n}));
    SP_RETURN_IF_ERROR(Order(ids, range, sorted.as<int64_t>(), perm.as<int64_t>()));
    s.perm = perm.as<int64_t>();
    s.owned.push_back(std::move(perm));  // (a Tensor's memory stays put when it moves)
    s.owned.push_back(std::move(sorted));
    s.ids = s.owned.back().view();
    for (const SparseTable::Slot& slot : t.slots()) {
      const bool gather = slot.view.nbytes() >= kGatherSlotBytes;
      s.gathered.push_back(gather);
      if (gather) {
        s.slots.push_back(slot.view);
        continue;
      }
      SP_ASSIGN_OR_RETURN(Tensor rows, Gather(slot.view, s.perm, threads));
      s.owned.push_back(std::move(rows));
      s.slots.push_back(s.owned.back().view());
    }
  }
  s.gathered.resize(t.slots().size(), false);
  if (t.deleted().empty()) {
    static const int64_t kNone = 0;
    s.deleted = TensorView(&kNone, DType::kI64, {0});
  } else {
    const TensorView del(t.deleted().data(), DType::kI64,
                         {static_cast<int64_t>(t.deleted().size())});
    SP_ASSIGN_OR_RETURN(s.deleted, SortedIds(del, t.deleted(), &s.owned));
  }
  SP_ASSIGN_OR_RETURN(s.slices, PackSlices(IdsOf(s.ids)));
  SP_ASSIGN_OR_RETURN(s.deleted_slices, PackSlices(IdsOf(s.deleted)));
  return s;
}

}  // namespace savepoint::sparse
