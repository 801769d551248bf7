// LoadSparse: the rows of a shard's slices, from any number of saving shards, with the delta chain
// applied; compaction.
//
// Stored tables are in storage order, (slice, id) ascending, whatever the number of ranks that
// wrote them (save.cc), and their slice index counts the rows of each slice. So the rows of
// slices [B, E) are one row range [sum(counts[0, B)), sum(counts[0, E))) of every table tensor:
// LoadDistributed reads just the chunks of that range, from just the files (saving ranks) that
// hold it, verifying each. The index is read only where it covers [B, E): format 2 through the
// ranks tensor (the saving ranks whose slices meet [B, E)), format 1 through the shards of its
// dense counts. Then the chain is applied oldest first: both sides are in storage
// order, so each delta is one merge (a delta's row wins over the older one of the same id, its
// deleted ids are dropped).
#include "sparse/load.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/select.h"
#include "savepoint/distributed.h"

namespace savepoint::sparse {
namespace {

std::span<const int64_t> Ids(const Tensor& t) { return t.as<const int64_t>(); }

// Rows [first, last) of the named tensors of `link`, read with LoadDistributed (only the chunks
// that hold them).
Result<std::vector<Tensor>> ReadRows(Link& link, const std::vector<std::string>& names,
                                     int64_t first, int64_t last, const LoadOptions& load,
                                     const IoOptions& io) {
  std::vector<Tensor> out;
  State targets;
  ShardLayout layout;
  for (const std::string& name : names) {
    const format::TensorRecord& rec = link.reader->manifest().tensors[link.reader->IndexOf(name)];
    ShardSpec spec{rec.shape, Shape(rec.shape.size(), 0), rec.shape, {}};
    spec.offsets[0] = first;
    spec.sizes[0] = last - first;
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(rec.dtype, spec.sizes));
    SP_RETURN_IF_ERROR(targets.PutView(name, t.view()));
    layout[name] = std::move(spec);
    out.push_back(std::move(t));
  }
  if (last > first) SP_RETURN_IF_ERROR(LoadDistributed(link.path, targets, layout, load, io));
  return out;
}

// Format 1: the slice range of `link`'s dense counts tensor `counts` to read for `range`, and the
// row where its first slice starts: the union of the stored shards (saving ranks' parts) that
// intersect `range`, and the first row of the ids tensor's shard in the same file as the first of
// them (a rank's rows and counts share its data file). So a loader reads only the files that hold
// its slices. When no such ids shard exists, every count from slice 0 (and row 0).
std::pair<SliceRange, int64_t> CountsToRead(const Link& link, const std::string& counts,
                                            const std::string& ids, SliceRange range) {
  const engine::Reader& r = *link.reader;
  const format::TensorRecord& c = r.manifest().tensors[r.IndexOf(counts)];
  const format::TensorRecord& i = r.manifest().tensors[r.IndexOf(ids)];
  SliceRange read = range;
  const format::ShardRecord* first = nullptr;
  for (const format::ShardRecord& s : c.shards) {
    const int64_t begin = s.offsets[0], end = begin + s.sizes[0];
    if (end <= range.begin || begin >= range.end || begin == end) continue;
    read.begin = std::min(read.begin, begin);
    read.end = std::max(read.end, end);
    if (first == nullptr || begin < first->offsets[0]) first = &s;
  }
  for (const format::ShardRecord& s : i.shards) {
    if (first != nullptr && s.file == first->file) return {read, s.offsets[0]};
  }
  return {SliceRange{0, read.end}, 0};
}

// Format 1: the rows of `range` in a table whose slice counts are tensor `counts` of `link` and
// whose ids tensor `ids` has `total` rows: [first, last). Corruption when a count is negative or
// the rows run past `total`.
Result<std::pair<int64_t, int64_t>> RowRangeDense(Link& link, const std::string& counts,
                                                  const std::string& ids, int64_t total,
                                                  SliceRange range, const LoadOptions& load,
                                                  const IoOptions& io) {
  const auto [read, row] = CountsToRead(link, counts, ids, range);
  SP_ASSIGN_OR_RETURN(std::vector<Tensor> t,
                      ReadRows(link, {counts}, read.begin, read.end, load, io));
  std::span<const int64_t> c = Ids(t[0]);
  int64_t sum = row, first = 0;
  for (int64_t s = read.begin; s < range.end; ++s) {
    if (s == range.begin) first = sum;
    const int64_t n = c[s - read.begin];
    if (n < 0 || n > total - sum) {
      return CorruptionError(
          fmt::format("checkpoint {}: tensor {:?}: slice {} counts {} rows, past "
                      "the {} stored (or negative)",
                      link.path, counts, s, n, total));
    }
    sum += n;
  }
  return std::make_pair(first, sum);
}

// Format 2: a table's slice index, the rows of its ranks tensor of saving ranks [first, last]
// (those whose slices meet the range being read: only their files are read) and their entries.
struct PackedIndex {
  int64_t n = 0, first = 0, last = 0;  // N saving ranks; the ranks read
  int64_t cols = 0;
  Tensor ranks;  // rows [first, last]
  int64_t begin = 0, end = 0;
  Tensor packed;  // entries [begin, end) of the counts tensor
  int64_t At(int64_t rank, int col) const {
    return ranks.as<const int64_t>()[(rank - first) * cols + col];
  }
};

// Reads the index of saving ranks [first, last] (`counts`, `ranks`: the tensors; `col`: the ranks
// column of `counts`). Corruption naming the tensor when their entries are no range of it.
Result<PackedIndex> ReadPackedIndex(Link& link, const std::string& counts, const std::string& ranks,
                                    int col, SliceRange range, const LoadOptions& load,
                                    const IoOptions& io) {
  const engine::Reader& r = *link.reader;
  const format::TensorRecord& rec = r.manifest().tensors[r.IndexOf(ranks)];
  const int64_t k = r.manifest().tensors[r.IndexOf(counts)].shape[0];
  PackedIndex x;
  x.n = rec.shape[0];
  x.cols = rec.shape[1];
  x.first = SavingRankOf(range.begin, x.n);
  x.last = SavingRankOf(range.end - 1, x.n);
  SP_ASSIGN_OR_RETURN(std::vector<Tensor> t,
                      ReadRows(link, {ranks}, x.first, x.last + 1, load, io));
  x.ranks = std::move(t[0]);
  x.begin = x.At(x.first, col);
  const int64_t last = x.At(x.last, col), entries = x.At(x.last, col + 1);
  if (x.begin < 0 || last < x.begin || last > k || entries < 0 || entries > k - last) {
    return CorruptionError(fmt::format(
        "checkpoint {}: tensor {:?}: saving ranks {} to {} give entries [{}, {} + {}) of the {} "
        "of {:?}",
        link.path, ranks, x.first, x.last, x.begin, last, entries, k, counts));
  }
  x.end = last + entries;
  SP_ASSIGN_OR_RETURN(t, ReadRows(link, {counts}, x.begin, x.end, load, io));
  x.packed = std::move(t[0]);
  return x;
}

// Format 2: the rows [first, last) of `range` in the table tensor of `total` rows whose packed
// slice index is `counts` (ranks columns `col`: first entry, entries, first row). Corruption
// naming the tensor when the index is not ascending slices of each rank's own range, its entries
// and rows do not follow the ranks before it, or they run past `total`.
Result<std::pair<int64_t, int64_t>> RowRangePacked(Link& link, const std::string& counts,
                                                   const std::string& ranks, int col, int64_t total,
                                                   SliceRange range, const LoadOptions& load,
                                                   const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(PackedIndex x, ReadPackedIndex(link, counts, ranks, col, range, load, io));
  std::span<const int64_t> packed = x.packed.as<const int64_t>();
  auto bad = [&](int64_t rank, std::string_view what) {
    return CorruptionError(fmt::format("checkpoint {}: tensor {:?}: saving rank {} of {}: {}",
                                       link.path, counts, rank, x.n, what));
  };
  int64_t first = -1, sum = 0, next = x.begin;
  for (int64_t rank = x.first; rank <= x.last; ++rank) {
    const int64_t b = x.At(rank, col), e = b + x.At(rank, col + 1), start = x.At(rank, col + 2);
    if (b != next || e < b || e > x.end || start < 0 || start > total ||
        (rank > x.first && start != sum)) {
      return bad(rank, fmt::format("its entries [{}, {}) or first row {} do not follow the "
                                   "ranks before it",
                                   b, e, start));
    }
    next = e;
    sum = start;
    const SliceRange own = *GenSlice(static_cast<int>(rank), static_cast<int>(x.n));
    int64_t prev = own.begin - 1;
    for (int64_t p = b; p < e; ++p) {
      const int64_t v = packed[p - x.begin];
      const int64_t slice = v & (kNumSlices - 1), rows = v >> 16;
      if (v <= 0 || rows < 1 || slice <= prev || slice >= own.end || rows > total - sum) {
        return bad(rank, fmt::format("entry {} ({}) is not a later slice of its range [{}, {}) "
                                     "with rows among the {} stored",
                                     p, v, own.begin, own.end, total));
      }
      prev = slice;
      if (slice >= range.end) break;
      if (slice >= range.begin && first < 0) first = sum;
      sum += rows;
    }
  }
  return std::make_pair(first < 0 ? sum : first, sum);
}

// The rows of `range` in table `t` of `link`: of its ids and slots, or (`deleted`) of its deleted
// ids.
Result<std::pair<int64_t, int64_t>> RowRange(Link& link, const StoredTable& t, bool deleted,
                                             SliceRange range, const LoadOptions& load,
                                             const IoOptions& io) {
  const engine::Reader& r = *link.reader;
  const std::string& ids = deleted ? t.names.deleted : t.names.ids;
  const std::string& counts = deleted ? t.names.deleted_counts : t.names.counts;
  const int64_t total = r.manifest().tensors[r.IndexOf(ids)].shape[0];
  if (link.desc.format == 1) return RowRangeDense(link, counts, ids, total, range, load, io);
  return RowRangePacked(link, counts, t.names.ranks, deleted ? kRankDeletedSlices : kRankSlices,
                        total, range, load, io);
}

// Corruption unless `ids` are in strict storage order and within `range`.
Status CheckIds(std::span<const int64_t> ids, SliceRange range, const Link& link,
                const std::string& tensor) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!range.Contains(SliceOf(ids[i])) || (i > 0 && !KeyLess(ids[i - 1], ids[i]))) {
      return CorruptionError(fmt::format(
          "checkpoint {}: tensor {:?}: id {} at row {} is out of order or outside the slices its "
          "counts give",
          link.path, tensor, ids[i], i));
    }
  }
  return Status::OK();
}

// The ids and the slots named `slots` of table `t` of `link`, for `range`.
Result<Rows> ReadTable(Link& link, const StoredTable& t, const std::vector<std::string>& slots,
                       SliceRange range, const LoadOptions& load, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(auto rows, RowRange(link, t, /*deleted=*/false, range, load, io));
  std::vector<std::string> names = {t.names.ids};
  for (const std::string& slot : slots) {
    for (const auto& [name, tensor] : t.names.slots) {
      if (name == slot) names.push_back(tensor);
    }
  }
  SP_ASSIGN_OR_RETURN(std::vector<Tensor> read,
                      ReadRows(link, names, rows.first, rows.second, load, io));
  SP_RETURN_IF_ERROR(CheckIds(Ids(read[0]), range, link, t.names.ids));
  Rows out{std::move(read[0]), {}};
  for (size_t k = 1; k < read.size(); ++k) out.slots.push_back(std::move(read[k]));
  return out;
}

// The deleted ids of delta table `t` of `link` in `range`.
Result<Tensor> ReadDeleted(Link& link, const StoredTable& t, SliceRange range,
                           const LoadOptions& load, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(auto rows, RowRange(link, t, /*deleted=*/true, range, load, io));
  SP_ASSIGN_OR_RETURN(std::vector<Tensor> read,
                      ReadRows(link, {t.names.deleted}, rows.first, rows.second, load, io));
  SP_RETURN_IF_ERROR(CheckIds(Ids(read[0]), range, link, t.names.deleted));
  return std::move(read[0]);
}

// Where each row of a merge comes from: row `row` of the older rows (delta false) or the delta's.
struct Pick {
  bool delta;
  int64_t row;
};

// The rows of `older` updated by `delta` and without `deleted` (all in storage order).
std::vector<Pick> MergeOrder(std::span<const int64_t> older, std::span<const int64_t> delta,
                             std::span<const int64_t> deleted) {
  std::vector<Pick> picks;
  picks.reserve(older.size() + delta.size());
  size_t i = 0, j = 0, k = 0;
  while (i < older.size() || j < delta.size()) {
    const bool take_delta = i == older.size() || (j < delta.size() && !KeyLess(older[i], delta[j]));
    if (take_delta) {
      if (i < older.size() && older[i] == delta[j]) ++i;  // replaced
      picks.push_back({true, static_cast<int64_t>(j++)});
      continue;
    }
    while (k < deleted.size() && KeyLess(deleted[k], older[i])) ++k;
    if (k == deleted.size() || deleted[k] != older[i]) picks.push_back({false, int64_t(i)});
    ++i;
  }
  return picks;
}

// Copies the rows `picks` of `older` / `delta` (same dtype and row shape) into a new tensor.
// Rows that fit apart may not fit together (two rows of [2^62, 0] are no shape): Corruption
// naming `what`.
Result<Tensor> CopyPicks(const Tensor& older, const Tensor& delta, const std::vector<Pick>& picks,
                         std::string_view what) {
  Shape shape = older.shape();
  shape[0] = static_cast<int64_t>(picks.size());
  if (Result<uint64_t> n = NumBytes(older.dtype(), shape); !n.ok()) {
    return CorruptionError(fmt::format("{}: the merged rows make the invalid shape {} ({})", what,
                                       ShapeToString(shape), n.status().message()));
  }
  SP_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(older.dtype(), shape));
  const uint64_t rb = SparseTable::RowBytes(older.view()) != 0
                          ? SparseTable::RowBytes(older.view())
                          : SparseTable::RowBytes(delta.view());
  for (size_t i = 0; i < picks.size(); ++i) {
    const Tensor& src = picks[i].delta ? delta : older;
    std::memcpy(out.data() + i * rb, src.data() + picks[i].row * rb, rb);
  }
  return out;
}

// `older` updated by `delta` of table `table` of chain link `path`, whose rows hold `slots`.
Result<Rows> Apply(const Rows& older, const Rows& delta, const Tensor& deleted,
                   const std::string& path, const std::string& table,
                   const std::vector<std::string>& slots) {
  const std::vector<Pick> picks = MergeOrder(Ids(older.ids), Ids(delta.ids), Ids(deleted));
  const std::string where = fmt::format("checkpoint {}: table {:?}", path, table);
  Rows out;
  SP_ASSIGN_OR_RETURN(out.ids, CopyPicks(older.ids, delta.ids, picks, where + ": ids"));
  for (size_t k = 0; k < older.slots.size(); ++k) {
    SP_ASSIGN_OR_RETURN(Tensor t, CopyPicks(older.slots[k], delta.slots[k], picks,
                                            fmt::format("{}: slot {:?}", where, slots[k])));
    out.slots.push_back(std::move(t));
  }
  return out;
}

const StoredTable* FindStored(const Desc& d, std::string_view name) {
  for (const StoredTable& t : d.tables) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The names of `all` that `patterns` select (all when empty); NotFound for a pattern that selects
// nothing (`what` names the kind of thing).
Result<std::vector<std::string>> Select(const std::vector<std::string>& patterns,
                                        const std::vector<std::string>& all,
                                        std::string_view what) {
  for (const std::string& p : patterns) {
    if (std::none_of(all.begin(), all.end(), [&](const auto& n) { return MatchesName(p, n); })) {
      return NotFoundError(fmt::format("no {} matches {:?}", what, p));
    }
  }
  std::vector<std::string> out;
  for (const std::string& n : all) {
    if (engine::Selected(patterns, n)) out.push_back(n);
  }
  return out;
}

// The slots to load of `table`, checking slot_dtypes.
Result<std::vector<std::string>> PickSlots(const std::string& table,
                                           const std::vector<SlotSchema>& slots,
                                           const SparseLoadOptions& o) {
  std::vector<std::string> out;
  for (const SlotSchema& s : slots) {
    if (!engine::Selected(o.slots, s.name)) continue;
    auto want = o.slot_dtypes.find(s.name);
    if (want != o.slot_dtypes.end() && want->second != s.dtype) {
      return InvalidArgumentError(
          fmt::format("table {:?}: slot {:?} is {} in the checkpoint, {} "
                      "was asked for",
                      table, s.name, DTypeName(s.dtype), DTypeName(want->second)));
    }
    out.push_back(s.name);
  }
  return out;
}

// One selected table: its stored name, the name it is returned under and the slots to load.
struct Selected {
  std::string name, as;
  std::vector<std::string> slots;
};

// The tables and slots `o` selects, in name order.
Result<std::vector<Selected>> SelectTables(const Schema& schema, const SparseLoadOptions& o) {
  std::vector<std::string> names, all_slots;
  for (const auto& [name, slots] : schema) {
    names.push_back(name);
    for (const SlotSchema& s : slots) all_slots.push_back(s.name);
  }
  SP_ASSIGN_OR_RETURN(std::vector<std::string> tables, Select(o.tables, names, "table"));
  SP_RETURN_IF_ERROR(Select(o.slots, all_slots, "slot").status());
  for (const auto& [from, to] : o.rename) {
    if (schema.count(from) == 0) return NotFoundError(fmt::format("rename: no table {:?}", from));
  }
  std::vector<Selected> out;
  for (const std::string& name : tables) {
    SP_ASSIGN_OR_RETURN(std::vector<std::string> slots, PickSlots(name, schema.at(name), o));
    auto it = o.rename.find(name);
    out.push_back({name, it == o.rename.end() ? name : it->second, std::move(slots)});
  }
  return out;
}

// The slice ranges that split `range` into batches of about `batch_bytes` of a table whose rows
// over every slice take about `bytes` (slices evenly filled, as hashed ids fill them); one batch
// when batch_bytes is 0.
std::vector<SliceRange> Batches(SliceRange range, uint64_t bytes, uint64_t batch_bytes) {
  const int64_t width = range.end - range.begin;
  int64_t n = 1;
  if (batch_bytes > 0) {
    const long double share = static_cast<long double>(bytes) * width / kNumSlices;
    n = static_cast<int64_t>(std::clamp<long double>(std::ceil(share / batch_bytes), 1, width));
  }
  std::vector<SliceRange> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back({range.begin + width * i / n, range.begin + width * (i + 1) / n});
  }
  return out;
}

// Loads the selected tables of this shard, handing each to `sink` in batches of slices of about
// `batch_bytes` (0: each table whole), in storage order. A table without rows in the shard gets
// one empty batch; a batch without rows is skipped otherwise.
Status LoadTables(std::vector<Link>& chain, const Schema& schema, const SparseLoadOptions& o,
                  const IoOptions& io, uint64_t batch_bytes, const SparseBatchSink& sink) {
  SP_ASSIGN_OR_RETURN(std::vector<Selected> selected, SelectTables(schema, o));
  const SliceRange range = *GenSlice(o.shard_id, o.shard_num);
  for (const Selected& t : selected) {
    const uint64_t bytes = batch_bytes > 0 ? ChainTableBytes(chain, t.name, t.slots) : 0;
    const std::vector<SliceRange> batches = Batches(range, bytes, batch_bytes);
    bool handed = false;
    for (size_t i = 0; i < batches.size(); ++i) {
      SP_ASSIGN_OR_RETURN(Rows rows, LoadTable(chain, t.name, t.slots, batches[i], o.load, io));
      if (rows.ids.shape()[0] == 0 && (handed || i + 1 < batches.size())) continue;
      std::vector<std::pair<std::string, Tensor>> named;
      for (size_t k = 0; k < t.slots.size(); ++k) {
        named.emplace_back(t.slots[k], std::move(rows.slots[k]));
      }
      SP_ASSIGN_OR_RETURN(SparseTable table,
                          SparseTable::FromTensors(std::move(rows.ids), std::move(named)));
      SP_RETURN_IF_ERROR(sink(t.as, std::move(table)));
      handed = true;
    }
  }
  return Status::OK();
}

// Opens and checks the chain of a sparse load.
Result<std::vector<Link>> OpenForLoad(const std::string& path, const SparseLoadOptions& o,
                                      const IoOptions& io, Schema* schema) {
  SP_RETURN_IF_ERROR(CheckLoadOptions(o));
  SP_ASSIGN_OR_RETURN(std::vector<Link> chain, OpenChain(path, o.load, io));
  SP_ASSIGN_OR_RETURN(*schema, ChainSchema(chain));
  return chain;
}

}  // namespace

Status CheckLoadOptions(const SparseLoadOptions& o) {
  if (o.load.mmap || !o.load.names.empty() || o.load.stats != nullptr || o.load.progress) {
    return InvalidArgumentError(
        "a checkpoint with sparse tables is loaded by LoadSparse, whose LoadOptions must leave "
        "mmap, "
        "names, stats and progress at their defaults (select with SparseLoadOptions)");
  }
  return GenSlice(o.shard_id, o.shard_num).status();
}

Result<Schema> ChainSchema(const std::vector<Link>& chain) {
  Schema schema = SchemaOf(chain.back());
  for (size_t l = 0; l + 1 < chain.size(); ++l) {
    SP_RETURN_IF_ERROR(CheckDeltaSchema(
        SchemaOf(chain[l]), StatusCode::kCorruption,
        fmt::format("delta chain link {} -> {}", chain[l].path, chain[l + 1].path), schema));
  }
  return schema;
}

Result<Rows> LoadTable(std::vector<Link>& chain, const std::string& name,
                       const std::vector<std::string>& slots, SliceRange range,
                       const LoadOptions& load, const IoOptions& io) {
  Link& base = chain.back();
  SP_ASSIGN_OR_RETURN(Rows rows,
                      ReadTable(base, *FindStored(base.desc, name), slots, range, load, io));
  for (size_t l = chain.size() - 1; l-- > 0;) {
    const StoredTable* t = FindStored(chain[l].desc, name);
    if (t == nullptr) continue;  // unchanged in this delta
    SP_ASSIGN_OR_RETURN(Rows delta, ReadTable(chain[l], *t, slots, range, load, io));
    SP_ASSIGN_OR_RETURN(Tensor deleted, ReadDeleted(chain[l], *t, range, load, io));
    SP_ASSIGN_OR_RETURN(rows, Apply(rows, delta, deleted, chain[l].path, name, slots));
  }
  return rows;
}

uint64_t ChainTableBytes(const std::vector<Link>& chain, const std::string& name,
                         const std::vector<std::string>& slots) {
  uint64_t bytes = 0;
  for (const Link& link : chain) {
    const StoredTable* t = FindStored(link.desc, name);
    if (t == nullptr) continue;
    const format::Manifest& m = link.reader->manifest();
    const int64_t rows = m.tensors[link.reader->IndexOf(t->names.ids)].shape[0];
    uint64_t row = sizeof(int64_t);
    for (const auto& [slot, tensor] : t->names.slots) {
      if (std::find(slots.begin(), slots.end(), slot) == slots.end()) continue;
      const format::TensorRecord& rec = m.tensors[link.reader->IndexOf(tensor)];
      Result<uint64_t> n = NumBytes(rec.dtype, Shape(rec.shape.begin() + 1, rec.shape.end()));
      row += n.ok() ? *n : 0;  // DecodeDesc checked the shapes
    }
    uint64_t link_bytes = 0;  // saturating: the caller cuts batches from it
    if (__builtin_mul_overflow(static_cast<uint64_t>(rows), row, &link_bytes) ||
        __builtin_add_overflow(bytes, link_bytes, &bytes)) {
      return UINT64_MAX;
    }
  }
  return bytes;
}

Status LoadDense(engine::Reader& r, const LoadOptions& load, State& into) {
  std::vector<std::pair<size_t, engine::Destination>> jobs;
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const TensorInfo& info = r.tensors()[i];
    if (info.name.starts_with(kTensorPrefix)) continue;
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info.dtype, info.shape));
    jobs.emplace_back(i, engine::Destination{t.data(), t.capacity()});
    SP_RETURN_IF_ERROR(into.Put(info.name, std::move(t)));
  }
  SP_RETURN_IF_ERROR(r.ReadMany(jobs, nullptr, load.verify_checksums));
  return CopyUserValues(r, into);
}

Status CopyUserValues(const engine::Reader& r, State& into) {
  State values;
  SP_RETURN_IF_ERROR(engine::CopyValues(r.values(), &values));
  values.Erase(format::kSparseValueName);
  return engine::CopyValues(values, &into);
}

}  // namespace savepoint::sparse

namespace savepoint {

Status LoadSparseInto(const std::string& path, State& into, const SparseLoadOptions& o,
                      const IoOptions& io) {
  const std::string context = fmt::format("sparse load {}", path);
  sparse::Schema schema;
  Result<std::vector<sparse::Link>> chain = sparse::OpenForLoad(path, o, io, &schema);
  if (!chain.ok()) return chain.status().WithContext(context);
  auto put = [&](const std::string& name, SparseTable t) {
    return into.PutTable(name, std::move(t));
  };
  SP_RETURN_IF_ERROR(sparse::LoadTables(*chain, schema, o, io, 0, put).WithContext(context));
  if (!o.dense) return Status::OK();
  return sparse::LoadDense(*chain->front().reader, o.load, into).WithContext(context);
}

Result<State> LoadSparse(const std::string& path, const SparseLoadOptions& o, const IoOptions& io) {
  State state;
  SP_RETURN_IF_ERROR(LoadSparseInto(path, state, o, io));
  return state;
}

Result<State> LoadSparseBatches(const std::string& path, const SparseBatchSink& sink,
                                const SparseLoadOptions& o, uint64_t batch_bytes,
                                const IoOptions& io) {
  const std::string context = fmt::format("sparse batched load {}", path);
  if (!sink) return InvalidArgumentError(context + ": no sink");
  sparse::Schema schema;
  Result<std::vector<sparse::Link>> chain = sparse::OpenForLoad(path, o, io, &schema);
  if (!chain.ok()) return chain.status().WithContext(context);
  SP_RETURN_IF_ERROR(
      sparse::LoadTables(*chain, schema, o, io, batch_bytes, sink).WithContext(context));
  State dense;
  if (o.dense) {
    SP_RETURN_IF_ERROR(
        sparse::LoadDense(*chain->front().reader, o.load, dense).WithContext(context));
  }
  return dense;
}

Result<std::vector<SparseChainLink>> SparseChain(const std::string& path, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(std::vector<sparse::Link> chain, sparse::OpenChain(path, LoadOptions{}, io));
  std::vector<SparseChainLink> out;
  for (const sparse::Link& l : chain) {
    out.push_back({l.path, l.reader->manifest().checkpoint_id, l.desc.depth});
  }
  return out;
}

bool ShouldCompact(int64_t depth, uint64_t delta_bytes, uint64_t base_bytes,
                   const CompactionPolicy& policy) {
  return depth > policy.max_depth || static_cast<double>(delta_bytes) >
                                         policy.max_delta_ratio * static_cast<double>(base_bytes);
}

}  // namespace savepoint
