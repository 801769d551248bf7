// Binding of CheckpointManager's direct API (Save / ShouldSave / LatestStep / All / Wait / Close).
// Restores are done by the Python side, which picks the record here and loads its path with
// savepoint.load (so like=, map_location and mmap work the same). The GIL is released for every
// call that may do I/O or wait.
#include "savepoint/manager.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/unique_ptr.h>

#include "common.h"

namespace savepoint::python {
namespace {

// Runs `fn` (returning Status or Result<T>) on the manager with the GIL released.
template <typename Fn>
auto Unlocked(Fn&& fn) {
  nb::gil_scoped_release release;
  return fn();
}

std::unique_ptr<CheckpointManager> Open(const nb::dict& kw) {
  ManagerOptions o;
  auto get = [&](const char* key, auto& field) {
    if (kw.contains(key)) field = nb::cast<std::decay_t<decltype(field)>>(kw[key]);
  };
  get("directory", o.directory);
  get("prefix", o.prefix);
  get("save_interval_steps", o.save_interval_steps);
  get("save_interval_seconds", o.save_interval_seconds);
  get("steps_per_epoch", o.steps_per_epoch);
  get("keep_last_n", o.keep_last_n);
  get("keep_per_n_minutes", o.keep_per_n_minutes);
  get("keep_all", o.keep_all);
  get("keep_every_n_steps", o.keep_every_n_steps);
  get("keep_best_n", o.keep_best_n);
  get("best_metric", o.best_metric);
  get("async", o.async);
  get("staging_bytes", o.async_options.staging_bytes);
  get("checksum", o.checksum);
  get("gc_on_open", o.gc_on_open);
  get("io_threads", o.io_threads);
  get("direct_io", o.direct_io);
  if (kw.contains("best_mode")) {
    std::string mode = nb::cast<std::string>(kw["best_mode"]);
    if (mode != "min" && mode != "max") {
      throw StatusError(
          InvalidArgumentError("best_mode = " + mode + ": must be \"min\" or \"max\""));
    }
    o.best_mode = mode == "min" ? MetricMode::kMin : MetricMode::kMax;
  }
  return Take(Unlocked([&] { return CheckpointManager::Open(std::move(o)); }));
}

bool Save(CheckpointManager& m, int64_t step, const std::vector<TensorSpec>& tensors,
          const std::vector<ValueSpec>& values, const std::string& metadata, const Metrics& metrics,
          bool force) {
  State state = MakeState(tensors, values, metadata);
  SaveArgs args;
  args.metrics = metrics;
  args.force = force;
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

nb::list All(CheckpointManager& m) {
  std::vector<CheckpointRecord> records = Unlocked([&] { return m.All(); });
  nb::list out;
  for (const CheckpointRecord& r : records) out.append(RecordToPython(r));
  return out;
}

nb::list Stats(CheckpointManager& m) {
  std::vector<CheckpointStats> stats = Unlocked([&] { return m.stats(); });
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
  nb::class_<CheckpointManager>(m, "CheckpointManager")
      .def_static("open", &Open, nb::arg("options"), "Opens a manager; options: a dict of fields.")
      .def("save", &Save, nb::arg("step"), nb::arg("tensors"), nb::arg("values"),
           nb::arg("metadata"), nb::arg("metrics"), nb::arg("force"))
      .def("should_save", [](CheckpointManager& c,
                             int64_t step) { return Unlocked([&] { return c.ShouldSave(step); }); })
      .def("latest_step",
           [](CheckpointManager& c) { return Unlocked([&] { return c.LatestStep(); }); })
      .def("all_steps", [](CheckpointManager& c) { return Unlocked([&] { return c.AllSteps(); }); })
      .def("all", &All)
      .def("stats", &Stats)
      .def("wait", [](CheckpointManager& c) { Check(Unlocked([&] { return c.Wait(); })); })
      .def("close", [](CheckpointManager& c) { Check(Unlocked([&] { return c.Close(); })); })
      .def_prop_ro("directory", [](CheckpointManager& c) { return c.directory(); })
      .def_prop_ro("prefix", [](CheckpointManager& c) { return c.prefix(); });
}

}  // namespace savepoint::python
