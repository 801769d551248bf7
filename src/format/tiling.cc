// Whether the shards of a tensor tile it: the check of every decoder (JSON bodies, version 3
// sections), of the DCP import, and of the distributed coordinator, which holds its boxes flat.
// Grids (the layouts of tensor, pipeline and data parallelism) are recognised in linear time;
// other layouts are swept.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "format/manifest.h"
#include "format/manifest_checks.h"
#include "format/manifest_index.h"

namespace savepoint::format {
namespace {

// Box `k` of the flat array: its offsets, then its sizes (nd values each).
struct Flat {
  const int64_t* data;
  size_t nd;
  const int64_t* offsets(size_t k) const { return data + 2 * nd * k; }
  const int64_t* sizes(size_t k) const { return data + 2 * nd * k + nd; }
};

bool Overlap(const Flat& f, size_t a, size_t b) {
  const int64_t *ao = f.offsets(a), *as = f.sizes(a), *bo = f.offsets(b), *bs = f.sizes(b);
  for (size_t d = 0; d < f.nd; ++d) {
    if (ao[d] + as[d] <= bo[d] || bo[d] + bs[d] <= ao[d]) return false;
  }
  return true;
}

// The element count of box `k` when it lies within `shape` (no sum that can overflow), else -1.
// (A box within a valid shape has a valid element count: its dims are at most the shape's.)
int64_t CountInShape(const Flat& f, size_t k, const Shape& shape) {
  int64_t n = 1;
  for (size_t d = 0; d < f.nd; ++d) {
    const int64_t o = f.offsets(k)[d], s = f.sizes(k)[d];
    if (o < 0 || s < 0 || o > shape[d] || s > shape[d] - o) return -1;
    n *= s;
  }
  return n;
}

// The dimension in which the boxes' offsets take the most distinct values.
size_t SweepDimension(const Flat& f, const std::vector<uint32_t>& live) {
  if (f.nd <= 1) return 0;
  size_t sweep = 0, most = 0;
  std::vector<int64_t> values(live.size()), table;
  for (size_t d = 0; d < f.nd; ++d) {
    for (size_t i = 0; i < live.size(); ++i) values[i] = f.offsets(live[i])[d];
    const size_t distinct = internal::DistinctCount(values, table);
    if (distinct > most) most = distinct, sweep = d;
  }
  return sweep;
}

// The distinct values of one dimension's offsets, each with its place among them in ascending
// order: an open-addressed table (empty slots -1). Values that collide on more than kProbes slots
// in a row are given up on (a hostile layout): GridOrder then says no, and the sweep decides.
class Cuts {
 public:
  // From the offsets in dimension `d` of `count` boxes. False when one is negative, when more than
  // `most` are distinct, or when values collide as above.
  bool Build(const Flat& f, size_t count, size_t d, size_t most) {
    Resize(6);  // (grown as values come: most layouts have few distinct offsets per dimension)
    sorted_.clear();
    for (size_t k = 0; k < count; ++k) {
      const int64_t v = f.offsets(k)[d];
      if (v < 0) return false;
      size_t h = Hash(v);
      for (int p = 0; keys_[h] != -1 && keys_[h] != v; h = (h + 1) & mask_) {
        if (++p > kProbes) return false;
      }
      if (keys_[h] != -1) continue;
      if (sorted_.size() == most) return false;
      keys_[h] = v;
      sorted_.push_back(v);
      if (2 * sorted_.size() > mask_ && !Grow()) return false;
    }
    std::sort(sorted_.begin(), sorted_.end());
    places_.resize(keys_.size());
    for (size_t h = 0; h <= mask_; ++h) {
      if (keys_[h] == -1) continue;
      places_[h] = static_cast<uint32_t>(
          std::lower_bound(sorted_.begin(), sorted_.end(), keys_[h]) - sorted_.begin());
    }
    return true;
  }
  // The place of `v` (one of the values built from) among the sorted values.
  uint32_t Place(int64_t v) const {
    size_t h = Hash(v);
    while (keys_[h] != v) h = (h + 1) & mask_;  // (present, within kProbes slots)
    return places_[h];
  }
  const std::vector<int64_t>& sorted() const { return sorted_; }

 private:
  static constexpr int kProbes = 32;
  size_t Hash(int64_t v) const {
    return static_cast<size_t>((static_cast<uint64_t>(v) * 0x9e3779b97f4a7c15u) >> shift_);
  }
  void Resize(int bits) {
    shift_ = 64 - bits;
    mask_ = (size_t{1} << bits) - 1;
    keys_.assign(mask_ + 1, -1);
  }
  // Twice the slots, the values so far placed again; false when they collide as in Build.
  bool Grow() {
    Resize(64 - shift_ + 1);
    for (const int64_t v : sorted_) {
      size_t h = Hash(v);
      for (int p = 0; keys_[h] != -1; h = (h + 1) & mask_) {
        if (++p > kProbes) return false;
      }
      keys_[h] = v;
    }
    return true;
  }
  int shift_ = 60;
  size_t mask_ = 0;
  std::vector<int64_t> keys_;
  std::vector<uint32_t> places_;
  std::vector<int64_t> sorted_;
};

}  // namespace

bool GridOrder(const Shape& shape, const int64_t* boxes, size_t count,
               std::vector<uint32_t>* order) {
  if (count == 0 || count > UINT32_MAX || !NumElements(shape).ok()) return false;
  const size_t nd = shape.size();
  const Flat f{boxes, nd};
  std::vector<Cuts> cuts(nd);
  size_t cells = 1;
  for (size_t d = 0; d < nd; ++d) {  // (the cells never outnumber the boxes: no overflow)
    if (!cuts[d].Build(f, count, d, count / cells)) return false;
    const std::vector<int64_t>& at = cuts[d].sorted();
    if (at.front() != 0 || at.back() >= shape[d]) return false;  // (so every cell is not empty)
    cells *= at.size();
  }
  if (cells != count) return false;
  order->assign(count, UINT32_MAX);
  for (size_t k = 0; k < count; ++k) {
    size_t cell = 0;
    for (size_t d = 0; d < nd; ++d) {
      const std::vector<int64_t>& at = cuts[d].sorted();
      const uint32_t i = cuts[d].Place(f.offsets(k)[d]);
      const int64_t end = i + 1 < at.size() ? at[i + 1] : shape[d];
      if (f.sizes(k)[d] != end - at[i]) return false;
      cell = cell * at.size() + i;
    }
    if ((*order)[cell] != UINT32_MAX) return false;
    (*order)[cell] = static_cast<uint32_t>(k);
  }
  return true;
}

size_t internal::DistinctCount(std::vector<int64_t>& values, std::vector<int64_t>& table) {
  if (std::is_sorted(values.begin(), values.end())) {
    return static_cast<size_t>(std::unique(values.begin(), values.end()) - values.begin());
  }
  int bits = 4;
  while ((size_t{1} << bits) < 2 * values.size()) ++bits;
  const size_t mask = (size_t{1} << bits) - 1;
  table.assign(mask + 1, -1);
  size_t distinct = 0, probes = 0;
  for (const int64_t v : values) {
    size_t h = static_cast<size_t>((static_cast<uint64_t>(v) * 0x9e3779b97f4a7c15u) >> (64 - bits));
    for (; table[h] != -1 && table[h] != v; h = (h + 1) & mask) ++probes;
    if (probes > 16 * values.size()) {
      std::sort(values.begin(), values.end());
      return static_cast<size_t>(std::unique(values.begin(), values.end()) - values.begin());
    }
    distinct += table[h] == -1;
    table[h] = v;
  }
  return distinct;
}

Status internal::CheckBoxTiling(const Shape& shape, const int64_t* boxes, size_t count,
                                const Ctx& ctx, const std::string& in, bool cover, bool grid) {
  Result<int64_t> total = NumElements(shape);
  if (!total.ok()) {
    return ctx.Bad(fmt::format("{}: shape {} is invalid ({})", in, ShapeToString(shape),
                               total.status().message()));
  }
  if (count > UINT32_MAX) return ctx.Bad(fmt::format("{}: {} shards", in, count));
  if (std::vector<uint32_t> order; grid && GridOrder(shape, boxes, count, &order)) {
    return Status::OK();  // (a grid tiles its shape: the common layout, checked in linear time)
  }
  const Flat f{boxes, shape.size()};
  std::vector<uint32_t> live;  // boxes that hold elements
  live.reserve(count);
  int64_t covered = 0;
  for (size_t k = 0; k < count; ++k) {
    const int64_t n = CountInShape(f, k, shape);
    if (n < 0) {
      const Shape o(f.offsets(k), f.offsets(k) + f.nd), s(f.sizes(k), f.sizes(k) + f.nd);
      return ctx.Bad(fmt::format("{} shard {}: box at {} of {} exceeds shape {}", in, k,
                                 ShapeToString(o), ShapeToString(s), ShapeToString(shape)));
    }
    if (n == 0) continue;
    // Boxes that do not overlap add up to at most the shape's count: past 2^63, some overlap.
    if (__builtin_add_overflow(covered, n, &covered)) {
      return ctx.Bad(fmt::format("{}: shards overlap (their elements add up past 2^63)", in));
    }
    live.push_back(static_cast<uint32_t>(k));
  }
  // Sweep along the dimension in which the offsets take the most distinct values (so shards side
  // by side in any one dimension are not compared pairwise), with a cap on the pairs compared so
  // that a hostile layout cannot make validation quadratic.
  // (value, box) by the boxes' offsets in the sweep dimension: sorted flat, not through an index.
  const size_t sweep = SweepDimension(f, live);
  std::vector<std::pair<int64_t, uint32_t>> order(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    order[i] = {f.nd > 0 ? f.offsets(live[i])[sweep] : 0, live[i]};
  }
  if (!std::is_sorted(order.begin(), order.end())) std::sort(order.begin(), order.end());
  uint64_t budget = (uint64_t{1} << 24) + 64 * uint64_t{live.size()};
  for (size_t i = 0; i < order.size(); ++i) {
    const auto [start, box] = order[i];
    const int64_t end = f.nd > 0 ? start + f.sizes(box)[sweep] : 0;
    for (size_t k = i + 1; k < order.size(); ++k) {
      if (f.nd > 0 && order[k].first >= end) break;
      if (Overlap(f, box, order[k].second)) return ctx.Bad(fmt::format("{}: shards overlap", in));
      if (--budget == 0) {
        return ctx.Bad(
            fmt::format("{}: layout of {} shards is too complex to validate", in, live.size()));
      }
    }
  }
  if (cover && covered != *total) {
    return ctx.Bad(fmt::format("{}: shards cover {} of {} elements", in, covered, *total));
  }
  return Status::OK();
}

// The boxes of `t` flat, for CheckBoxTiling; Corruption when one's rank is not the shape's.
Status internal::CheckTiling(const TensorRecord& t, const Ctx& ctx, const std::string& in,
                             bool cover) {
  const size_t nd = t.shape.size();
  std::vector<int64_t> flat;
  flat.reserve(2 * nd * t.shards.size());
  for (size_t k = 0; k < t.shards.size(); ++k) {
    const ShardRecord& s = t.shards[k];
    if (s.offsets.size() != nd || s.sizes.size() != nd) {
      return ctx.Bad(fmt::format("{} shard {}: box at {} of {} exceeds shape {}", in, k,
                                 ShapeToString(s.offsets), ShapeToString(s.sizes),
                                 ShapeToString(t.shape)));
    }
    flat.insert(flat.end(), s.offsets.begin(), s.offsets.end());
    flat.insert(flat.end(), s.sizes.begin(), s.sizes.end());
  }
  return CheckBoxTiling(t.shape, flat.data(), t.shards.size(), ctx, in, cover);
}

Status CheckTensorTiling(const TensorRecord& t, std::string_view where) {
  return internal::CheckTiling(t, internal::Ctx{where}, fmt::format("tensor {:?}", t.name));
}

Status CheckFlatTiling(const Shape& shape, const int64_t* boxes, size_t count,
                       std::string_view where, const std::string& in) {
  return internal::CheckBoxTiling(shape, boxes, count, internal::Ctx{where}, in, true, false);
}

}  // namespace savepoint::format
