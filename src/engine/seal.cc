// Sealing of a save's chunks (engine/seal.h).
#include "engine/seal.h"

#include <algorithm>
#include <utility>

#include "util/crc32c.h"

namespace savepoint::engine {

Result<format::CheckpointKeys> NewSaveKeys(const EncryptionKey& key, FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(SecretBytes user, format::ResolveUserKey(key, fs, "SaveOptions.key"));
  SP_ASSIGN_OR_RETURN(format::Salt salt, format::RandomSalt());
  return format::CheckpointKeys::Derive(user, salt);
}

void EnableSealing(format::CheckpointKeys keys, uint32_t file_index, format::Manifest* m,
                   std::vector<ChunkTask>* tasks, ChunkSeal* seal) {
  m->encryption.enabled = true;
  m->encryption.salt = keys.salt();
  m->encryption.key_check = keys.key_check();
  seal->keys = std::move(keys);
  seal->checkpoint_id = m->checkpoint_id;
  seal->file_index = file_index;
  for (auto& t : m->tensors) {
    for (auto& s : t.shards) s.tags.resize(s.crc32c.size());
  }
  for (ChunkTask& task : *tasks) {  // PlanSave's tasks are chunks of shard 0 of a record of `m`
    task.seal = seal;
    task.tag = &task.tensor->shards[0].tags[task.chunk];
  }
}

format::ChunkIdentity IdentityOf(const ChunkTask& t, uint64_t offset, uint64_t stored,
                                 bool compressed) {
  const format::ShardRecord& s = t.tensor->shards[0];
  format::ChunkIdentity id;
  id.checkpoint_id = t.seal->checkpoint_id;
  id.file = t.seal->file_index;
  id.offset = offset;
  id.tensor = t.tensor->name;
  id.box = s.offsets;
  id.chunk = t.chunk;
  id.raw_bytes = t.len;
  id.stored_bytes = stored;
  id.compressed = compressed;
  return id;
}

Status SealChunk(const ChunkTask& t, uint64_t offset, const std::byte* in, std::byte* out,
                 uint64_t len, bool compressed) {
  SP_ASSIGN_OR_RETURN(crypto::GcmSealer sealer,
                      t.seal->keys.BeginSeal(IdentityOf(t, offset, len, compressed)));
  uint32_t crc = 0;
  for (uint64_t at = 0; at < len; at += kCrc32cSlice) {
    const uint64_t n = std::min<uint64_t>(kCrc32cSlice, len - at);
    SP_RETURN_IF_ERROR(sealer.Update({in + at, n}, {out + at, n}));
    crc = Crc32cExtend(crc, {out + at, n});
  }
  SP_ASSIGN_OR_RETURN(*t.tag, sealer.Finish());
  *t.crc = crc;
  return Status::OK();
}

}  // namespace savepoint::engine
