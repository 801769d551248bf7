// MindSpore `.ckpt` files: read what MindSpore's save_checkpoint writes and write files its
// load_checkpoint loads (docs/INTEROP.md).
//
// A `.ckpt` file is a sequence of protobuf messages, one per entry (a tensor, a string, or a
// hash-map parameter), optionally followed by a 17-byte CRC-32 trailer ("crc_num" + the CRC of
// everything before it, as MindSpore's crc_check writes it). How entries map to a State:
//  - a tensor of dtype Int8 ... Float64, Bool or BFloat16 is a tensor of the same dtype; a scalar
//    (dims [], or [0] in older files) is a 0-d tensor;
//  - an Int4 tensor (one element per byte) is an I8 tensor; its name is listed in the metadata
//    under "mindspore.ckpt" / "int4", and writing such a State writes it back as Int4;
//  - a string (type "str", UCS-4) is a string value;
//  - a hash-map parameter (MapTensorProto: keys, values, status) is three tensors
//    "<name>.keys", "<name>.values", "<name>.status", its name listed under "mindspore.ckpt" /
//    "map_tensors";
//  - a tensor in pieces (MindSpore writes those over 512 MiB in 512 MiB pieces) is one tensor.
// Writing: every tensor (MindSpore's type names), every value (int as an Int64 scalar, float as a
// Float64 scalar, bool as a Bool scalar, string as "str"), and what no MindSpore type holds (the
// metadata other than "mindspore.ckpt", bytes and JSON values) in one string entry
// "savepoint.metadata" (JSON), which MindSpore loads as an ordinary string parameter and savepoint
// reads back into the metadata and the values. Tensors
// over 512 MiB are split as MindSpore splits them.
//
// Encryption (enc_key / dec_key): MindSpore's block framing (docs/INTEROP.md, "Encrypted .ckpt
// files"): the plaintext file (CRC trailer included) is cut into 64 MiB blocks, each encrypted with
// AES-GCM, AES-CBC or SM4-CBC under a fresh random IV. Every AES-GCM block is authenticated.
// AES-CBC and SM4-CBC are not authenticated in MindSpore's format, so savepoint also writes an
// HMAC-SHA256 of each block into a sidecar file "<path>.mac" and checks it when present (MindSpore
// ignores the sidecar).
//
// Thread safety: the functions are reentrant.
#ifndef SAVEPOINT_MINDSPORE_H_
#define SAVEPOINT_MINDSPORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/encryption.h"
#include "savepoint/export.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint {

// The metadata key of what a State needs to be written back as MindSpore wrote it.
inline constexpr char kMindSporeMetadataKey[] = "mindspore.ckpt";
// The entry holding the rest of the metadata in a `.ckpt` file savepoint wrote.
inline constexpr char kMindSporeSavepointMetadataEntry[] = "savepoint.metadata";

// MindSpore's encryption modes (enc_mode / dec_mode).
using MindSporeCipher = Cipher;  // savepoint/encryption.h

// "AES-GCM", "AES-CBC", "SM4-CBC".
SAVEPOINT_API std::string_view MindSporeCipherName(MindSporeCipher cipher);
// The inverse (case-insensitive); InvalidArgument listing the modes for anything else.
SAVEPOINT_API Result<MindSporeCipher> ParseMindSporeCipher(std::string_view name);

struct SAVEPOINT_API MindSporeSaveOptions {
  // Replace an existing file at the path. Default: false (AlreadyExists).
  bool overwrite = false;
  // Create missing parent directories. Default: true.
  bool create_parents = true;
  // Append MindSpore's CRC-32 trailer (crc_check=True). With encryption the trailer is part of
  // the plaintext (MindSpore loads such files, with crc_check too). Default: false.
  bool crc_check = false;
  // Encrypt the file with this key (enc_key). Default: none (not encrypted).
  EncryptionKey enc_key = {};
  // The cipher when enc_key is set (enc_mode). Default: AES-GCM.
  MindSporeCipher enc_mode = MindSporeCipher::kAesGcm;
  // Optional: receives statistics (bytes = tensor bytes written).
  SaveStats* stats = nullptr;
  // Optional progress: tensor bytes written so far and the state's tensor bytes, at most about
  // 10 times a second, from the I/O threads and the calling thread, never two calls at once; once
  // more with done == total before the commit. Default: empty.
  ProgressFn progress = nullptr;
};

// Writes `state` as a `.ckpt` file at `path`, durably (a hidden temporary file in the same
// directory, synced and renamed; docs/FORMAT.md §5), in parallel pieces through io.
// Errors: InvalidArgument (a dtype MindSpore lacks: F8*, C64, C128; a value named
// "savepoint.metadata"), AlreadyExists, I/O errors.
SAVEPOINT_API Status SaveMindSporeCheckpoint(const State& state, const std::string& path,
                                             const MindSporeSaveOptions& options = {},
                                             const IoOptions& io = {});

struct SAVEPOINT_API MindSporeLoadOptions {
  // Entries to load: exact names or glob patterns (MatchesName). Empty = everything. A name or
  // pattern that matches nothing fails with NotFound.
  std::vector<std::string> names = {};
  // Verify the CRC-32 trailer when the file has one (the whole file is then read). Default: true.
  bool crc_check = true;
  // The key of an encrypted file (dec_key). Required for an encrypted file; refused for a file
  // that is not encrypted. Default: none.
  EncryptionKey dec_key = {};
  // The cipher the file must use (dec_mode); nullopt accepts the one the file names. Default:
  // nullopt.
  std::optional<MindSporeCipher> dec_mode = std::nullopt;
  // Optional: receives statistics (bytes = tensor bytes loaded).
  LoadStats* stats = nullptr;
  // Optional progress: tensor bytes read so far and the selection's total, as for SaveOptions.
  ProgressFn progress = nullptr;
};

// Reads a `.ckpt` file: the structure is scanned with bounded memory (tensor bytes are skipped),
// then every selected tensor is read straight into its own buffer on io.io_threads threads (the
// bytes are not block-aligned, so io.direct_io does not apply). Errors name the file, the entry
// and the byte offset: Corruption (a malformed message, a length past its end, a size that does
// not match the shape, a CRC mismatch: expected and found), InvalidArgument (an unknown type).
// An encrypted file is scanned through a decrypting view and then decrypted block by block in
// parallel (every block authenticated before any of its bytes is trusted; io.io_threads blocks
// of up to 64 MiB in memory at once); Unauthenticated names the block that fails (wrong key, or
// modified), InvalidArgument a missing key, a wrong key size or a dec_mode the file does not use.
SAVEPOINT_API Result<State> LoadMindSporeCheckpoint(const std::string& path,
                                                    const MindSporeLoadOptions& options = {},
                                                    const IoOptions& io = {});

// One entry of a `.ckpt` file.
struct SAVEPOINT_API MindSporeEntryInfo {
  std::string name;
  std::string type;    // MindSpore's type name ("Float32", "str", ...; "map" for a hash map)
  Shape shape;         // as stored (a scalar written with dims [0] shows [0])
  uint64_t bytes = 0;  // content bytes (all pieces; a hash map: its three tensors)
  uint32_t pieces = 1;
};

struct SAVEPOINT_API MindSporeCheckpointInfo {
  std::string path;
  uint64_t file_bytes = 0;
  bool has_crc = false;
  uint32_t stored_crc = 0;  // the trailer's CRC (when has_crc)
  // Encryption: "" (not encrypted), "AES-GCM", "AES-CBC" or "SM4-CBC", and the number of blocks.
  std::string cipher;
  uint32_t cipher_blocks = 0;
  // How changes to an encrypted file are detected: "AES-GCM tags and block sequence" (AES-GCM
  // files savepoint wrote: their nonces number the blocks), "AES-GCM tags (block order not
  // protected: ...)" (MindSpore's random nonces: whole blocks could be swapped unnoticed),
  // "HMAC-SHA256 sidecar <path>.mac", or "none" (a CBC file without a sidecar: a changed byte
  // decrypts to wrong values unnoticed, as in MindSpore).
  std::string authentication;
  // MindSpore 2.10 appends a CRC trailer holding 0 after the blocks of a file saved with both
  // enc_key and crc_check; it cannot be checked and is ignored.
  bool outer_crc_trailer = false;
  // False when the file is encrypted and no key was given: entries and has_crc are then unknown.
  bool entries_listed = true;
  std::vector<MindSporeEntryInfo> entries;  // in file order
  // The values and metadata savepoint keeps in its "savepoint.metadata" entry (a State without
  // tensors; empty for a file without that entry or when entries are not listed). Not
  // authenticated: read through the decrypting view, like `entries`.
  State values;
};

// Scans the structure of the file at `path` through `fs` (nullptr = DefaultFileSystem()),
// reading no tensor bytes and not checking the CRC or authenticating the blocks. An encrypted
// file lists its entries only with `dec_key`.
SAVEPOINT_API Result<MindSporeCheckpointInfo> InspectMindSporeCheckpoint(
    const std::string& path, FileSystem* fs = nullptr, const EncryptionKey& dec_key = {});

}  // namespace savepoint

#endif  // SAVEPOINT_MINDSPORE_H_
