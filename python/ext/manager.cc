// Binding of CheckpointManager's direct API (Save / ResumeFrom / ShouldSave / LatestStep / All /
// Wait / Close). Everything else of the Python manager (registered objects, hooks, breakpoints,
// signal handling) is pure Python over these calls, in savepoint/_manager.py. Restores are done
// by the Python side, which loads the chosen record's path with savepoint.load (so like=,
// map_location and mmap work the same) and then tells the manager with ResumeFrom. The GIL is
// released for every call that may do I/O or wait; the prefix_fn / directory_fn callables take it
// back while they run, and an exception they raise propagates to the Python caller unchanged.
#include "savepoint/manager.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>

#include "common.h"
#include "savepoint/cuda.h"
#include "tables.h"

namespace savepoint::python {
namespace {

// A manager and the CUDA snapshot copier its async Checkpointer uses (destroyed after it).
struct PyManager {
  std::unique_ptr<SnapshotCopier> copier;
  std::unique_ptr<CheckpointManager> m;
};

// cuda_device >= 0: CUDA tensors of async saves are copied by CreateCudaSnapshotCopier into the
// page-locked staging slabs (the Python side decides when; ManagerOptions checks the rest).
std::unique_ptr<PyManager> Open(ManagerOptions o, int cuda_device) {
  auto out = std::make_unique<PyManager>();
  if (cuda_device >= 0) {
    out->copier = Take(Unlocked([&] { return CreateCudaSnapshotCopier({.device = cuda_device}); }));
    o.async_save.checkpointer.copier = out->copier.get();
  }
  out->m = Take(Unlocked([&] { return CheckpointManager::Open(std::move(o)); }));
  return out;
}

bool Save(PyManager& pm, int64_t step, const std::vector<TensorSpec>& tensors,
          const std::vector<ValueSpec>& values, const std::string& metadata, const Metrics& metrics,
          bool force, std::optional<int64_t> epoch, std::optional<int64_t> step_in_epoch,
          bool epoch_end, bool breakpoint, const std::vector<TableSpec>& tables, bool delta) {
  CheckpointManager& m = *pm.m;
  State state = MakeState(tensors, values, metadata);
  AddTables(state, tables, m.directory());
  SaveArgs args;
  args.metrics = metrics;
  args.force = force;
  args.epoch = epoch;
  args.step_in_epoch = step_in_epoch;
  args.epoch_end = epoch_end;
  args.breakpoint = breakpoint;
  args.delta = delta;
  return Take(Unlocked([&] { return m.Save(step, state, args); }));
}

nb::dict RecordToPython(const CheckpointRecord& r) {
  nb::dict d;
  d["name"] = r.name;
  d["path"] = r.path;
  d["step"] = r.step;
  d["epoch"] = r.epoch;
  d["step_in_epoch"] = r.step_in_epoch;
  d["created_ns"] = r.created_ns;
  d["bytes"] = r.bytes;
  d["breakpoint"] = r.breakpoint;
  d["epoch_end"] = r.epoch_end;
  d["metrics"] = nb::cast(r.metrics);
  return d;
}

nb::dict ResumeFrom(PyManager& pm, std::optional<int64_t> step, const std::string& name) {
  CheckpointManager& m = *pm.m;
  Which which;
  which.step = step;
  which.name = name;
  return RecordToPython(Take(Unlocked([&] { return m.ResumeFrom(which); })));
}

nb::list Records(std::vector<CheckpointRecord> records) {
  nb::list out;
  for (const CheckpointRecord& r : records) out.append(RecordToPython(r));
  return out;
}

nb::list All(PyManager& pm) {
  return Records(Unlocked([&] { return pm.m->All(); }));
}

nb::list Remote(PyManager& pm) {
  return Records(Unlocked([&] { return pm.m->Remote(); }));
}

nb::list Stats(PyManager& pm) {
  std::vector<CheckpointStats> stats = Unlocked([&] { return pm.m->stats(); });
  nb::list out;
  for (const CheckpointStats& s : stats) {
    nb::dict d;
    d["action"] = s.action;
    d["name"] = s.name;
    d["step"] = s.step;
    d["bytes"] = s.bytes;
    d["seconds"] = s.seconds;
    d["blocked_seconds"] = s.blocked_seconds;
    out.append(d);
  }
  return out;
}

}  // namespace

void BindManager(nb::module_& m) {
  nb::class_<PyManager>(m, "CheckpointManager")
      .def_static("open", &Open, nb::arg("options"), nb::arg("cuda_device") = -1,
                  "Opens a manager (options: a ManagerOptions); cuda_device >= 0: async saves "
                  "copy CUDA tensors through a snapshot copier of that device.")
      .def("save", &Save, nb::arg("step"), nb::arg("tensors"), nb::arg("values"),
           nb::arg("metadata"), nb::arg("metrics"), nb::arg("force"), nb::arg("epoch").none(),
           nb::arg("step_in_epoch").none(), nb::arg("epoch_end"), nb::arg("breakpoint"),
           nb::arg("tables") = std::vector<TableSpec>{}, nb::arg("delta") = false)
      .def("resume_from", &ResumeFrom, nb::arg("step").none(), nb::arg("name"),
           "Continue from the newest checkpoint at `step` (None: any) or named `name` (''); "
           "returns its record.")
      .def("should_save",
           [](PyManager& p, int64_t step) {
             return Unlocked([&] { return p.m->ShouldSave(step); });
           })
      .def("latest_step", [](PyManager& p) { return Unlocked([&] { return p.m->LatestStep(); }); })
      .def("all_steps", [](PyManager& p) { return Unlocked([&] { return p.m->AllSteps(); }); })
      .def("all", &All)
      .def("remote", &Remote)
      .def("stats", &Stats)
      .def("reserve", [](PyManager& p,
                         uint64_t bytes) { Check(Unlocked([&] { return p.m->Reserve(bytes); })); })
      .def("wait", [](PyManager& p) { Check(Unlocked([&] { return p.m->Wait(); })); })
      .def("close", [](PyManager& p) { Check(Unlocked([&] { return p.m->Close(); })); })
      .def_prop_ro("directory", [](PyManager& p) { return p.m->directory(); })
      .def_prop_ro("prefix", [](PyManager& p) { return p.m->prefix(); })
      .def_prop_ro("device_copies", [](const PyManager& p) { return p.copier != nullptr; });
}

}  // namespace savepoint::python
