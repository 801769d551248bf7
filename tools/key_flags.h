// The key flags of the subcommands that read or write encrypted checkpoints (docs/CLI.md):
// `--dec-key-file F [--dec-mode MODE]` to read, `--enc-key-file F [--enc-mode MODE]` to write.
// A key file holds the raw key bytes. MODE is a MindSpore cipher (AES-GCM, AES-CBC, SM4-CBC) and
// applies to `.ckpt` files only; native checkpoints always use AES-256-GCM.
#ifndef SAVEPOINT_TOOLS_KEY_FLAGS_H_
#define SAVEPOINT_TOOLS_KEY_FLAGS_H_

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "savepoint/encryption.h"
#include "savepoint/mindspore.h"

namespace savepoint::cli {

struct KeyFlags {
  bool decrypt = true;        // --dec-* (else --enc-*)
  std::string key_file = {};  // empty: no key
  std::string mode = {};      // empty: the default
};

// Adds --dec-key-file/--dec-mode (flags->decrypt) or --enc-key-file/--enc-mode to `sub`.
void AddKeyFlags(CLI::App* sub, KeyFlags* flags);

// The key (none without --*-key-file).
EncryptionKey KeyOf(const KeyFlags& flags);

// The mode named by --*-mode, nullopt when not given. InvalidArgument for a mode without a key
// file.
Result<std::optional<MindSporeCipher>> ModeOf(const KeyFlags& flags);

}  // namespace savepoint::cli

#endif  // SAVEPOINT_TOOLS_KEY_FLAGS_H_
