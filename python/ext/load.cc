// Bindings of the read side: CheckpointReader (manifest, values, metadata), LoadInto (parallel,
// CRC-verified reads into memory the Python side allocated), the copy-on-write mapped load behind
// load(mmap=True), Verify, ListCheckpoints, DeleteCheckpoint and
// GarbageCollect. The GIL is released for all I/O.
#include <nanobind/stl/unique_ptr.h>

#include "common.h"

namespace savepoint::python {
namespace {

// LoadOptions::key from a Python key (see KeyFromPython).
LoadOptions WithKey(LoadOptions o, nb::handle key) {
  o.key = KeyFromPython(key, "savepoint.load key");
  return o;
}

std::unique_ptr<CheckpointReader> Open(const std::string& path, int io_threads, bool direct_io,
                                       nb::handle key) {
  Result<std::unique_ptr<CheckpointReader>> r = InternalError("not opened");
  LoadOptions o = WithKey({}, key);
  {
    nb::gil_scoped_release release;
    r = CheckpointReader::Open(path, o, {.io_threads = io_threads, .direct_io = direct_io});
  }
  return Take(std::move(r));
}

nb::list TensorsToPython(const CheckpointReader& r) {
  nb::list out;
  for (const TensorInfo& t : r.tensors()) {
    out.append(nb::make_tuple(nb::str(t.name.data(), t.name.size()),
                              nb::str(DTypeName(t.dtype).data()), nb::tuple(nb::cast(t.shape)),
                              t.nbytes, t.num_shards));
  }
  return out;
}

nb::dict LoadInto(const std::string& path, const std::vector<TensorSpec>& targets, bool verify,
                  int io_threads, bool direct_io, nb::handle key) {
  State state = MakeState(targets, {}, "");
  LoadStats stats;
  LoadOptions o = WithKey({.verify_checksums = verify, .stats = &stats}, key);
  Status s;
  {
    nb::gil_scoped_release release;
    s = savepoint::LoadInto(path, state, o, {.io_threads = io_threads, .direct_io = direct_io});
  }
  Check(s);
  return LoadStatsToPython(stats);
}

// Load(mmap = true, copy-on-write) of exactly the tensors `names` (a name always selects itself):
// (tensors as TensorBytesToPython gives them, statistics). Single-shard tensors are writable views
// into one copy-on-write mapping per data file, checked (header, size and, with `verify`, every
// chunk's CRC32C) before they are handed out; multi-shard and compressed ones are read into owned
// buffers.
nb::tuple LoadMapped(const std::string& path, const std::vector<std::string>& names, bool verify,
                     int io_threads, nb::handle key) {
  LoadStats stats;
  if (names.empty()) return nb::make_tuple(nb::list(), LoadStatsToPython(stats));
  LoadOptions o = WithKey({.names = names,
                           .verify_checksums = verify,
                           .mmap = true,
                           .map_mode = MapMode::kCopyOnWrite,
                           .stats = &stats},
                          key);
  Result<State> r = InternalError("not loaded");
  {
    nb::gil_scoped_release release;
    r = Load(path, o, {.io_threads = io_threads, .direct_io = false});
  }
  State state = Take(std::move(r));
  return nb::make_tuple(TensorBytesToPython(std::move(state)), LoadStatsToPython(stats));
}

nb::dict Verify(const std::string& path, int io_threads, bool direct_io, nb::handle key) {
  LoadStats stats;
  LoadOptions o = WithKey({.stats = &stats}, key);
  Status s;
  {
    nb::gil_scoped_release release;
    s = savepoint::Verify(path, o, {.io_threads = io_threads, .direct_io = direct_io});
  }
  Check(s);
  return LoadStatsToPython(stats);
}

nb::list List(const std::string& root) {
  Result<std::vector<CheckpointEntry>> r = InternalError("not listed");
  {
    nb::gil_scoped_release release;
    r = ListCheckpoints(root);
  }
  nb::list out;
  for (const CheckpointEntry& e : Take(std::move(r))) {
    nb::dict d;
    d["name"] = e.name;
    d["path"] = e.path;
    d["committed"] = e.committed;
    d["problem"] = e.problem;
    d["step"] = e.step ? nb::object(nb::int_(*e.step)) : nb::none();
    d["bytes"] = e.bytes;
    d["created_ns"] = e.created_ns;
    d["num_tensors"] = e.num_tensors;
    out.append(d);
  }
  return out;
}

void Delete(const std::string& path) {
  Status s;
  {
    nb::gil_scoped_release release;
    s = DeleteCheckpoint(path);
  }
  Check(s);
}

std::vector<std::string> Gc(const std::string& root, int64_t min_age_seconds, bool dry_run) {
  Result<std::vector<std::string>> r = InternalError("not collected");
  {
    nb::gil_scoped_release release;
    r = GarbageCollect(root, {.min_age_seconds = min_age_seconds, .dry_run = dry_run});
  }
  return Take(std::move(r));
}

}  // namespace

void BindLoad(nb::module_& m) {
  nb::class_<CheckpointReader>(m, "Reader")
      .def_static("open", &Open, nb::arg("path"), nb::arg("io_threads"), nb::arg("direct_io"),
                  nb::arg("key").none() = nb::none())
      .def_prop_ro("path", &CheckpointReader::path)
      .def_prop_ro("format_version", &CheckpointReader::format_version)
      .def_prop_ro("encrypted", &CheckpointReader::encrypted)
      .def_prop_ro("created_ns", &CheckpointReader::created_ns)
      .def_prop_ro("total_file_bytes", &CheckpointReader::total_file_bytes)
      .def("tensors", &TensorsToPython, "[(name, dtype, shape, nbytes, num_shards)] by name.")
      .def("values", [](const CheckpointReader& r) { return ValuesToPython(r.values()); })
      .def("metadata_json",
           [](const CheckpointReader& r) { return DumpJson(r.values().metadata()); })
      .def("manifest_json", [](const CheckpointReader& r) { return DumpJson(r.manifest_json()); });
  m.def("load_into", &LoadInto, nb::arg("path"), nb::arg("targets"), nb::arg("verify"),
        nb::arg("io_threads"), nb::arg("direct_io"), nb::arg("key").none() = nb::none());
  m.def("load_mapped", &LoadMapped, nb::arg("path"), nb::arg("names"), nb::arg("verify"),
        nb::arg("io_threads"), nb::arg("key").none() = nb::none());
  m.def("verify", &Verify, nb::arg("path"), nb::arg("io_threads"), nb::arg("direct_io"),
        nb::arg("key").none() = nb::none());
  m.def("list_checkpoints", &List, nb::arg("root"));
  m.def("delete_checkpoint", &Delete, nb::arg("path"));
  m.def("gc", &Gc, nb::arg("root"), nb::arg("min_age_seconds"), nb::arg("dry_run"));
  m.def(
      "s3_requests",
      [] {
        const S3RequestCounts c = Take(S3Requests());
        nb::dict d;
        d["get"] = c.get;
        d["put"] = c.put;
        d["head"] = c.head;
        d["list"] = c.list;
        d["delete"] = c.del;
        d["post"] = c.post;
        d["retries"] = c.retries;
        d["bytes_sent"] = c.bytes_sent;
        d["bytes_received"] = c.bytes_received;
        return d;
      },
      "Requests made through s3:// URIs in this process, by kind, and bytes moved (benchmarks, "
      "tests).");
}

}  // namespace savepoint::python
