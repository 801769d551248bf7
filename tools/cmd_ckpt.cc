// `savepoint inspect FILE.ckpt [--json]` and `savepoint verify FILE.ckpt [--json]`: MindSpore
// `.ckpt` files, encrypted ones with --dec-key-file. inspect scans the structure (no tensor bytes
// read): entries with their MindSpore type, shape, bytes and pieces, whether the file has a CRC-32
// trailer, and its encryption (cipher, blocks, how changes are detected). verify loads every entry
// (every length and size checked, every tensor byte read, every encrypted block authenticated)
// and checks the CRC-32 trailer when there is one. cmd_inspect.cc and cmd_verify.cc hand a path
// ending in ".ckpt" over to these.
#include <fmt/format.h>

#include <chrono>
#include <string>

#include "commands.h"
#include "common.h"
#include "savepoint/mindspore.h"

namespace savepoint::cli {
namespace {

void PrintEncryption(const MindSporeCheckpointInfo& info) {
  if (info.cipher.empty()) return;
  fmt::print("encrypted: {} in {} blocks; changes detected by: {}\n", info.cipher,
             info.cipher_blocks, info.authentication);
  if (info.authentication == "none") {
    fmt::print(
        "warning: {} is not authenticated: a changed byte decrypts to wrong values unnoticed "
        "(files savepoint writes in this mode carry a MAC sidecar {}.mac)\n",
        info.cipher, info.path);
  }
  if (!info.entries_listed) fmt::print("entries: not listed (pass --dec-key-file)\n");
}

void PrintHuman(const MindSporeCheckpointInfo& info) {
  PrintEncryption(info);
  if (!info.entries_listed) return;
  uint64_t bytes = 0;
  for (const MindSporeEntryInfo& e : info.entries) bytes += e.bytes;
  fmt::print("MindSpore checkpoint {} ({} entries, {} of content, {} in all; {})\n", info.path,
             info.entries.size(), HumanBytes(bytes), HumanBytes(info.file_bytes),
             info.has_crc ? fmt::format("CRC-32 trailer {}", info.stored_crc)
                          : std::string("no CRC trailer"));
  if (info.entries.empty()) return;
  Table table({"NAME", "TYPE", "SHAPE", "BYTES", "PIECES"}, {false, false, false, true, true});
  for (const MindSporeEntryInfo& e : info.entries) {
    table.AddRow({e.name, e.type, e.type == "map" ? "-" : ShapeToString(e.shape),
                  HumanBytes(e.bytes), std::to_string(e.pieces)});
  }
  fmt::print("\nentries:\n");
  table.Print(stdout);
}

void PrintJsonReport(const MindSporeCheckpointInfo& info) {
  Json entries = Json::array();
  for (const MindSporeEntryInfo& e : info.entries) {
    entries.push_back({{"name", e.name},
                       {"type", e.type},
                       {"shape", e.shape},
                       {"bytes", e.bytes},
                       {"pieces", e.pieces}});
  }
  Json out = {{"path", info.path},
              {"format", "ckpt"},
              {"file_bytes", info.file_bytes},
              {"crc", info.has_crc ? Json(info.stored_crc) : Json(nullptr)},
              {"entries", info.entries_listed ? entries : Json(nullptr)}};
  out["encryption"] = info.cipher.empty() ? Json(nullptr)
                                          : Json{{"cipher", info.cipher},
                                                 {"blocks", info.cipher_blocks},
                                                 {"authentication", info.authentication}};
  PrintJson(out);
}

}  // namespace

int RunInspectCkpt(std::string_view command, const std::string& path, bool json,
                   const KeyFlags& dec) {
  Result<MindSporeCheckpointInfo> info = InspectMindSporeCheckpoint(path, nullptr, KeyOf(dec));
  if (!info.ok()) return Fail(command, info.status());
  if (json) {
    PrintJsonReport(*info);
  } else {
    PrintHuman(*info);
  }
  return kExitOk;
}

VerifyReport VerifyCkptFile(const std::string& path, int threads, const ProgressFn& progress,
                            const KeyFlags& dec) {
  VerifyReport out;
  out.path = path;
  out.format = "ckpt";
  Result<std::optional<MindSporeCipher>> mode = ModeOf(dec);
  Result<MindSporeCheckpointInfo> info = mode.ok()
                                             ? InspectMindSporeCheckpoint(path, nullptr, KeyOf(dec))
                                             : Result<MindSporeCheckpointInfo>(mode.status());
  out.status = info.status();
  if (!info.ok()) return out;
  out.checksums = info->has_crc;  // one CRC-32 over the whole file
  Result<State> state = LoadMindSporeCheckpoint(
      path, {.dec_key = KeyOf(dec), .dec_mode = *mode, .stats = &out.stats, .progress = progress},
      {.io_threads = threads});
  out.status = state.status();
  if (state.ok()) out.tensors = state->num_tensors();
  out.stats.chunks = info->has_crc ? 1 : 0;
  return out;
}

}  // namespace savepoint::cli
