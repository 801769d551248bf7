// The module `savepoint._core`: error translation, State <-> Python conversions, and the small
// calls (version, log level) that belong to no other binding file.
#include <nanobind/ndarray.h>
#include <nanobind/stl/unique_ptr.h>

#include "common.h"

namespace savepoint::python {
namespace {

// Exception classes by StatusCode, registered by savepoint/_errors.py at import. Strong references
// held for the life of the process (never released: the translator may run until exit).
std::vector<PyObject*>& ErrorClasses() {
  static auto* classes = new std::vector<PyObject*>();
  return *classes;
}

void SetErrorClasses(const nb::dict& classes) {
  std::vector<PyObject*>& table = ErrorClasses();
  for (auto [key, cls] : classes) {
    size_t code = nb::cast<size_t>(key);
    if (code > 64) throw nb::value_error("status code out of range");
    if (table.size() <= code) table.resize(code + 1, nullptr);
    Py_XINCREF(cls.ptr());
    table[code] = cls.ptr();
  }
}

void Translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const StatusError& e) {
    size_t code = static_cast<size_t>(e.status().code());
    const std::vector<PyObject*>& table = ErrorClasses();
    PyObject* cls = code < table.size() && table[code] ? table[code] : PyExc_RuntimeError;
    PyErr_SetString(cls, e.status().message().c_str());
  }
}

Value ToValue(const std::string& name, const std::string& kind, const nb::handle& v) {
  if (kind == "int") return Value(nb::cast<int64_t>(v));
  if (kind == "float") return Value(nb::cast<double>(v));
  if (kind == "bool") return Value(nb::cast<bool>(v));
  if (kind == "string") return Value(nb::cast<std::string>(v));
  if (kind == "bytes") {
    nb::bytes b = nb::cast<nb::bytes>(v);
    const auto* p = static_cast<const uint8_t*>(b.data());
    return Value(Bytes{std::vector<uint8_t>(p, p + b.size())});
  }
  if (kind == "json") {
    Json j = Json::parse(nb::cast<std::string>(v), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw StatusError(InvalidArgumentError("value " + name + ": bad JSON"));
    return Value::FromJson(std::move(j));
  }
  throw StatusError(InvalidArgumentError("value " + name + ": unknown kind " + kind));
}

}  // namespace

nb::object FromValue(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kInt:
      return nb::int_(v.as_int());
    case ValueKind::kFloat:
      return nb::float_(v.as_float());
    case ValueKind::kBool:
      return nb::bool_(v.as_bool());
    case ValueKind::kString:
      return nb::str(v.as_string().data(), v.as_string().size());
    case ValueKind::kBytes:
      return nb::bytes(v.as_bytes().data.data(), v.as_bytes().data.size());
    case ValueKind::kJson:
      return nb::str(DumpJson(v.as_json()).c_str());
  }
  return nb::none();
}

State MakeState(const std::vector<TensorSpec>& tensors, const std::vector<ValueSpec>& values,
                const std::string& metadata_json) {
  State state;
  for (const auto& [name, address, dtype_name, shape] : tensors) {
    std::optional<DType> dtype = DTypeFromName(dtype_name);
    if (!dtype) throw StatusError(InvalidArgumentError("tensor " + name + ": dtype " + dtype_name));
    Check(state.PutView(name, TensorView(reinterpret_cast<void*>(address), *dtype, shape)));
  }
  for (const auto& [name, kind, v] : values) Check(state.PutValue(name, ToValue(name, kind, v)));
  if (!metadata_json.empty()) {
    state.metadata() = Json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
    if (state.metadata().is_discarded()) throw StatusError(InvalidArgumentError("bad metadata"));
  }
  return state;
}

nb::list ValuesToPython(const State& state) {
  nb::list out;
  for (const auto& [name, e] : state.entries()) {
    if (e.is_tensor()) continue;
    out.append(nb::make_tuple(nb::str(name.data(), name.size()),
                              nb::str(ValueKindName(e.value().kind()).data()),
                              FromValue(e.value())));
  }
  return out;
}

nb::list TensorBytesToPython(State state) {
  auto* owned = new State(std::move(state));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<State*>(p); });
  nb::list tensors;
  for (const auto& [name, e] : owned->entries()) {
    if (!e.is_tensor()) continue;
    const TensorView& t = e.tensor();
    nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> bytes(reinterpret_cast<uint8_t*>(t.data()),
                                                       {static_cast<size_t>(t.nbytes())}, owner);
    tensors.append(nb::make_tuple(nb::str(name.data(), name.size()),
                                  nb::str(DTypeName(t.dtype()).data()),
                                  nb::tuple(nb::cast(t.shape())), bytes.cast()));
  }
  return tensors;
}

nb::tuple LoadedStateToPython(State state) {
  nb::list values = ValuesToPython(state);
  std::string metadata = DumpJson(state.metadata());
  return nb::make_tuple(TensorBytesToPython(std::move(state)), values, metadata);
}

std::string DumpJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// The fields SaveStats and LoadStats share.
template <typename Stats>
nb::dict CommonStatsToPython(const Stats& s) {
  nb::dict d;
  d["bytes"] = s.bytes;
  d["stored_bytes"] = s.stored_bytes;
  d["chunks"] = s.chunks;
  d["seconds"] = s.seconds;
  d["direct_io"] = s.direct_io;
  return d;
}

}  // namespace

nb::dict LoadStatsToPython(const LoadStats& s) { return CommonStatsToPython(s); }

nb::dict SaveStatsToPython(const SaveStats& s) {
  nb::dict d = CommonStatsToPython(s);
  d["blocked_seconds"] = s.blocked_seconds;
  d["snapshot_seconds"] = s.snapshot_seconds;
  return d;
}

void BindErrors(nb::module_& m) {
  nb::register_exception_translator(Translate);
  m.def("_set_error_classes", &SetErrorClasses,
        "Registers {status code: exception class}; called once by savepoint._errors.");
  nb::dict codes;
  for (int c = 0; c <= static_cast<int>(kLastStatusCode); ++c) {
    codes[nb::str(StatusCodeName(static_cast<StatusCode>(c)).data())] = c;
  }
  m.attr("STATUS_CODES") = codes;
}

}  // namespace savepoint::python

NB_MODULE(_core, m) {
  using namespace savepoint::python;
  m.doc() = "savepoint C++ core (internal; use the savepoint package)";
  m.attr("__version__") = savepoint::Version();
  BindErrors(m);
  BindOptions(m);
  BindSave(m);
  BindLoad(m);
  BindConvert(m);
  BindManager(m);
  BindSafetensors(m);
  BindMindSpore(m);
  BindMindSporeStrategy(m);
  BindMindSporeDistributed(m);
  BindDcp(m);
  BindTorchDistributed(m);
  BindSparse(m);
  BindRecis(m);
#ifdef SAVEPOINT_PY_FAILOVER
  BindFailover(m);
#endif
  m.def("match_name", &savepoint::MatchesName, nb::arg("pattern"), nb::arg("name"),
        "Whether the pattern selects the entry name (savepoint::MatchesName: the one name rule).");
  m.def(
      "write_file_durably",
      [](const std::string& path, nb::bytes data, bool overwrite) {
        savepoint::Status s;
        {
          nb::gil_scoped_release release;
          s = savepoint::WriteFileDurably(savepoint::DefaultFileSystem(), path,
                                          {data.c_str(), data.size()}, overwrite);
        }
        Check(s);
      },
      nb::arg("path"), nb::arg("data"), nb::arg("overwrite"),
      "Writes a small file whole and durably (savepoint::WriteFileDurably).");
  m.def("set_log_level", [](const std::string& level) {
    savepoint::SetLogLevel(Take(savepoint::ParseLogLevel(level)));
  });
}
