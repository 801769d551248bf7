// The store seam: one internal interface for a checkpoint container, whatever its format
// (savepoint/format.h). A Reader lists a container's entries, reads them (all or by name), reads
// byte ranges of a tensor where the format allows it, and verifies every checksum the format has;
// a Writer commits a State atomically. The native directory, safetensors files and MindSpore
// `.ckpt` files stand behind both; PyTorch DCP and RecIS directories are read-only stores.
//
// The public verbs (src/api/: Save, Load, Verify, Convert), `savepoint transform` (it reads its
// source files through Reader::ReadRange) and the CLI go through here; nothing below this folder
// knows which formats exist. docs/ARCHITECTURE.md, "The store seam".
//
// Ownership: a Reader owns its open files (and mappings) until destroyed; States it returns keep
// what they point into alive. Thread safety: a Reader's const methods and ReadRange may be called
// from several threads at once; Entries, Read and Verify from one at a time. A Writer is used by
// one thread.
#ifndef SAVEPOINT_STORE_STORE_H_
#define SAVEPOINT_STORE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "savepoint/checkpoint.h"
#include "savepoint/encryption.h"
#include "savepoint/format.h"
#include "savepoint/sparse.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint::store {

// What a format's store can do.
struct Capabilities {
  bool write = false;          // a Writer exists (else the store is read-only)
  bool ranges = false;         // Reader::ReadRange reads parts of a tensor
  bool map = false;            // tensors can be loaded as views into a mapping of the files
  bool encrypt = false;        // keys (LoadOptions::key, SaveOptions::key)
  bool shard = false;          // the ranks of a Communicator write one container together
  bool tables = false;         // sparse embedding tables
  bool file_checksum = false;  // a whole-file checksum (MindSpore's CRC-32 / crc_num)
};

// Never kAuto.
Capabilities CapabilitiesOf(Format format);

// One entry of a container, as listed without reading tensor bytes.
struct Entry {
  std::string name = {};
  bool tensor = false;  // a dense tensor (dtype, shape valid); else a value, string or hash map
  DType dtype = DType::kU8;
  Shape shape = {};
  bool int4 = false;  // a MindSpore Int4 tensor, listed as I8 (two nibbles per byte)
};

// An open container.
class Reader {
 public:
  virtual ~Reader() = default;
  virtual Format format() const = 0;
  Capabilities caps() const { return CapabilitiesOf(format()); }
  virtual const std::string& path() const = 0;
  // Every entry, in the container's own order (file order where it has one, else name order).
  // Listed from headers, at open or on the first call (an encrypted `.ckpt` file is decrypted to
  // list its entries, so that is left until asked; it lists names only, every entry with
  // tensor = false). A native checkpoint with sparse tables lists their stored tensors.
  virtual Result<std::vector<Entry>> Entries() = 0;
  // The entries `names` selects (LoadOptions::names: empty = all), with values and metadata, into
  // owned tensors or views the State keeps alive. NotFound for a name that matches nothing.
  virtual Result<State> Read(const std::vector<std::string>& names) = 0;
  // Bytes [offset, offset + dst.size()) of tensor `name`'s row-major bytes. Formats without
  // caps().ranges: Unimplemented. NotFound for no such tensor, OutOfRange past its end.
  virtual Status ReadRange(std::string_view name, uint64_t offset, std::span<std::byte> dst) const;
  // Reads everything and checks every checksum the format has (see the public Verify).
  virtual Status Verify(LoadStats* stats) = 0;
  // What the container held that a Read leaves out, and what was read instead of the path given,
  // one line each (RecIS). Default: none.
  virtual std::vector<std::string> notes() const { return {}; }
};

// Opens the container at `path`. `format` kAuto: DetectFormat (nothing at the path, or a file
// system that cannot tell: native, whose reader names what is missing). `options` are the read's
// (checked here against the format: a key it cannot use, mmap where it cannot map, a cipher for
// another format than `.ckpt` are InvalidArgument naming the field); `cipher` is the
// cipher an encrypted `.ckpt` must use (nullopt: the one it names; another format: must be
// nullopt). Opening reads headers and manifests only, except for DCP and RecIS directories, which
// are read whole here.
Result<std::unique_ptr<Reader>> OpenRead(const std::string& path, Format format,
                                         const LoadOptions& options, const IoOptions& io,
                                         std::optional<Cipher> cipher = std::nullopt);

// What a file format's writer adds to SaveOptions (the MindSpore faces' own options).
struct FileOptions {
  bool file_checksum = false;       // MindSpore's CRC-32 trailer (.ckpt) or crc_num (safetensors)
  bool mindspore_flavour = false;   // safetensors: `__metadata__` "format": "ms"
  Cipher cipher = Cipher::kAesGcm;  // .ckpt with SaveOptions::key
};

// A container being written: nothing is visible at the path until Commit returns OK.
class Writer {
 public:
  virtual ~Writer() = default;
  virtual Format format() const = 0;
  // Writes `state` and commits it atomically at the path (once). On error nothing new is at the
  // path and an old container there is intact.
  virtual Status Commit(const State& state) = 0;
};

// Opens a write of `request` (its path, topology, options and io; request.state is ignored: the
// State comes with Commit) in `format` (kAuto: TargetFormat). Checks the options against the
// format (InvalidArgument naming a field it cannot honour; kDcp and kRecis are read-only) and,
// without overwrite and for one process, that nothing is at the path yet (AlreadyExists), before
// anything is written (a distributed write checks that in its own protocol).
Result<std::unique_ptr<Writer>> OpenWrite(const engine::WriteRequest& request, Format format,
                                          const FileOptions& file = {});

// The native store's write of a request (request.state set): sparse tables flattened first
// (sparse::Flatten with `tables`, or the default table options when null), then engine::Write for
// one process or dist::Write for the ranks of request.topology. What the public Save,
// SaveSparse, SaveDistributed and SaveSparseDistributed do.
Status WriteNative(const engine::WriteRequest& request, const SparseSaveOptions* tables = nullptr);

}  // namespace savepoint::store

#endif  // SAVEPOINT_STORE_STORE_H_
