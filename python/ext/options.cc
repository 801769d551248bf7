// The options structs as Python classes (savepoint._core.ManagerOptions and its role groups,
// CheckpointerOptions, IoOptions): one attribute per C++ field (def_rw), nested groups returned
// by reference, so `o.retention.keep_last_n = 3` sets the field of `o`. AsyncCheckpointer
// (savepoint/_save.py) fills a CheckpointerOptions and an IoOptions. The Python CheckpointManager
// (savepoint/_manager.py) checks and converts its keyword arguments and fills one of these. Fields
// that need a conversion are properties: name callables (prefix_fn, directory_fn), the key,
// append_dict and the cipher (by MindSpore's name). The snapshot copier and the file system are
// not exposed: the binding's CheckpointManager.open sets the copier itself.
#include <nanobind/stl/map.h>

#include <memory>
#include <string>

#include "common.h"
#include "savepoint/manager.h"
#include "savepoint/mindspore.h"

namespace savepoint::python {
namespace {

// A Python callable f(step, epoch, step_in_epoch) -> str as a ManagerOptions name callable. The
// manager calls it with the GIL released (it may copy the std::function without the GIL too, so
// the reference lives in a shared_ptr whose deleter takes the GIL).
std::function<std::string(const StepInfo&)> NameCallable(nb::handle fn) {
  if (fn.is_none()) return nullptr;
  if (!PyCallable_Check(fn.ptr())) throw nb::type_error("a name callable must be callable or None");
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
  throw StatusError(InvalidArgumentError("ManagerOptions.storage.append_dict[\"" + key +
                                         "\"] is a " + type +
                                         ": only int, float, bool and str are allowed"));
}

// A property setter that takes None (to clear a callable or a key).
const auto kNone = nb::for_setter(nb::arg("value").none());

void BindEnums(nb::module_& m) {
  nb::enum_<SeriesRule>(m, "SeriesRule")
      .value("kContinue", SeriesRule::kContinue)
      .value("kNew", SeriesRule::kNew);
  nb::enum_<MetricMode>(m, "MetricMode")
      .value("kMin", MetricMode::kMin)
      .value("kMax", MetricMode::kMax);
  nb::enum_<Format>(m, "Format")
      .value("kAuto", Format::kAuto)
      .value("kNative", Format::kNative)
      .value("kSafetensors", Format::kSafetensors)
      .value("kMindSporeCkpt", Format::kMindSporeCkpt)
      .value("kDcp", Format::kDcp)
      .value("kRecis", Format::kRecis);
}

void BindPolicies(nb::module_& m) {
  nb::class_<ManagerNaming>(m, "ManagerNaming")
      .def(nb::init<>())
      .def_rw("directory", &ManagerNaming::directory)
      .def_prop_rw(
          "directory_fn", [](const ManagerNaming& n) { return static_cast<bool>(n.directory_fn); },
          [](ManagerNaming& n, nb::handle fn) { n.directory_fn = NameCallable(fn); }, kNone,
          "Set: f(step, epoch, step_in_epoch) -> str, or None. Get: whether one is set.")
      .def_rw("prefix", &ManagerNaming::prefix)
      .def_rw("series", &ManagerNaming::series)
      .def_prop_rw(
          "prefix_fn", [](const ManagerNaming& n) { return static_cast<bool>(n.prefix_fn); },
          [](ManagerNaming& n, nb::handle fn) { n.prefix_fn = NameCallable(fn); }, kNone,
          "Set: f(step, epoch, step_in_epoch) -> str, or None. Get: whether one is set.");
  nb::class_<SavePolicy>(m, "SavePolicy")
      .def(nb::init<>())
      .def_rw("interval_steps", &SavePolicy::interval_steps)
      .def_rw("interval_seconds", &SavePolicy::interval_seconds)
      .def_rw("steps_per_epoch", &SavePolicy::steps_per_epoch);
  nb::class_<RetentionPolicy>(m, "RetentionPolicy")
      .def(nb::init<>())
      .def_rw("keep_last_n", &RetentionPolicy::keep_last_n)
      .def_rw("keep_per_n_minutes", &RetentionPolicy::keep_per_n_minutes)
      .def_rw("keep_all", &RetentionPolicy::keep_all)
      .def_rw("keep_every_n_steps", &RetentionPolicy::keep_every_n_steps)
      .def_rw("keep_best_n", &RetentionPolicy::keep_best_n)
      .def_rw("best_metric", &RetentionPolicy::best_metric)
      .def_rw("best_mode", &RetentionPolicy::best_mode);
  nb::class_<CheckpointerOptions>(m, "CheckpointerOptions")
      .def(nb::init<>())
      .def_rw("staging_bytes", &CheckpointerOptions::staging_bytes)
      .def_rw("prefault_bytes", &CheckpointerOptions::prefault_bytes)
      .def_rw("slab_bytes", &CheckpointerOptions::slab_bytes)
      .def_rw("persist_during_snapshot", &CheckpointerOptions::persist_during_snapshot)
      .def_rw("allow_concurrent_saves", &CheckpointerOptions::allow_concurrent_saves)
      .def_rw("snapshot_threads", &CheckpointerOptions::snapshot_threads);
  nb::class_<AsyncSavePolicy>(m, "AsyncSavePolicy")
      .def(nb::init<>())
      .def_rw("enabled", &AsyncSavePolicy::enabled)
      .def_rw("checkpointer", &AsyncSavePolicy::checkpointer)
      .def_rw("prefault_staging", &AsyncSavePolicy::prefault_staging);
  nb::class_<BreakpointPolicy>(m, "BreakpointPolicy")
      .def(nb::init<>())
      .def_rw("on_exception", &BreakpointPolicy::on_exception)
      .def_rw("handle_signals", &BreakpointPolicy::handle_signals);
  nb::class_<CompactionPolicy>(m, "CompactionPolicy")
      .def(nb::init<>())
      .def_rw("max_depth", &CompactionPolicy::max_depth)
      .def_rw("max_delta_ratio", &CompactionPolicy::max_delta_ratio);
  nb::class_<SparsePolicy>(m, "SparsePolicy")
      .def(nb::init<>())
      .def_rw("compact", &SparsePolicy::compact)
      .def_rw("compaction", &SparsePolicy::compaction);
  nb::class_<RemoteTier>(m, "RemoteTier")
      .def(nb::init<>())
      .def_rw("location", &RemoteTier::location)
      .def_rw("retention", &RemoteTier::retention)
      .def_rw("upload_every_n_steps", &RemoteTier::upload_every_n_steps)
      .def_rw("threads", &RemoteTier::threads)
      .def_rw("max_bytes_per_second", &RemoteTier::max_bytes_per_second);
}

void BindStorage(nb::module_& m) {
  nb::class_<ManagerStorage>(m, "ManagerStorage")
      .def(nb::init<>())
      .def_rw("format", &ManagerStorage::format)
      .def_rw("verify_checksums", &ManagerStorage::verify_checksums)
      .def_prop_rw(
          "key", [](const ManagerStorage& s) { return static_cast<bool>(s.key); },
          [](ManagerStorage& s, nb::handle key) {
            s.key = KeyFromPython(key, "CheckpointManager key");
          },
          kNone,
          "Set: a key as savepoint.save takes it (normalized), or None. Get: whether one is set.")
      .def_rw("file_checksum", &ManagerStorage::file_checksum)
      .def_prop_rw(
          "cipher",
          [](const ManagerStorage& s) { return std::string(MindSporeCipherName(s.cipher)); },
          [](ManagerStorage& s, const std::string& name) {
            s.cipher = Take(ParseMindSporeCipher(name));
          },
          "The cipher by MindSpore's name: \"AES-GCM\", \"AES-CBC\" or \"SM4-CBC\".")
      .def_rw("append_info", &ManagerStorage::append_info,
              "Reading it gives a copy (a list): assign a new list to change it.")
      .def_prop_rw(
          "append_dict",
          [](const ManagerStorage& s) {
            nb::dict d;
            for (const auto& [k, v] : s.append_dict) d[nb::cast(k)] = FromValue(v);
            return d;
          },
          [](ManagerStorage& s, nb::handle d) {
            std::map<std::string, Value> out;
            if (!d.is_none()) {
              for (auto [key, value] : nb::cast<nb::dict>(d)) {
                std::string k = nb::cast<std::string>(key);
                out[k] = AppendValue(k, value);
              }
            }
            s.append_dict = std::move(out);
          },
          kNone,
          "{name: int | float | bool | str} (or None: none), stored as values in every "
          "checkpoint. Reading it gives a copy.");
  nb::class_<IoOptions>(m, "IoOptions")
      .def(nb::init<>())
      .def_rw("io_threads", &IoOptions::io_threads)
      .def_rw("direct_io", &IoOptions::direct_io);
}

}  // namespace

void BindOptions(nb::module_& m) {
  BindEnums(m);
  BindPolicies(m);
  BindStorage(m);
  nb::class_<ManagerOptions>(m, "ManagerOptions")
      .def(nb::init<>())
      .def_rw("naming", &ManagerOptions::naming)
      .def_rw("save_policy", &ManagerOptions::save_policy)
      .def_rw("retention", &ManagerOptions::retention)
      .def_rw("async_save", &ManagerOptions::async_save)
      .def_rw("storage", &ManagerOptions::storage)
      .def_rw("breakpoints", &ManagerOptions::breakpoints)
      .def_rw("sparse", &ManagerOptions::sparse)
      .def_rw("remote", &ManagerOptions::remote)
      .def_rw("shard_id", &ManagerOptions::shard_id)
      .def_rw("num_shards", &ManagerOptions::num_shards)
      .def_rw("gc_on_open", &ManagerOptions::gc_on_open)
      .def_rw("io", &ManagerOptions::io)
      .def(
          "validate", [](const ManagerOptions& o) { Check(ValidateManagerOptions(o)); },
          "Raises InvalidArgumentError naming the first invalid field.");
}

}  // namespace savepoint::python
