// Internal helpers of the distributed save and load: resolving a rank's layout, the deterministic
// replica-write assignment, and box arithmetic.
#ifndef SAVEPOINT_DISTRIBUTED_SHARD_H_
#define SAVEPOINT_DISTRIBUTED_SHARD_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "savepoint/distributed.h"

namespace savepoint::dist {

// One local tensor of this rank with its resolved layout (defaults filled, replicas sorted).
struct LocalShard {
  std::string name;
  TensorView view;
  ShardSpec spec;
};

// The stored tensor local entry `name` under `spec` is a box of (ShardSpec::tensor).
inline const std::string& StoredName(const std::string& name, const ShardSpec& spec) {
  return spec.tensor.empty() ? name : spec.tensor;
}

// Most ranks a layout may describe.
inline constexpr int64_t kMaxWorld = int64_t{1} << 20;

// Part i of n of a dim of S elements: [i * S / n, (i + 1) * S / n) as (offset, size), without
// overflow (S <= 2^62, n <= 2^20).
inline std::pair<int64_t, int64_t> SplitRange(int64_t s, int64_t n, int64_t i) {
  auto at = [&](int64_t k) { return static_cast<int64_t>(static_cast<__int128>(k) * s / n); };
  return {at(i), at(i + 1) - at(i)};
}

// InvalidArgument naming `name` unless offsets/sizes have the rank of `global` and the box
// [offsets, offsets + sizes) lies within it.
Status CheckBox(std::string_view name, const Shape& global, const Shape& offsets,
                const Shape& sizes);

// Resolves every tensor of `local` against `layout` for rank `rank` of `size`: a tensor without
// an entry is the whole tensor replicated on all ranks. Checks boxes, that sizes equal the local
// shape, and that replica groups hold valid, distinct ranks including `rank`. A layout entry
// without a tensor in `local` is an error. Result sorted by name.
Result<std::vector<LocalShard>> ResolveLocalShards(const State& local, const ShardLayout& layout,
                                                   int rank, int size);

// Which shards `rank` writes: each shard is assigned to one member of its replica group. For every
// replica group the members' shards (identical on every member) are sorted by bytes (largest
// first, then name) and each goes to the member with the fewest bytes so far (lowest rank on
// ties). Every member computes the same assignment without communication. Returns indices into
// `shards`, in order.
std::vector<size_t> AssignWrites(const std::vector<LocalShard>& shards, int rank);

// The intersection of boxes a and b (same rank); false when it is empty.
bool IntersectBoxes(const Shape& a_off, const Shape& a_size, const Shape& b_off,
                    const Shape& b_size, Shape* off, Shape* size);

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_SHARD_H_
