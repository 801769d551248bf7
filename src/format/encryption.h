// Encryption of native checkpoints (docs/FORMAT.md §10, required feature "encryption"): the keys
// of one checkpoint derived from the user's key and the checkpoint's salt, the nonce and
// additional authenticated data (AAD) of each chunk, AES-256-GCM sealing and opening of chunks,
// and the manifest's MAC. docs/FORMAT.md is the specification; this file implements it.
//
// Ownership: CheckpointKeys holds the derived keys in SecretBytes (wiped when the last copy goes;
// copies share them). Thread safety: a CheckpointKeys is immutable; all its methods may be called
// from any number of threads at once. Key bytes never appear in an error message.
#ifndef SAVEPOINT_FORMAT_ENCRYPTION_H_
#define SAVEPOINT_FORMAT_ENCRYPTION_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "crypto/aead.h"
#include "savepoint/encryption.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint::format {

struct Manifest;  // manifest.h

// The name a checkpoint with encrypted chunks lists in `required_features`.
inline constexpr std::string_view kFeatureEncryption = "encryption";
// The manifest's "encryption" object: its only cipher and key derivation.
inline constexpr std::string_view kCipherName = "AES-256-GCM";
inline constexpr std::string_view kKdfName = "HKDF-SHA256";
// HKDF-SHA256 "info" strings of the three derived values.
inline constexpr std::string_view kChunkKeyInfo = "savepoint/1 chunk key";
inline constexpr std::string_view kMacKeyInfo = "savepoint/1 manifest mac key";
inline constexpr std::string_view kKeyCheckInfo = "savepoint/1 key check";
// First bytes of every chunk's AAD.
inline constexpr std::string_view kAadMagic = "SVPTCHNK";

inline constexpr size_t kSaltBytes = 32;
inline constexpr size_t kKeyCheckBytes = 16;
// The user's key: any 16 to 64 bytes (HKDF stretches it to the 32-byte AES-256 key).
inline constexpr size_t kMinKeyBytes = 16;
inline constexpr size_t kMaxKeyBytes = 64;
// MANIFEST header: flags bit 0 says the manifest is authenticated; the MAC (HMAC-SHA256 truncated
// to 20 bytes) is in the header's bytes [40, 60), over header bytes [0, 40) and the body.
inline constexpr uint32_t kManifestFlagEncrypted = 1;
inline constexpr size_t kManifestMacOffset = 40;
inline constexpr size_t kManifestMacBytes = 20;

using Salt = std::array<std::byte, kSaltBytes>;
using KeyCheck = std::array<std::byte, kKeyCheckBytes>;
using ManifestMac = std::array<std::byte, kManifestMacBytes>;
using Nonce = std::array<std::byte, crypto::kGcmNonceBytes>;

// The manifest's "encryption" object, and the header's MAC (decoded manifests only).
struct EncryptionRecord {
  bool enabled = false;
  Salt salt{};
  KeyCheck key_check{};
  ManifestMac mac{};
};

// What a stored chunk is: its nonce and AAD bind its ciphertext to all of it, so a chunk that is
// moved, swapped, reordered or copied from another checkpoint fails authentication.
struct ChunkIdentity {
  uint64_t checkpoint_id = 0;
  uint32_t file = 0;                  // index of its data file in the manifest
  uint64_t offset = 0;                // where its stored bytes start in that file
  std::string_view tensor = {};       // the tensor's name
  std::span<const int64_t> box = {};  // the shard's offsets in the tensor
  uint64_t chunk = 0;                 // index of the chunk in its shard
  uint64_t raw_bytes = 0;             // its size before compression
  uint64_t stored_bytes = 0;          // its size as stored (compressed or raw)
  bool compressed = false;
};

// The 12-byte nonce of a chunk: file (u32 LE) then offset (u64 LE). Unique within a checkpoint,
// since no two stored chunks of a file start at the same offset.
Nonce ChunkNonce(const ChunkIdentity& id);
// The AAD of a chunk (docs/FORMAT.md §10).
std::string ChunkAad(const ChunkIdentity& id);

// The keys of one encrypted checkpoint.
class CheckpointKeys {
 public:
  // HKDF-SHA256 of `user_key` (kMinKeyBytes..kMaxKeyBytes, checked by ResolveUserKey) with `salt`.
  static Result<CheckpointKeys> Derive(const SecretBytes& user_key, const Salt& salt);

  const Salt& salt() const { return salt_; }
  // Stored in the manifest, so that a wrong key is told apart from a modified manifest.
  const KeyCheck& key_check() const { return key_check_; }
  // Whether `other` (a manifest's key_check) is this key's (constant time).
  bool MatchesKeyCheck(const KeyCheck& other) const;

  // Starts sealing chunk `id` (its plaintext is given to the sealer in pieces).
  Result<crypto::GcmSealer> BeginSeal(const ChunkIdentity& id) const;
  // Decrypts and authenticates chunk `id` (in == out allowed). Unauthenticated on failure (the
  // caller names the chunk).
  Status Open(const ChunkIdentity& id, crypto::Bytes in, const crypto::GcmTag& tag,
              crypto::MutableBytes out) const;
  // The MAC of a MANIFEST: HMAC-SHA256 of header bytes [0, 40) then the body, first 20 bytes.
  ManifestMac Mac(std::string_view header_prefix, std::string_view body) const;

 private:
  std::shared_ptr<const SecretBytes> chunk_key_;
  std::shared_ptr<const SecretBytes> mac_key_;
  Salt salt_{};
  KeyCheck key_check_{};
};

// The user's key bytes from `key`, through `fs` for a key file. InvalidArgument naming `field`
// (e.g. "SaveOptions.key") and the key's source, never its bytes, when there is no key or it is
// not 16 to 64 bytes long; the source's own error otherwise.
Result<SecretBytes> ResolveUserKey(const EncryptionKey& key, FileSystem* fs,
                                   std::string_view field);

// A fresh random salt.
Result<Salt> RandomSalt();

// OK if the MANIFEST file `bytes` (already decoded into `m`, which is encrypted) carries the MAC
// of `keys`; Unauthenticated naming `where` otherwise.
Status AuthenticateManifest(std::string_view bytes, const Manifest& m, const CheckpointKeys& keys,
                            std::string_view where);

// Decodes exactly out.size() bytes of lower-case or upper-case hex; false on anything else.
bool ParseHex(std::string_view hex, std::span<std::byte> out);

}  // namespace savepoint::format

#endif  // SAVEPOINT_FORMAT_ENCRYPTION_H_
