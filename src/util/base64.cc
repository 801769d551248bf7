#include "util/base64.h"

#include <openssl/evp.h>

#include <climits>

namespace savepoint {

std::string Base64Encode(const std::vector<uint8_t>& data) {
  std::string out;
  const size_t kBlock = 3 * 1024 * 1024;  // keep each call's int length small
  for (size_t pos = 0; pos < data.size(); pos += kBlock) {
    size_t n = std::min(kBlock, data.size() - pos);
    std::string piece(4 * ((n + 2) / 3) + 1, '\0');
    int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(piece.data()), data.data() + pos,
                                  static_cast<int>(n));
    out.append(piece.data(), static_cast<size_t>(written));
  }
  return out;
}

namespace {

bool IsBase64Char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

}  // namespace

Result<std::vector<uint8_t>> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return CorruptionError("base64 text length is not a multiple of 4");
  // EVP_DecodeBlock skips leading and trailing whitespace and decodes '=' anywhere as zero bits:
  // check the alphabet here, with '=' allowed only as the last one or two characters.
  size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') ++padding;
  for (size_t i = 0; i + padding < text.size(); ++i) {
    if (!IsBase64Char(text[i])) {
      return CorruptionError("invalid base64 text: bad character at offset " + std::to_string(i));
    }
  }
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  const size_t kBlock = 4 * 1024 * 1024;
  for (size_t pos = 0; pos < text.size(); pos += kBlock) {
    std::string_view piece = text.substr(pos, kBlock);
    size_t pad = 0;
    if (pos + piece.size() == text.size()) {
      while (pad < 2 && pad < piece.size() && piece[piece.size() - 1 - pad] == '=') ++pad;
    }
    std::vector<uint8_t> buf(piece.size() / 4 * 3 + 1);
    int n = EVP_DecodeBlock(buf.data(), reinterpret_cast<const unsigned char*>(piece.data()),
                            static_cast<int>(piece.size()));
    if (n < 0) return CorruptionError("invalid base64 text");
    out.insert(out.end(), buf.begin(), buf.begin() + (n - static_cast<int>(pad)));
  }
  return out;
}

}  // namespace savepoint
