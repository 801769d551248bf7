// SaveDistributed: every rank writes its own data file, the coordinator writes the one manifest.
//
// Protocol (docs/DISTRIBUTED.md); rank 0 is the coordinator:
//   1. Every rank resolves its layout and decides, without communication, which shards it writes
//      (AssignWrites: one member per replica group, balanced by bytes), then lays them out in its
//      own data file data-<rank>-00000.spd (engine::PlanSave). Nothing is written yet.
//   2. Gather(plan descriptor) to the coordinator. A rank that failed to plan sends its error.
//   3. The coordinator merges the descriptors, checks dtypes, global shapes and that the shards of
//      every tensor tile it exactly (InvalidArgument naming the tensor), then creates the hidden
//      temporary directory (engine::BeginSave), numbers the data files and picks the checkpoint
//      id (and, for an encrypted save, the salt). Broadcast(verdict). On error every rank returns
//      it; nothing was written.
//   4. Every rank with shards writes and syncs its data file in the temporary directory. An
//      encrypted save: each rank derives the checkpoint's keys from its own SaveOptions::key and
//      the coordinator's salt and seals its chunks (engine/seal.h); nonces are unique across ranks
//      because each rank's file has its own index.
//   5. Gather(status + CRC32Cs, and for an encrypted save the key check and GCM tags) to the
//      coordinator, which refuses a rank whose key differs from its own.
//   6. The coordinator, only if every rank succeeded: writes and syncs MANIFEST, syncs the
//      directory, commits by rename (engine::FinishFiles, engine::CommitSave, the single-process
//      protocol's steps 4-10). Otherwise it removes the temporary directory.
//   7. Broadcast(result): every rank returns the same status.
// A collective that fails (timeout, an aborted or dead rank) breaks the group, so every rank
// returns an error; the coordinator removes the temporary directory on any error after step 3.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "distributed/descriptor.h"
#include "distributed/shard.h"
#include "engine/paths.h"
#include "engine/seal.h"
#include "engine/select.h"
#include "engine/writer.h"
#include "savepoint/distributed.h"
#include "util/progress.h"

namespace savepoint::dist {
namespace {

constexpr int kRoot = 0;

// One rank's part of the save.
struct RankPlan {
  State mine;          // views of the shards this rank writes
  format::Manifest m;  // local manifest: files[0] = this rank's data file
  std::vector<engine::ChunkTask> tasks;
  bool direct = false;             // whether this rank's data file was written with O_DIRECT
  std::optional<SecretBytes> key;  // SaveOptions::key resolved (encrypted saves)
  engine::ChunkSeal seal;          // encrypted saves: how `tasks` are sealed
};

Status PlanRank(const State& local, const ShardLayout& layout, int rank, int size,
                const SaveOptions& o, const IoOptions& io, RankPlan* p) {
  const uint64_t chunk_bytes = o.chunk_bytes;
  const Compression& compression = o.compression;
  SP_RETURN_IF_ERROR(engine::CheckSaveOptions(
      SaveOptions{.chunk_bytes = chunk_bytes, .format_version = o.format_version}));
  if (compression.codec != Compression::Codec::kNone) {
    return UnimplementedError("SaveOptions.compression: distributed saves do not compress yet");
  }
  if (o.key) {
    SP_ASSIGN_OR_RETURN(p->key, format::ResolveUserKey(o.key, FileSystemOf(io), "SaveOptions.key"));
  }
  SP_ASSIGN_OR_RETURN(std::vector<LocalShard> shards,
                      ResolveLocalShards(local, layout, rank, size));
  std::vector<size_t> writes = AssignWrites(shards, rank);
  for (size_t i : writes) SP_RETURN_IF_ERROR(p->mine.PutView(shards[i].name, shards[i].view));
  SP_ASSIGN_OR_RETURN(p->tasks,
                      engine::PlanSave(p->mine, chunk_bytes, &p->m, {}, o.format_version));
  p->m.files[0].name = engine::DataFileName(rank, 0);
  for (size_t k = 0; k < writes.size(); ++k) {  // PlanSave keeps name order, as `writes` does
    const ShardSpec& spec = shards[writes[k]].spec;
    p->m.tensors[k].shape = spec.global_shape;
    p->m.tensors[k].shards[0].offsets = spec.offsets;
  }
  return Status::OK();
}

// Step 4: writes this rank's data file (if it has shards) into the temporary directory; its
// header is stamped with `file_index`, the file's index in the global manifest.
Status WriteRankFile(const engine::SaveTarget& target, const SaveOptions& o, const IoOptions& io,
                     uint32_t file_index, RankPlan* p) {
  if (p->m.tensors.empty()) return Status::OK();
  format::Manifest stamp;  // just what CreateDataFile reads: version, id and files[file_index]
  stamp.version = p->m.version;
  stamp.checkpoint_id = p->m.checkpoint_id;
  stamp.files.resize(size_t{file_index} + 1);
  stamp.files[file_index] = p->m.files[0];
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                      engine::CreateDataFile(target, stamp, io.direct_io, file_index));
  p->direct = f->direct();
  Progress progress(o.progress, p->mine.tensor_bytes());
  SP_RETURN_IF_ERROR(engine::WriteTasks(p->tasks, p->m.chunk_bytes, io.io_threads, f.get(),
                                        /*alloc=*/nullptr, &progress));  // nothing is compressed
  progress.Finish();
  SP_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

// The coordinator's state across steps 3-6.
struct Coordinator {
  explicit Coordinator(int size) : merger(size) {}
  ManifestMerger merger;
  engine::SaveTarget target;
  bool began = false;
};

// Step 3 (coordinator): merges plans, validates, creates the temporary directory.
Verdict Decide(const std::vector<std::string>& plans, const std::string& path, const SaveOptions& o,
               const IoOptions& io, Coordinator* c) {
  Verdict v;
  v.status = [&]() -> Status {
    for (size_t r = 0; r < plans.size(); ++r) {
      SP_RETURN_IF_ERROR(c->merger.AddPlan(static_cast<int>(r), plans[r]));
    }
    SP_ASSIGN_OR_RETURN(v.file_index, c->merger.Finish());
    SP_ASSIGN_OR_RETURN(c->target, engine::BeginSave(path, o, io));
    c->began = true;
    v.tmp = c->target.tmp;
    v.checkpoint_id = engine::RandomU64();
    if (c->merger.encrypted()) {
      SP_ASSIGN_OR_RETURN(format::Salt salt, format::RandomSalt());
      v.salt.assign(reinterpret_cast<const char*>(salt.data()), salt.size());
    }
    return Status::OK();
  }();
  return v;
}

// Step 6 (coordinator): checks every rank's report, writes the manifest and commits.
Status Commit(const std::vector<std::string>& reports, const Verdict& v, const SaveOptions& o,
              RankPlan* p, Coordinator* c) {
  const bool encrypted = p->m.encryption.enabled;
  for (size_t r = 0; r < reports.size(); ++r) {
    SP_RETURN_IF_ERROR(c->merger.AddCrcs(static_cast<int>(r), reports[r], p->m.chunk_bytes,
                                         encrypted ? &p->m.encryption.key_check : nullptr));
  }
  format::Manifest m = std::move(p->m);  // keeps the id stamp, time, writer, chunk size and salt
  m.checkpoint_id = v.checkpoint_id;
  c->merger.TakeInto(&m);
  SP_RETURN_IF_ERROR(
      engine::FinishFiles(c->target, nullptr, m, encrypted ? &p->seal.keys : nullptr));
  return engine::CommitSave(c->target, o.overwrite);
}

// How long a rank waits for the coordinator's answer (steps 3 and 7). The coordinator gets the
// full timeout; every other rank twice that (saturating), so that the coordinator, which alone
// sees which ranks are missing from its gather, gives the verdict naming them, instead of a rank
// that got to the broadcast ahead of a coordinator slowed down by a loaded machine timing out
// first and naming the coordinator.
Timeout AnswerWait(const DistributedSaveOptions& o, bool root) {
  if (root || o.timeout > Timeout::max() / 2) return o.timeout;
  return 2 * o.timeout;
}

// Step 4, encrypted saves: derives the keys from this rank's key and the coordinator's salt and
// makes the rank's plan sealed (its data file is `file_index` in the manifest).
Status SealPlan(const Verdict& v, uint32_t file_index, RankPlan* p) {
  format::Salt salt;
  if (v.salt.size() != salt.size()) {
    return InternalError(fmt::format("save verdict: salt of {} bytes", v.salt.size()));
  }
  std::memcpy(salt.data(), v.salt.data(), salt.size());
  SP_ASSIGN_OR_RETURN(format::CheckpointKeys keys, format::CheckpointKeys::Derive(*p->key, salt));
  engine::EnableSealing(std::move(keys), file_index, &p->m, &p->tasks, &p->seal);
  return Status::OK();
}

// A collective that failed: the coordinator drops the temporary directory.
Status Fail(const Status& s, Coordinator* c) {
  if (c != nullptr && c->began) engine::AbandonSave(c->target);
  return s;
}

Status Run(Communicator& comm, const State& local, const ShardLayout& layout,
           const std::string& path, const DistributedSaveOptions& o, const IoOptions& io,
           RankPlan* p) {
  const int rank = comm.rank(), size = comm.size();
  const bool root = rank == kRoot;
  Status planned = ValidateIoOptions(io, "distributed save");
  if (planned.ok()) planned = PlanRank(local, layout, rank, size, o.save, io, p);
  if (planned.ok() && root) planned = engine::CopyValues(local, &p->m.values);
  SP_ASSIGN_OR_RETURN(std::vector<std::string> plans,
                      comm.Gather(EncodePlan(planned, p->m, p->key.has_value()), kRoot, o.timeout));
  std::unique_ptr<Coordinator> c = root ? std::make_unique<Coordinator>(size) : nullptr;
  std::string msg = root ? EncodeVerdict(Decide(plans, path, o.save, io, c.get())) : "";
  Status s = comm.Broadcast(&msg, kRoot, AnswerWait(o, root));
  if (!s.ok()) return Fail(s, c.get());
  SP_ASSIGN_OR_RETURN(Verdict v, DecodeVerdict(msg, size));
  if (!v.status.ok()) return Fail(v.status, c.get());
  p->m.checkpoint_id = v.checkpoint_id;
  engine::SaveTarget target{FileSystemOf(io), path, v.tmp};
  // A rank that writes no file still derives the keys: the coordinator writes the manifest, and
  // every rank's key check is compared with the coordinator's.
  const uint32_t file_index = static_cast<uint32_t>(std::max<int64_t>(v.file_index[rank], 0));
  Status wrote = p->key ? SealPlan(v, file_index, p) : Status::OK();
  if (wrote.ok()) wrote = WriteRankFile(target, o.save, io, file_index, p);
  Result<std::vector<std::string>> reports = comm.Gather(EncodeCrcs(wrote, p->m), kRoot, o.timeout);
  if (!reports.ok()) return Fail(reports.status(), c.get());
  msg.clear();
  if (root) {
    Status committed = Commit(*reports, v, o.save, p, c.get());
    if (!committed.ok()) Fail(committed, c.get()).IgnoreError();
    EncodeStatus(committed, &msg);
  }
  s = comm.Broadcast(&msg, kRoot, AnswerWait(o, root));
  if (!s.ok()) return s;
  return DecodeStatus(msg, "save result");
}

}  // namespace
}  // namespace savepoint::dist

namespace savepoint {

Status SaveDistributed(Communicator& comm, const State& local, const ShardLayout& layout,
                       const std::string& path, const DistributedSaveOptions& o,
                       const IoOptions& io) {
  auto start = std::chrono::steady_clock::now();
  dist::RankPlan p;
  Status s = dist::Run(comm, local, layout, path, o, io, &p);
  std::string context =
      fmt::format("distributed save {} (rank {} of {})", path, comm.rank(), comm.size());
  if (!s.ok()) return s.WithContext(context);
  if (o.save.stats != nullptr) {
    const uint64_t bytes = p.mine.tensor_bytes();
    *o.save.stats = SaveStats{bytes, p.tasks.size(), 0, p.direct, bytes, 0, 0};
    o.save.stats->seconds = o.save.stats->blocked_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Status::OK();
}

}  // namespace savepoint
