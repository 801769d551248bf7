// Fuzz target for the sparse-table description decoder (src/sparse/stored.h, docs/FORMAT.md §11):
// the JSON value "savepoint.sparse" of a checkpoint, which names the tensors storing each table
// and the base of a delta. The input is that JSON; it is put into the manifests of two real
// checkpoints (a full save and a delta of it, made once in memory; their manifests also get the
// dense slice_rows tensors of description format 1, so that both formats can decode) and decoded
// against each. Any input must give OK or a clean error: no crash, no sanitizer report, no huge
// allocation. A description that decodes is encoded again and must decode to the same tables.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/manifest.h"
#include "io/mem_fs.h"
#include "savepoint/sparse.h"
#include "sparse/stored.h"

namespace {

using namespace savepoint;

SparseTable Table(int64_t first, int64_t n, std::vector<int64_t> deleted) {
  Tensor ids = Tensor::Empty(DType::kI64, {n}).value();
  Tensor emb = Tensor::Zeros(DType::kF32, {n, 4}).value();
  Tensor cnt = Tensor::Zeros(DType::kI64, {n}).value();
  for (int64_t i = 0; i < n; ++i) ids.as<int64_t>()[i] = first + i * 65537;
  Tensor del = Tensor::Empty(DType::kI64, {static_cast<int64_t>(deleted.size())}).value();
  for (size_t i = 0; i < deleted.size(); ++i) del.as<int64_t>()[i] = deleted[i];
  std::vector<std::pair<std::string, Tensor>> slots;
  slots.emplace_back("embedding", std::move(emb));
  slots.emplace_back("count", std::move(cnt));
  return SparseTable::FromTensors(std::move(ids), std::move(slots), std::move(del)).value();
}

// The MANIFEST bytes of a full checkpoint and of a delta on it (built once).
const std::vector<std::string>& Manifests() {
  static const std::vector<std::string> manifests = [] {
    MemFileSystem fs;
    const IoOptions io{.fs = &fs};
    State full, delta;
    full.PutTable("emb", Table(3, 10, {})).IgnoreError();
    delta.PutTable("emb", Table(5, 2, {3})).IgnoreError();
    if (!SaveSparse(full, "/full", {}, io).ok()) std::abort();
    SparseSaveOptions o;
    o.base = "/full";
    if (!SaveSparse(delta, "/delta", o, io).ok()) std::abort();
    return std::vector<std::string>{fs.ReadFile("/full/MANIFEST", 1 << 24).value(),
                                    fs.ReadFile("/delta/MANIFEST", 1 << 24).value()};
  }();
  return manifests;
}

void Decode(const std::string& manifest, const Json& desc) {
  Result<format::Manifest> parsed = format::DecodeManifest(manifest, "in");
  if (!parsed.ok()) std::abort();
  format::Manifest& m = *parsed;
  for (const char* name :
       {"savepoint.sparse/0.emb/slice_rows", "savepoint.sparse/0.emb/deleted_slice_rows"}) {
    format::TensorRecord t;
    t.name = name;
    t.dtype = DType::kI64;
    t.shape = {kNumSlices};
    m.tensors.push_back(std::move(t));
  }
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  m.values.Erase(format::kSparseValueName);
  if (!m.values.PutValue(std::string(format::kSparseValueName), Value::FromJson(desc)).ok()) {
    return;
  }
  bool found = false;
  Result<sparse::Desc> d = sparse::DecodeDesc(m, "in", &found);
  if (!d.ok() || !found) return;
  m.values.Erase(format::kSparseValueName);
  m.values.PutValue(std::string(format::kSparseValueName), Value::FromJson(sparse::EncodeDesc(*d)))
      .IgnoreError();
  Result<sparse::Desc> back = sparse::DecodeDesc(m, "back", &found);
  if (!back.ok() || back->tables.size() != d->tables.size() || back->depth != d->depth ||
      back->format != d->format || sparse::EncodeDesc(*back) != sparse::EncodeDesc(*d)) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  Json desc = Json::parse(std::string_view(reinterpret_cast<const char*>(data), size), nullptr,
                          /*allow_exceptions=*/false);
  if (desc.is_discarded()) return 0;
  for (const std::string& m : Manifests()) Decode(m, desc);
  return 0;
}
