// Bindings of the MindSpore distributed loads, redundancy-free saves and exports
// (savepoint/mindspore_strategy.h, "Loading a MindSpore distributed checkpoint"). The GIL is
// released for all I/O; errors raise the typed exceptions of savepoint._errors.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>

#include "common.h"
#include "savepoint/mindspore_strategy.h"

namespace savepoint::python {
namespace {

// (global_shape, offsets, sizes) per tensor, as savepoint.mindspore.load_distributed takes it.
using BoxSpec = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>>;

nb::tuple LoadRank(const std::string& src_dir, int64_t rank, const std::optional<std::string>& src,
                   const std::optional<std::string>& dst, int io_threads) {
  const MindSporeDistributedLoadOptions o{.src_strategy_file = src, .dst_strategy_file = dst};
  return LoadedStateToPython(Take(Unlocked(
      [&] { return LoadMindSporeDistributedRank(src_dir, rank, o, {.io_threads = io_threads}); })));
}

nb::tuple LoadLayout(const std::string& src_dir, const std::map<std::string, BoxSpec>& boxes,
                     const std::optional<std::string>& src, int io_threads) {
  ShardLayout layout;
  for (const auto& [name, box] : boxes) {
    layout[name] = ShardSpec{std::get<0>(box), std::get<1>(box), std::get<2>(box), {}};
  }
  const MindSporeDistributedLoadOptions o{.src_strategy_file = src};
  return LoadedStateToPython(Take(Unlocked([&] {
    return LoadMindSporeDistributedAlloc(src_dir, layout, o, {.io_threads = io_threads});
  })));
}

nb::dict SaveRedundancyFree(const std::string& path, const std::vector<TensorSpec>& tensors,
                            const std::vector<ValueSpec>& values, const std::string& strategy,
                            int64_t rank, bool overwrite, bool crc_check, int io_threads) {
  State state = MakeState(tensors, values, "");
  SaveStats stats;
  const MindSporeSaveOptions o{.overwrite = overwrite, .crc_check = crc_check, .stats = &stats};
  Check(Unlocked([&] {
    return SaveMindSporeRedundancyFree(state, strategy, rank, path, o, {.io_threads = io_threads});
  }));
  return SaveStatsToPython(stats);
}

void Export(const std::string& src, const std::string& dst_dir, const std::string& prefix,
            const std::optional<std::string>& dst, const std::vector<int64_t>& ranks,
            int io_threads) {
  const MindSporeExportOptions o{.dst_strategy_file = dst, .ranks = ranks};
  Check(Unlocked([&] {
    return ExportMindSporeDistributed(src, dst_dir, prefix, o, {.io_threads = io_threads});
  }));
}

}  // namespace

void BindMindSporeDistributed(nb::module_& m) {
  m.def("ms_load_distributed_rank", &LoadRank, nb::arg("src_dir"), nb::arg("rank"),
        nb::arg("src").none(), nb::arg("dst").none(), nb::arg("io_threads"),
        "LoadMindSporeDistributedRank (GIL released): (tensors, values, metadata JSON).");
  m.def("ms_load_distributed_layout", &LoadLayout, nb::arg("src_dir"), nb::arg("layout"),
        nb::arg("src").none(), nb::arg("io_threads"),
        "LoadMindSporeDistributedAlloc (GIL released): (tensors, values, metadata JSON).");
  m.def("ms_save_redundancy_free", &SaveRedundancyFree, nb::arg("path"), nb::arg("tensors"),
        nb::arg("values"), nb::arg("strategy"), nb::arg("rank"), nb::arg("overwrite"),
        nb::arg("crc_check"), nb::arg("io_threads"),
        "SaveMindSporeRedundancyFree of borrowed tensors (GIL released); SaveStats.");
  m.def("ms_export", &Export, nb::arg("src"), nb::arg("dst_dir"), nb::arg("prefix"),
        nb::arg("dst").none(), nb::arg("ranks"), nb::arg("io_threads"),
        "ExportMindSporeDistributed (GIL released).");
}

}  // namespace savepoint::python
