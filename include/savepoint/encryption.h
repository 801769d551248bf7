// Keys for encrypted checkpoints: native checkpoints (SaveOptions::key, LoadOptions::key) and
// MindSpore `.ckpt` files (MindSporeSaveOptions::enc_key, MindSporeLoadOptions::dec_key).
//
// A key comes from one of three sources: raw bytes held in memory, a file holding the raw bytes,
// or a provider callback (so a KMS or secret store can supply it when it is needed). The key bytes
// are never logged, printed or put into an error message: errors and Describe() name only the
// source ("raw key (32 bytes)", "key file /etc/keys/ckpt.key", "key provider kms:train").
//
//   SaveOptions o;
//   o.key = savepoint::EncryptionKey::FromFile("/run/secrets/ckpt.key");
//   SP_RETURN_IF_ERROR(savepoint::Save(state, "/ckpt/step-10", o));
//
// Thread safety: an EncryptionKey is an immutable value; copies share nothing but the provider
// callback, which may be called from any thread (once per Resolve) and must be thread-safe.
#ifndef SAVEPOINT_ENCRYPTION_H_
#define SAVEPOINT_ENCRYPTION_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

// A block cipher of the file formats that encrypt a whole file in blocks (MindSpore `.ckpt`,
// savepoint/mindspore.h, where it is called MindSporeCipher and named by MindSporeCipherName).
// savepoint's own checkpoints always use AES-256-GCM per chunk (docs/FORMAT.md §10).
enum class Cipher {
  kAesGcm,  // "AES-GCM": keys of 16, 24 or 32 bytes; authenticated
  kAesCbc,  // "AES-CBC": keys of 16, 24 or 32 bytes; PKCS#7 padding; not authenticated
  kSm4Cbc,  // "SM4-CBC": 16-byte keys; PKCS#7 padding; not authenticated
};

// Key bytes in memory that are wiped (OPENSSL_cleanse) when the last copy goes away. Move-only.
class SAVEPOINT_API SecretBytes {
 public:
  SecretBytes() = default;
  explicit SecretBytes(size_t zeros);  // `zeros` zero bytes, to be filled
  explicit SecretBytes(std::span<const std::byte> bytes);
  explicit SecretBytes(const std::string& bytes);
  SecretBytes(SecretBytes&& other) noexcept;
  SecretBytes& operator=(SecretBytes&& other) noexcept;
  SecretBytes(const SecretBytes&) = delete;
  SecretBytes& operator=(const SecretBytes&) = delete;
  ~SecretBytes();

  std::span<const std::byte> bytes() const { return {data_.get(), size_}; }
  std::span<std::byte> mutable_bytes() { return {data_.get(), size_}; }
  const unsigned char* data() const { return reinterpret_cast<const unsigned char*>(data_.get()); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void Wipe();
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

class SAVEPOINT_API EncryptionKey {
 public:
  // Returns the key bytes, or an error; called by Resolve. Must not log the key.
  using Provider = std::function<Result<std::string>()>;

  // No key: the checkpoint is not encrypted (the default of every options struct).
  EncryptionKey() = default;
  // A key held in memory (copied; the copy is wiped when the last EncryptionKey holding it goes).
  static EncryptionKey FromBytes(std::span<const std::byte> bytes);
  static EncryptionKey FromBytes(const std::string& bytes);
  // A file whose whole content is the raw key bytes (no newline, no encoding), read through the
  // FileSystem given to Resolve when the key is needed. Refused if larger than 4 KiB.
  static EncryptionKey FromFile(std::string path);
  // A callback asked for the key when it is needed (once per save or load). `name` describes it
  // in errors and Describe(), e.g. "kms:projects/x/keys/ckpt".
  static EncryptionKey FromProvider(Provider provider, std::string name);

  // Whether a key was given (any source).
  bool has_value() const { return kind_ != Kind::kNone; }
  explicit operator bool() const { return has_value(); }

  // The key bytes. InvalidArgument for an empty key; the file's read error (naming the file) or
  // the provider's error, with context naming the source. `fs` reads key files (null = POSIX).
  Result<SecretBytes> Resolve(FileSystem* fs = nullptr) const;

  // The source, without the key: "no key", "raw key (32 bytes)", "key file PATH",
  // "key provider NAME".
  std::string Describe() const;

 private:
  enum class Kind { kNone, kBytes, kFile, kProvider };
  Kind kind_ = Kind::kNone;
  std::shared_ptr<const SecretBytes> bytes_;
  std::string source_;  // file path or provider name
  Provider provider_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_ENCRYPTION_H_
