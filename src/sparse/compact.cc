// CompactInParts (compact.h): a delta chain folded into one full checkpoint, streamed one slice
// range at a time so that memory follows a part, not the chain.
//
// The output is written as a distributed save of P parts would be: part p holds every table's
// rows of the slices GenSlice(p, P), in its own data file, and the tables' ranks tensors record
// the parts as saving ranks (docs/FORMAT.md §11). The public RankSave / SaveCoordinator steps
// (savepoint/distributed.h) run in this one process, one part after the other:
//  1. Count: each part's merged ids (ids only) give its rows and slice index, which place every
//     part's rows in the global tensors.
//  2. Plan: each part's save is planned against reserved memory that cannot be read or written
//     (planning needs shapes and addresses, not bytes), and the coordinator decides on the plans:
//     tiling checks, the temporary directory, file numbers. Nothing is kept of a part but its plan.
//  3. Write: each part is loaded (ids and slots merged), planned again over its real rows, which
//     must be the rows counted, and written and synced to its data file; then freed.
//  4. Commit: the coordinator writes the manifest and commits by rename, as any save.
// The dense tensors, values and metadata of src go with part 0 (the tensors whole).
#include "sparse/compact.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "engine/select.h"
#include "io/commit.h"
#include "savepoint/distributed.h"
#include "sparse/load.h"
#include "sparse/save.h"

namespace savepoint::sparse {
namespace {

// Address space for planning: views may point into it, but any access faults (PROT_NONE), so a
// plan that read or wrote its tensors would crash rather than use garbage. Costs no memory.
class Phantom {
 public:
  explicit Phantom(uint64_t bytes) : bytes_(std::max<uint64_t>(bytes, 1)) {
    void* p = mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  Phantom(const Phantom&) = delete;
  Phantom& operator=(const Phantom&) = delete;
  ~Phantom() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  std::byte* data() const { return base_; }

 private:
  uint64_t bytes_;
  std::byte* base_ = nullptr;
};

// What the count gives of one table in one part.
struct Counted {
  int64_t rows = 0;
  int64_t slices = 0;                          // entries of its slice index
  Tensor index;                                // the slice index (moved into the plan)
  int64_t rows_before = 0, slices_before = 0;  // of the parts before this one
};

// The compaction's layout: the tables (name order, every slot), the parts and their counts.
struct Plan {
  std::vector<std::string> tables;
  std::vector<std::vector<SlotSchema>> slots;  // per table
  int parts = 1;
  std::vector<std::vector<Counted>> counted;  // [part][table]
};

std::vector<std::string> SlotNames(const std::vector<SlotSchema>& slots) {
  std::vector<std::string> out;
  for (const SlotSchema& s : slots) out.push_back(s.name);
  return out;
}

// The tables and how many parts the chain is cut into (about batch_bytes each; 0: one part; at
// most kMaxCompactionParts).
Plan Cut(const std::vector<Link>& chain, const Schema& schema, uint64_t batch_bytes) {
  Plan plan;
  long double bytes = 0;
  for (const auto& [name, slots] : schema) {
    plan.tables.push_back(name);
    plan.slots.push_back(slots);
    bytes += ChainTableBytes(chain, name, SlotNames(slots));
  }
  if (batch_bytes > 0) {
    plan.parts = static_cast<int>(
        std::clamp<long double>(std::ceil(bytes / batch_bytes), 1, kMaxCompactionParts));
  }
  return plan;
}

// Step 1: every part's rows and slice index, from its merged ids.
Status Count(std::vector<Link>& chain, const LoadOptions& load, const IoOptions& io, Plan* plan) {
  plan->counted.resize(plan->parts);
  for (int p = 0; p < plan->parts; ++p) {
    const SliceRange range = *GenSlice(p, plan->parts);
    for (const std::string& name : plan->tables) {
      SP_ASSIGN_OR_RETURN(Rows rows, LoadTable(chain, name, {}, range, load, io));
      SP_ASSIGN_OR_RETURN(Tensor index, PackSlices(rows.ids.as<const int64_t>()));
      const int64_t slices = index.shape()[0];
      Counted c{rows.ids.shape()[0], slices, std::move(index)};
      if (p > 0) {
        const Counted& prev = plan->counted[p - 1][plan->counted[p].size()];
        c.rows_before = prev.rows_before + prev.rows;
        c.slices_before = prev.slices_before + prev.slices;
      }
      plan->counted[p].push_back(std::move(c));
    }
  }
  return Status::OK();
}

// Where part `p`'s rows and slice entries of table `t` go in the global tensors.
Placement PlaceOf(const Plan& plan, int p, size_t t) {
  Placement out;
  const Counted& c = plan.counted[p][t];
  out.offset[kRows] = c.rows_before;
  out.offset[kSlices] = c.slices_before;
  out.count[kRows] = c.rows;
  out.count[kSlices] = c.slices;
  out.total[kRows] = plan.counted.back()[t].rows_before + plan.counted.back()[t].rows;
  out.total[kSlices] = plan.counted.back()[t].slices_before + plan.counted.back()[t].slices;
  return out;
}

// Shape of `rows` rows of slot `s`.
Shape RowsOf(const SlotSchema& s, int64_t rows) {
  Shape shape = {rows};
  shape.insert(shape.end(), s.row.begin(), s.row.end());
  return shape;
}

// The most bytes any tensor of a part takes (its dense tensors included): the phantom's size.
// Corruption when a part's rows make no valid shape (rows that fit apart may not fit merged).
Result<uint64_t> LargestTensor(const Plan& plan, const engine::Reader& newest) {
  uint64_t most = 0;
  for (const TensorInfo& info : newest.tensors()) most = std::max(most, info.nbytes);
  for (const auto& part : plan.counted) {
    for (size_t t = 0; t < part.size(); ++t) {
      most = std::max<uint64_t>(most, part[t].rows * sizeof(int64_t));
      for (const SlotSchema& s : plan.slots[t]) {
        Result<uint64_t> n = NumBytes(s.dtype, RowsOf(s, part[t].rows));
        if (!n.ok()) {
          return CorruptionError(
              fmt::format("table {:?}: slot {:?}: the merged rows make no valid "
                          "shape ({})",
                          plan.tables[t], s.name, n.status().message()));
        }
        most = std::max(most, *n);
      }
    }
  }
  return most;
}

// Part 0's dense tensors as views of `phantom`, with src's values and metadata.
Result<State> PhantomDense(const engine::Reader& newest, const Phantom& phantom) {
  State dense;
  for (const TensorInfo& info : newest.tensors()) {
    if (info.name.starts_with(kTensorPrefix)) continue;
    SP_RETURN_IF_ERROR(
        dense.PutView(info.name, TensorView(phantom.data(), info.dtype, info.shape)));
  }
  SP_RETURN_IF_ERROR(CopyUserValues(newest, dense));
  return dense;
}

// Part `p`'s tables as views of `phantom` (step 2), with the counted slice indexes.
std::vector<PartTable> PhantomTables(Plan& plan, int p, const Phantom& phantom) {
  std::vector<PartTable> out;
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    Counted& c = plan.counted[p][t];
    PartTable part{plan.tables[t], SlotNames(plan.slots[t]), {}, PlaceOf(plan, p, t)};
    part.sorted.ids = TensorView(phantom.data(), DType::kI64, {c.rows});
    for (const SlotSchema& s : plan.slots[t]) {
      part.sorted.slots.push_back(TensorView(phantom.data(), s.dtype, RowsOf(s, c.rows)));
    }
    part.sorted.gathered.assign(plan.slots[t].size(), false);
    part.sorted.slices = std::move(c.index);
    out.push_back(std::move(part));
  }
  return out;
}

// Part `p`'s tables loaded (step 3): their rows must be the rows counted.
Result<std::vector<PartTable>> LoadPart(std::vector<Link>& chain, const Plan& plan, int p,
                                        const LoadOptions& load, const IoOptions& io) {
  std::vector<PartTable> out;
  const SliceRange range = *GenSlice(p, plan.parts);
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    PartTable part{plan.tables[t], SlotNames(plan.slots[t]), {}, PlaceOf(plan, p, t)};
    SP_ASSIGN_OR_RETURN(Rows rows, LoadTable(chain, part.name, part.slots, range, load, io));
    SortedTable& s = part.sorted;
    SP_ASSIGN_OR_RETURN(s.slices, PackSlices(rows.ids.as<const int64_t>()));
    const Counted& c = plan.counted[p][t];
    if (rows.ids.shape()[0] != c.rows || s.slices.shape()[0] != c.slices) {
      return InternalError(fmt::format(
          "table {:?}: slices [{}, {}) read {} rows in {} slices, counted {} in {}: the chain "
          "changed during the compaction",
          part.name, range.begin, range.end, rows.ids.shape()[0], s.slices.shape()[0], c.rows,
          c.slices));
    }
    s.ids = rows.ids.view();
    s.owned.push_back(std::move(rows.ids));
    for (Tensor& slot : rows.slots) {
      s.slots.push_back(slot.view());
      s.owned.push_back(std::move(slot));
    }
    s.gathered.assign(s.slots.size(), false);
    out.push_back(std::move(part));
  }
  return out;
}

// The options each part is written with: `o` without stats, and progress over the whole
// compaction (part p's bytes after those of the parts before it).
SaveOptions PartOptions(const SaveOptions& o, uint64_t before, uint64_t total) {
  SaveOptions out = o;
  out.stats = nullptr;
  out.progress = nullptr;
  if (o.progress) {
    out.progress = [fn = o.progress, before, total](uint64_t done, uint64_t) {
      fn(before + done, total);
    };
  }
  return out;
}

// The compaction's steps (top of the file) after the chain is open.
class Compaction {
 public:
  Compaction(std::vector<Link> chain, std::string dst, const SparseSaveOptions& o,
             const LoadOptions& load, const IoOptions& io)
      : chain_(std::move(chain)), dst_(std::move(dst)), o_(o), load_(load), io_(io) {
    if (o.concurrency > 0) io_.io_threads = o.concurrency;
  }

  Status Run(uint64_t batch_bytes) {
    const auto start = std::chrono::steady_clock::now();
    SP_ASSIGN_OR_RETURN(Schema schema, ChainSchema(chain_));
    plan_ = Cut(chain_, schema, batch_bytes);
    SP_RETURN_IF_ERROR(Count(chain_, load_, io_, &plan_));
    SaveCoordinator coordinator(dst_, plan_.parts, PartOptions(o_.save, 0, 0), io_);
    SP_ASSIGN_OR_RETURN(std::string verdict, Decide(coordinator));
    SP_RETURN_IF_ERROR(WriteParts(verdict));
    SP_RETURN_IF_ERROR(coordinator.Commit(reports_, *first_));
    if (SaveStats* stats = o_.save.stats; stats != nullptr) {
      *stats = SaveStats{bytes_, chunks_, 0, direct_, bytes_, 0, 0};
      stats->seconds = stats->blocked_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return Status::OK();
  }

 private:
  engine::Reader& newest() { return *chain_.front().reader; }

  // Step 2: every part planned over the phantom; the coordinator's verdict.
  Result<std::string> Decide(SaveCoordinator& coordinator) {
    SP_ASSIGN_OR_RETURN(const uint64_t largest, LargestTensor(plan_, newest()));
    Phantom phantom(largest);
    if (phantom.data() == nullptr) return ResourceExhaustedError("no address space to plan in");
    std::vector<std::string> plans;
    for (int p = 0; p < plan_.parts; ++p) {
      State dense;
      if (p == 0) {
        SP_ASSIGN_OR_RETURN(dense, PhantomDense(newest(), phantom));
      }
      Flat flat;
      SP_RETURN_IF_ERROR(
          FlattenPart(dense, PhantomTables(plan_, p, phantom), {p, plan_.parts}, &flat));
      RankSave save(p, plan_.parts);
      plans.push_back(save.Plan(flat.state, flat.layout, PartOptions(o_.save, 0, 0), io_));
      SP_RETURN_IF_ERROR(save.planned());
      total_ += save.bytes();
    }
    std::string verdict = coordinator.Decide(plans);
    SP_RETURN_IF_ERROR(coordinator.decided());
    return verdict;
  }

  // Step 3: every part loaded, planned and written; part 0's save kept for the commit.
  Status WriteParts(const std::string& verdict) {
    for (int p = 0; p < plan_.parts; ++p) {
      State dense;
      if (p == 0) SP_RETURN_IF_ERROR(LoadDense(newest(), load_, dense));
      SP_ASSIGN_OR_RETURN(std::vector<PartTable> tables, LoadPart(chain_, plan_, p, load_, io_));
      Flat flat;
      SP_RETURN_IF_ERROR(FlattenPart(dense, std::move(tables), {p, plan_.parts}, &flat));
      auto save = std::make_unique<RankSave>(p, plan_.parts);
      const SaveOptions so = PartOptions(o_.save, bytes_, total_);
      save->Plan(flat.state, flat.layout, so, io_);
      SP_RETURN_IF_ERROR(save->planned());
      SP_ASSIGN_OR_RETURN(std::string report, save->Write(verdict, so, io_));
      SP_RETURN_IF_ERROR(save->wrote());
      reports_.push_back(std::move(report));
      bytes_ += save->bytes();
      chunks_ += save->chunks();
      direct_ = direct_ || save->direct_io();
      if (p == 0) first_ = std::move(save);  // its manifest is the commit's (no data used)
    }
    return Status::OK();
  }

  std::vector<Link> chain_;
  std::string dst_;
  SparseSaveOptions o_;
  LoadOptions load_;
  IoOptions io_;
  Plan plan_;
  std::vector<std::string> reports_;
  std::unique_ptr<RankSave> first_;
  uint64_t total_ = 0, bytes_ = 0, chunks_ = 0;
  bool direct_ = false;
};

}  // namespace

Status CompactInParts(const std::string& src, const std::string& dst, const SparseSaveOptions& o,
                      const LoadOptions& load, const IoOptions& io, uint64_t batch_bytes) {
  SP_RETURN_IF_ERROR(CheckLoadOptions({.load = load}));
  FileSystem* fs = FileSystemOf(io);
  if (!o.save.overwrite && fs->Exists(dst) && !io::IsEmptyDirectory(fs, dst)) {
    // As the commit would find, but before the chain is read.
    return AlreadyExistsError(fmt::format("save {}: a checkpoint already exists there", dst));
  }
  SP_ASSIGN_OR_RETURN(std::vector<Link> chain, OpenChain(src, load, io));
  Compaction c(std::move(chain), dst, o, load, io);
  return c.Run(batch_bytes);
}

}  // namespace savepoint::sparse
