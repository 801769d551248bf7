// Flatten: a State with tables becomes a State of tensors (the tables' rows in storage order,
// views where they already are) plus the description value (docs/FORMAT.md §11), handed to the
// engine as a WriteRequest (src/api/save.cc), so chunking, checksums, compression, encryption and
// the commit protocol are the engine's.
//
// A distributed save first all-gathers every rank's counts (rows, deleted ids, slices holding
// either) and table schemas: rank r's entries of each table tensor follow those of ranks < r, so
// every rank's part is one box in its own data file and the global tensors are in storage order;
// its row of the ranks tensor records where its parts start.
#include "sparse/save.h"

#include <fmt/format.h>

#include "engine/select.h"
#include "savepoint/distributed.h"
#include "sparse/chain.h"

namespace savepoint::sparse {
namespace {

Status CheckDense(const State& state) {
  for (const auto& [name, e] : state.entries()) {
    if (name.starts_with(kTensorPrefix) || name == format::kSparseValueName) {
      return InvalidArgumentError(fmt::format(
          "entry {:?}: the prefix {:?} and the name {:?} are reserved for sparse tables", name,
          kTensorPrefix, format::kSparseValueName));
    }
  }
  return Status::OK();
}

// The schema of the tables of `state`.
Schema SchemaOfState(const State& state) {
  Schema schema;
  for (const auto& [name, t] : state.tables()) {
    std::vector<SlotSchema>& slots = schema[name];
    for (const SparseTable::Slot& s : t->slots()) {
      slots.push_back(
          {s.name, s.view.dtype(), Shape(s.view.shape().begin() + 1, s.view.shape().end())});
    }
  }
  return schema;
}

// For a delta: records the base in `d` and checks the tables against the base chain's.
Status PrepareDelta(const State& state, const std::string& path, const SparseSaveOptions& o,
                    const IoOptions& io, Desc* d) {
  if (o.base.empty()) {
    for (const auto& [name, t] : state.tables()) {
      if (!t->deleted().empty()) {
        return InvalidArgumentError(fmt::format(
            "table {:?} has deleted ids, but SparseSaveOptions.base is empty (a full save)", name));
      }
    }
    return Status::OK();
  }
  SP_ASSIGN_OR_RETURN(d->base, RecordBase(path, o.base));
  Result<std::vector<Link>> chain = OpenChain(o.base, LoadOptions{}, io);  // manifests only
  if (!chain.ok()) return chain.status().WithContext(fmt::format("delta save {}: base", path));
  d->base_id = chain->front().reader->manifest().checkpoint_id;
  d->depth = chain->front().desc.depth + 1;
  if (d->depth > kMaxChainDepth) {
    return InvalidArgumentError(
        fmt::format("delta save {}: the chain would exceed {} deltas "
                    "(compact it: CompactSparse)",
                    path, kMaxChainDepth));
  }
  return CheckDeltaSchema(SchemaOfState(state), StatusCode::kInvalidArgument,
                          fmt::format("delta save {} on {}", path, o.base),
                          SchemaOf(chain->back()));
}

// This rank's entries of a sorted table, per Part.
std::vector<int64_t> Counts(const SortedTable& s) {
  return {s.ids.shape()[0], s.deleted.shape()[0], s.slices.shape()[0], s.deleted_slices.shape()[0]};
}

// Adds `view` as tensor `name` of `flat`, this rank's box at `row` of a global tensor of `rows`
// rows (dims after the first whole).
Status AddPart(const std::string& name, const TensorView& view, int64_t row, int64_t rows,
               Flat* flat) {
  ShardSpec spec;
  spec.global_shape = view.shape();
  spec.global_shape[0] = rows;
  spec.offsets = Shape(view.shape().size(), 0);
  spec.offsets[0] = row;
  spec.sizes = view.shape();
  spec.replicas = {};  // this rank only
  flat->layout[name] = std::move(spec);
  return flat->state.PutView(name, view);
}

// This rank's row of a table's ranks tensor (docs/FORMAT.md §11), kept in `flat`.
Result<TensorView> RankRow(const Placement& p, Flat* flat) {
  const bool delta = flat->desc.delta();
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, {1, RankColumns(delta)}));
  std::span<int64_t> row = t.as<int64_t>();
  row[kRankSlices] = p.offset[kSlices];
  row[kRankEntries] = p.count[kSlices];
  row[kRankIds] = p.offset[kRows];
  if (delta) {
    row[kRankDeletedSlices] = p.offset[kDeletedSlices];
    row[kRankDeletedEntries] = p.count[kDeletedSlices];
    row[kRankDeleted] = p.offset[kDeleted];
  }
  flat->index.push_back(std::move(t));
  return flat->index.back().view();
}

// The tensors of table `name` (number `index` in name order; slots named `slots`, sorted into `s`)
// into `flat`.
Status AddTable(const std::string& name, size_t index, const std::vector<std::string>& slots,
                const SortedTable& s, Rank rank, const Placement& p, Flat* flat) {
  StoredTable stored{name, NamesFor(index, name, slots, flat->desc.delta())};
  const StoredNames& n = stored.names;
  SP_RETURN_IF_ERROR(AddPart(n.ids, s.ids, p.offset[kRows], p.total[kRows], flat));
  SP_RETURN_IF_ERROR(AddPart(n.counts, s.slices.view(), p.offset[kSlices], p.total[kSlices], flat));
  SP_ASSIGN_OR_RETURN(TensorView ranks, RankRow(p, flat));
  SP_RETURN_IF_ERROR(AddPart(n.ranks, ranks, rank.index, rank.size, flat));
  for (size_t k = 0; k < slots.size(); ++k) {
    SP_RETURN_IF_ERROR(
        AddPart(n.slots[k].second, s.slots[k], p.offset[kRows], p.total[kRows], flat));
    if (s.gathered[k]) {
      flat->gathers[n.slots[k].second] = {s.slots[k].data(), s.perm.data(), s.perm.size(),
                                          SparseTable::RowBytes(s.slots[k])};
    }
    if (s.late) flat->late.names.insert(n.slots[k].second);
  }
  if (s.late) flat->late.names.insert(n.ids);
  if (flat->desc.delta()) {
    SP_RETURN_IF_ERROR(AddPart(n.deleted, s.deleted, p.offset[kDeleted], p.total[kDeleted], flat));
    SP_RETURN_IF_ERROR(AddPart(n.deleted_counts, s.deleted_slices.view(), p.offset[kDeletedSlices],
                               p.total[kDeletedSlices], flat));
  }
  flat->desc.tables.push_back(std::move(stored));
  return Status::OK();
}

// Sorts every table of `state` (name order) into `flat->sorted`, or stages it (flat->buffers).
Status SortAll(const State& state, SliceRange range, int threads, Flat* flat) {
  for (const auto& [name, t] : state.tables()) {
    // (one pass over the ids decides both: staged, or rows already in order)
    const bool large = flat->buffers != nullptr && Stageable(*t);
    const bool in_order = large && InStorageOrder(t->ids());
    Result<SortedTable> s = Status();
    if (large && !in_order) {
      s = StageTable(*t, range, threads, flat->buffers.get(), &flat->leased,
                     &flat->staged.emplace_back());
    } else {
      s = SortTable(*t, range, threads, in_order);
    }
    if (!s.ok()) return s.status().WithContext(fmt::format("sparse table {:?}", name));
    flat->sorted.push_back(std::move(*s));
  }
  return Status::OK();
}

// Fills `flat->state`: the dense tensors (views), values and metadata of `state`, every table's
// tensors placed by `places` (one per table, name order), and the description.
Status Fill(const State& state, Rank rank, const std::vector<Placement>& places, Flat* flat) {
  SP_RETURN_IF_ERROR(engine::CopyValues(state, &flat->state));
  for (const auto& [name, e] : state.entries()) {
    if (e.is_tensor()) SP_RETURN_IF_ERROR(flat->state.PutView(name, e.tensor()));
  }
  size_t i = 0;
  for (const auto& [name, t] : state.tables()) {
    std::vector<std::string> slots;
    for (const SparseTable::Slot& slot : t->slots()) slots.push_back(slot.name);
    SP_RETURN_IF_ERROR(AddTable(name, i, slots, flat->sorted[i], rank, places[i], flat));
    ++i;
  }
  return flat->state.PutValue(std::string(format::kSparseValueName),
                              Value::FromJson(EncodeDesc(flat->desc)));
}

// Checks `state` and prepares `flat` (sorted tables, the delta's base) for rank `range`'s slices.
Status Prepare(const State& state, const std::string& path, const SparseSaveOptions& o,
               const IoOptions& io, SliceRange range, Flat* flat) {
  SP_RETURN_IF_ERROR(CheckDense(state));
  SP_RETURN_IF_ERROR(PrepareDelta(state, path, o, io, &flat->desc));
  const int threads = o.concurrency > 0 ? o.concurrency : io.io_threads;
  return SortAll(state, range, threads, flat);
}

// The engine's request for the flattened state: `in` with flat's state, layout and gathers, and
// the table options' concurrency as the writer threads.
void MakeRequest(const engine::WriteRequest& in, const SparseSaveOptions& o, Flat* flat) {
  engine::WriteRequest& r = flat->request;
  r = in;
  r.state = &flat->state;
  r.gathers = &flat->gathers;
  if (!flat->late.names.empty()) {
    flat->late.prepare = [flat]() -> Status {
      for (const Staged& s : flat->staged) SP_RETURN_IF_ERROR(SortStaged(s));
      return Status::OK();
    };
    r.late = &flat->late;
  }
  if (in.topology.comm != nullptr) r.topology.layout = &flat->layout;
  if (o.concurrency > 0) r.io.io_threads = o.concurrency;
}

// --- Distributed: one all-gather of every rank's row counts and schemas. ---

// This rank's message: its error, or per table (name order) its name, Counts and schema.
std::string EncodeCounts(const Status& prepared, const State& state, const Flat& flat, int shard) {
  if (!prepared.ok()) {
    return Json{{"code", static_cast<int>(prepared.code())}, {"error", prepared.message()}}.dump();
  }
  Json tables = Json::array();
  const Schema schema = SchemaOfState(state);
  size_t i = 0;
  for (const auto& [name, t] : state.tables()) {
    Json slots = Json::array();
    for (const auto& s : schema.at(name)) {
      slots.push_back({s.name, DTypeName(s.dtype), s.row});
    }
    tables.push_back({name, Counts(flat.sorted[i]), slots});
    ++i;
  }
  return Json{{"tables", tables}, {"shard", shard}}.dump();
}

// Whether two ranks' table lists (EncodeCounts) name the same tables with the same slots.
bool SameTables(const Json& a, const Json& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i][0] != b[i][0] || a[i][2] != b[i][2]) return false;
  }
  return true;
}

// The shard of every rank's message (`msgs`); InvalidArgument unless they are a permutation of
// 0..N-1 (N ranks).
Result<std::vector<int64_t>> ShardsOf(const std::vector<Json>& msgs) {
  std::vector<int64_t> shards, owner(msgs.size(), -1);
  for (size_t r = 0; r < msgs.size(); ++r) {
    const Json shard = msgs[r].value("shard", Json());
    if (!shard.is_number_integer()) return InternalError("bad sparse save message");
    const int64_t s = shard.get<int64_t>();
    if (s < 0 || s >= static_cast<int64_t>(msgs.size()) || owner[s] >= 0) {
      return InvalidArgumentError(fmt::format(
          "rank {} saves the rows of shard {}{}: each of the {} ranks must save a different "
          "shard of {}",
          r, s,
          s >= 0 && s < static_cast<int64_t>(msgs.size()) && owner[s] >= 0
              ? fmt::format(", as rank {} does", owner[s])
              : "",
          msgs.size(), msgs.size()));
    }
    owner[s] = static_cast<int64_t>(r);
    shards.push_back(s);
  }
  return shards;
}

// This rank's placement of every table from the gathered messages: its entries follow those of
// the ranks saving lower shards. The first rank's error, or InvalidArgument naming a rank whose
// tables differ from rank 0's or whose shard is taken. The same verdict on every rank.
Result<std::vector<Placement>> Place(const std::vector<std::string>& all, int rank) {
  std::vector<Json> msgs;
  for (size_t r = 0; r < all.size(); ++r) {
    msgs.push_back(Json::parse(all[r], nullptr, false));
    const Json& m = msgs.back();
    if (m.is_discarded() || !m.is_object()) return InternalError("bad sparse save message");
    if (m.contains("error")) {
      return Status(static_cast<StatusCode>(m["code"].get<int>()),
                    fmt::format("rank {}: {}", r, m["error"].get<std::string>()));
    }
  }
  SP_ASSIGN_OR_RETURN(std::vector<int64_t> shards, ShardsOf(msgs));
  const Json& tables0 = msgs[0]["tables"];
  std::vector<Placement> places(tables0.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    const Json& tables = msgs[r]["tables"];
    if (!SameTables(tables, tables0)) {
      return InvalidArgumentError(fmt::format(
          "rank {} holds tables {}, rank 0 {}: every rank must hold the same tables and slots", r,
          tables.dump().substr(0, 512), tables0.dump().substr(0, 512)));
    }
    for (size_t i = 0; i < tables.size(); ++i) {
      for (int k = 0; k < kParts; ++k) {
        const int64_t n = tables[i][1][k].get<int64_t>();
        if (shards[r] < shards[rank]) places[i].offset[k] += n;
        if (static_cast<int>(r) == rank) places[i].count[k] = n;
        places[i].total[k] += n;
      }
    }
  }
  return places;
}

// One process: every slice is this process's.
Status FlattenLocal(const State& state, const SparseSaveOptions& o, const IoOptions& io,
                    const std::string& path, Flat* flat) {
  if (o.shard_id != -1 || o.shard_num != 0) {
    return InvalidArgumentError(
        "SparseSaveOptions.shard_id / shard_num are for distributed saves; a save of one process "
        "holds every shard");
  }
  SP_RETURN_IF_ERROR(Prepare(state, path, o, io, SliceRange{}, flat));
  std::vector<Placement> places;
  for (const auto& s : flat->sorted) {
    Placement p;
    const std::vector<int64_t> counts = Counts(s);
    std::copy(counts.begin(), counts.end(), p.total);
    std::copy(counts.begin(), counts.end(), p.count);
    places.push_back(p);
  }
  return Fill(state, Rank{}, places, flat);
}

// Every rank of `comm`: its slices, placed after the rows of the ranks before it.
Status FlattenDistributed(Communicator& comm, const State& local, const ShardLayout& layout,
                          const SparseSaveOptions& o, const IoOptions& io, const std::string& path,
                          Flat* flat) {
  const bool mine = o.shard_id == -1 && o.shard_num == 0;  // the rank's place in comm
  const Rank shard = mine ? Rank{comm.rank(), comm.size()} : Rank{o.shard_id, o.shard_num};
  Result<SliceRange> range = GenSlice(shard.index, shard.size);
  Status prepared = range.status();
  if (prepared.ok() && shard.size != comm.size()) {
    prepared = InvalidArgumentError(
        fmt::format("SparseSaveOptions.shard_num is {}, the communicator has {} ranks", shard.size,
                    comm.size()));
  }
  if (prepared.ok()) prepared = Prepare(local, path, o, io, *range, flat);
  SP_ASSIGN_OR_RETURN(std::vector<std::string> all,
                      comm.AllGather(EncodeCounts(prepared, local, *flat, shard.index), o.timeout));
  Result<std::vector<Placement>> places = Place(all, comm.rank());
  Status filled = places.status();
  if (filled.ok()) filled = Fill(local, shard, *places, flat);
  for (const auto& [name, spec] : layout) {
    if (filled.ok() && flat->layout.count(name) == 0) flat->layout[name] = spec;
  }
  if (!places.ok()) return places.status();  // on every rank
  if (!filled.ok()) comm.Abort(filled);      // this rank only: the others' writes fail, naming it
  return filled;
}

}  // namespace

Flat::~Flat() {
  if (buffers != nullptr) buffers->Give(std::move(leased));
}

Status FlattenPart(const State& dense, std::vector<PartTable> tables, Rank rank, Flat* flat) {
  SP_RETURN_IF_ERROR(CheckDense(dense));
  SP_RETURN_IF_ERROR(engine::CopyValues(dense, &flat->state));
  for (const auto& [name, e] : dense.entries()) {
    if (!e.is_tensor()) continue;
    const Shape& shape = e.tensor().shape();
    flat->layout[name] = ShardSpec{shape, Shape(shape.size(), 0), shape, {}};  // this rank only
    SP_RETURN_IF_ERROR(flat->state.PutView(name, e.tensor()));
  }
  for (PartTable& t : tables) flat->sorted.push_back(std::move(t.sorted));
  for (size_t i = 0; i < tables.size(); ++i) {
    SP_RETURN_IF_ERROR(
        AddTable(tables[i].name, i, tables[i].slots, flat->sorted[i], rank, tables[i].place, flat));
  }
  return flat->state.PutValue(std::string(format::kSparseValueName),
                              Value::FromJson(EncodeDesc(flat->desc)));
}

Status Flatten(const engine::WriteRequest& in, const SparseSaveOptions& o, Flat* flat) {
  Communicator* comm = in.topology.comm;
  if (comm == nullptr) {
    SP_RETURN_IF_ERROR(FlattenLocal(*in.state, o, in.io, in.path, flat)
                           .WithContext(fmt::format("save {}", in.path)));
  } else {
    SP_RETURN_IF_ERROR(
        FlattenDistributed(*comm, *in.state, *in.topology.layout, o, in.io, in.path, flat)
            .WithContext(fmt::format("sparse save {} (rank {} of {})", in.path, comm->rank(),
                                     comm->size())));
  }
  MakeRequest(in, o, flat);
  if (flat->buffers != nullptr) {
    uint64_t staged = 0;
    for (const Tensor& t : flat->leased) staged += t.nbytes();
    flat->buffers->Trim(staged);
  }
  return Status::OK();
}

}  // namespace savepoint::sparse
