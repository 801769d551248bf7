// Bindings of MindSpore strategy files and transforms (savepoint/mindspore_strategy.h). The GIL is
// released for all I/O; errors raise the typed exceptions of savepoint._errors.
#include "savepoint/mindspore_strategy.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>

#include "common.h"

namespace savepoint::python {
namespace {

// `format` is "ckpt", "safetensors" or "native".
MindSporeTransformOptions Options(const std::optional<std::string>& src,
                                  const std::optional<std::string>& dst,
                                  uint64_t memory_budget_bytes,
                                  const std::string& format = "ckpt") {
  return {.src_strategy_file = src,
          .dst_strategy_file = dst,
          .memory_budget_bytes = memory_budget_bytes,
          .output_format = Take(MindSporeTransformFormatFromName(format))};
}

void Transform(const std::string& src_dir, const std::string& dst_dir, const std::string& prefix,
               const std::optional<std::string>& src, const std::optional<std::string>& dst,
               const std::vector<int64_t>& ranks, uint64_t memory_budget_bytes, int io_threads,
               const std::string& format) {
  MindSporeTransformOptions o = Options(src, dst, memory_budget_bytes, format);
  o.ranks = ranks;
  Check(Unlocked([&] {
    return MindSporeTransformCheckpoints(src_dir, dst_dir, prefix, o, {.io_threads = io_threads});
  }));
}

void TransformByRank(int64_t rank, const std::map<int64_t, std::string>& files,
                     const std::string& dst_file, const std::optional<std::string>& src,
                     const std::optional<std::string>& dst, uint64_t memory_budget_bytes,
                     int io_threads, const std::string& format) {
  const MindSporeTransformOptions o = Options(src, dst, memory_budget_bytes, format);
  Check(Unlocked([&] {
    return MindSporeTransformCheckpointByRank(rank, files, dst_file, o, {.io_threads = io_threads});
  }));
}

std::vector<int64_t> RankList(int64_t rank, const std::optional<std::string>& src,
                              const std::optional<std::string>& dst) {
  const MindSporeTransformOptions o = Options(src, dst, 0);
  return Take(Unlocked([&] { return MindSporeRankListForTransform(rank, o); }));
}

void Merge(const std::string& src_dir, const std::string& dst_file) {
  Check(Unlocked([&] { return MergeMindSporeStrategies(src_dir, dst_file); }));
}

// {param: {"dev_matrix", "tensor_map", "stages", ...}} of a resolved strategy file.
nb::dict Layouts(const std::string& path) {
  MindSporeLayoutMap m = Take(Unlocked([&] { return ReadMindSporeLayouts(path); }));
  nb::dict out;
  for (const auto& [name, p] : m.params) {
    nb::dict d;
    d["dev_matrix"] = p.layout.dev_matrix;
    d["tensor_map"] = p.layout.tensor_map;
    d["param_split_shape"] = p.layout.param_split_shape;
    d["opt_weight_shard_size"] = p.layout.opt_weight_shard_size;
    d["opt_weight_shard_step"] = p.layout.opt_weight_shard_step;
    d["stages"] = p.stages;
    out[nb::str(name.data(), name.size())] = d;
  }
  return out;
}

}  // namespace

void BindMindSporeStrategy(nb::module_& m) {
  m.def("ms_transform", &Transform, nb::arg("src_dir"), nb::arg("dst_dir"), nb::arg("prefix"),
        nb::arg("src").none(), nb::arg("dst").none(), nb::arg("ranks"),
        nb::arg("memory_budget_bytes"), nb::arg("io_threads"), nb::arg("output_format"),
        "MindSporeTransformCheckpoints (GIL released).");
  m.def("ms_transform_by_rank", &TransformByRank, nb::arg("rank"), nb::arg("files"),
        nb::arg("dst_file"), nb::arg("src").none(), nb::arg("dst").none(),
        nb::arg("memory_budget_bytes"), nb::arg("io_threads"), nb::arg("output_format"),
        "MindSporeTransformCheckpointByRank (GIL released).");
  m.def("ms_rank_list", &RankList, nb::arg("rank"), nb::arg("src").none(), nb::arg("dst").none(),
        "MindSporeRankListForTransform (GIL released).");
  m.def("ms_merge_strategies", &Merge, nb::arg("src_dir"), nb::arg("dst_file"),
        "MergeMindSporeStrategies (GIL released).");
  m.def("ms_strategy_layouts", &Layouts, nb::arg("path"),
        "ReadMindSporeLayouts (GIL released): {param: layout dict}.");
}

}  // namespace savepoint::python
