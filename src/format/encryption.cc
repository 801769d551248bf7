// Key derivation, chunk nonces and AAD, chunk sealing and the manifest MAC (format/encryption.h).
#include "format/encryption.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <cstring>
#include <vector>

#include "format/endian.h"
#include "format/manifest.h"

namespace savepoint::format {
namespace {

using crypto::AsBytes;

crypto::Bytes ViewBytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

Result<std::shared_ptr<const SecretBytes>> DeriveKey(const SecretBytes& user_key, const Salt& salt,
                                                     std::string_view info, size_t bytes) {
  SecretBytes out(bytes);
  SP_RETURN_IF_ERROR(
      crypto::HkdfSha256(user_key.bytes(), salt, ViewBytes(info), out.mutable_bytes()));
  return std::make_shared<const SecretBytes>(std::move(out));
}

void AppendU32(std::string* s, uint32_t v) {
  s->append(4, '\0');
  PutU32(s, s->size() - 4, v);
}
void AppendU64(std::string* s, uint64_t v) {
  s->append(8, '\0');
  PutU64(s, s->size() - 8, v);
}

}  // namespace

Nonce ChunkNonce(const ChunkIdentity& id) {
  std::string n(crypto::kGcmNonceBytes, '\0');
  PutU32(&n, 0, id.file);
  PutU64(&n, 4, id.offset);
  Nonce out;
  std::memcpy(out.data(), n.data(), out.size());
  return out;
}

std::string ChunkAad(const ChunkIdentity& id) {
  std::string a(kAadMagic);
  a.reserve(a.size() + 64 + 8 * id.box.size() + id.tensor.size());
  AppendU64(&a, id.checkpoint_id);
  AppendU32(&a, id.file);
  AppendU64(&a, id.offset);
  AppendU64(&a, id.chunk);
  AppendU64(&a, id.raw_bytes);
  AppendU64(&a, id.stored_bytes);
  a.push_back(id.compressed ? '\1' : '\0');
  AppendU32(&a, static_cast<uint32_t>(id.box.size()));
  for (int64_t o : id.box) AppendU64(&a, static_cast<uint64_t>(o));
  AppendU32(&a, static_cast<uint32_t>(id.tensor.size()));
  a.append(id.tensor);
  return a;
}

Result<CheckpointKeys> CheckpointKeys::Derive(const SecretBytes& user_key, const Salt& salt) {
  CheckpointKeys k;
  k.salt_ = salt;
  SP_ASSIGN_OR_RETURN(k.chunk_key_, DeriveKey(user_key, salt, kChunkKeyInfo, 32));
  SP_ASSIGN_OR_RETURN(k.mac_key_, DeriveKey(user_key, salt, kMacKeyInfo, 32));
  SP_ASSIGN_OR_RETURN(auto check, DeriveKey(user_key, salt, kKeyCheckInfo, kKeyCheckBytes));
  std::memcpy(k.key_check_.data(), check->data(), kKeyCheckBytes);
  return k;
}

bool CheckpointKeys::MatchesKeyCheck(const KeyCheck& other) const {
  return CRYPTO_memcmp(key_check_.data(), other.data(), kKeyCheckBytes) == 0;
}

Result<crypto::GcmSealer> CheckpointKeys::BeginSeal(const ChunkIdentity& id) const {
  const Nonce nonce = ChunkNonce(id);
  const std::string aad = ChunkAad(id);
  return crypto::GcmSealer::Begin(chunk_key_->bytes(), nonce, AsBytes(aad));
}

Status CheckpointKeys::Open(const ChunkIdentity& id, crypto::Bytes in, const crypto::GcmTag& tag,
                            crypto::MutableBytes out) const {
  const Nonce nonce = ChunkNonce(id);
  const std::string aad = ChunkAad(id);
  return crypto::GcmOpen(chunk_key_->bytes(), nonce, AsBytes(aad), in, tag, out);
}

ManifestMac CheckpointKeys::Mac(std::string_view header_prefix, std::string_view body) const {
  const std::vector<crypto::Bytes> input = {ViewBytes(header_prefix), ViewBytes(body)};
  const crypto::Sha256 full = crypto::HmacSha256(mac_key_->bytes(), input);
  ManifestMac mac;
  std::memcpy(mac.data(), full.data(), mac.size());
  return mac;
}

Result<SecretBytes> ResolveUserKey(const EncryptionKey& key, FileSystem* fs,
                                   std::string_view field) {
  if (!key) return InvalidArgumentError(fmt::format("{}: no key was given", field));
  Result<SecretBytes> bytes = key.Resolve(fs);
  if (!bytes.ok()) return bytes.status().WithContext(std::string(field));
  if (bytes->size() < kMinKeyBytes || bytes->size() > kMaxKeyBytes) {
    return InvalidArgumentError(fmt::format(
        "{} ({}): the key is {} bytes; an encryption key must be {} to {} bytes (e.g. 32 random "
        "bytes)",
        field, key.Describe(), bytes->size(), kMinKeyBytes, kMaxKeyBytes));
  }
  return bytes;
}

Result<Salt> RandomSalt() {
  Salt s;
  SP_RETURN_IF_ERROR(crypto::RandomBytes(s));
  return s;
}

Status AuthenticateManifest(std::string_view bytes, const Manifest& m, const CheckpointKeys& keys,
                            std::string_view where) {
  const ManifestMac mac = keys.Mac(bytes.substr(0, kManifestMacOffset),
                                   bytes.substr(std::min<size_t>(bytes.size(), 64)));
  if (CRYPTO_memcmp(mac.data(), m.encryption.mac.data(), mac.size()) == 0) return Status::OK();
  return UnauthenticatedError(fmt::format(
      "{}: the manifest fails authentication (HMAC-SHA256 mismatch): it was modified after it was "
      "written",
      where));
}

bool ParseHex(std::string_view hex, std::span<std::byte> out) {
  if (hex.size() != 2 * out.size()) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return true;
}

}  // namespace savepoint::format
