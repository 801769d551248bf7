// Encryption of a save's chunks (docs/FORMAT.md §10), shared by Save (writer.cc), the async
// Checkpointer (async_saver.cc, snapshot.cc) and the multi-rank save (distributed/save.cc).
//
// A save that encrypts resolves SaveOptions::key once, derives the checkpoint's keys with a fresh
// salt (NewSaveKeys; a multi-rank save uses the coordinator's salt), plans as usual, then calls
// EnableSealing: the manifest becomes encrypted (salt, key check, a tag slot per chunk) and every
// chunk task points at the save's ChunkSeal. Writers then seal each chunk where it is staged or
// about to be written (SealChunk), never in the caller's memory, and take its CRC32C on the
// ciphertext. Nonces are (data file index, stored offset): unique within the checkpoint, as no two
// stored chunks of a file start at the same offset and every rank writes a file of its own.
//
// Ownership: the ChunkSeal is owned by the save and must outlive its tasks. Thread safety:
// SealChunk may run on any number of threads at once (distinct tasks).
#ifndef SAVEPOINT_ENGINE_SEAL_H_
#define SAVEPOINT_ENGINE_SEAL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/writer.h"
#include "format/encryption.h"

namespace savepoint::engine {

// How one save seals its chunks: the checkpoint's keys, and the checkpoint id and data file index
// that go into every chunk's nonce and AAD.
struct ChunkSeal {
  format::CheckpointKeys keys;
  uint64_t checkpoint_id = 0;
  uint32_t file_index = 0;
};

// The keys of a new encrypted checkpoint: SaveOptions::key resolved (through `fs` for a key file)
// and derived with a fresh random salt. Errors name SaveOptions.key.
Result<format::CheckpointKeys> NewSaveKeys(const EncryptionKey& key, FileSystem* fs);

// Makes the planned save (`m`, `tasks` from PlanSave) encrypted: fills `seal` (the keys, m's
// checkpoint id, `file_index`: the data file's index in the final manifest), enables
// m->encryption (salt, key check), gives every shard of `m` one tag slot per chunk and points every
// task at `seal` and its slot. Call once m's checkpoint id is final (a multi-rank save learns it
// from the coordinator).
void EnableSealing(format::CheckpointKeys keys, uint32_t file_index, format::Manifest* m,
                   std::vector<ChunkTask>* tasks, ChunkSeal* seal);

// What chunk `t` is when stored at `offset` as `stored` bytes (`compressed`: its compressed form).
format::ChunkIdentity IdentityOf(const ChunkTask& t, uint64_t offset, uint64_t stored,
                                 bool compressed);

// Seals chunk `t` (t.seal set) as stored at `offset`: encrypts `len` bytes from `in` into `out`
// (in == out allowed; `len` is t.len, or the compressed size when `compressed`), a 256 KiB slice
// at a time, each slice checksummed right after while it is in cache; sets *t.crc (CRC32C of the
// ciphertext) and *t.tag.
Status SealChunk(const ChunkTask& t, uint64_t offset, const std::byte* in, std::byte* out,
                 uint64_t len, bool compressed);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_SEAL_H_
