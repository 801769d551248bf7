// Symmetric crypto primitives over OpenSSL EVP, for encrypted checkpoints: AES-GCM
// (authenticated; 128/192/256-bit keys by key size), AES-CBC and SM4-CBC (PKCS#7 padding,
// unauthenticated; MindSpore's legacy modes), HMAC-SHA256, HKDF-SHA256 and random bytes.
//
// Every function is thread-safe (each call has its own EVP context). Errors never contain key
// bytes; callers add the file, block or chunk to the message.
#ifndef SAVEPOINT_CRYPTO_AEAD_H_
#define SAVEPOINT_CRYPTO_AEAD_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "savepoint/encryption.h"
#include "savepoint/status.h"

struct evp_cipher_ctx_st;  // OpenSSL's EVP_CIPHER_CTX

namespace savepoint::crypto {

using Bytes = std::span<const std::byte>;
using MutableBytes = std::span<std::byte>;

inline constexpr size_t kGcmNonceBytes = 12;
inline constexpr size_t kGcmTagBytes = 16;
inline constexpr size_t kCbcBlockBytes = 16;  // AES and SM4 block size
inline constexpr size_t kSha256Bytes = 32;

using GcmTag = std::array<std::byte, kGcmTagBytes>;
using Sha256 = std::array<std::byte, kSha256Bytes>;

// AES-GCM: encrypts `in` into `out` (same size; in == out allowed) with a 16, 24 or 32-byte key,
// a 12-byte nonce and additional authenticated data `aad` (may be empty); returns the tag.
// `in` may be given in several pieces (they are encrypted as their concatenation).
Result<GcmTag> GcmSeal(Bytes key, Bytes nonce, Bytes aad, std::span<const Bytes> in,
                       MutableBytes out);
Result<GcmTag> GcmSeal(Bytes key, Bytes nonce, Bytes aad, Bytes in, MutableBytes out);
// AES-GCM encryption of one message that arrives in pieces whose ciphertext may go to different
// places (e.g. a chunk staged across two buffers): the message is the concatenation of the
// Update calls' inputs, and Finish returns the tag GcmSeal would. One message per object; an
// object is used by one thread at a time.
class GcmSealer {
 public:
  // Same key, nonce and aad rules as GcmSeal.
  static Result<GcmSealer> Begin(Bytes key, Bytes nonce, Bytes aad);
  // Encrypts the next in.size() bytes of the message into `out` (at least as large; in == out
  // allowed). Any piece sizes, in any number.
  Status Update(Bytes in, MutableBytes out);
  // The tag; the sealer is spent afterwards (FailedPrecondition on any further call).
  Result<GcmTag> Finish();

 private:
  struct CtxFree {
    void operator()(evp_cipher_ctx_st* c) const;
  };
  std::unique_ptr<evp_cipher_ctx_st, CtxFree> ctx_;
};
// Decrypts and authenticates; Unauthenticated when the tag does not match (wrong key, or the
// nonce, aad, ciphertext or tag changed). `out` may hold garbage on failure.
Status GcmOpen(Bytes key, Bytes nonce, Bytes aad, Bytes in, const GcmTag& tag, MutableBytes out);
// The same with the plaintext scattered over consecutive outputs (their sizes add up to
// in.size(); an output may be the matching part of `in` itself).
Status GcmOpen(Bytes key, Bytes nonce, Bytes aad, Bytes in, const GcmTag& tag,
               std::span<const MutableBytes> outs);
// The keystream part of GCM without authentication: decrypts bytes of a GCM ciphertext starting
// at `offset` (any byte) of the message sealed with `nonce`. For reading a few bytes (headers)
// before the whole message is authenticated; callers must authenticate later.
Status GcmDecryptRange(Bytes key, Bytes nonce, uint64_t offset, Bytes in, MutableBytes out);

enum class CbcCipher { kAes, kSm4 };

// CBC with PKCS#7 padding: `out` must hold CbcPaddedSize(in.size()) bytes. Keys: AES 16/24/32,
// SM4 16 bytes; IV 16 bytes.
inline constexpr uint64_t CbcPaddedSize(uint64_t n) {
  return (n / kCbcBlockBytes + 1) * kCbcBlockBytes;
}
Status CbcEncrypt(CbcCipher cipher, Bytes key, Bytes iv, std::span<const Bytes> in,
                  MutableBytes out);
// Decrypts and strips the padding; returns the plaintext size (<= in.size(), written to out).
// Corruption when the size is not a whole number of blocks or the padding is invalid (the usual
// sign of a wrong key).
Result<uint64_t> CbcDecrypt(CbcCipher cipher, Bytes key, Bytes iv, Bytes in, MutableBytes out);
// Decrypts whole blocks without padding handling; `iv` is the ciphertext block before `in` (or
// the IV for the first block). For random access to CBC ciphertext.
Status CbcDecryptRaw(CbcCipher cipher, Bytes key, Bytes iv, Bytes in, MutableBytes out);

// SHA-256 of `bytes`, or of the concatenation of `parts`.
Sha256 Sha256Of(Bytes bytes);
Sha256 Sha256Of(std::span<const Bytes> parts);
// HMAC-SHA256 of the concatenation of `parts`.
Sha256 HmacSha256(Bytes key, std::span<const Bytes> parts);
// HKDF-SHA256 (RFC 5869): `out.size()` bytes from `key`, `salt` and `info`.
Status HkdfSha256(Bytes key, Bytes salt, Bytes info, MutableBytes out);
// Cryptographically random bytes (RAND_bytes).
Status RandomBytes(MutableBytes out);

// Lower-case hex of `bytes`; and its inverse (InvalidArgument for bad input).
std::string Hex(Bytes bytes);
Result<std::string> Unhex(const std::string& hex);

// Byte views of strings.
inline Bytes AsBytes(const std::string& s) { return std::as_bytes(std::span(s)); }

}  // namespace savepoint::crypto

#endif  // SAVEPOINT_CRYPTO_AEAD_H_
