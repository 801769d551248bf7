// SaveDistributed: every rank writes its own data file, the coordinator writes the one manifest.
//
// Protocol (docs/DISTRIBUTED.md); rank 0 is the coordinator:
//   1. Every rank resolves its layout and decides, without communication, which shards it writes
//      (AssignWrites: one member per replica group, balanced by bytes), then lays them out in its
//      own data file data-<rank>-00000.spd (engine::PlanSave). Nothing is written yet.
//   2. Gather(plan descriptor) to the coordinator. A rank that failed to plan sends its error.
//   3. The coordinator merges the descriptors, checks dtypes, global shapes and that the shards of
//      every tensor tile it exactly (InvalidArgument naming the tensor), picks the format version
//      when the ranks left it to it (SaveOptions::format_version 0), then creates the hidden
//      temporary directory (engine::BeginSave), numbers the data files and picks the checkpoint
//      id (and, for an encrypted save, the salt). Broadcast(verdict). On error every rank returns
//      it; nothing was written.
//   4. Every rank with shards writes and syncs its data file in the temporary directory, its
//      header stamped with the verdict's format version. An
//      encrypted save: each rank derives the checkpoint's keys from its own SaveOptions::key and
//      the coordinator's salt and seals its chunks (engine/seal.h); nonces are unique across ranks
//      because each rank's file has its own index.
//   5. Gather(status + CRC32Cs, and for an encrypted save the key check and GCM tags) to the
//      coordinator, which refuses a rank whose key differs from its own.
//   6. The coordinator, only if every rank succeeded: writes and syncs MANIFEST, syncs the
//      directory, commits by rename (engine::FinishFiles, engine::CommitSave, the single-process
//      protocol's steps 3c and 4-8). Otherwise it removes the temporary directory.
//   7. Broadcast(result): every rank returns the same status.
// A collective that fails (timeout, an aborted or dead rank) breaks the group, so every rank
// returns an error; the coordinator removes the temporary directory on any error after step 3.
// The steps are the public RankSave (1, 4) and SaveCoordinator (3, 6), so that a framework with
// collectives of its own (the torch DCP plug-in) runs the same protocol; Run joins them here.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "distributed/descriptor.h"
#include "distributed/merge.h"
#include "distributed/save_access.h"
#include "distributed/shard.h"
#include "distributed/write.h"
#include "engine/paths.h"
#include "engine/request.h"
#include "engine/seal.h"
#include "engine/select.h"
#include "engine/writer.h"
#include "format/manifest_index.h"
#include "savepoint/distributed.h"
#include "util/progress.h"
#include "util/random.h"

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
                const SaveOptions& o, const IoOptions& io, const engine::RowGathers* gathers,
                RankPlan* p) {
  const uint64_t chunk_bytes = o.chunk_bytes;
  const Compression& compression = o.compression;
  SP_RETURN_IF_ERROR(engine::CheckSaveOptions(
      SaveOptions{.chunk_bytes = chunk_bytes, .format_version = o.format_version}));
  SP_RETURN_IF_ERROR(engine::RefuseTopology(o.topology, "distributed save", "SaveOptions"));
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
                      engine::PlanSave(p->mine, chunk_bytes, &p->m, {}, o.format_version, gathers));
  // Until the verdict, the version asked for: 0 leaves it to the coordinator (which picks 2 or 4,
  // versions that lay out a data file as PlanSave just did).
  p->m.version = o.format_version;
  p->m.files[0].name = engine::DataFileName(rank, 0);
  for (size_t k = 0; k < writes.size(); ++k) {  // PlanSave keeps name order, as `writes` does
    const ShardSpec& spec = shards[writes[k]].spec;
    if (!spec.tensor.empty()) p->m.tensors[k].name = spec.tensor;
    p->m.tensors[k].shape = spec.global_shape;
    p->m.tensors[k].shards[0].offsets = spec.offsets;
  }
  return Status::OK();
}

// Step 4's first part: the format version the verdict gives becomes the version of the rank's
// data file and manifest, which held the version it asked for: the verdict's must be that one, or
// for 0 (the coordinator's choice) one of versions 2 to 4, which lay out a data file as the
// rank's plan did (PlanSave resolved 0 to 2).
Status TakeVersion(uint32_t version, format::Manifest* m) {
  constexpr uint32_t kSameLayoutFrom = 2;  // (version 1 aligns every extent to 4096 bytes)
  const bool chosen = m->version == 0 && version >= kSameLayoutFrom;
  if (version == 0 || version > format::kMaxFormatVersion || (version != m->version && !chosen)) {
    return InternalError(fmt::format("save verdict: format version {} for a rank that asked for {}",
                                     version, m->version));
  }
  m->version = version;
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

// How long a rank waits for the coordinator's answer (steps 3 and 7). The coordinator gets the
// full timeout; every other rank twice that (saturating), so that the coordinator, which alone
// sees which ranks are missing from its gather, gives the verdict naming them, instead of a rank
// that got to the broadcast ahead of a coordinator slowed down by a loaded machine timing out
// first and naming the coordinator.
Timeout AnswerWait(Timeout timeout, bool root) {
  if (root || timeout > Timeout::max() / 2) return timeout;
  return 2 * timeout;
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

// Steps 2 and 3: gathers `mine` (a plan or its digest) to the coordinator `c` (null on the other
// ranks), whose verdict *msg every rank receives. (The plans are freed once decided: at scale
// they are hundreds of megabytes.)
Status Decided(Communicator& comm, const std::string& mine, SaveCoordinator* c, Timeout timeout,
               std::string* msg) {
  {
    SP_ASSIGN_OR_RETURN(std::vector<std::string> plans, comm.Gather(mine, kRoot, timeout));
    if (c != nullptr) *msg = c->Decide(plans);
  }
  return comm.Broadcast(msg, kRoot, AnswerWait(timeout, c != nullptr));
}

// The steps joined by the communicator's collectives.
Status Run(const engine::WriteRequest& r, RankSave* mine) {
  Communicator& comm = *r.topology.comm;
  const Timeout timeout = r.topology.timeout;
  const bool root = comm.rank() == kRoot;
  std::unique_ptr<SaveCoordinator> c =
      root ? std::make_unique<SaveCoordinator>(r.path, comm.size(), r.options, r.io) : nullptr;
  const std::string plan =
      RankSaveAccess::Plan(*mine, *r.state, *r.topology.layout, r.options, r.io, r.gathers);
  // The plans' digests first: a coordinator that merged the same plans before decides from them
  // (the plan cache); otherwise its verdict asks for the plans themselves.
  std::string msg;
  SP_RETURN_IF_ERROR(Decided(comm, EncodePlanDigest(plan), c.get(), timeout, &msg));
  SP_ASSIGN_OR_RETURN(Verdict first, DecodeVerdict(msg, comm.size()));
  if (first.need_plans) SP_RETURN_IF_ERROR(Decided(comm, plan, c.get(), timeout, &msg));
  SP_ASSIGN_OR_RETURN(std::string report, mine->Write(msg, r.options, r.io));
  SP_ASSIGN_OR_RETURN(std::vector<std::string> reports, comm.Gather(report, kRoot, timeout));
  msg.clear();
  if (root) EncodeStatus(c->Commit(reports, *mine), &msg);
  SP_RETURN_IF_ERROR(comm.Broadcast(&msg, kRoot, AnswerWait(timeout, root)));
  return DecodeStatus(msg, "save result");
}

}  // namespace
}  // namespace savepoint::dist

namespace savepoint {

struct RankSave::Impl {
  int rank, world;
  dist::RankPlan p;
  Status planned = FailedPreconditionError("RankSave: not planned");
  Status wrote = FailedPreconditionError("RankSave: not written");
  dist::Verdict verdict;
};

RankSave::RankSave(int rank, int world) : impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->world = world;
}
RankSave::~RankSave() = default;
const Status& RankSave::planned() const { return impl_->planned; }
const Status& RankSave::wrote() const { return impl_->wrote; }
uint64_t RankSave::bytes() const { return impl_->p.mine.tensor_bytes(); }
size_t RankSave::chunks() const { return impl_->p.tasks.size(); }
bool RankSave::direct_io() const { return impl_->p.direct; }

std::string RankSave::Plan(const State& local, const ShardLayout& layout, const SaveOptions& o,
                           const IoOptions& io) {
  return RankSaveAccess::Plan(*this, local, layout, o, io, nullptr);
}

std::string RankSaveAccess::Plan(RankSave& save, const State& local, const ShardLayout& layout,
                                 const SaveOptions& o, const IoOptions& io,
                                 const engine::RowGathers* gathers) {
  RankSave::Impl& i = *save.impl_;
  i.p = dist::RankPlan();
  i.planned = ValidateIoOptions(io, "distributed save");
  if (i.planned.ok() && !local.tables().empty()) {
    i.planned = InvalidArgumentError(fmt::format(
        "this rank's state holds sparse table {:?}: save tables with SaveSparseDistributed",
        local.tables().begin()->first));
  }
  if (i.planned.ok()) {
    i.planned = dist::PlanRank(local, layout, i.rank, i.world, o, io, gathers, &i.p);
  }
  if (i.planned.ok() && i.rank == dist::kRoot) i.planned = save.AddValues(local);
  return dist::EncodePlan(i.planned, i.p.m, i.p.key.has_value());
}

std::string RankSaveAccess::DryReport(RankSave& save) {
  dist::RankPlan& p = save.impl_->p;
  if (save.impl_->planned.ok()) {
    for (format::TensorRecord& t : p.m.tensors) {
      format::ShardRecord& s = t.shards[0];
      s.crc32c.assign(format::NumChunks(s.bytes, p.m.chunk_bytes), 0);
    }
  }
  return dist::EncodeCrcs(save.impl_->planned, p.m);
}

Status RankSave::AddValues(const State& values) {
  for (const auto& [name, e] : values.entries()) {
    if (!e.is_tensor()) SP_RETURN_IF_ERROR(impl_->p.m.values.PutValue(name, e.value()));
  }
  if (!values.metadata().is_null()) impl_->p.m.values.metadata() = values.metadata();
  return Status::OK();
}

Result<std::string> RankSave::Write(std::string_view verdict, const SaveOptions& o,
                                    const IoOptions& io) {
  Impl& i = *impl_;
  SP_RETURN_IF_ERROR(engine::RefuseTopology(o.topology, "distributed save write", "SaveOptions"));
  SP_ASSIGN_OR_RETURN(i.verdict, dist::DecodeVerdict(verdict, i.world));
  SP_RETURN_IF_ERROR(i.verdict.status);
  if (i.verdict.need_plans) {
    return FailedPreconditionError("RankSave::Write: the verdict asks for the plans, not a write");
  }
  i.p.m.checkpoint_id = i.verdict.checkpoint_id;
  i.wrote = i.planned;
  if (i.wrote.ok()) i.wrote = dist::TakeVersion(i.verdict.version, &i.p.m);
  engine::SaveTarget target{FileSystemOf(io), "", i.verdict.tmp};
  // A rank that writes no file still derives the keys: the coordinator writes the manifest, and
  // every rank's key check is compared with the coordinator's.
  const uint32_t file_index =
      static_cast<uint32_t>(std::max<int64_t>(i.verdict.file_index[i.rank], 0));
  if (i.wrote.ok() && i.p.key) i.wrote = dist::SealPlan(i.verdict, file_index, &i.p);
  if (i.wrote.ok()) i.wrote = dist::WriteRankFile(target, o, io, file_index, &i.p);
  return dist::EncodeCrcs(i.wrote, i.p.m);
}

struct SaveCoordinator::Impl {
  explicit Impl(int world) : world(world) {}
  int world;
  std::string path;
  SaveOptions o;
  IoOptions io;
  std::shared_ptr<const dist::MergedPlan> plan;
  engine::SaveTarget target;
  dist::Verdict verdict;
  bool began = false, committed = false;
  // After a verdict that asked for the plans: the digests it had and their key.
  std::vector<std::string> digests;
  crypto::Sha256 digests_key{};
};

SaveCoordinator::SaveCoordinator(std::string path, int world, SaveOptions o, IoOptions io)
    : impl_(std::make_unique<Impl>(world)) {
  impl_->path = std::move(path);
  impl_->o = std::move(o);
  impl_->io = io;
}

SaveCoordinator::~SaveCoordinator() { Abandon(); }

void SaveCoordinator::Abandon() {
  if (impl_->began && !impl_->committed) engine::AbandonSave(impl_->target);
  impl_->began = false;
}

const Status& SaveCoordinator::decided() const { return impl_->verdict.status; }

std::string SaveCoordinator::Decide(const std::vector<std::string>& plans) {
  Impl& c = *impl_;
  if (c.began) {  // (the first decision stands: its save is under way)
    dist::Verdict again;
    again.status = FailedPreconditionError("SaveCoordinator::Decide: already decided");
    return dist::EncodeVerdict(again);
  }
  c.verdict = dist::Verdict();
  dist::Verdict& v = c.verdict;
  v.status = [&]() -> Status {
    if (plans.size() != static_cast<size_t>(c.world)) {
      return InternalError(fmt::format("{} plans for {} ranks", plans.size(), c.world));
    }
    // The plan cache: the same plans as an earlier save (or their digests) are not merged again.
    // The key is always that of the messages at hand, so that what is cached is the merge of the
    // plans it names.
    bool digests = false;
    const int threads = dist::CoordinatorThreads(plans.size());
    crypto::Sha256 key;
    std::vector<std::string> digests_asked;  // the plans must be these digests' (checked by merge)
    if (!c.digests.empty()) {  // the plans the last verdict asked for: the key is the digests'
      digests_asked = std::move(c.digests);
      c.digests.clear();  // (a failed second round starts over)
      c.plan = nullptr;
      key = c.digests_key;
    } else {
      key = dist::PlanKey(plans, &digests, threads);
      c.plan = dist::CachedPlan(key);
      if (c.plan != nullptr && c.plan->world() != c.world) c.plan = nullptr;
    }
    if (c.plan == nullptr && digests) {
      v.need_plans = true;  // (SaveDistributed's first round: the ranks send their plans)
      c.digests = plans;
      c.digests_key = key;
      return Status::OK();
    }
    if (c.plan == nullptr) {
      SP_ASSIGN_OR_RETURN(
          c.plan,
          dist::MergePlans(plans, threads, digests_asked.empty() ? nullptr : &digests_asked));
      dist::CachePlan(key, c.plan);
    }
    v.file_index = c.plan->file_index();
    v.version = c.plan->version();
    SP_ASSIGN_OR_RETURN(c.target, engine::BeginSave(c.path, c.o, c.io));
    c.began = true;
    v.tmp = c.target.tmp;
    v.checkpoint_id = RandomU64();
    if (c.plan->encrypted()) {
      SP_ASSIGN_OR_RETURN(format::Salt salt, format::RandomSalt());
      v.salt.assign(reinterpret_cast<const char*>(salt.data()), salt.size());
    }
    return Status::OK();
  }();
  return dist::EncodeVerdict(v);
}

Status SaveCoordinator::Commit(const std::vector<std::string>& reports, RankSave& own) {
  Impl& c = *impl_;
  Status s = [&]() -> Status {
    SP_RETURN_IF_ERROR(c.verdict.status);
    if (!c.began) return FailedPreconditionError("SaveCoordinator::Commit before Decide");
    dist::RankPlan* p = &own.impl_->p;
    const bool encrypted = p->m.encryption.enabled;
    if (p->m.chunk_bytes != c.plan->chunk_bytes() ||
        reports.size() != c.plan->file_index().size()) {
      return InternalError("SaveCoordinator::Commit: the reports do not match the plan");
    }
    dist::SaveChecksums sums(c.plan);
    SP_RETURN_IF_ERROR(sums.AddAll(reports, encrypted ? &p->m.encryption.key_check : nullptr,
                                   dist::CoordinatorThreads(reports.size())));
    format::Manifest m = std::move(p->m);  // keeps the id stamp, time, writer, chunk size, salt
    m.checkpoint_id = c.verdict.checkpoint_id;
    m.version = c.plan->version();  // (the rank's Write took it from the verdict too)
    const format::CheckpointKeys* keys = encrypted ? &p->seal.keys : nullptr;
    if (m.version >= format::kIndexedFormatVersion) {  // sections from the plan's records
      uint64_t largest = 0;
      std::string front;
      const std::vector<std::string_view> manifest = sums.EncodeIndexed(&m, keys, &front, &largest);
      SP_RETURN_IF_ERROR(engine::FinishEncoded(c.target, nullptr, m, manifest, largest));
    } else {
      sums.TakeInto(&m);
      SP_RETURN_IF_ERROR(engine::FinishFiles(c.target, nullptr, m, keys));
    }
    return engine::CommitSave(c.target, c.o.overwrite);
  }();
  c.committed = s.ok();
  if (!s.ok()) Abandon();
  return s;
}

namespace dist {

Status Write(const engine::WriteRequest& r) {
  const auto start = std::chrono::steady_clock::now();
  Communicator& comm = *r.topology.comm;
  RankSave mine(comm.rank(), comm.size());
  Status s = r.late != nullptr && r.late->prepare ? r.late->prepare() : Status::OK();
  if (!s.ok()) comm.Abort(s);  // the others' steps fail, naming this rank
  if (s.ok()) s = Run(r, &mine);
  if (!s.ok()) {
    return s.WithContext(
        fmt::format("distributed save {} (rank {} of {})", r.path, comm.rank(), comm.size()));
  }
  if (SaveStats* stats = r.options.stats; stats != nullptr) {
    const uint64_t bytes = mine.bytes();
    *stats = SaveStats{bytes, mine.chunks(), 0, mine.direct_io(), bytes, 0, 0};
    stats->seconds = stats->blocked_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Status::OK();
}

}  // namespace dist
}  // namespace savepoint
