// Staging of hash-ordered tables for asynchronous saves. See stage.h.
#include "sparse/stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <new>
#include <utility>

#include "format/manifest.h"
#include "util/parallel.h"

namespace savepoint::sparse {
namespace {

// Bytes one thread copies at a time (a multiple of 8: pieces of the ids hold whole ids).
constexpr uint64_t kPiece = uint64_t{4} << 20;

// A piece of one copy; pieces of the ids also count the rows per slice.
struct Piece {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  uint64_t n = 0;
  bool ids = false;
};

void AddPieces(const std::byte* src, std::byte* dst, uint64_t bytes, bool ids,
               std::vector<Piece>* out) {
  for (uint64_t at = 0; at < bytes; at += kPiece) {
    out->push_back({src + at, dst + at, std::min(kPiece, bytes - at), ids});
  }
}

// Copies every piece on `threads` threads; returns the rows per slice of the ids' pieces.
Result<std::vector<int64_t>> CopyCounting(const std::vector<Piece>& pieces, int threads) {
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(std::max(threads, 1)));
  SP_RETURN_IF_ERROR(ParallelFor(pieces.size(), threads, [&](size_t i, int w) -> Status {
    const Piece& p = pieces[i];
    if (!p.ids) {
      std::memcpy(p.dst, p.src, p.n);
      return Status::OK();
    }
    std::vector<int64_t>& c = counts[static_cast<size_t>(w)];
    if (c.empty()) c.assign(kNumSlices, 0);
    const size_t n = p.n / sizeof(int64_t);
    const auto* src = reinterpret_cast<const int64_t*>(p.src);
    auto* dst = reinterpret_cast<int64_t*>(p.dst);
    for (size_t k = 0; k < n; ++k) {
      dst[k] = src[k];
      ++c[static_cast<size_t>(SliceOf(src[k]))];
    }
    return Status::OK();
  }));
  std::vector<int64_t> total(kNumSlices, 0);
  for (const std::vector<int64_t>& c : counts) {
    for (size_t s = 0; s < c.size(); ++s) total[s] += c[s];
  }
  return total;
}

// The slice index (PackSlice of each slice with rows) from the rows per slice; InvalidArgument for
// a slice outside `range` (naming its first id in `ids`) or holding too many rows.
Result<Tensor> IndexOf(const std::vector<int64_t>& counts, SliceRange range,
                       std::span<const int64_t> ids) {
  std::vector<std::pair<int64_t, int64_t>> slice_rows;
  for (int64_t slice = 0; slice < kNumSlices; ++slice) {
    const int64_t rows = counts[static_cast<size_t>(slice)];
    if (rows == 0) continue;
    if (!range.Contains(slice)) return CheckRange(ids, range, "id");
    slice_rows.emplace_back(slice, rows);
  }
  return PackedIndex(slice_rows);
}

}  // namespace

Result<Tensor> CopyBuffers::Take(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const uint64_t cap = it->nbytes();
      if (cap >= bytes && cap <= 2 * std::max<uint64_t>(bytes, 1) &&
          (best == free_.end() || cap < best->nbytes())) {
        best = it;
      }
    }
    if (best != free_.end()) {
      Tensor t = std::move(*best);
      free_.erase(best);
      return t;
    }
  }
  return Tensor::Empty(DType::kU8, {static_cast<int64_t>(bytes + (bytes >> kHeadroomShift))});
}

void CopyBuffers::Give(std::vector<Tensor> buffers) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Tensor& t : buffers) free_.push_back(std::move(t));
}

void CopyBuffers::Trim(uint64_t staged) {
  std::vector<Tensor> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    most_staged_ = std::max(most_staged_, staged);
    uint64_t total = 0;
    for (const Tensor& t : free_) total += t.nbytes();
    size_t n = 0;
    while (n < free_.size() && total > 2 * most_staged_) total -= free_[n++].nbytes();
    std::move(free_.begin(), free_.begin() + static_cast<ptrdiff_t>(n),
              std::back_inserter(dropped));
    free_.erase(free_.begin(), free_.begin() + static_cast<ptrdiff_t>(n));
  }
}  // (freed here, outside the lock)

uint64_t CopyBuffers::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const Tensor& t : free_) n += t.nbytes();
  return n;
}

bool Stageable(const SparseTable& t) {
  if (t.ids_view().nbytes() < kStageIdsBytes) return false;
  for (const SparseTable::Slot& slot : t.slots()) {
    if (slot.view.nbytes() < format::kPackBelowBytes) return false;  // late tensors are not packed
  }
  return true;
}

Result<SortedTable> StageTable(const SparseTable& t, SliceRange range, int threads,
                               CopyBuffers* buffers, std::vector<Tensor>* leased, Staged* staged) {
  auto take = [&](uint64_t bytes) -> Result<std::byte*> {
    SP_ASSIGN_OR_RETURN(Tensor b, buffers->Take(bytes));
    leased->push_back(std::move(b));
    return leased->back().data();
  };
  const std::span<const int64_t> ids = t.ids();
  const uint64_t id_bytes = ids.size() * sizeof(int64_t);
  const int64_t rows = static_cast<int64_t>(ids.size());
  SortedTable s;
  s.late = true;
  std::vector<Piece> pieces;
  SP_ASSIGN_OR_RETURN(std::byte * copy, take(id_bytes));
  AddPieces(reinterpret_cast<const std::byte*>(ids.data()), copy, id_bytes, true, &pieces);
  for (const SparseTable::Slot& slot : t.slots()) {
    SP_ASSIGN_OR_RETURN(std::byte * dst, take(slot.view.nbytes()));
    AddPieces(slot.view.data(), dst, slot.view.nbytes(), false, &pieces);
    s.slots.emplace_back(dst, slot.view.dtype(), slot.view.shape());
    s.gathered.push_back(true);
  }
  SP_ASSIGN_OR_RETURN(std::byte * sorted, take(id_bytes));
  SP_ASSIGN_OR_RETURN(std::byte * perm, take(id_bytes));
  SP_ASSIGN_OR_RETURN(std::vector<int64_t> counts, CopyCounting(pieces, threads));
  const std::span<const int64_t> copied(reinterpret_cast<const int64_t*>(copy), ids.size());
  SP_ASSIGN_OR_RETURN(s.slices, IndexOf(counts, range, copied));
  s.ids = TensorView(sorted, DType::kI64, {rows});
  s.perm = {reinterpret_cast<const int64_t*>(perm), ids.size()};
  *staged = {copied,
             {reinterpret_cast<int64_t*>(sorted), ids.size()},
             {reinterpret_cast<int64_t*>(perm), ids.size()},
             range};
  SP_RETURN_IF_ERROR(CheckRange(t.deleted(), range, "deleted id"));
  const std::span<const int64_t> del = t.deleted();
  static const int64_t kNone = 0;
  const TensorView deleted(del.empty() ? &kNone : del.data(), DType::kI64,
                           {static_cast<int64_t>(del.size())});
  SP_ASSIGN_OR_RETURN(s.deleted, SortedIds(deleted, del, &s.owned));
  const std::span<const int64_t> sorted_deleted(reinterpret_cast<const int64_t*>(s.deleted.data()),
                                                del.size());
  SP_ASSIGN_OR_RETURN(s.deleted_slices, PackSlices(sorted_deleted));
  return s;
}

Status SortStaged(const Staged& s) {
  try {  // (on a background thread: no allocation failure may escape it)
    return Order(s.ids, s.range, s.sorted, s.perm);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(
        fmt::format("sorting a staged table of {} rows: out of memory", s.ids.size()));
  }
}

}  // namespace savepoint::sparse
