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
#include <string_view>

#include "common.h"
#include "savepoint/cuda.h"
#include "tables.h"

namespace savepoint::python {
namespace {

// A Python callable f(step, epoch, step_in_epoch) -> str as a ManagerOptions name callable. The
// manager calls it with the GIL released (it may copy the std::function without the GIL too, so
// the reference lives in a shared_ptr whose deleter takes the GIL).
std::function<std::string(const StepInfo&)> NameCallable(nb::handle fn) {
  std::shared_ptr<nb::object> ref(new nb::object(nb::borrow(fn)), [](nb::object* o) {
    if (Py_IsInitialized()) {
      nb::gil_scoped_acquire gil;
      delete o;
    } else {
      o->release();  // the interpreter is gone: leak the reference
      delete o;
    }
  });
  return [ref](const StepInfo& info) {
    nb::gil_scoped_acquire gil;
    return nb::cast<std::string>((*ref)(info.step, info.epoch, info.step_in_epoch));
  };
}

Value AppendValue(const std::string& key, nb::handle v) {
  if (nb::isinstance<nb::bool_>(v)) return Value(nb::cast<bool>(v));
  if (nb::isinstance<nb::int_>(v)) return Value(nb::cast<int64_t>(v));
  if (nb::isinstance<nb::float_>(v)) return Value(nb::cast<double>(v));
  if (nb::isinstance<nb::str>(v)) return Value(nb::cast<std::string>(v));
  std::string type = nb::cast<std::string>(nb::str(v.type().attr("__name__")));
  throw StatusError(InvalidArgumentError("ManagerOptions.append_dict[\"" + key + "\"] is a " +
                                         type + ": only int, float, bool and str are allowed"));
}

// Every key Open understands (the Python side passes all of them), each between spaces.
constexpr std::string_view kOptionKeys =
    " directory directory_fn prefix prefix_fn series save_interval_steps save_interval_seconds"
    " steps_per_epoch keep_last_n keep_per_n_minutes keep_all keep_every_n_steps keep_best_n"
    " best_metric best_mode async staging_bytes slab_bytes"
    " persist_during_snapshot allow_concurrent_saves snapshot_threads checksum format append_info"
    " append_dict exception_save shard_id num_shards gc_on_open io_threads direct_io key crc_check"
    " enc_mode compact compaction_max_depth compaction_max_delta_ratio cuda_device ";

// A manager and the CUDA snapshot copier its async Checkpointer uses (destroyed after it).
struct PyManager {
  std::unique_ptr<SnapshotCopier> copier;
  std::unique_ptr<CheckpointManager> m;
};

// cuda_device >= 0: CUDA tensors of async saves are copied by CreateCudaSnapshotCopier into the
// page-locked staging slabs (the Python side decides when; ManagerOptions checks the rest).
std::unique_ptr<PyManager> Open(const nb::dict& kw) {
  for (auto [key, value] : kw) {
    std::string k = nb::cast<std::string>(key);
    if (k.find(' ') != std::string::npos || kOptionKeys.find(" " + k + " ") == kOptionKeys.npos) {
      throw nb::type_error(("unknown manager option " + k).c_str());
    }
  }
  ManagerOptions o;
  auto get = [&](const char* key, auto& field) {
    if (kw.contains(key) && !kw[key].is_none()) {
      field = nb::cast<std::decay_t<decltype(field)>>(kw[key]);
    }
  };
  auto choice = [&](const char* key, const std::vector<std::string>& allowed) -> std::string {
    std::string v = nb::cast<std::string>(kw[key]);
    for (const std::string& a : allowed) {
      if (v == a) return v;
    }
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
    throw StatusError(
        InvalidArgumentError("ManagerOptions." + std::string(key) + " = " + v + ": use " + list));
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
  get("slab_bytes", o.async_options.slab_bytes);
  get("persist_during_snapshot", o.async_options.persist_during_snapshot);
  get("allow_concurrent_saves", o.async_options.allow_concurrent_saves);
  get("snapshot_threads", o.async_options.snapshot_threads);
  get("checksum", o.checksum);
  get("append_info", o.append_info);
  get("exception_save", o.exception_save);
  get("shard_id", o.shard_id);
  get("num_shards", o.num_shards);
  get("gc_on_open", o.gc_on_open);
  get("io_threads", o.io.io_threads);
  get("direct_io", o.io.direct_io);
  get("compact", o.compact);
  get("compaction_max_depth", o.compaction.max_depth);
  get("compaction_max_delta_ratio", o.compaction.max_delta_ratio);
  // handle_signals is not passed: the Python front end installs its own handlers (signal module),
  // since the C++ ones would only be acted on by the C++ hooks.
  if (kw.contains("best_mode")) {
    o.best_mode =
        choice("best_mode", {"min", "max"}) == "min" ? MetricMode::kMin : MetricMode::kMax;
  }
  if (kw.contains("series")) {
    o.series =
        choice("series", {"continue", "new"}) == "new" ? SeriesRule::kNew : SeriesRule::kContinue;
  }
  if (kw.contains("format")) {
    const std::string f = choice("format", {"native", "ckpt", "safetensors"});
    o.format = f == "native" ? CheckpointFormat::kNative
               : f == "ckpt" ? CheckpointFormat::kMindSporeCkpt
                             : CheckpointFormat::kSafetensors;
  }
  get("crc_check", o.crc_check);
  if (kw.contains("enc_mode")) {
    o.enc_mode = Take(ParseMindSporeCipher(nb::cast<std::string>(kw["enc_mode"])));
  }
  if (kw.contains("append_dict") && !kw["append_dict"].is_none()) {
    for (auto [key, value] : nb::cast<nb::dict>(kw["append_dict"])) {
      std::string k = nb::cast<std::string>(key);
      o.append_dict[k] = AppendValue(k, value);
    }
  }
  if (kw.contains("key")) o.key = KeyFromPython(kw["key"], "CheckpointManager key");
  if (kw.contains("prefix_fn") && !kw["prefix_fn"].is_none()) {
    o.prefix_fn = NameCallable(kw["prefix_fn"]);
  }
  if (kw.contains("directory_fn") && !kw["directory_fn"].is_none()) {
    o.directory_fn = NameCallable(kw["directory_fn"]);
  }
  auto out = std::make_unique<PyManager>();
  if (kw.contains("cuda_device") && nb::cast<int>(kw["cuda_device"]) >= 0) {
    const int device = nb::cast<int>(kw["cuda_device"]);
    out->copier = Take(Unlocked([&] { return CreateCudaSnapshotCopier({.device = device}); }));
    o.async_options.copier = out->copier.get();
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

nb::list All(PyManager& pm) {
  std::vector<CheckpointRecord> records = Unlocked([&] { return pm.m->All(); });
  nb::list out;
  for (const CheckpointRecord& r : records) out.append(RecordToPython(r));
  return out;
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
      .def_static("open", &Open, nb::arg("options"), "Opens a manager; options: a dict of fields.")
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
