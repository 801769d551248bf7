#include "testutil/sparse_tables.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace savepoint::testing {
namespace {

template <typename T>
T OrDie(Result<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "MakeTable: %s\n", r.status().ToString().c_str());
    std::abort();
  }
  return std::move(*r);
}

Tensor IdTensor(std::span<const int64_t> ids) {
  Tensor t = OrDie(Tensor::Empty(DType::kI64, {static_cast<int64_t>(ids.size())}));
  if (!ids.empty()) std::memcpy(t.data(), ids.data(), ids.size_bytes());
  return t;
}

}  // namespace

SparseTable MakeTable(std::span<const int64_t> ids, const std::vector<TableSlot>& slots,
                      std::span<const int64_t> deleted) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const TableSlot& s : slots) {
    const Shape shape = s.width < 0 ? Shape{n} : Shape{n, s.width};
    Tensor t = OrDie(Tensor::Empty(s.dtype, shape));
    const uint64_t rb = SparseTable::RowBytes(t.view());
    for (int64_t i = 0; i < n; ++i) {
      s.fill(ids[i], std::span<std::byte>(t.data() + static_cast<uint64_t>(i) * rb, rb));
    }
    tensors.emplace_back(s.name, std::move(t));
  }
  return OrDie(SparseTable::FromTensors(IdTensor(ids), std::move(tensors), IdTensor(deleted)));
}

}  // namespace savepoint::testing
