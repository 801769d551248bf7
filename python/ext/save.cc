// Bindings of Save (synchronous) and of Checkpointer / SaveHandle (asynchronous two-phase saves).
// The GIL is released for all I/O and for every wait; waits are sliced so Ctrl-C is noticed.
#include <nanobind/stl/unique_ptr.h>

#include <chrono>

#include "common.h"
#include "savepoint/sparse.h"
#include "tables.h"

namespace savepoint::python {

Compression MakeCompression(const CompressionSpec& spec) {
  const auto& [codec, shuffle, level] = spec;
  Compression c;
  if (codec == "zstd") {
    c.codec = Compression::Codec::kZstd;
  } else if (codec == "lz4") {
    c.codec = Compression::Codec::kLz4;
  } else if (codec != "none") {
    throw StatusError(InvalidArgumentError("compression codec " + codec));
  }
  if (shuffle == "on") {
    c.shuffle = Compression::Shuffle::kOn;
  } else if (shuffle == "off") {
    c.shuffle = Compression::Shuffle::kOff;
  } else if (shuffle != "auto") {
    throw StatusError(InvalidArgumentError("compression shuffle " + shuffle));
  }
  c.zstd_level = level;
  return c;
}

namespace {

SaveOptions MakeSaveOptions(bool overwrite, bool create_parents, const CompressionSpec& compression,
                            nb::handle key) {
  SaveOptions o;
  o.compression = MakeCompression(compression);
  o.overwrite = overwrite;
  o.create_parents = create_parents;
  o.key = KeyFromPython(key, "savepoint.save key");
  return o;
}

nb::dict SaveSync(const std::string& path, const std::vector<TensorSpec>& tensors,
                  const std::vector<ValueSpec>& values, const std::string& metadata, bool overwrite,
                  bool create_parents, bool direct_io, int io_threads, uint64_t chunk_bytes,
                  const CompressionSpec& compression, nb::handle key, uint32_t format_version) {
  State state = MakeState(tensors, values, metadata);
  SaveStats stats;
  SaveOptions o = MakeSaveOptions(overwrite, create_parents, compression, key);
  o.chunk_bytes = chunk_bytes;
  o.format_version = format_version;
  o.stats = &stats;
  Status s;
  {
    nb::gil_scoped_release release;
    s = Save(state, path, o, {.io_threads = io_threads, .direct_io = direct_io});
  }
  Check(s);
  return SaveStatsToPython(stats);
}

// A Checkpointer and the snapshot copier it uses (destroyed after it).
struct PyCheckpointer {
  std::unique_ptr<SnapshotCopier> copier;
  std::unique_ptr<Checkpointer> c;
};

// cuda_device >= 0: tensors in CUDA memory are copied by CreateCudaSnapshotCopier into pinned
// slabs (registered by that device's primary context); its errors are raised (FailedPrecondition
// without a CUDA driver). -1: host memory only.
// options and io: the bound CheckpointerOptions and IoOptions (python/ext/options.cc).
std::unique_ptr<PyCheckpointer> CreateCheckpointer(CheckpointerOptions o, const IoOptions& io,
                                                   int cuda_device) {
  auto out = std::make_unique<PyCheckpointer>();
  if (cuda_device >= 0) {  // (opens the driver and a context: without the GIL)
    out->copier = Take(Unlocked([&] { return CreateCudaSnapshotCopier({.device = cuda_device}); }));
  }
  o.copier = out->copier.get();
  out->c = Take(Checkpointer::Create(o, io));
  return out;
}

// tables (borrowed, savepoint/_sparse_io.py) with `base` (a delta's; empty: a full save) and
// `concurrency` go through SaveAsync's SparseSaveOptions form.
SaveHandle SaveAsync(PyCheckpointer& pc, const std::string& path,
                     const std::vector<TensorSpec>& tensors, const std::vector<ValueSpec>& values,
                     const std::string& metadata, bool overwrite, bool create_parents,
                     const CompressionSpec& compression, nb::handle key,
                     const std::vector<TableSpec>& tables, const std::string& base,
                     int concurrency) {
  State state = MakeState(tensors, values, metadata);
  AddTables(state, tables, path);
  SparseSaveOptions o{.save = MakeSaveOptions(overwrite, create_parents, compression, key),
                      .base = base,
                      .concurrency = concurrency};
  const bool sparse = !tables.empty() || !base.empty() || concurrency != 0;
  Result<SaveHandle> h = InternalError("save not started");
  {
    nb::gil_scoped_release release;
    h = sparse ? pc.c->SaveAsync(state, path, o) : pc.c->SaveAsync(state, path, o.save);
  }
  return Take(std::move(h));
}

// Waits up to `timeout_s` seconds (negative = forever) in slices of 50 ms with the GIL released,
// checking for signals between slices so KeyboardInterrupt is raised promptly (the save itself
// goes on in the background). Returns whether the save finished.
bool WaitFor(const SaveHandle& h, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_s < 0 ? 0 : timeout_s));
  while (true) {
    auto slice = std::chrono::milliseconds(50);
    if (timeout_s >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return h.Poll();
      slice = std::min(slice, left);
    }
    bool done;
    {
      nb::gil_scoped_release release;
      done = h.WaitFor(slice);
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

void WaitAll(PyCheckpointer& pc) {
  Status s;
  {
    nb::gil_scoped_release release;
    s = pc.c->WaitAll();
  }
  Check(s);
}

}  // namespace

void BindSave(nb::module_& m) {
  m.def("save", &SaveSync, nb::arg("path"), nb::arg("tensors"), nb::arg("values"),
        nb::arg("metadata"), nb::arg("overwrite"), nb::arg("create_parents"), nb::arg("direct_io"),
        nb::arg("io_threads"), nb::arg("chunk_bytes"),
        nb::arg("compression") = CompressionSpec("none", "auto", 1),
        nb::arg("key").none() = nb::none(),
        nb::arg("format_version") = SaveOptions{}.format_version,
        "Saves borrowed tensors + values (GIL released); returns SaveStats as a dict. key: None, "
        "bytes, a key file path or a callable (SaveOptions::key).");

  nb::class_<SaveHandle>(m, "SaveHandle")
      .def("poll", &SaveHandle::Poll)
      .def("wait_for", &WaitFor, nb::arg("timeout_s"))
      .def(
          "check", [](const SaveHandle& h) { Check(h.status()); },
          "Raises the save's error; FailedPrecondition while it is still running.")
      .def_prop_ro("stats", [](const SaveHandle& h) { return SaveStatsToPython(h.stats()); })
      .def_prop_ro("path", &SaveHandle::path);

  nb::class_<PyCheckpointer>(m, "Checkpointer")
      .def_static("create", &CreateCheckpointer, nb::arg("options"), nb::arg("io"),
                  nb::arg("cuda_device") = -1,
                  "options: a CheckpointerOptions, io: an IoOptions; cuda_device >= 0: CUDA "
                  "tensors are copied by a snapshot copier of that device.")
      .def(
          "reserve", [](PyCheckpointer& pc, uint64_t bytes) { pc.c->Reserve(bytes); },
          nb::arg("bytes"))
      .def("save_async", &SaveAsync, nb::arg("path"), nb::arg("tensors"), nb::arg("values"),
           nb::arg("metadata"), nb::arg("overwrite"), nb::arg("create_parents"),
           nb::arg("compression") = CompressionSpec("none", "auto", 1),
           nb::arg("key").none() = nb::none(), nb::arg("tables") = std::vector<TableSpec>(),
           nb::arg("base") = "", nb::arg("concurrency") = 0)
      .def("wait_all", &WaitAll)
      .def_prop_ro("staging_allocated_bytes",
                   [](const PyCheckpointer& pc) { return pc.c->staging_allocated_bytes(); })
      .def_prop_ro("staging_cap_bytes",
                   [](const PyCheckpointer& pc) { return pc.c->staging_cap_bytes(); })
      .def_prop_ro("device_copies", [](const PyCheckpointer& pc) { return pc.copier != nullptr; });
}

}  // namespace savepoint::python
