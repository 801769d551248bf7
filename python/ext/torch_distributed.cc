// Bindings of the distributed save and load for PyTorch jobs (savepoint/_distributed.py): a
// Communicator whose collectives are carried out by a Python object (savepoint/_torch_comm.py,
// which moves bytes over a gloo process group), SaveDistributed of borrowed tensors with their
// boxes, and LoadDistributed into borrowed buffers.
//
// SaveDistributed runs with the GIL released; each collective of the communicator takes the GIL
// back for the Python call. Only the calling rank's thread uses its communicator (comm.h), so
// the Python object is never called concurrently.
//
// Also replica_digest, the hash of the replica check (every rank hashes its plain tensors before
// a save, savepoint/_distributed.py): the CRC32C of a buffer, by ISA-L.
#include <fmt/format.h>
#include <isa-l/crc.h>
#include <nanobind/stl/map.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common.h"

namespace savepoint::python {
namespace {

// A Communicator over a Python object with attributes `rank`, `size` and the methods
//   call(op: str, data: bytes, root: int, timeout_s: float) -> (code, message, [bytes])
//   abort(code: int, message: str) -> None
// where op is "barrier", "broadcast", "gather" or "all_gather"; code is a StatusCode (0: OK,
// then the list holds the result: [] for a barrier, [root's bytes] for a broadcast, one entry per
// rank for a gather on the root and an all-gather, [] for a gather elsewhere). The object never
// raises (a raise is reported as an internal error).
class PyCommunicator final : public Communicator {
 public:
  // Called with the GIL held.
  explicit PyCommunicator(nb::object comm)
      : comm_(std::move(comm)),
        rank_(nb::cast<int>(comm_.attr("rank"))),
        size_(nb::cast<int>(comm_.attr("size"))) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Barrier(Timeout timeout) override { return Call("barrier", {}, 0, timeout).status(); }

  Status Broadcast(std::string* bytes, int root, Timeout timeout) override {
    SP_ASSIGN_OR_RETURN(std::vector<std::string> got, Call("broadcast", *bytes, root, timeout));
    if (got.size() != 1) return InternalError("torch communicator: broadcast result is not 1 item");
    *bytes = std::move(got[0]);
    return Status::OK();
  }

  Result<std::vector<std::string>> Gather(std::string_view bytes, int root,
                                          Timeout timeout) override {
    return Call("gather", bytes, root, timeout);
  }

  Result<std::vector<std::string>> AllGather(std::string_view bytes, Timeout timeout) override {
    return Call("all_gather", bytes, 0, timeout);
  }

  void Abort(const Status& reason) override {
    nb::gil_scoped_acquire gil;
    try {
      comm_.attr("abort")(static_cast<int>(reason.code()), reason.message());
    } catch (const nb::python_error&) {
      // Abort never fails: the other ranks then time out instead.
    }
  }

 private:
  static double Seconds(Timeout t) {
    if (t == Timeout::max()) return std::numeric_limits<double>::infinity();
    return static_cast<double>(t.count()) / 1000.0;
  }

  Result<std::vector<std::string>> Call(const char* op, std::string_view data, int root,
                                        Timeout timeout) {
    nb::gil_scoped_acquire gil;
    try {
      nb::tuple r = nb::cast<nb::tuple>(
          comm_.attr("call")(op, nb::bytes(data.data(), data.size()), root, Seconds(timeout)));
      int code = nb::cast<int>(r[0]);
      if (code != 0) {
        StatusCode c = code > 0 && code <= static_cast<int>(kLastStatusCode)
                           ? static_cast<StatusCode>(code)
                           : StatusCode::kInternal;
        return Status(c, nb::cast<std::string>(r[1]));
      }
      std::vector<std::string> out;
      for (nb::handle item : nb::cast<nb::list>(r[2])) {
        nb::bytes b = nb::cast<nb::bytes>(item);
        out.emplace_back(b.c_str(), b.size());
      }
      return out;
    } catch (const std::exception& e) {
      return InternalError(
          fmt::format("torch communicator {} on rank {}: {}", op, rank_, e.what()));
    }
  }

  nb::object comm_;
  int rank_;
  int size_;
};

// (global_shape, offsets, sizes, replicas) per tensor: savepoint::ShardSpec.
using BoxSpec =
    std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int>>;

ShardLayout MakeLayout(const std::map<std::string, BoxSpec>& boxes) {
  ShardLayout layout;
  for (const auto& [name, box] : boxes) {
    const auto& [global_shape, offsets, sizes, replicas] = box;
    layout[name] = ShardSpec{global_shape, offsets, sizes, replicas};
  }
  return layout;
}

Timeout TimeoutFromSeconds(double s) {
  if (!(s > 0)) throw StatusError(InvalidArgumentError(fmt::format("timeout {} s", s)));
  if (std::isinf(s) || s > 1e9) return Timeout::max();
  return Timeout(static_cast<int64_t>(std::ceil(s * 1000.0)));
}

nb::dict SaveDistributedPy(nb::object comm, const std::string& path,
                           const std::vector<TensorSpec>& tensors,
                           const std::map<std::string, BoxSpec>& boxes,
                           const std::vector<ValueSpec>& values, const std::string& metadata,
                           bool overwrite, bool create_parents, uint64_t chunk_bytes,
                           int io_threads, bool direct_io, double timeout_s, nb::handle key,
                           uint32_t format_version) {
  State state = MakeState(tensors, values, metadata);
  ShardLayout layout = MakeLayout(boxes);
  SaveStats stats;
  DistributedSaveOptions o;
  o.save.overwrite = overwrite;
  o.save.create_parents = create_parents;
  o.save.chunk_bytes = chunk_bytes;
  o.save.format_version = format_version;
  o.save.key = KeyFromPython(key, "savepoint.save key");
  o.save.stats = &stats;
  o.timeout = TimeoutFromSeconds(timeout_s);
  PyCommunicator communicator(std::move(comm));
  Check(Unlocked([&] {
    return SaveDistributed(communicator, state, layout, path, o,
                           {.io_threads = io_threads, .direct_io = direct_io});
  }));
  return SaveStatsToPython(stats);
}

nb::dict LoadDistributedPy(const std::string& path, const std::vector<TensorSpec>& targets,
                           const std::map<std::string, BoxSpec>& boxes, bool verify, int io_threads,
                           bool direct_io, nb::handle key) {
  State state = MakeState(targets, {}, "");
  ShardLayout layout = MakeLayout(boxes);
  LoadStats stats;
  LoadOptions o{.verify_checksums = verify, .stats = &stats};
  o.key = KeyFromPython(key, "savepoint.load key");
  Check(Unlocked([&] {
    return LoadDistributed(path, state, layout, o,
                           {.io_threads = io_threads, .direct_io = direct_io});
  }));
  return LoadStatsToPython(stats);
}

// The replica digest of [p, p + n): its CRC32C by ISA-L (crc32_iscsi, the checksum the engine
// uses for every chunk), little-endian. Every byte counts: a difference confined to 32 bits is
// always caught, any other is missed with a probability of about 2^-32 per piece (a CRC, not a
// cryptographic hash: the check catches mistakes, not attacks).
nb::bytes ReplicaDigest(uintptr_t address, uint64_t nbytes) {
  uint32_t crc = 0;
  {
    nb::gil_scoped_release unlocked;
    const auto* p = reinterpret_cast<const unsigned char*>(address);
    crc = 0xFFFFFFFFu;
    for (uint64_t done = 0; done < nbytes;) {  // crc32_iscsi takes an int length
      const uint64_t n = std::min<uint64_t>(nbytes - done, uint64_t{1} << 30);
      crc = crc32_iscsi(const_cast<unsigned char*>(p + done), static_cast<int>(n), crc);
      done += n;
    }
    crc ^= 0xFFFFFFFFu;
  }
  unsigned char out[4];
  for (int k = 0; k < 4; ++k) out[k] = static_cast<unsigned char>(crc >> (8 * k));
  return nb::bytes(reinterpret_cast<const char*>(out), sizeof(out));
}

}  // namespace

std::unique_ptr<Communicator> MakeTorchCommunicator(nb::object comm) {
  return std::make_unique<PyCommunicator>(std::move(comm));
}

ShardLayout LayoutFromBoxes(const BoxSpecs& boxes) { return MakeLayout(boxes); }

Timeout TimeoutFromPython(double seconds) { return TimeoutFromSeconds(seconds); }

void BindTorchDistributed(nb::module_& m) {
  m.def("replica_digest", &ReplicaDigest, nb::arg("address"), nb::arg("nbytes"),
        "The replica check's digest of nbytes at address (GIL released): their CRC32C (ISA-L), "
        "4 bytes little-endian.");
  m.def("save_distributed", &SaveDistributedPy, nb::arg("comm"), nb::arg("path"),
        nb::arg("tensors"), nb::arg("boxes"), nb::arg("values"), nb::arg("metadata"),
        nb::arg("overwrite"), nb::arg("create_parents"), nb::arg("chunk_bytes"),
        nb::arg("io_threads"), nb::arg("direct_io"), nb::arg("timeout_s"),
        nb::arg("key").none() = nb::none(),
        nb::arg("format_version") = SaveOptions{}.format_version,
        "SaveDistributed of borrowed tensors (GIL released; the communicator `comm` takes it "
        "back for each collective); boxes: {name: (global_shape, offsets, sizes, replicas)}. "
        "Returns this rank's SaveStats.");
  m.def("load_distributed", &LoadDistributedPy, nb::arg("path"), nb::arg("targets"),
        nb::arg("boxes"), nb::arg("verify"), nb::arg("io_threads"), nb::arg("direct_io"),
        nb::arg("key").none() = nb::none(),
        "LoadDistributed into borrowed buffers (GIL released); boxes as save_distributed takes "
        "them (replicas ignored). Returns LoadStats.");
}

}  // namespace savepoint::python
