// Bindings behind the torch.distributed.checkpoint (DCP) storage plug-in (savepoint/torch.py):
// the distributed save's steps one by one (RankSave, SaveCoordinator: DCP runs the collectives
// and carries their bytes in SavePlan.storage_data and WriteResult.storage_data) and LoadBoxes
// (DCP's ReadItems: boxes of stored tensors read straight into the destinations). The GIL is
// released for all I/O.
#include <nanobind/stl/string_view.h>

#include "common.h"

namespace savepoint::python {
namespace {

// (local name, address, dtype name, local shape, global shape, offsets of the box in the global
// tensor, the stored tensor when the local name is another: ShardSpec::tensor). The plug-in names
// a rank's second and later boxes of one tensor (savepoint/torch.py, _local_names).
using ShardTensorSpec = std::tuple<std::string, uintptr_t, std::string, std::vector<int64_t>,
                                   std::vector<int64_t>, std::vector<int64_t>, std::string>;

// A State borrowing the shards' memory and their layout (each box held by this rank only: DCP's
// planner has already picked one writer per replicated box).
std::pair<State, ShardLayout> ShardsToState(const std::vector<ShardTensorSpec>& shards) {
  std::vector<TensorSpec> tensors;
  ShardLayout layout;
  for (const auto& [name, address, dtype, shape, global, offsets, tensor] : shards) {
    tensors.emplace_back(name, address, dtype, shape);
    ShardSpec spec{.global_shape = global,
                   .offsets = offsets,
                   .sizes = shape,
                   .replicas = {},
                   .tensor = tensor};
    if (!layout.emplace(name, std::move(spec)).second) {
      throw StatusError(InternalError("DCP save: two shards of one rank named " + name));
    }
  }
  return {MakeState(tensors, {}, ""), std::move(layout)};
}

SaveOptions MakeSaveOptions(uint64_t chunk_bytes, bool overwrite) {
  return {.chunk_bytes = chunk_bytes, .overwrite = overwrite};
}

// Step 1 for another rank, without its data (the coordinator plans every rank once DCP's planner
// has picked the writers): the shards' addresses are placeholders that are never read, since the
// RankSave is dropped before any write.
nb::bytes PlanShapes(int rank, int world, std::vector<ShardTensorSpec> shards,
                     uint64_t chunk_bytes) {
  static const std::byte placeholder[kTensorAlignment] = {};
  for (auto& s : shards) std::get<1>(s) = reinterpret_cast<uintptr_t>(placeholder);
  auto [state, layout] = ShardsToState(shards);
  RankSave plan(rank, world);
  std::string bytes = plan.Plan(state, layout, MakeSaveOptions(chunk_bytes, false), {});
  Check(plan.planned());
  return nb::bytes(bytes.data(), bytes.size());
}

// One rank's part: holds the State (views of the caller's tensors) between plan and write.
class DcpRankSave {
 public:
  DcpRankSave(int rank, int world, uint64_t chunk_bytes, int io_threads, bool direct_io)
      : save_(rank, world),
        o_(MakeSaveOptions(chunk_bytes, false)),
        io_{.io_threads = io_threads, .direct_io = direct_io} {}

  nb::bytes Plan(const std::vector<ShardTensorSpec>& shards) {
    std::tie(state_, layout_) = ShardsToState(shards);
    std::string bytes = save_.Plan(state_, layout_, o_, io_);
    return nb::bytes(bytes.data(), bytes.size());
  }

  // The report bytes; raises when the verdict is an error. A failed write travels in the report.
  nb::bytes Write(nb::bytes verdict) {
    std::string_view v(static_cast<const char*>(verdict.data()), verdict.size());
    Result<std::string> r = Unlocked([&] { return save_.Write(v, o_, io_); });
    std::string report = Take(std::move(r));
    return nb::bytes(report.data(), report.size());
  }

  void AddValues(const std::vector<ValueSpec>& values, const std::string& metadata_json) {
    Check(save_.AddValues(MakeState({}, values, metadata_json)));
  }

  RankSave& save() { return save_; }

 private:
  RankSave save_;
  SaveOptions o_;
  IoOptions io_;
  State state_;
  ShardLayout layout_;
};

class DcpCoordinator {
 public:
  DcpCoordinator(std::string path, int world, bool overwrite)
      : c_(std::move(path), world, MakeSaveOptions(SaveOptions{}.chunk_bytes, overwrite), {}) {}

  // The verdict bytes for every rank; raises when the plans are refused.
  nb::bytes Decide(const std::vector<nb::bytes>& plans) {
    std::vector<std::string> p;
    for (const nb::bytes& b : plans) p.emplace_back(static_cast<const char*>(b.data()), b.size());
    std::string verdict = Unlocked([&] { return c_.Decide(p); });
    Check(c_.decided());
    return nb::bytes(verdict.data(), verdict.size());
  }

  void Commit(const std::vector<nb::bytes>& reports, DcpRankSave& own) {
    std::vector<std::string> r;
    for (const nb::bytes& b : reports) r.emplace_back(static_cast<const char*>(b.data()), b.size());
    Check(Unlocked([&] { return c_.Commit(r, own.save()); }));
  }

  void Abandon() {
    Unlocked([&] {
      c_.Abandon();
      return 0;
    });
  }

 private:
  SaveCoordinator c_;
};

// (name, offsets of the box in the global tensor, address, dtype name, box shape).
using BoxSpec =
    std::tuple<std::string, std::vector<int64_t>, uintptr_t, std::string, std::vector<int64_t>>;

void LoadBoxesPy(const std::string& path, const std::vector<BoxSpec>& specs, bool verify,
                 int io_threads, bool direct_io) {
  std::vector<BoxTarget> boxes;
  boxes.reserve(specs.size());
  for (const auto& [name, offsets, address, dtype_name, shape] : specs) {
    std::optional<DType> dtype = DTypeFromName(dtype_name);
    if (!dtype) throw StatusError(InvalidArgumentError("tensor " + name + ": dtype " + dtype_name));
    boxes.push_back({name, offsets, TensorView(reinterpret_cast<void*>(address), *dtype, shape)});
  }
  Status s = Unlocked([&] {
    return LoadBoxes(path, boxes, {.verify_checksums = verify},
                     {.io_threads = io_threads, .direct_io = direct_io});
  });
  Check(s);
}

}  // namespace

void BindDcp(nb::module_& m) {
  m.def(
      "dcp_plan_shapes", &PlanShapes, nb::arg("rank"), nb::arg("world"), nb::arg("shards"),
      nb::arg("chunk_bytes"),
      "Plan bytes of a rank's shards [(name, 0, dtype, shape, global, offsets, tensor)], no data.");
  nb::class_<DcpRankSave>(m, "DcpRankSave")
      .def(nb::init<int, int, uint64_t, int, bool>(), nb::arg("rank"), nb::arg("world"),
           nb::arg("chunk_bytes"), nb::arg("io_threads"), nb::arg("direct_io"))
      .def("plan", &DcpRankSave::Plan, nb::arg("shards"))
      .def("write", &DcpRankSave::Write, nb::arg("verdict"))
      .def("add_values", &DcpRankSave::AddValues, nb::arg("values"), nb::arg("metadata_json"));
  nb::class_<DcpCoordinator>(m, "DcpCoordinator")
      .def(nb::init<std::string, int, bool>(), nb::arg("path"), nb::arg("world"),
           nb::arg("overwrite"))
      .def("decide", &DcpCoordinator::Decide, nb::arg("plans"))
      .def("commit", &DcpCoordinator::Commit, nb::arg("reports"), nb::arg("own"))
      .def("abandon", &DcpCoordinator::Abandon);
  m.def("load_boxes", &LoadBoxesPy, nb::arg("path"), nb::arg("boxes"), nb::arg("verify"),
        nb::arg("io_threads"), nb::arg("direct_io"),
        "Reads boxes [(name, offsets, address, dtype, shape)] of stored tensors (LoadBoxes).");
}

}  // namespace savepoint::python
