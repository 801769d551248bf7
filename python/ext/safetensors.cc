// Bindings of the safetensors reader and writer (savepoint/safetensors.h). The GIL is released for
// all I/O. Loaded tensors are handed to Python without a copy (TensorBytesToPython).
#include <nanobind/stl/map.h>

#include <memory>

#include "common.h"

namespace savepoint::python {
namespace {

nb::dict SaveSafetensorsPy(const std::string& path, const std::vector<TensorSpec>& tensors,
                           const std::vector<ValueSpec>& values, const std::string& metadata,
                           bool overwrite, bool create_parents, int io_threads,
                           bool mindspore_format, bool crc_check) {
  State state = MakeState(tensors, values, metadata);
  SaveStats stats;
  SafetensorsSaveOptions o;
  o.overwrite = overwrite;
  o.create_parents = create_parents;
  o.stats = &stats;
  o.mindspore_format = mindspore_format;
  o.crc_check = crc_check;
  Status s;
  {
    nb::gil_scoped_release release;
    s = SaveSafetensors(state, path, o, {.io_threads = io_threads});
  }
  Check(s);
  return SaveStatsToPython(stats);
}

// (tensors [(name, dtype, shape, uint8 array of the bytes)], values [(name, kind, value)],
// metadata JSON). With `mmap` the arrays are copy-on-write views into one mapping of the file
// (writable; writes stay private); otherwise they are the owned buffers the file was read into.
// `crc_check`: verify MindSpore's crc_num when the file has one.
nb::tuple LoadSafetensorsPy(const std::string& path, const std::vector<std::string>& names,
                            bool mmap, bool crc_check, int io_threads) {
  SafetensorsLoadOptions o;
  o.names = names;
  o.mmap = mmap;
  if (mmap) o.map_mode = MapMode::kCopyOnWrite;
  o.crc_check = crc_check;
  Result<State> r = InternalError("not loaded");
  {
    nb::gil_scoped_release release;
    r = LoadSafetensors(path, o, {.io_threads = io_threads});
  }
  return LoadedStateToPython(Take(std::move(r)));
}

nb::dict InspectSafetensorsPy(const std::string& path) {
  Result<SafetensorsInfo> r = InternalError("not inspected");
  {
    nb::gil_scoped_release release;
    r = InspectSafetensors(path);
  }
  SafetensorsInfo info = Take(std::move(r));
  nb::list tensors;
  for (const SafetensorsTensorInfo& t : info.tensors) {
    tensors.append(nb::make_tuple(nb::str(t.name.data(), t.name.size()),
                                  nb::str(DTypeName(t.dtype).data()), nb::tuple(nb::cast(t.shape)),
                                  t.begin, t.end));
  }
  nb::dict d;
  d["path"] = info.path;
  d["file_bytes"] = info.file_bytes;
  d["header_bytes"] = info.header_bytes;
  d["data_offset"] = info.data_offset;
  d["tensors"] = tensors;
  d["raw_metadata"] = info.raw_metadata;
  d["mindspore_format"] = info.mindspore_format;
  d["crc_num"] = info.has_crc_num ? nb::object(nb::int_(info.crc_num)) : nb::none();
  d["values"] = ValuesToPython(info.values);
  d["metadata_json"] = DumpJson(info.values.metadata());
  return d;
}

}  // namespace

void BindSafetensors(nb::module_& m) {
  m.def("save_safetensors", &SaveSafetensorsPy, nb::arg("path"), nb::arg("tensors"),
        nb::arg("values"), nb::arg("metadata"), nb::arg("overwrite"), nb::arg("create_parents"),
        nb::arg("io_threads"), nb::arg("mindspore_format") = false, nb::arg("crc_check") = false,
        "SaveSafetensors of borrowed tensors (GIL released); SaveStats. mindspore_format / "
        "crc_check: MindSpore's flavour (\"format\": \"ms\") / its crc_num.");
  m.def("load_safetensors", &LoadSafetensorsPy, nb::arg("path"), nb::arg("names"), nb::arg("mmap"),
        nb::arg("crc_check") = true, nb::arg("io_threads") = IoOptions().io_threads,
        "LoadSafetensors (GIL released): (tensors, values, metadata_json); crc_check verifies "
        "MindSpore's crc_num when present.");
  m.def("inspect_safetensors", &InspectSafetensorsPy, nb::arg("path"),
        "InspectSafetensors (GIL released): the validated header as a dict.");
}

}  // namespace savepoint::python
