// Reading and writing safetensors files (https://github.com/huggingface/safetensors), the format
// the Hugging Face ecosystem exchanges weights in.
//
// A safetensors file is `u64 little-endian N` + `N bytes of JSON header` + one data buffer:
//   {"<tensor>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}
// Offsets are relative to the start of the data buffer, which the tensors tile exactly (no holes,
// no overlaps); data is dense, C-order, little-endian.
//
// Mapping between a savepoint State and a file (lossless both ways for everything savepoint writes;
// files written by others keep their metadata):
//  - Tensors 1:1 by name. Every savepoint dtype has the safetensors code of the same name, except
//    C128, which safetensors lacks: saving a C128 tensor fails with InvalidArgument. Reading
//    accepts the 16 codes savepoint shares with safetensors (BOOL U8 I8 U16 I16 U32 I32 U64 I64
//    F16 BF16 F32 F64 F8_E4M3 F8_E5M2 C64); a safetensors code savepoint lacks (F8_E4M3FNUZ,
//    F8_E5M2FNUZ, F8_E8M0, F6_E2M3, F6_E3M2, F4) is Unimplemented, and anything else Corruption.
//  - `__metadata__` (a string -> string map) carries State::metadata() and the non-tensor values:
//      * each string member of the metadata object is written 1:1 under its own key (so other
//        tools see it), and each `__metadata__` entry of a foreign file becomes a string member;
//      * `savepoint.metadata` (reserved key, compact JSON): the metadata members that are not
//        strings (or that are named like a reserved key), as one JSON object, or the whole
//        metadata document when it is not an object. Absent when not needed. On load, its members
//        are merged over the 1:1 entries;
//      * `savepoint.values` (reserved key, compact JSON): the non-tensor values, as the native
//        manifest's "values" array ([{"name", "kind", "value"}], docs/FORMAT.md). Absent when the
//        State has no values.
//    A State whose metadata is null and that has no values writes an empty `__metadata__`
//    (omitted) and reads back with null metadata. A foreign file's metadata reads back as a JSON
//    object of strings.
//  - `crc_num` is never copied from the metadata into a file (it would not match the data): a
//    file has one only when SafetensorsSaveOptions::crc_check computes it.
//
// MindSpore's flavour (mindspore.save_checkpoint(..., format="safetensors"); docs/INTEROP.md):
// an ordinary safetensors file whose `__metadata__` holds "format": "ms" and, with MindSpore's
// crc_check, "crc_num": the decimal CRC-32 (zlib) of, for every tensor in name order, its UTF-8
// name followed by its bytes, except that a 0-d integer tensor (I8 ... U64) holding v, with
// 0 <= v < 2^63, counts as v zero bytes (Python's bytes(array) reads such an array as a count).
// SaveSafetensors writes it with SafetensorsSaveOptions::mindspore_format / crc_check;
// LoadSafetensors and VerifySafetensors check any crc_num they find (unless told not to).
//
// Parsing treats every file as hostile: the header length is capped (kMaxSafetensorsHeaderBytes,
// the reference implementation's cap), the JSON nesting depth is capped, every name must be a
// valid savepoint name (UTF-8, no control characters, see ValidateName) and unique, every dtype
// known, every shape valid with `elements x element size == end - begin` (checked arithmetic), and
// the offsets must tile the data buffer exactly, which must end at the end of the file. Each
// rejection is Corruption naming the file and, where there is one, the tensor.
//
// Thread safety: all functions are reentrant; distinct paths may be used concurrently.
#ifndef SAVEPOINT_SAFETENSORS_H_
#define SAVEPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/dtype.h"
#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint {

// Largest header (the JSON part) accepted or written: 100,000,000 bytes, as the reference reader.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Reserved `__metadata__` keys (see the file comment).
inline constexpr char kSafetensorsMetadataKey[] = "savepoint.metadata";
inline constexpr char kSafetensorsValuesKey[] = "savepoint.values";

// What one SaveSafetensors writes (per call); the file system, threads and direct I/O are the
// IoOptions (savepoint/io_options.h).
struct SAVEPOINT_API SafetensorsSaveOptions {
  // Replace an existing file at the path. Default: false (AlreadyExists).
  bool overwrite = false;
  // Create missing parent directories. Default: true.
  bool create_parents = true;
  // Optional: receives statistics (bytes = tensor bytes written).
  SaveStats* stats = nullptr;
  // Optional progress of SaveSafetensors: called with the tensor bytes written so far and the
  // state's tensor bytes, per 8 MiB piece of the file, at most about 10 times a second, and once
  // more with done == total when all data is written (before the commit). Called from the I/O
  // worker threads and the calling thread, never two calls at once; done never decreases. Must be
  // cheap and must not call into savepoint. Default: empty (never called).
  ProgressFn progress = nullptr;
  // Write MindSpore's flavour, as mindspore.save_checkpoint(..., format="safetensors") does:
  // `__metadata__` "format" is "ms" (whatever the metadata's own "format" member says), and what
  // MindSpore 2.10's load_checkpoint cannot read is refused with InvalidArgument before anything
  // is written: F8_E4M3, F8_E5M2 and C64 tensors, and a metadata string member named like a
  // tensor (MindSpore reads it as that tensor's type), unless its value is "Int4". Default: false.
  bool mindspore_format = false;
  // Store MindSpore's `crc_num` (crc_check=True; see the file comment) in `__metadata__`, which
  // MindSpore's load_checkpoint(..., crc_check=True) verifies. The CRC is computed from the staged
  // bytes while the tensors are written, and the header is written last. Works without
  // mindspore_format too (MindSpore itself writes it only in its flavour). MindSpore 2.10 itself
  // cannot compute the CRC of a BF16 tensor or of a negative (or >= 2^63) integer scalar, so it
  // fails to load such a file with crc_check=True (savepoint checks it). Default: false.
  bool crc_check = false;
};

// Writes `state` as one safetensors file at `path`. Tensors are laid out back to back from offset
// 0 of the data buffer in the reference writer's order (safetensors 0.8: by its dtype enum, last
// first, so larger element sizes first, then by name), and listed in that order in the header,
// after `__metadata__` (as the reference writer does; MindSpore's reader requires it). The header
// is padded with spaces to a multiple of 8 bytes, so every tensor starts at a file offset that is
// a multiple of its element size. When the tensor bytes are a multiple of 8, the header is padded
// further (by less than 4 KiB) so that the file is a whole number of 4 KiB blocks and can be
// written with O_DIRECT (readers accept any padding; the reference one does). The layout depends
// only on the State, so equal States give byte-identical files. Tensor bytes are copied through
// aligned staging buffers (8 MiB per thread, io.io_threads threads) and written in parallel; with
// io.direct_io every whole 4 KiB block is written with O_DIRECT and a last partial block through a
// buffered handle (SaveStats::direct_io says whether O_DIRECT was in effect). The caller's memory
// is only read.
//
// Durability: the file is written under a hidden temporary name in the same directory
// (".<name>.savepoint-tmp.<pid>.<random>"), synced, closed and renamed to `path`, and the directory
// is synced: a reader never sees a partial file at `path`. With `overwrite`, an existing file is
// first renamed aside to ".<name>.savepoint-old.<random>" and removed after the commit (the
// FileSystem's Rename never replaces). A crash between the two renames leaves no file at `path`
// but the previous one intact under that hidden name, to be renamed back by hand; a crash before
// the commit may leave the hidden temporary file. (`savepoint gc` cleans up checkpoint
// directories only, not these files.) On an error the temporary file is removed (best effort)
// and a previous file at `path` is intact.
//
// Errors: InvalidArgument (a C128 tensor, an invalid view, metadata strings that are not UTF-8,
// a header over kMaxSafetensorsHeaderBytes, with mindspore_format what MindSpore cannot load),
// AlreadyExists, and I/O errors.
SAVEPOINT_API Status SaveSafetensors(const State& state, const std::string& path,
                                     const SafetensorsSaveOptions& options = {},
                                     const IoOptions& io = {});

// What one LoadSafetensors selects and how (per call); the file system and threads are the
// IoOptions (savepoint/io_options.h).
struct SAVEPOINT_API SafetensorsLoadOptions {
  // Entries to load (tensors and values): exact names or glob patterns, as LoadOptions::names.
  // Empty = everything. A name or pattern that matches nothing fails with NotFound.
  std::vector<std::string> names = {};
  // Map the file instead of reading it (FileSystem::MapFile): tensors become borrowed views into
  // the mapping, which the returned State keeps alive (State::KeepAlive), as with
  // LoadOptions::mmap. Nothing but the header is read at load time. On a file system that cannot
  // map, tensors are read into owned Tensors instead. Default: false.
  bool mmap = false;
  // How the file is mapped with mmap: kReadOnly (writing through a view crashes) or kCopyOnWrite
  // (views are writable; writes stay private to the process, the file never changes).
  // kCopyOnWrite without mmap is InvalidArgument. Default: kReadOnly.
  MapMode map_mode = MapMode::kReadOnly;
  // Optional: receives statistics (bytes = tensor bytes loaded or mapped).
  LoadStats* stats = nullptr;
  // Optional progress of LoadSafetensors: called with the tensor bytes read so far and the total
  // to read (the selected tensors, or every tensor when crc_num is checked), per 8 MiB piece, at
  // most about 10 times a second, and once more with done == total at the end, from the I/O
  // threads and the calling thread, never two calls at once; done never decreases. With mmap
  // nothing is read (unless crc_num is checked), so it is called once, with done == total. Must
  // be cheap and must not call into savepoint. Default: empty (never called).
  ProgressFn progress = nullptr;
  // Verify MindSpore's `crc_num` when `__metadata__` has one (a file without it loads as
  // always). The CRC covers every tensor, so every tensor is read: those `names` leaves out into
  // scratch buffers, and with mmap the mapping is read through once (pass false to keep a
  // mapped load lazy). A mismatch, or a crc_num that is not a decimal CRC-32, is Corruption
  // naming the file and both values. Default: true.
  bool crc_check = true;
};

// One tensor entry of a safetensors header.
struct SAVEPOINT_API SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t begin = 0;  // data_offsets[0], relative to the data buffer
  uint64_t end = 0;    // data_offsets[1]; end - begin == nbytes
  uint64_t nbytes() const { return end - begin; }
};

// What a safetensors header says (no tensor data read).
struct SAVEPOINT_API SafetensorsInfo {
  std::string path;
  uint64_t file_bytes = 0;
  uint64_t header_bytes = 0;  // N, the JSON header's length (padding included)
  uint64_t data_offset = 0;   // 8 + N: where the data buffer starts in the file
  // Tensors in name order.
  std::vector<SafetensorsTensorInfo> tensors;
  // `__metadata__` exactly as stored (reserved keys included).
  std::map<std::string, std::string> raw_metadata;
  // MindSpore's flavour: `__metadata__` "format" is "ms".
  bool mindspore_format = false;
  // Whether `__metadata__` has a `crc_num`, and its value when that is a decimal CRC-32 (else 0;
  // LoadSafetensors and VerifySafetensors then fail with Corruption). Not checked here.
  bool has_crc_num = false;
  uint32_t crc_num = 0;
  // The decoded values and metadata (a State without tensors), per the mapping above.
  State values;
};

// Reads and fully validates the header of the file at `path` through `fs` (nullptr =
// DefaultFileSystem()).
SAVEPOINT_API Result<SafetensorsInfo> InspectSafetensors(const std::string& path,
                                                         FileSystem* fs = nullptr);

// Loads a safetensors file into a State: owned, kTensorAlignment-aligned tensors (or, with
// options.mmap, views into the mapping), the non-tensor values and the metadata. Tensors are read
// in 8 MiB pieces by io.io_threads threads through the page cache: a safetensors file's tensors
// start at arbitrary offsets, so io.direct_io does not apply (LoadStats::direct_io is false).
SAVEPOINT_API Result<State> LoadSafetensors(const std::string& path,
                                            const SafetensorsLoadOptions& options = {},
                                            const IoOptions& io = {});

// What one VerifySafetensors checks and reports.
struct SAVEPOINT_API SafetensorsVerifyOptions {
  // Verify `crc_num` when the file has one, as SafetensorsLoadOptions::crc_check. Default: true.
  bool crc_check = true;
  // Optional: receives statistics (bytes = stored_bytes = tensor bytes read; chunks = 1 when a
  // crc_num was verified, else 0), also on failure.
  LoadStats* stats = nullptr;
  // Optional progress: tensor bytes read so far of all of them, as SafetensorsLoadOptions.
  ProgressFn progress = nullptr;
};

// Verifies the safetensors file at `path` without keeping its data: validates the header (as
// InspectSafetensors), then reads every tensor byte in 8 MiB pieces on io.io_threads threads into
// per-thread buffers, checking MindSpore's crc_num when the file has one. Errors: those of
// InspectSafetensors, Corruption for a crc_num mismatch (naming the file and both values) or a
// file that shrank, and I/O errors.
SAVEPOINT_API Status VerifySafetensors(const std::string& path,
                                       const SafetensorsVerifyOptions& options = {},
                                       const IoOptions& io = {});

// Whether savepoint can store `dtype` in a safetensors file (every dtype but C128).
SAVEPOINT_API bool IsSafetensorsDType(DType dtype);

}  // namespace savepoint

#endif  // SAVEPOINT_SAFETENSORS_H_
