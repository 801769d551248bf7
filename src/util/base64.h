// Base64 (RFC 4648, standard alphabet, padded) via OpenSSL's EVP block codec.
#ifndef SAVEPOINT_UTIL_BASE64_H_
#define SAVEPOINT_UTIL_BASE64_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/status.h"

namespace savepoint {

std::string Base64Encode(const std::vector<uint8_t>& data);
// Fails with Corruption on characters outside the alphabet or a bad length.
Result<std::vector<uint8_t>> Base64Decode(std::string_view text);

}  // namespace savepoint

#endif  // SAVEPOINT_UTIL_BASE64_H_
