// Bindings of the MindSpore `.ckpt` reader and writer (savepoint/mindspore.h). The GIL is released
// for all I/O. Loaded tensors are handed to Python without a copy (TensorBytesToPython).
#include "savepoint/mindspore.h"

#include "common.h"

namespace savepoint::python {
namespace {

nb::dict SaveCkpt(const std::string& path, const std::vector<TensorSpec>& tensors,
                  const std::vector<ValueSpec>& values, const std::string& metadata, bool overwrite,
                  bool crc_check, nb::handle enc_key, const std::string& enc_mode, int io_threads) {
  State state = MakeState(tensors, values, metadata);
  SaveStats stats;
  MindSporeSaveOptions o{.overwrite = overwrite,
                         .crc_check = crc_check,
                         .enc_key = KeyFromPython(enc_key, "enc_key"),
                         .stats = &stats};
  if (o.enc_key) o.enc_mode = Take(ParseMindSporeCipher(enc_mode));
  Check(Unlocked(
      [&] { return SaveMindSporeCheckpoint(state, path, o, {.io_threads = io_threads}); }));
  return SaveStatsToPython(stats);
}

// (tensors [(name, dtype, shape, uint8 array of the bytes)], values [(name, kind, value)],
// metadata JSON).
nb::tuple LoadCkpt(const std::string& path, const std::vector<std::string>& names, bool crc_check,
                   nb::handle dec_key, const std::string& dec_mode, int io_threads) {
  MindSporeLoadOptions o{
      .names = names, .crc_check = crc_check, .dec_key = KeyFromPython(dec_key, "dec_key")};
  if (o.dec_key) o.dec_mode = Take(ParseMindSporeCipher(dec_mode));
  return LoadedStateToPython(
      Take(Unlocked([&] { return LoadMindSporeCheckpoint(path, o, {.io_threads = io_threads}); })));
}

// {"path", "file_bytes", "has_crc", "stored_crc", "entries": [(name, type, shape, bytes,
// pieces)]}.
nb::dict InspectCkpt(const std::string& path, nb::handle dec_key) {
  const EncryptionKey key = KeyFromPython(dec_key, "dec_key");
  MindSporeCheckpointInfo info =
      Take(Unlocked([&] { return InspectMindSporeCheckpoint(path, nullptr, key); }));
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
  d["cipher"] = info.cipher;
  d["cipher_blocks"] = info.cipher_blocks;
  d["authentication"] = info.authentication;
  d["entries_listed"] = info.entries_listed;
  d["entries"] = entries;
  return d;
}

}  // namespace

void BindMindSpore(nb::module_& m) {
  m.def("save_mindspore", &SaveCkpt, nb::arg("path"), nb::arg("tensors"), nb::arg("values"),
        nb::arg("metadata"), nb::arg("overwrite"), nb::arg("crc_check"), nb::arg("enc_key").none(),
        nb::arg("enc_mode"), nb::arg("io_threads"),
        "SaveMindSporeCheckpoint of borrowed tensors (GIL released); SaveStats.");
  m.def("load_mindspore", &LoadCkpt, nb::arg("path"), nb::arg("names"), nb::arg("crc_check"),
        nb::arg("dec_key").none(), nb::arg("dec_mode"), nb::arg("io_threads"),
        "LoadMindSporeCheckpoint (GIL released): (tensors, values, metadata_json).");
  m.def("inspect_mindspore", &InspectCkpt, nb::arg("path"), nb::arg("dec_key").none() = nb::none(),
        "InspectMindSporeCheckpoint (GIL released): the entries, without reading tensor bytes.");
}

}  // namespace savepoint::python
