// Bindings of the MindSpore `.ckpt` reader and writer (savepoint/mindspore.h). The GIL is released
// for all I/O. Loaded tensors are handed to Python without a copy (TensorBytesToPython).
#include "savepoint/mindspore.h"

#include "common.h"

namespace savepoint::python {
namespace {

nb::dict SaveCkpt(const std::string& path, const std::vector<TensorSpec>& tensors,
                  const std::vector<ValueSpec>& values, const std::string& metadata, bool overwrite,
                  bool crc_check, int io_threads) {
  State state = MakeState(tensors, values, metadata);
  SaveStats stats;
  const MindSporeSaveOptions o{.overwrite = overwrite, .crc_check = crc_check, .stats = &stats};
  Check(Unlocked(
      [&] { return SaveMindSporeCheckpoint(state, path, o, {.io_threads = io_threads}); }));
  return SaveStatsToPython(stats);
}

// (tensors [(name, dtype, shape, uint8 array of the bytes)], values [(name, kind, value)],
// metadata JSON).
nb::tuple LoadCkpt(const std::string& path, const std::vector<std::string>& names, bool crc_check,
                   int io_threads) {
  return LoadedStateToPython(Take(Unlocked([&] {
    return LoadMindSporeCheckpoint(path, {.names = names, .crc_check = crc_check},
                                   {.io_threads = io_threads});
  })));
}

// {"path", "file_bytes", "has_crc", "stored_crc", "entries": [(name, type, shape, bytes,
// pieces)]}.
nb::dict InspectCkpt(const std::string& path) {
  MindSporeCheckpointInfo info = Take(Unlocked([&] { return InspectMindSporeCheckpoint(path); }));
  nb::list entries;
  for (const MindSporeEntryInfo& e : info.entries) {
    entries.append(nb::make_tuple(nb::str(e.name.data(), e.name.size()), e.type,
                                  nb::tuple(nb::cast(e.shape)), e.bytes, e.pieces));
  }
  nb::dict d;
  d["path"] = info.path;
  d["file_bytes"] = info.file_bytes;
  d["has_crc"] = info.has_crc;
  d["stored_crc"] = info.stored_crc;
  d["entries"] = entries;
  return d;
}

}  // namespace

void BindMindSpore(nb::module_& m) {
  m.def("save_mindspore", &SaveCkpt, nb::arg("path"), nb::arg("tensors"), nb::arg("values"),
        nb::arg("metadata"), nb::arg("overwrite"), nb::arg("crc_check"), nb::arg("io_threads"),
        "SaveMindSporeCheckpoint of borrowed tensors (GIL released); SaveStats.");
  m.def("load_mindspore", &LoadCkpt, nb::arg("path"), nb::arg("names"), nb::arg("crc_check"),
        nb::arg("io_threads"),
        "LoadMindSporeCheckpoint (GIL released): (tensors, values, metadata_json).");
  m.def("inspect_mindspore", &InspectCkpt, nb::arg("path"),
        "InspectMindSporeCheckpoint (GIL released): the entries, without reading tensor bytes.");
}

}  // namespace savepoint::python
