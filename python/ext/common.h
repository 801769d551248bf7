// Shared pieces of the Python extension `savepoint._core`: Status -> Python exception mapping,
// State <-> Python conversions, and the per-concept Bind* entry points (one .cc each).
//
// The extension is deliberately thin: the pure-Python package (python/savepoint/) turns nested
// structures of torch tensors / numpy arrays into flat lists of (name, address, dtype, shape)
// and values, and this layer turns those into a State that *borrows* the caller's memory
// (TensorView), then calls the C++ API with the GIL released.
//
// Thread safety: every function here must be called with the GIL held, except where noted.
#ifndef SAVEPOINT_PYTHON_COMMON_H_
#define SAVEPOINT_PYTHON_COMMON_H_

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "savepoint/savepoint.h"

namespace savepoint::python {

namespace nb = nanobind;

// A C++ Status travelling to Python; the registered translator raises the exception class that
// savepoint/_errors.py registered for its code, with the Status message unchanged.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

inline void Check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) throw StatusError(r.status());
  return std::move(r).value();
}

// (entry name, address of the first byte, dtype name such as "BF16", shape). The memory is the
// caller's (a contiguous CPU torch tensor or numpy array) and must stay alive during the call.
using TensorSpec = std::tuple<std::string, uintptr_t, std::string, std::vector<int64_t>>;
// (entry name, kind: "int" | "float" | "bool" | "string" | "bytes" | "json", Python value; a
// "json" value is passed as its JSON text).
using ValueSpec = std::tuple<std::string, std::string, nb::object>;

// A State whose tensors borrow the memory named by `tensors`; `metadata_json` is JSON text ("" =
// no metadata). Raises InvalidArgument naming the entry on a bad name, dtype, shape or value.
State MakeState(const std::vector<TensorSpec>& tensors, const std::vector<ValueSpec>& values,
                const std::string& metadata_json);

// The non-tensor values of `state` as a list of (name, kind, value) like ValueSpec.
nb::list ValuesToPython(const State& state);

// The tensors of `state` as a list of (name, dtype name, shape, uint8 numpy array of its bytes),
// without a copy: `state` moves to the heap, and a capsule shared by the arrays keeps it (its
// owned buffers and its mappings) alive until the last array is gone. The arrays are writable:
// load paths pass only owned tensors or copy-on-write mappings here.
nb::list TensorBytesToPython(State state);

// Runs `fn` (returning Status, Result<T> or a value) with the GIL released.
template <typename Fn>
auto Unlocked(Fn&& fn) {
  nb::gil_scoped_release release;
  return fn();
}

// A loaded State as (tensors as TensorBytesToPython, values as ValuesToPython, metadata JSON):
// what the loaders of other formats hand to Python.
nb::tuple LoadedStateToPython(State state);

// JSON text of `j` (invalid UTF-8 replaced; never throws).
std::string DumpJson(const Json& j);

// LoadStats as a dict {bytes, stored_bytes, chunks, seconds, direct_io}.
nb::dict LoadStatsToPython(const LoadStats& s);
// SaveStats as a dict {bytes, stored_bytes, chunks, seconds, blocked_seconds, snapshot_seconds,
// direct_io}: one shape for synchronous and asynchronous saves.
nb::dict SaveStatsToPython(const SaveStats& s);

// An encryption key from Python (savepoint/_keys.py normalises it first): None (no key), bytes
// (the raw key), str (a key file) or a callable returning bytes (a provider, called with the GIL
// taken). TypeError for anything else; `what` names the argument.
EncryptionKey KeyFromPython(nb::handle key, const char* what);

// Distributed saves from Python (torch_distributed.cc): a Communicator over a Python object
// (savepoint/_torch_comm.py's TorchCommunicator; see PyCommunicator there), a ShardLayout from
// {name: (global_shape, offsets, sizes, replicas)}, and a collective timeout from seconds
// (InvalidArgument unless > 0; inf = none).
using BoxSpecs = std::map<std::string, std::tuple<std::vector<int64_t>, std::vector<int64_t>,
                                                  std::vector<int64_t>, std::vector<int>>>;
std::unique_ptr<Communicator> MakeTorchCommunicator(nb::object comm);
ShardLayout LayoutFromBoxes(const BoxSpecs& boxes);
Timeout TimeoutFromPython(double seconds);

void BindErrors(nb::module_& m);
// A Value as a Python object: int, float, bool, str, bytes, or a JSON document as str.
nb::object FromValue(const Value& v);

// The options structs (options.cc), bound before the calls that take them.
void BindOptions(nb::module_& m);
void BindSave(nb::module_& m);
void BindLoad(nb::module_& m);
void BindConvert(nb::module_& m);
void BindManager(nb::module_& m);
void BindSafetensors(nb::module_& m);
void BindMindSpore(nb::module_& m);
void BindMindSporeStrategy(nb::module_& m);
void BindMindSporeDistributed(nb::module_& m);
// (codec, shuffle, zstd level) from Python: codec "none" | "zstd" | "lz4", shuffle "auto" | "on" |
// "off" (the Python side checks the spelling; anything else is InvalidArgument here too).
using CompressionSpec = std::tuple<std::string, std::string, int>;
Compression MakeCompression(const CompressionSpec& spec);  // save.cc

void BindDcp(nb::module_& m);
void BindTorchDistributed(nb::module_& m);
void BindSparse(nb::module_& m);
void BindRecis(nb::module_& m);
// failover.cc, built only with savepoint_failover (SAVEPOINT_PY_FAILOVER).
void BindFailover(nb::module_& m);

}  // namespace savepoint::python

#endif  // SAVEPOINT_PYTHON_COMMON_H_
