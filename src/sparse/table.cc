// SparseTable, the slice partition, DirtySet, MakeDelta, and State's table accessors.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "savepoint/sparse.h"
#include "sparse/stored.h"

namespace savepoint {

Result<SliceRange> GenSlice(int index, int shards) {
  if (shards < 1 || shards > kNumSlices || index < 0 || index >= shards) {
    return InvalidArgumentError(
        fmt::format("shard {} of {}: need 1 <= shards <= {} and 0 <= index < shards", index, shards,
                    kNumSlices));
  }
  const int64_t each = kNumSlices / shards, extra = kNumSlices % shards;
  SliceRange r;
  r.begin = index * each + std::min<int64_t>(index, extra);
  r.end = r.begin + each + (index < extra ? 1 : 0);
  return r;
}

namespace {

std::span<const int64_t> I64Span(const TensorView& v) {
  if (v.data() == nullptr) return {};
  return {reinterpret_cast<const int64_t*>(v.data()), static_cast<size_t>(v.nbytes() / 8)};
}

Status CheckIdTensor(const TensorView& v, std::string_view what) {
  SP_RETURN_IF_ERROR(v.Validate().WithContext(what));
  if (v.dtype() != DType::kI64 || v.shape().size() != 1) {
    return InvalidArgumentError(fmt::format("{} must be I64 of rank 1, not {} {}", what,
                                            DTypeName(v.dtype()), ShapeToString(v.shape())));
  }
  return Status::OK();
}

// The positions of a list of ids: an open-addressing table (linear probing, Fibonacci hashing)
// of twice the ids' count, 16 bytes a slot: validating and indexing millions of ids costs a few
// milliseconds, against tens for a sort or a node-based hash set.
class IdIndex {
 public:
  // Indexes `ids`; InvalidArgument naming the first id that appears twice (`what` says which
  // list).
  static Result<IdIndex> Of(std::span<const int64_t> ids, std::string_view what) {
    IdIndex index(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      size_t h = index.Home(ids[i]);
      while (index.pos_[h] >= 0 && index.keys_[h] != ids[i]) h = (h + 1) & index.mask_;
      if (index.pos_[h] >= 0) {
        return InvalidArgumentError(fmt::format("{}: id {} appears twice", what, ids[i]));
      }
      index.keys_[h] = ids[i];
      index.pos_[h] = static_cast<int64_t>(i);
    }
    return index;
  }
  // The position of `id` in the list, or -1.
  int64_t Find(int64_t id) const {
    for (size_t h = Home(id); pos_[h] >= 0; h = (h + 1) & mask_) {
      if (keys_[h] == id) return pos_[h];
    }
    return -1;
  }

 private:
  explicit IdIndex(size_t n)
      : mask_(std::bit_ceil(std::max<size_t>(16, 2 * n)) - 1),
        shift_(64 - std::countr_zero(mask_ + 1)),
        keys_(mask_ + 1),
        pos_(mask_ + 1, -1) {}
  size_t Home(int64_t id) const {
    return static_cast<size_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  size_t mask_;
  int shift_;
  std::vector<int64_t> keys_;
  std::vector<int64_t> pos_;  // -1 = empty
};

// InvalidArgument "{what}: id X appears twice" unless `ids` are unique: one pass when they
// ascend by value or in storage order (slice, id), else a hash index.
Status CheckUnique(std::span<const int64_t> ids, std::string_view what) {
  if (std::adjacent_find(ids.begin(), ids.end(), [](int64_t a, int64_t b) { return a >= b; }) ==
          ids.end() ||
      std::adjacent_find(ids.begin(), ids.end(), [](int64_t a, int64_t b) {
        return !sparse::KeyLess(a, b);
      }) == ids.end()) {
    return Status::OK();
  }
  return IdIndex::Of(ids, what).status();
}

}  // namespace

std::span<const int64_t> SparseTable::ids() const { return I64Span(ids_); }
std::span<const int64_t> SparseTable::deleted() const { return I64Span(deleted_); }

const TensorView* SparseTable::FindSlot(std::string_view name) const {
  for (const Slot& s : slots_) {
    if (s.name == name) return &s.view;
  }
  return nullptr;
}

uint64_t SparseTable::RowBytes(const TensorView& s) {
  const int64_t rows = s.shape().empty() ? 0 : s.shape()[0];
  return rows > 0 ? s.nbytes() / static_cast<uint64_t>(rows) : 0;
}

Status SparseTable::Validate() const { return Check(true); }

Status SparseTable::Check(bool unique_ids) const {
  SP_RETURN_IF_ERROR(CheckIdTensor(ids_, "ids"));
  if (deleted_.data() != nullptr || !deleted_.shape().empty()) {
    SP_RETURN_IF_ERROR(CheckIdTensor(deleted_, "deleted ids"));
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    SP_RETURN_IF_ERROR(ValidateName(s.name).WithContext("slot name"));
    std::string what = fmt::format("slot {:?}", s.name);
    SP_RETURN_IF_ERROR(s.view.Validate().WithContext(what));
    for (size_t j = 0; j < i; ++j) {
      if (slots_[j].name == s.name) return InvalidArgumentError(what + " appears twice");
    }
    if (s.view.shape().empty() || s.view.shape()[0] != num_rows()) {
      return InvalidArgumentError(fmt::format("{} is {}: its dim 0 must be the {} rows of ids",
                                              what, ShapeToString(s.view.shape()), num_rows()));
    }
  }
  if (deleted().empty()) return unique_ids ? CheckUnique(ids(), "ids") : Status::OK();
  // Both lists unique, then the ids probed against the deleted ones (or the other way round).
  SP_ASSIGN_OR_RETURN(IdIndex del, IdIndex::Of(deleted(), "deleted ids"));
  if (ids().size() > deleted().size()) {
    if (unique_ids) SP_RETURN_IF_ERROR(CheckUnique(ids(), "ids"));
  } else {
    SP_ASSIGN_OR_RETURN(IdIndex rows, IdIndex::Of(ids(), "ids"));
    for (int64_t id : deleted()) {
      if (rows.Find(id) >= 0) {
        return InvalidArgumentError(fmt::format("id {} is both a row and deleted", id));
      }
    }
    return Status::OK();
  }
  for (int64_t id : ids()) {
    if (del.Find(id) >= 0) {
      return InvalidArgumentError(fmt::format("id {} is both a row and deleted", id));
    }
  }
  return Status::OK();
}

Result<SparseTable> SparseTable::FromViews(TensorView ids, std::vector<Slot> slots,
                                           TensorView deleted, IdCheck id_check) {
  SparseTable t;
  t.ids_ = std::move(ids);
  t.slots_ = std::move(slots);
  t.deleted_ = std::move(deleted);
  SP_RETURN_IF_ERROR(t.Check(id_check == IdCheck::kNow));
  t.validated_ = true;
  return t;
}

Result<SparseTable> SparseTable::FromTensors(Tensor ids,
                                             std::vector<std::pair<std::string, Tensor>> slots,
                                             Tensor deleted) {
  SparseTable t;
  t.ids_ = ids.view();
  if (deleted.data() != nullptr) t.deleted_ = deleted.view();
  t.owned_.push_back(std::move(ids));
  t.owned_.push_back(std::move(deleted));
  for (auto& [name, tensor] : slots) {
    t.slots_.push_back({name, tensor.view()});
    t.owned_.push_back(std::move(tensor));
  }
  SP_RETURN_IF_ERROR(t.Validate());
  t.validated_ = true;
  return t;
}

void DirtySet::Touch(std::span<const int64_t> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t id : ids) {
    touched_.insert(id);
    deleted_.erase(id);
  }
}

void DirtySet::Delete(std::span<const int64_t> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t id : ids) {
    deleted_.insert(id);
    touched_.erase(id);
  }
}

namespace {
std::vector<int64_t> Sorted(const std::unordered_set<int64_t>& s) {
  std::vector<int64_t> v(s.begin(), s.end());
  std::sort(v.begin(), v.end());
  return v;
}
}  // namespace

std::vector<int64_t> DirtySet::touched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Sorted(touched_);
}

std::vector<int64_t> DirtySet::deleted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Sorted(deleted_);
}

void DirtySet::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  touched_.clear();
  deleted_.clear();
}

namespace {

// An I64 [n] tensor holding `ids`.
Result<Tensor> IdTensor(std::span<const int64_t> ids) {
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, {static_cast<int64_t>(ids.size())}));
  if (!ids.empty()) std::memcpy(t.data(), ids.data(), ids.size_bytes());
  return t;
}

}  // namespace

namespace {

// The row of each of `touched` in `ids`: one pass over `ids` probing an index of the touched ids
// (a few per cent of the rows, so the index stays in cache). NotFound naming the first touched id
// that is not a row; InvalidArgument for one given twice.
Result<std::vector<int64_t>> RowsOf(std::span<const int64_t> ids,
                                    std::span<const int64_t> touched) {
  SP_ASSIGN_OR_RETURN(IdIndex index, IdIndex::Of(touched, "touched ids"));
  std::vector<int64_t> rows(touched.size(), -1);
  for (size_t r = 0; r < ids.size(); ++r) {
    const int64_t i = index.Find(ids[r]);
    if (i >= 0) rows[static_cast<size_t>(i)] = static_cast<int64_t>(r);
  }
  for (size_t i = 0; i < touched.size(); ++i) {
    if (rows[i] < 0) {
      return NotFoundError(fmt::format("touched id {} is not in the table", touched[i]));
    }
  }
  return rows;
}

}  // namespace

Result<SparseTable> MakeDelta(const SparseTable& table, std::span<const int64_t> touched,
                              std::span<const int64_t> deleted) {
  SP_ASSIGN_OR_RETURN(std::vector<int64_t> rows, RowsOf(table.ids(), touched));
  SP_ASSIGN_OR_RETURN(Tensor ids, IdTensor(touched));
  SP_ASSIGN_OR_RETURN(Tensor del, IdTensor(deleted));
  std::vector<std::pair<std::string, Tensor>> slots;
  for (const SparseTable::Slot& s : table.slots()) {
    Shape shape = s.view.shape();
    shape[0] = static_cast<int64_t>(rows.size());
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(s.view.dtype(), shape));
    const uint64_t rb = SparseTable::RowBytes(s.view);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(t.data() + i * rb, s.view.data() + rows[i] * rb, rb);
    }
    slots.emplace_back(s.name, std::move(t));
  }
  return SparseTable::FromTensors(std::move(ids), std::move(slots), std::move(del));
}

Result<SparseTable> MakeDelta(const SparseTable& table, const DirtySet& dirty) {
  return MakeDelta(table, dirty.touched(), dirty.deleted());
}

// --- State's tables (declared in savepoint/state.h). ---

Status State::PutTable(std::string name, SparseTable table) {
  SP_RETURN_IF_ERROR(ValidateName(name));
  Status s = table.validated_ ? Status::OK() : table.Validate();  // (tables are immutable)
  if (!s.ok()) return s.WithContext(fmt::format("sparse table {:?}", name));
  if (entries_.count(name) > 0 || tables_.count(name) > 0) {
    return AlreadyExistsError(fmt::format("duplicate state entry or table {:?}", name));
  }
  tables_.emplace(std::move(name), std::make_shared<const SparseTable>(std::move(table)));
  return Status::OK();
}

const SparseTable* State::FindTable(std::string_view name) const {
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second.get();
}

bool State::EraseTable(std::string_view name) {
  auto it = tables_.find(name);
  if (it == tables_.end()) return false;
  tables_.erase(it);
  return true;
}

}  // namespace savepoint
