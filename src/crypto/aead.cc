// OpenSSL EVP implementations of crypto/aead.h.
#include "crypto/aead.h"

#include <fmt/format.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>

namespace savepoint::crypto {
namespace {

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

const unsigned char* U(Bytes b) { return reinterpret_cast<const unsigned char*>(b.data()); }
unsigned char* U(MutableBytes b) { return reinterpret_cast<unsigned char*>(b.data()); }

const EVP_CIPHER* GcmFor(size_t key_bytes) {
  switch (key_bytes) {
    case 16:
      return EVP_aes_128_gcm();
    case 24:
      return EVP_aes_192_gcm();
    case 32:
      return EVP_aes_256_gcm();
  }
  return nullptr;
}

const EVP_CIPHER* CtrFor(size_t key_bytes) {
  switch (key_bytes) {
    case 16:
      return EVP_aes_128_ctr();
    case 24:
      return EVP_aes_192_ctr();
    case 32:
      return EVP_aes_256_ctr();
  }
  return nullptr;
}

const EVP_CIPHER* CbcFor(CbcCipher cipher, size_t key_bytes) {
  if (cipher == CbcCipher::kSm4) return key_bytes == 16 ? EVP_sm4_cbc() : nullptr;
  switch (key_bytes) {
    case 16:
      return EVP_aes_128_cbc();
    case 24:
      return EVP_aes_192_cbc();
    case 32:
      return EVP_aes_256_cbc();
  }
  return nullptr;
}

Status KeySizeError(const char* mode, size_t n, const char* allowed) {
  return InvalidArgumentError(
      fmt::format("{} needs a key of {} bytes, got {} bytes", mode, allowed, n));
}

Status OpenSslError(const char* what) {
  return InternalError(fmt::format("OpenSSL {} failed", what));
}

// Runs EVP_CipherUpdate over `in` (in pieces of at most 1 GiB: lengths are ints) into `out`;
// returns the bytes written.
Result<uint64_t> Update(EVP_CIPHER_CTX* ctx, Bytes in, unsigned char* out) {
  constexpr size_t kStep = size_t{1} << 30;
  uint64_t written = 0;
  for (size_t at = 0; at < in.size(); at += kStep) {
    const int n = static_cast<int>(std::min(kStep, in.size() - at));
    int got = 0;
    if (EVP_CipherUpdate(ctx, out + written, &got, U(in) + at, n) != 1) {
      return OpenSslError("cipher update");
    }
    written += static_cast<uint64_t>(got);
  }
  return written;
}

Result<Ctx> Init(const EVP_CIPHER* cipher, Bytes key, Bytes iv, bool encrypt, size_t iv_len = 0) {
  Ctx ctx(EVP_CIPHER_CTX_new());
  if (!ctx) return OpenSslError("context allocation");
  const int enc = encrypt ? 1 : 0;
  if (EVP_CipherInit_ex(ctx.get(), cipher, nullptr, nullptr, nullptr, enc) != 1) {
    return OpenSslError("cipher init");
  }
  if (iv_len > 0 && EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(iv_len),
                                        nullptr) != 1) {
    return OpenSslError("GCM IV length");
  }
  if (EVP_CipherInit_ex(ctx.get(), nullptr, nullptr, U(key), U(iv), enc) != 1) {
    return OpenSslError("key setup");
  }
  return ctx;
}

Result<Ctx> GcmInit(Bytes key, Bytes nonce, Bytes aad, bool encrypt) {
  const EVP_CIPHER* c = GcmFor(key.size());
  if (c == nullptr) return KeySizeError("AES-GCM", key.size(), "16, 24 or 32");
  if (nonce.size() != kGcmNonceBytes) return InternalError("AES-GCM nonce must be 12 bytes");
  SP_ASSIGN_OR_RETURN(Ctx ctx, Init(c, key, nonce, encrypt, kGcmNonceBytes));
  if (!aad.empty()) {
    int got = 0;
    if (EVP_CipherUpdate(ctx.get(), nullptr, &got, U(aad), static_cast<int>(aad.size())) != 1) {
      return OpenSslError("GCM AAD");
    }
  }
  return ctx;
}

}  // namespace

void GcmSealer::CtxFree::operator()(evp_cipher_ctx_st* c) const { EVP_CIPHER_CTX_free(c); }

Result<GcmSealer> GcmSealer::Begin(Bytes key, Bytes nonce, Bytes aad) {
  SP_ASSIGN_OR_RETURN(Ctx ctx, GcmInit(key, nonce, aad, true));
  GcmSealer s;
  s.ctx_.reset(ctx.release());
  return s;
}

Status GcmSealer::Update(Bytes in, MutableBytes out) {
  if (!ctx_) return FailedPreconditionError("GcmSealer: used after Finish");
  if (out.size() < in.size()) return InternalError("GcmSealer: output too small");
  return crypto::Update(ctx_.get(), in, U(out)).status();
}

Result<GcmTag> GcmSealer::Finish() {
  if (!ctx_) return FailedPreconditionError("GcmSealer: used after Finish");
  Ctx ctx(ctx_.release());
  int got = 0;
  unsigned char last[16];  // GCM is a stream mode: Final writes nothing
  if (EVP_CipherFinal_ex(ctx.get(), last, &got) != 1) return OpenSslError("GCM final");
  GcmTag tag;
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kGcmTagBytes, tag.data()) != 1) {
    return OpenSslError("GCM tag");
  }
  return tag;
}

Result<GcmTag> GcmSeal(Bytes key, Bytes nonce, Bytes aad, std::span<const Bytes> in,
                       MutableBytes out) {
  SP_ASSIGN_OR_RETURN(GcmSealer sealer, GcmSealer::Begin(key, nonce, aad));
  uint64_t at = 0;
  for (Bytes part : in) {
    if (part.size() > out.size() - at) return InternalError("GcmSeal: output too small");
    SP_RETURN_IF_ERROR(sealer.Update(part, out.subspan(at, part.size())));
    at += part.size();
  }
  return sealer.Finish();
}

Result<GcmTag> GcmSeal(Bytes key, Bytes nonce, Bytes aad, Bytes in, MutableBytes out) {
  return GcmSeal(key, nonce, aad, std::span<const Bytes>(&in, 1), out);
}

Status GcmOpen(Bytes key, Bytes nonce, Bytes aad, Bytes in, const GcmTag& tag,
               std::span<const MutableBytes> outs) {
  uint64_t total = 0;
  for (MutableBytes o : outs) total += o.size();
  if (total != in.size()) return InternalError("GcmOpen: outputs do not match the input");
  SP_ASSIGN_OR_RETURN(Ctx ctx, GcmInit(key, nonce, aad, false));
  uint64_t at = 0;
  for (MutableBytes o : outs) {
    SP_RETURN_IF_ERROR(Update(ctx.get(), in.subspan(at, o.size()), U(o)).status());
    at += o.size();
  }
  GcmTag t = tag;
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kGcmTagBytes, t.data()) != 1) {
    return OpenSslError("GCM tag");
  }
  int got = 0;
  unsigned char none[16];
  if (EVP_CipherFinal_ex(ctx.get(), none, &got) != 1) {
    return UnauthenticatedError("AES-GCM authentication failed (wrong key, or the data changed)");
  }
  return Status::OK();
}

Status GcmOpen(Bytes key, Bytes nonce, Bytes aad, Bytes in, const GcmTag& tag, MutableBytes out) {
  if (out.size() < in.size()) return InternalError("GcmOpen: output too small");
  const MutableBytes o = out.first(in.size());
  return GcmOpen(key, nonce, aad, in, tag, std::span<const MutableBytes>(&o, 1));
}

Status GcmDecryptRange(Bytes key, Bytes nonce, uint64_t offset, Bytes in, MutableBytes out) {
  const EVP_CIPHER* c = CtrFor(key.size());
  if (c == nullptr) return KeySizeError("AES-GCM", key.size(), "16, 24 or 32");
  if (nonce.size() != kGcmNonceBytes || out.size() < in.size()) {
    return InternalError("GcmDecryptRange: bad nonce or output size");
  }
  // GCM encrypts the message's block i with counter block nonce || (2 + i), big-endian.
  const uint64_t block = offset / 16 + 2;
  if (block > UINT32_MAX) return InvalidArgumentError("AES-GCM offset past the 2^32 block limit");
  std::array<std::byte, 16> iv{};
  std::memcpy(iv.data(), nonce.data(), kGcmNonceBytes);
  for (int i = 0; i < 4; ++i) iv[15 - i] = static_cast<std::byte>(block >> (8 * i));
  SP_ASSIGN_OR_RETURN(Ctx ctx, Init(c, key, iv, false));
  std::array<std::byte, 16> skip{};
  const size_t k = offset % 16;
  if (k > 0)
    SP_RETURN_IF_ERROR(Update(ctx.get(), Bytes(skip).first(k), U(MutableBytes(skip))).status());
  return Update(ctx.get(), in, U(out)).status();
}

Status CbcEncrypt(CbcCipher cipher, Bytes key, Bytes iv, std::span<const Bytes> in,
                  MutableBytes out) {
  const EVP_CIPHER* c = CbcFor(cipher, key.size());
  const char* mode = cipher == CbcCipher::kSm4 ? "SM4-CBC" : "AES-CBC";
  if (c == nullptr)
    return KeySizeError(mode, key.size(), cipher == CbcCipher::kSm4 ? "16" : "16, 24 or 32");
  uint64_t total = 0;
  for (Bytes p : in) total += p.size();
  if (out.size() < CbcPaddedSize(total)) return InternalError("CbcEncrypt: output too small");
  SP_ASSIGN_OR_RETURN(Ctx ctx, Init(c, key, iv, true));
  uint64_t at = 0;
  for (Bytes part : in) {
    SP_ASSIGN_OR_RETURN(uint64_t n, Update(ctx.get(), part, U(out) + at));
    at += n;
  }
  int got = 0;
  if (EVP_CipherFinal_ex(ctx.get(), U(out) + at, &got) != 1) return OpenSslError("CBC final");
  return Status::OK();
}

Result<uint64_t> CbcDecrypt(CbcCipher cipher, Bytes key, Bytes iv, Bytes in, MutableBytes out) {
  const EVP_CIPHER* c = CbcFor(cipher, key.size());
  const char* mode = cipher == CbcCipher::kSm4 ? "SM4-CBC" : "AES-CBC";
  if (c == nullptr)
    return KeySizeError(mode, key.size(), cipher == CbcCipher::kSm4 ? "16" : "16, 24 or 32");
  if (in.empty() || in.size() % kCbcBlockBytes != 0) {
    return CorruptionError(
        fmt::format("{} ciphertext of {} bytes is not a whole number of "
                    "16-byte blocks",
                    mode, in.size()));
  }
  if (out.size() < in.size()) return InternalError("CbcDecrypt: output too small");
  SP_ASSIGN_OR_RETURN(Ctx ctx, Init(c, key, iv, false));
  SP_ASSIGN_OR_RETURN(uint64_t n, Update(ctx.get(), in, U(out)));
  int got = 0;
  if (EVP_CipherFinal_ex(ctx.get(), U(out) + n, &got) != 1) {
    return UnauthenticatedError(fmt::format(
        "{} padding is invalid after decryption (wrong key, or the data changed)", mode));
  }
  return n + static_cast<uint64_t>(got);
}

Status CbcDecryptRaw(CbcCipher cipher, Bytes key, Bytes iv, Bytes in, MutableBytes out) {
  const EVP_CIPHER* c = CbcFor(cipher, key.size());
  if (c == nullptr) return KeySizeError("CBC", key.size(), "16, 24 or 32");
  if (in.size() % kCbcBlockBytes != 0 || out.size() < in.size()) {
    return InternalError("CbcDecryptRaw: not whole blocks");
  }
  SP_ASSIGN_OR_RETURN(Ctx ctx, Init(c, key, iv, false));
  EVP_CIPHER_CTX_set_padding(ctx.get(), 0);
  return Update(ctx.get(), in, U(out)).status();
}

Sha256 Sha256Of(std::span<const Bytes> parts) {
  Sha256 out{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1;
  for (Bytes p : parts) ok = ok && EVP_DigestUpdate(ctx, p.data(), p.size()) == 1;
  unsigned int n = 0;
  ok = ok && EVP_DigestFinal_ex(ctx, U(MutableBytes(out)), &n) == 1;
  EVP_MD_CTX_free(ctx);
  if (!ok) std::abort();  // only on allocation failure inside OpenSSL
  return out;
}

Sha256 Sha256Of(Bytes bytes) { return Sha256Of(std::span<const Bytes>(&bytes, 1)); }

Sha256 HmacSha256(Bytes key, std::span<const Bytes> parts) {
  Sha256 out{};
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = mac != nullptr ? EVP_MAC_CTX_new(mac) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  size_t n = 0;
  // An empty key is valid HMAC, but a null key pointer means "keep the previous key" to OpenSSL.
  static const unsigned char kNoKey = 0;
  const unsigned char* k = key.empty() ? &kNoKey : U(key);
  bool ok = ctx != nullptr && EVP_MAC_init(ctx, k, key.size(), params) == 1;
  for (Bytes p : parts) ok = ok && EVP_MAC_update(ctx, U(p), p.size()) == 1;
  ok = ok && EVP_MAC_final(ctx, U(MutableBytes(out)), &n, out.size()) == 1;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  if (!ok) std::abort();  // only on allocation failure inside OpenSSL
  return out;
}

Status HkdfSha256(Bytes key, Bytes salt, Bytes info, MutableBytes out) {
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t n = out.size();
  const bool ok = ctx != nullptr && EVP_PKEY_derive_init(ctx) == 1 &&
                  EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_key(ctx, U(key), static_cast<int>(key.size())) == 1 &&
                  (salt.empty() ||  // no salt: RFC 5869's default (zeros)
                   EVP_PKEY_CTX_set1_hkdf_salt(ctx, U(salt), static_cast<int>(salt.size())) == 1) &&
                  (info.empty() ||
                   EVP_PKEY_CTX_add1_hkdf_info(ctx, U(info), static_cast<int>(info.size())) == 1) &&
                  EVP_PKEY_derive(ctx, U(out), &n) == 1 && n == out.size();
  EVP_PKEY_CTX_free(ctx);
  return ok ? Status::OK() : OpenSslError("HKDF");
}

Status RandomBytes(MutableBytes out) {
  if (RAND_bytes(U(out), static_cast<int>(out.size())) != 1) return OpenSslError("RAND_bytes");
  return Status::OK();
}

std::string Hex(Bytes bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    s += kDigits[static_cast<unsigned>(b) >> 4];
    s += kDigits[static_cast<unsigned>(b) & 15];
  }
  return s;
}

Result<std::string> Unhex(const std::string& hex) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return InvalidArgumentError("hex string of odd length");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgumentError("not a hex string");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

}  // namespace savepoint::crypto
