// The key flags (key_flags.h).
#include "key_flags.h"

#include <fmt/format.h>

namespace savepoint::cli {

void AddKeyFlags(CLI::App* sub, KeyFlags* flags) {
  const char* verb = flags->decrypt ? "dec" : "enc";
  const char* what = flags->decrypt ? "read the encrypted source" : "encrypt the target";
  sub->add_option(fmt::format("--{}-key-file", verb), flags->key_file,
                  fmt::format("File holding the raw key bytes to {}", what))
      ->check(CLI::ExistingFile);
  sub->add_option(fmt::format("--{}-mode", verb), flags->mode,
                  flags->decrypt
                      ? "Cipher the .ckpt source must use: AES-GCM, AES-CBC or SM4-CBC (default: "
                        "the one the file names)"
                      : "Cipher of a .ckpt target: AES-GCM (default), AES-CBC or SM4-CBC")
      ->check(CLI::IsMember({"AES-GCM", "AES-CBC", "SM4-CBC"}, CLI::ignore_case));
}

EncryptionKey KeyOf(const KeyFlags& flags) {
  return flags.key_file.empty() ? EncryptionKey() : EncryptionKey::FromFile(flags.key_file);
}

Result<std::optional<MindSporeCipher>> ModeOf(const KeyFlags& flags) {
  const char* verb = flags.decrypt ? "dec" : "enc";
  if (flags.mode.empty()) return std::optional<MindSporeCipher>();
  if (flags.key_file.empty()) {
    return InvalidArgumentError(fmt::format("--{}-mode needs --{}-key-file", verb, verb));
  }
  SP_ASSIGN_OR_RETURN(MindSporeCipher m, ParseMindSporeCipher(flags.mode));
  return std::optional<MindSporeCipher>(m);
}

}  // namespace savepoint::cli
