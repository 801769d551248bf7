// SecretBytes and EncryptionKey (savepoint/encryption.h).
#include <fmt/format.h>
#include <openssl/crypto.h>

#include <cstring>

#include "savepoint/encryption.h"

namespace savepoint {

namespace {
constexpr uint64_t kMaxKeyFileBytes = 4096;
}  // namespace

SecretBytes::SecretBytes(std::span<const std::byte> bytes)
    : data_(bytes.empty() ? nullptr : new std::byte[bytes.size()]), size_(bytes.size()) {
  if (size_ > 0) std::memcpy(data_.get(), bytes.data(), size_);
}

SecretBytes::SecretBytes(size_t zeros)
    : data_(zeros == 0 ? nullptr : new std::byte[zeros]()), size_(zeros) {}

SecretBytes::SecretBytes(const std::string& bytes) : SecretBytes(std::as_bytes(std::span(bytes))) {}

SecretBytes::SecretBytes(SecretBytes&& other) noexcept
    : data_(std::move(other.data_)), size_(other.size_) {
  other.size_ = 0;
}

SecretBytes& SecretBytes::operator=(SecretBytes&& other) noexcept {
  if (this != &other) {
    Wipe();
    data_ = std::move(other.data_);
    size_ = other.size_;
    other.size_ = 0;
  }
  return *this;
}

SecretBytes::~SecretBytes() { Wipe(); }

void SecretBytes::Wipe() {
  if (data_ != nullptr) OPENSSL_cleanse(data_.get(), size_);
  data_.reset();
  size_ = 0;
}

EncryptionKey EncryptionKey::FromBytes(std::span<const std::byte> bytes) {
  EncryptionKey k;
  k.kind_ = Kind::kBytes;
  k.bytes_ = std::make_shared<const SecretBytes>(bytes);
  return k;
}

EncryptionKey EncryptionKey::FromBytes(const std::string& bytes) {
  return FromBytes(std::as_bytes(std::span(bytes)));
}

EncryptionKey EncryptionKey::FromFile(std::string path) {
  EncryptionKey k;
  k.kind_ = Kind::kFile;
  k.source_ = std::move(path);
  return k;
}

EncryptionKey EncryptionKey::FromProvider(Provider provider, std::string name) {
  EncryptionKey k;
  k.kind_ = Kind::kProvider;
  k.provider_ = std::move(provider);
  k.source_ = std::move(name);
  return k;
}

std::string EncryptionKey::Describe() const {
  switch (kind_) {
    case Kind::kNone:
      return "no key";
    case Kind::kBytes:
      return fmt::format("raw key ({} bytes)", bytes_->size());
    case Kind::kFile:
      return fmt::format("key file {}", source_);
    case Kind::kProvider:
      return fmt::format("key provider {}", source_);
  }
  return "key";
}

namespace {

Result<SecretBytes> ReadKeyFile(const std::string& path, FileSystem* fs) {
  if (fs == nullptr) fs = DefaultFileSystem();
  SP_ASSIGN_OR_RETURN(auto file, fs->NewRandomAccessFile(path, {}));
  const uint64_t n = file->size();
  if (n > kMaxKeyFileBytes) {
    return InvalidArgumentError(fmt::format(
        "{} bytes; a key file holds the raw key bytes (at most {})", n, kMaxKeyFileBytes));
  }
  SecretBytes buf(static_cast<size_t>(n));
  SP_RETURN_IF_ERROR(file->ReadAt(0, buf.mutable_bytes()));
  return buf;
}

}  // namespace

Result<SecretBytes> EncryptionKey::Resolve(FileSystem* fs) const {
  Result<SecretBytes> out = InvalidArgumentError("no encryption key was given");
  switch (kind_) {
    case Kind::kNone:
      return out;
    case Kind::kBytes:
      out = SecretBytes(bytes_->bytes());
      break;
    case Kind::kFile:
      out = ReadKeyFile(source_, fs);
      if (!out.ok()) return out.status().WithContext(Describe());
      break;
    case Kind::kProvider: {
      Result<std::string> k =
          provider_ ? provider_()
                    : Result<std::string>(InvalidArgumentError("the provider callback is empty"));
      if (!k.ok()) return k.status().WithContext(Describe());
      out = SecretBytes(*k);
      OPENSSL_cleanse(k->data(), k->size());
      break;
    }
  }
  if (out.ok() && out->empty()) {
    return InvalidArgumentError(fmt::format("{}: the key is empty", Describe()));
  }
  return out;
}

}  // namespace savepoint
