// CheckpointManager (savepoint/manager.h).
//
// Save path: decide (interval, never one step twice) -> name -> decorate the state (step
// metadata, append_info) -> engine Save, or Checkpointer::SaveAsync. A synchronous save is
// committed on return; an async one is queued in `pending_` and reaped (polled) by every later
// call, or waited for by Wait/Close/Restore. Reaping a committed save = Commit: read back its
// manifest (creation time, size), add it to the index, apply retention, write the index. The
// index is therefore updated strictly after the checkpoint is durable; a crash in between is
// repaired by Reconcile at the next Open.
#include "savepoint/manager.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <set>

#include "engine/writer.h"
#include "io/commit.h"
#include "manager/chains.h"
#include "manager/index.h"
#include "manager/options.h"
#include "manager/registry.h"
#include "manager/retention.h"
#include "manager/signals.h"
#include "manager/store.h"
#include "manager/tier.h"
#include "savepoint/catalog.h"

namespace savepoint {
namespace manager {
namespace {

constexpr const char* kLockName = "savepoint.lock";

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A State that borrows `s`'s tensors and tables and copies its values and metadata.
Result<State> Borrow(const State& s) {
  State out;
  for (const auto& [name, e] : s.entries()) {
    SP_RETURN_IF_ERROR(e.is_tensor() ? out.PutView(name, e.tensor())
                                     : out.PutValue(name, e.value()));
  }
  for (const auto& [name, t] : s.tables()) {
    const std::span<const int64_t> del = t->deleted();
    TensorView deleted;
    if (!del.empty()) {
      deleted = TensorView(del.data(), DType::kI64, {static_cast<int64_t>(del.size())});
    }
    SP_ASSIGN_OR_RETURN(SparseTable view,
                        SparseTable::FromViews(t->ids_view(), t->slots(), std::move(deleted)));
    SP_RETURN_IF_ERROR(out.PutTable(name, std::move(view)));
  }
  out.metadata() = s.metadata();
  return out;
}

class ManagerImpl final : public CheckpointManager {
 public:
  explicit ManagerImpl(ManagerOptions o)
      : o_(std::move(o)),
        policy_(ResolvePolicy(o_)),
        fs_(FileSystemOf(o_.io)),
        registry_(o_.shard_id, o_.num_shards) {}

  ~ManagerImpl() override {
    Status s = Close();
    if (!s.ok()) spdlog::error("savepoint: closing checkpoint manager: {}", s.ToString());
  }

  Status Init() {
    SP_ASSIGN_OR_RETURN(store_, Store::Create(o_));
    if (!o_.remote.location.empty()) {
      SP_ASSIGN_OR_RETURN(tier_, Tier::Open(o_));
    }
    std::string dir =
        o_.naming.directory_fn ? o_.naming.directory_fn(StepInfo{0, 1, 0}) : o_.naming.directory;
    SP_RETURN_IF_ERROR(OpenDirectory(dir));
    if (o_.breakpoints.handle_signals) {
      SP_RETURN_IF_ERROR(InstallSignalHandlers());
      signals_installed_ = true;
    }
    return Status::OK();
  }

  // --- Direct API. ---
  Result<bool> Save(int64_t step, const State& state, const SaveArgs& args) override {
    std::lock_guard<std::mutex> lock(mu_);
    return SaveLocked(step, state, args);
  }
  bool ShouldSave(int64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    return last_saved_step_ != step && ShouldSaveLocked(step);
  }
  Result<State> Restore(const Which& which) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    SP_RETURN_IF_ERROR(Reap(true));
    SP_ASSIGN_OR_RETURN(CheckpointRecord rec, Find(which));
    auto t0 = std::chrono::steady_clock::now();
    LoadStats io;
    SP_ASSIGN_OR_RETURN(State state, StoreOf(rec.path).Load(rec.path, &io));
    Restored(rec, io.bytes, SecondsSince(t0));
    return state;
  }
  Result<CheckpointRecord> ResumeFrom(const Which& which) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    SP_RETURN_IF_ERROR(Reap(true));
    SP_ASSIGN_OR_RETURN(CheckpointRecord rec, Find(which));
    ResumeLocked(rec);
    return rec;
  }
  std::optional<CheckpointRecord> Latest() override {
    std::lock_guard<std::mutex> lock(mu_);
    ReapQuietly();
    std::vector<CheckpointRecord> all = Merged();
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  std::optional<int64_t> LatestStep() override {
    std::optional<CheckpointRecord> r = Latest();
    return r ? std::optional<int64_t>(r->step) : std::nullopt;
  }
  std::vector<CheckpointRecord> All() override {
    std::lock_guard<std::mutex> lock(mu_);
    ReapQuietly();
    return Merged();
  }
  std::vector<CheckpointRecord> Remote() override {
    std::lock_guard<std::mutex> lock(mu_);
    ReapQuietly();
    return tier_ ? tier_->Records() : std::vector<CheckpointRecord>{};
  }
  std::vector<int64_t> AllSteps() override {
    std::vector<int64_t> steps;
    for (const CheckpointRecord& r : All()) steps.push_back(r.step);
    return steps;
  }
  Status Wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    return Drain();
  }
  Status Close() override {
    std::lock_guard<std::mutex> lock(mu_);
    return CloseLocked();
  }
  std::string directory() override {
    std::lock_guard<std::mutex> lock(mu_);
    return dir_;
  }
  std::string prefix() override {
    std::lock_guard<std::mutex> lock(mu_);
    return prefix_;
  }
  std::vector<CheckpointStats> stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  // --- Registered state. ---
  Status Register(const std::string& name, Stateful* object, Category category) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(registry_.Add(name, object, category));
    if (o_.async_save.enabled && o_.async_save.prefault_staging) ReserveStaging();
    return Status::OK();
  }
  Status Reserve(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    if (!o_.async_save.enabled || o_.storage.format != Format::kNative) {
      return FailedPreconditionError(fmt::format(
          "checkpoint manager {}: Reserve: only async native saves stage (async = {}, format = {})",
          dir_, o_.async_save.enabled, FormatName(o_.storage.format)));
    }
    store_->Reserve(bytes);
    return Status::OK();
  }
  Status Unregister(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    return registry_.Remove(name);
  }
  Result<bool> SaveRegistered(int64_t step, const SaveArgs& args) override {
    std::lock_guard<std::mutex> lock(mu_);
    return SaveRegisteredLocked(step, args);
  }
  Result<CheckpointRecord> RestoreRegistered(const Which& which,
                                             const LoadConfig& config) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    SP_RETURN_IF_ERROR(Reap(true));
    SP_ASSIGN_OR_RETURN(CheckpointRecord rec, Find(which));
    auto t0 = std::chrono::steady_clock::now();
    SP_RETURN_IF_ERROR(LoadRegistered(rec.path, config));
    Restored(rec, rec.bytes, SecondsSince(t0));
    return rec;
  }
  Status LoadFrom(const std::string& path, const LoadConfig& config) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    return LoadRegistered(path, config);
  }

  // --- Hooks. ---
  Status OnStepEnd(int64_t step, int64_t epoch, const Metrics& metrics) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    NoteStep(step, epoch);
    if (int sig = PendingSignal(); sig != 0 && o_.breakpoints.handle_signals)
      return HandleSignal(sig);
    SaveArgs args = HookArgs(metrics);
    return SaveRegisteredLocked(step, args).status();
  }
  Status OnEpochEnd(int64_t epoch, const Metrics& metrics) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    if (epoch != cur_epoch_) NoteStep(last_step_, epoch);
    if (int sig = PendingSignal(); sig != 0 && o_.breakpoints.handle_signals)
      return HandleSignal(sig);
    if (last_saved_step_ == last_step_) return MarkEpochEnd(last_step_);
    SaveArgs args = HookArgs(metrics);
    args.force = true;
    args.epoch_end = true;
    return SaveRegisteredLocked(last_step_, args).status();
  }
  Status OnTrainEnd(const Metrics& metrics) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    SaveArgs args = HookArgs(metrics);
    args.force = true;
    SP_RETURN_IF_ERROR(SaveRegisteredLocked(last_step_, args).status());
    return Reap(true);
  }
  Result<bool> Step(const Metrics& metrics) override {
    std::lock_guard<std::mutex> lock(mu_);
    SP_RETURN_IF_ERROR(CheckOpen());
    NoteStep(global_step_ + 1, cur_epoch_ > 0 ? cur_epoch_ : 1);
    if (int sig = PendingSignal(); sig != 0 && o_.breakpoints.handle_signals)
      return HandleSignal(sig);
    if (policy_.save_steps <= 0 || global_step_ % policy_.save_steps != 0) return false;
    SaveArgs args = HookArgs(metrics);
    args.force = true;
    return SaveRegisteredLocked(global_step_, args);
  }
  int64_t global_step() override {
    std::lock_guard<std::mutex> lock(mu_);
    return global_step_;
  }
  Status SaveBreakpoint() override {
    std::lock_guard<std::mutex> lock(mu_);
    return SaveBreakpointLocked();
  }

 private:
  struct Pending {
    std::shared_ptr<InFlight> handle;
    CheckpointRecord record;
    std::string base = {};  // a delta's base (its name), else empty
  };

  Status CheckOpen() const {
    if (!closed_) return Status::OK();
    return FailedPreconditionError(fmt::format("checkpoint manager of {} is closed", dir_));
  }

  // --- Directory. ---
  Status OpenDirectory(const std::string& dir) {
    const std::string context = fmt::format("open checkpoint directory {}", dir);
    SP_RETURN_IF_ERROR(io::CreateDirsDurably(fs_, dir).WithContext(context));
    Result<std::unique_ptr<FileSystem::FileLock>> lock = fs_->LockFile(JoinPath(dir, kLockName));
    if (!lock.ok()) {
      return lock.status().WithContext(
          fmt::format("{}: another checkpoint manager is using it", context));
    }
    if (o_.gc_on_open) {
      GcOptions gc;
      gc.fs = fs_;
      Result<std::vector<std::string>> removed = GarbageCollect(dir, gc);
      if (!removed.ok()) spdlog::warn("savepoint: {}: {}", context, removed.status().ToString());
    }
    SP_ASSIGN_OR_RETURN(Index index, ReadIndex(fs_, dir));
    SP_ASSIGN_OR_RETURN(
        bool changed, Reconcile(*store_, fs_, dir, index.records, o_.save_policy.steps_per_epoch));
    if (changed) SP_RETURN_IF_ERROR(WriteIndex(fs_, dir, index).WithContext(context));
    SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, fs_->ListDir(dir));
    std::vector<std::string> names;
    for (const FileInfo& e : entries) {
      std::optional<std::string> name = store_->NameOf(e);
      if (name && !name->ends_with("_breakpoint")) names.push_back(*name);
    }
    prefix_ = o_.naming.prefix_fn ? std::string() : ResolvePrefixConflict(o_.naming.prefix, names);
    saved_in_dir_ = false;
    lock_ = std::move(lock).value();
    index_ = std::move(index);
    bases_ = std::make_unique<Bases>(store_.get());
    dir_ = dir;
    return Status::OK();
  }

  Status MaybeSwitchDirectory(const StepInfo& info) {
    if (!o_.naming.directory_fn) return Status::OK();
    std::string dir = o_.naming.directory_fn(info);
    if (dir == dir_) return Status::OK();
    SP_RETURN_IF_ERROR(Reap(true));
    lock_.reset();
    return OpenDirectory(dir);
  }

  Status CloseLocked() {
    if (closed_) return Status::OK();
    Status s = Drain();
    if (tier_) tier_->Close();
    tier_.reset();
    compact_later_.reset();  // (Reap waited for any compaction in flight)
    closed_ = true;
    pending_.clear();
    store_.reset();
    lock_.reset();
    if (signals_installed_) UninstallSignalHandlers();
    signals_installed_ = false;
    return s;
  }

  // Reserves staging memory for every registered tensor
  // (ManagerOptions::async_save.prefault_staging).
  void ReserveStaging() {
    Result<Gathered> g = registry_.Gather();
    if (!g.ok()) return;  // the first save reports it
    uint64_t bytes = 0;
    for (const auto& [name, e] : g->state.entries()) {
      if (e.is_tensor()) bytes += e.tensor().nbytes();
    }
    if (store_) store_->Reserve(bytes);
  }

  // --- Saving. ---
  bool ShouldSaveLocked(int64_t step) const {
    if (policy_.save_steps > 0) return step >= last_trigger_ + policy_.save_steps;
    if (policy_.save_seconds > 0) {
      return SecondsSince(last_save_time_) > static_cast<double>(policy_.save_seconds);
    }
    return false;
  }

  StepInfo InfoFor(int64_t step, const SaveArgs& args) const {
    const int64_t spe = o_.save_policy.steps_per_epoch;
    StepInfo info{step, spe > 0 ? (step - 1) / spe + 1 : 1, spe > 0 ? (step - 1) % spe + 1 : step};
    if (spe > 0 && step <= 0) info = {step, 1, 0};
    if (args.epoch) info.epoch = *args.epoch;
    if (args.step_in_epoch) info.step_in_epoch = *args.step_in_epoch;
    return info;
  }

  Result<std::string> NameFor(const StepInfo& info, bool breakpoint) const {
    if (!o_.naming.prefix_fn) return CheckpointName(prefix_, info, breakpoint);
    std::string name = o_.naming.prefix_fn(info);
    SP_RETURN_IF_ERROR(ValidatePrefix(name, "prefix_fn result"));
    return breakpoint ? name + "_breakpoint" : name;
  }

  // The state as saved: `state` plus the manager metadata and append_info values.
  Result<State> Decorate(const State& state, const CheckpointRecord& rec) const {
    SP_ASSIGN_OR_RETURN(State out, Borrow(state));
    Json& meta = out.metadata();
    if (meta.is_null()) meta = Json::object();
    if (!meta.is_object()) {
      return InvalidArgumentError(
          fmt::format("save {}: the state's metadata is not an object", rec.name));
    }
    Json& mine = meta[kMetaKey];
    if (!mine.is_object()) mine = Json::object();
    mine.update(RecordMeta(rec));
    meta["step"] = rec.step;
    const std::string context = fmt::format("save {}: append_info", rec.name);
    for (const std::string& item : o_.storage.append_info) {
      const int64_t n = item == "epoch_num" ? rec.epoch : rec.step;
      SP_RETURN_IF_ERROR(out.PutValue(item, Value(n)).WithContext(context));
    }
    for (const auto& [key, value] : o_.storage.append_dict) {
      SP_RETURN_IF_ERROR(out.PutValue(key, value).WithContext(context));
    }
    return out;
  }

  Result<bool> SaveLocked(int64_t step, const State& state, const SaveArgs& args) {
    SP_RETURN_IF_ERROR(CheckOpen());
    SP_RETURN_IF_ERROR(Reap(false));
    if (!args.breakpoint) {
      if (last_saved_step_ == step) {
        if (args.epoch_end) SP_RETURN_IF_ERROR(MarkEpochEnd(step));
        return false;
      }
      if (!args.force && !ShouldSaveLocked(step)) return false;
    }
    const StepInfo info = InfoFor(step, args);
    SP_RETURN_IF_ERROR(MaybeSwitchDirectory(info));
    SP_ASSIGN_OR_RETURN(std::string base, NameFor(info, args.breakpoint));
    const std::string name = store_->EntryName(base);
    CheckpointRecord rec{
        name, JoinPath(dir_, name), step,           info.epoch,  info.step_in_epoch, 0,
        0,    args.breakpoint,      args.epoch_end, args.metrics};
    if (!state.tables().empty() && o_.storage.format != CheckpointFormat::kNative) {
      return InvalidArgumentError(fmt::format(
          "save {}: sparse tables ({}, ...) need ManagerOptions.storage.format = kNative", rec.path,
          state.tables().begin()->first));
    }
    const bool staged = o_.async_save.enabled;  // tables and deltas too
    if (!staged) SP_RETURN_IF_ERROR(CheckHostMemory(state, rec.path));
    SP_ASSIGN_OR_RETURN(State full, Decorate(state, rec));
    bases_->Forget(rec.name);              // the name may be replaced
    if (tier_) tier_->Withdraw(rec.name);  // and must not be read by an upload meanwhile
    if (args.delta) {
      SP_RETURN_IF_ERROR(SaveDeltaLocked(std::move(rec), full, staged));
    } else if (staged) {
      SP_ASSIGN_OR_RETURN(std::shared_ptr<InFlight> h, store_->SaveAsync(full, rec.path));
      pending_.push_back({std::move(h), std::move(rec)});
    } else {
      SaveStats io;
      SP_RETURN_IF_ERROR(store_->Save(full, rec.path, &io));
      SP_RETURN_IF_ERROR(
          Commit(rec, {"checkpoint_save", rec.name, step, io.bytes, io.seconds, io.seconds}));
    }
    saved_in_dir_ = true;
    last_saved_step_ = step;
    last_trigger_ = step;
    last_save_time_ = std::chrono::steady_clock::now();
    return true;
  }

  // A save that does not go through the async Checkpointer (a synchronous one) reads the tensors
  // in place: none may be in memory only its copier can reach (device memory).
  Status CheckHostMemory(const State& state, const std::string& path) const {
    const SnapshotCopier* copier = o_.async_save.checkpointer.copier;
    if (copier == nullptr) return Status::OK();
    for (const auto& [name, e] : state.entries()) {
      if (e.is_tensor() && e.tensor().nbytes() > 0 && copier->Copies(e.tensor().data())) {
        return InvalidArgumentError(fmt::format(
            "save {}: tensor \"{}\" is in device memory, but this save is synchronous and reads "
            "host memory only: copy it to the host first",
            path, name));
      }
    }
    return Status::OK();
  }

  // A delta on the newest committed checkpoint (SaveArgs::delta), then maybe its compaction;
  // `staged`: started asynchronously, committed (and maybe compacted) when reaped.
  Status SaveDeltaLocked(CheckpointRecord rec, const State& full, bool staged) {
    SP_RETURN_IF_ERROR(Reap(true));  // the base must be committed, and not being compacted
    if (index_.records.empty()) {
      return FailedPreconditionError(fmt::format(
          "delta save {}: {} has no committed checkpoint to be its base (save a full one first)",
          rec.name, dir_));
    }
    const CheckpointRecord base = index_.records.back();
    if (base.name == rec.name) {
      return FailedPreconditionError(
          fmt::format("delta save {}: its base would be the checkpoint it replaces", rec.path));
    }
    if (staged) {
      // A compaction deferred for an upload must not rewrite this delta's base while the delta
      // is in flight (it would be "replaced"): the delta's own commit considers the chain anew.
      compact_later_.reset();
      SP_ASSIGN_OR_RETURN(std::shared_ptr<InFlight> h,
                          store_->SaveDeltaAsync(full, rec.path, base.path));
      pending_.push_back({std::move(h), std::move(rec), base.name});
      return Status::OK();
    }
    SaveStats io;
    SP_RETURN_IF_ERROR(store_->SaveDelta(full, rec.path, base.path, &io));
    bases_->Set(rec.name, base.name);
    CheckpointStats cs{"checkpoint_save", rec.name, rec.step, io.bytes, io.seconds, io.seconds};
    SP_RETURN_IF_ERROR(Commit(rec, std::move(cs)));
    MaybeCompact(rec);
    return Status::OK();
  }

  // Starts compacting the chain ending at `head` when the policy says so.
  void MaybeCompact(const CheckpointRecord& head) {
    if (!o_.sparse.compact || compaction_) return;  // (one at a time: the next delta tries again)
    compact_later_.reset();
    if (tier_ && tier_->Busy(head.name)) {  // not while it is being uploaded: after (Reap)
      compact_later_ = head;
      return;
    }
    Result<bool> due =
        ChainNeedsCompaction(*store_, head.path, index_.records, o_.sparse.compaction);
    if (!due.ok()) {
      spdlog::warn("savepoint: compaction of {}: {}", head.path, due.status().ToString());
    } else if (*due) {
      compaction_ = std::make_unique<Compaction>(store_.get(), head);
    }
  }

  // Takes in a finished compaction (waiting for it when `block`): the checkpoint is now a full
  // one, so the bases only it needed may go. A failed compaction leaves the chain as it was.
  Status FinishCompaction(bool block) {
    if (!compaction_ || (!block && !compaction_->Done())) return Status::OK();
    Status s = compaction_->Wait();
    const CheckpointRecord rec = compaction_->record();
    const double seconds = compaction_->seconds();
    compaction_.reset();
    if (!s.ok()) {
      spdlog::warn("savepoint: compaction of {} failed; its delta chain stays: {}", rec.path,
                   s.ToString());
      return Status::OK();
    }
    bases_->Set(rec.name, "");
    SP_ASSIGN_OR_RETURN(StoredFacts facts, store_->Describe(rec.path, /*metadata=*/false));
    for (CheckpointRecord& r : index_.records) {
      if (r.name != rec.name) continue;
      r.created_ns = facts.created_ns;
      r.bytes = facts.bytes;
    }
    SortRecords(index_.records);
    stats_.push_back({"checkpoint_compact", rec.name, rec.step, facts.bytes, seconds, 0});
    ApplyRetention();
    return WriteIndex(fs_, dir_, index_).WithContext(fmt::format("update index of {}", dir_));
  }

  Result<bool> SaveRegisteredLocked(int64_t step, const SaveArgs& args) {
    if (registry_.empty()) {
      return FailedPreconditionError(
          fmt::format("save step {} to {}: no objects are registered", step, dir_));
    }
    if (!args.breakpoint && last_saved_step_ == step) return false;
    if (!args.breakpoint && !args.force && !ShouldSaveLocked(step)) return false;
    SP_ASSIGN_OR_RETURN(Gathered g, registry_.Gather());
    return SaveLocked(step, g.state, args);
  }

  Status SaveBreakpointLocked() {
    if (!o_.breakpoints.on_exception) {
      return FailedPreconditionError(
          "SaveBreakpoint: ManagerOptions.breakpoints.on_exception is false");
    }
    SP_RETURN_IF_ERROR(CheckOpen());
    SaveArgs args = HookArgs({});
    args.breakpoint = true;
    SP_RETURN_IF_ERROR(SaveRegisteredLocked(last_step_, args).status());
    return Reap(true);
  }

  Status HandleSignal(int sig) {
    Status s = o_.breakpoints.on_exception ? SaveBreakpointLocked() : Reap(true);
    std::string latest = index_.records.empty() ? "none" : index_.records.back().path;
    Status closed = CloseLocked();
    if (s.ok()) s = closed;
    spdlog::warn("savepoint: signal {}: saved ({}), latest checkpoint {}; re-raising", sig,
                 s.ToString(), latest);
    ReraiseSignal(sig);
    return FailedPreconditionError(fmt::format(
        "training stopped by signal {}; latest checkpoint {} ({})", sig, latest, s.ToString()));
  }

  // Indexes a committed checkpoint, applies retention, writes the index.
  Status Commit(CheckpointRecord rec, CheckpointStats stats) {
    SP_ASSIGN_OR_RETURN(StoredFacts facts, store_->Describe(rec.path, /*metadata=*/false));
    rec.created_ns = facts.created_ns;
    rec.bytes = facts.bytes;
    std::erase_if(index_.records, [&](const CheckpointRecord& r) { return r.name == rec.name; });
    const std::string rec_name = rec.name;
    index_.records.push_back(std::move(rec));
    SortRecords(index_.records);
    stats_.push_back(std::move(stats));
    OfferToTier(index_.records, rec_name);
    ApplyRetention();
    return WriteIndex(fs_, dir_, index_).WithContext(fmt::format("update index of {}", dir_));
  }

  // Queues the upload of the committed checkpoint `name` and of the links of its delta chain.
  void OfferToTier(const std::vector<CheckpointRecord>& records, const std::string& name) {
    if (!tier_) return;
    std::vector<CheckpointRecord> chain;
    for (std::string link = name; !link.empty() && chain.size() <= records.size();) {
      auto it = std::find_if(records.begin(), records.end(),
                             [&](const CheckpointRecord& r) { return r.name == link; });
      if (it == records.end()) break;
      chain.insert(chain.begin(), *it);
      link = bases_->Of(*it);
    }
    tier_->Offer(std::move(chain));
  }

  // Waits for every save, upload and compaction: saves first (their commits queue uploads), then
  // the uploads, then a compaction that waited for its upload.
  Status Drain() {
    Status s = Reap(true);
    if (Status t = WaitForUploads(); s.ok()) s = t;
    if (compact_later_) {
      if (Status c = Reap(true); s.ok()) s = c;
    }
    return s;
  }

  // Waits for the remote tier's uploads; local checkpoints they kept may go now.
  Status WaitForUploads() {
    if (!tier_) return Status::OK();
    Status s = tier_->Collect(/*block=*/true, &stats_);
    const size_t before = index_.records.size();
    ApplyRetention();  // what was kept for its upload may go now
    if (index_.records.size() == before) return s;
    Status w = WriteIndex(fs_, dir_, index_).WithContext(fmt::format("update index of {}", dir_));
    return s.ok() ? w : s;
  }

  // Both tiers' checkpoints, oldest first: the local ones and those only the remote has.
  std::vector<CheckpointRecord> Merged() const {
    std::vector<CheckpointRecord> all = index_.records;
    if (!tier_) return all;
    for (CheckpointRecord& r : tier_->Records()) {
      bool local =
          std::any_of(all.begin(), all.end(), [&](const auto& l) { return l.name == r.name; });
      if (!local) all.push_back(std::move(r));
    }
    SortRecords(all);
    return all;
  }

  // The store that reads the checkpoint at `path`: the remote tier's for a remote one.
  Store& StoreOf(const std::string& path) {
    return tier_ && tier_->Holds(path) ? tier_->store() : *store_;
  }

  void ApplyRetention() {
    const std::vector<std::string> doomed = SelectForDeletion(index_.records, policy_);
    const std::set<std::string> needed = NeededByKept(index_.records, doomed, *bases_);
    for (const std::string& name : doomed) {
      if (needed.count(name) > 0) continue;  // the base of a kept delta
      bool in_flight = std::any_of(pending_.begin(), pending_.end(),
                                   [&](const Pending& p) { return p.record.name == name; });
      if (in_flight) continue;                   // being overwritten by a save in flight
      if (tier_ && tier_->Busy(name)) continue;  // being uploaded (or queued)
      auto t0 = std::chrono::steady_clock::now();
      const std::string path = JoinPath(dir_, name);
      Status s = store_->Delete(path);
      if (!s.ok()) {
        spdlog::warn("savepoint: retention: {}", s.ToString());
        if (fs_->Exists(path)) continue;  // still there: keep its record (else it is gone)
      }
      int64_t step = 0;
      for (const CheckpointRecord& r : index_.records) step = r.name == name ? r.step : step;
      std::erase_if(index_.records, [&](const CheckpointRecord& r) { return r.name == name; });
      stats_.push_back({"checkpoint_delete", name, step, 0, SecondsSince(t0), SecondsSince(t0)});
    }
  }

  // Commits finished async saves (all of them when `block`). Returns the first error, including
  // one deferred from an earlier non-blocking reap.
  Status Reap(bool block) {
    Status first = std::exchange(deferred_, Status::OK());
    if (tier_) {
      if (Status t = tier_->Collect(/*block=*/false, &stats_); !t.ok() && first.ok()) first = t;
    }
    // A compaction deferred for an upload starts first, so that a blocking reap waits for it.
    if (compact_later_ && !compaction_ && tier_ && !tier_->Busy(compact_later_->name)) {
      MaybeCompact(CheckpointRecord(*compact_later_));
    }
    if (Status c = FinishCompaction(block); !c.ok() && first.ok()) first = c;
    while (!pending_.empty()) {
      if (!block && !pending_.front().handle->Poll()) break;
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      Status s = p.handle->Wait();
      SaveStats st = p.handle->stats();
      CheckpointStats cs{"checkpoint_save", p.record.name, p.record.step,
                         st.bytes,          st.seconds,    st.blocked_seconds};
      if (s.ok() && !p.base.empty()) bases_->Set(p.record.name, p.base);
      const CheckpointRecord rec = p.record;
      if (s.ok()) s = Commit(std::move(p.record), cs);
      if (s.ok() && !p.base.empty()) MaybeCompact(rec);
      if (!s.ok()) spdlog::error("savepoint: async save failed: {}", s.ToString());
      if (!s.ok() && first.ok()) first = s;
    }
    if (block) {  // a compaction started by a delta committed above
      if (Status c = FinishCompaction(true); !c.ok() && first.ok()) first = c;
    }
    return first;
  }

  // Reap(false), keeping an error for the next Save/Wait/hook to return.
  void ReapQuietly() {
    if (closed_) return;
    Status s = Reap(false);
    if (!s.ok()) deferred_ = s;
  }

  // --- Restoring. ---
  Result<CheckpointRecord> Find(const Which& which) const {
    const std::vector<CheckpointRecord> rs = Merged();
    for (auto it = rs.rbegin(); it != rs.rend(); ++it) {
      const bool named = it->name == which.name || it->name == store_->EntryName(which.name);
      if (!which.name.empty() ? named : (!which.step.has_value() || it->step == *which.step)) {
        return *it;
      }
    }
    std::string what = !which.name.empty() ? fmt::format("named {:?}", which.name)
                       : which.step        ? fmt::format("at step {}", *which.step)
                                           : std::string("at all");
    const std::string where =
        tier_ ? fmt::format("{} or its remote tier {}", dir_, tier_->location()) : dir_;
    return NotFoundError(
        fmt::format("no checkpoint {} in {} ({} committed)", what, where, rs.size()));
  }

  Status LoadRegistered(const std::string& path, const LoadConfig& config) {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<EntrySource> source, StoreOf(path).OpenSource(path));
    return registry_.Load(*source, config);
  }

  // Training continues after rec's step: the counters, and (SeriesRule::kContinue, before this
  // directory's first save) rec's series of names.
  void ResumeLocked(const CheckpointRecord& rec) {
    last_saved_step_ = last_trigger_ = global_step_ = last_step_ = rec.step;
    cur_epoch_ = rec.epoch;
    epoch_first_step_ = rec.step - rec.step_in_epoch + 1;
    last_save_time_ = std::chrono::steady_clock::now();
    if (o_.naming.series == SeriesRule::kContinue && !o_.naming.prefix_fn && !saved_in_dir_) {
      if (std::optional<std::string> series = SeriesOf(o_.naming.prefix, rec.name))
        prefix_ = *series;
    }
  }

  void Restored(const CheckpointRecord& rec, uint64_t bytes, double seconds) {
    ResumeLocked(rec);
    stats_.push_back({"checkpoint_load", rec.name, rec.step, bytes, seconds, seconds});
  }

  // --- Hook bookkeeping. ---
  void NoteStep(int64_t step, int64_t epoch) {
    if (epoch != cur_epoch_) {
      cur_epoch_ = epoch;
      epoch_first_step_ = step;
    }
    last_step_ = global_step_ = step;
  }

  SaveArgs HookArgs(const Metrics& metrics) const {
    SaveArgs args;
    args.metrics = metrics;
    if (o_.save_policy.steps_per_epoch == 0) {
      args.epoch = cur_epoch_ > 0 ? cur_epoch_ : 1;
      args.step_in_epoch = cur_epoch_ > 0 ? last_step_ - epoch_first_step_ + 1 : last_step_;
    }
    return args;
  }

  // Marks the newest checkpoint of `step` (in flight or committed) as its epoch's end.
  Status MarkEpochEnd(int64_t step) {
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
      if (it->record.step != step) continue;
      it->record.epoch_end = true;
      return Status::OK();
    }
    for (auto it = index_.records.rbegin(); it != index_.records.rend(); ++it) {
      if (it->step != step) continue;
      if (it->epoch_end) return Status::OK();
      it->epoch_end = true;
      return WriteIndex(fs_, dir_, index_);
    }
    return Status::OK();
  }

  const ManagerOptions o_;
  const Policy policy_;
  FileSystem* const fs_;

  std::mutex mu_;  // guards everything below
  bool closed_ = false;
  bool signals_installed_ = false;
  std::string dir_;
  std::string prefix_;
  bool saved_in_dir_ = false;  // a save into dir_ since it was opened (fixes the series)
  std::unique_ptr<FileSystem::FileLock> lock_;
  Index index_;
  std::unique_ptr<Store> store_;
  std::deque<Pending> pending_;
  std::unique_ptr<Bases> bases_;                   // the base of each checkpoint (delta chains)
  std::unique_ptr<Compaction> compaction_;         // in flight, at most one
  std::unique_ptr<Tier> tier_;                     // the remote tier, when ManagerOptions::remote
  std::optional<CheckpointRecord> compact_later_;  // to compact once its upload is done
  Status deferred_;
  Registry registry_;
  std::vector<CheckpointStats> stats_;
  std::optional<int64_t> last_saved_step_;
  int64_t last_trigger_ = 0;
  std::chrono::steady_clock::time_point last_save_time_ = std::chrono::steady_clock::now();
  int64_t global_step_ = 0;
  int64_t last_step_ = 0;
  int64_t cur_epoch_ = 0;
  int64_t epoch_first_step_ = 1;
};

}  // namespace
}  // namespace manager

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(ManagerOptions options) {
  SP_RETURN_IF_ERROR(ValidateManagerOptions(options));
  auto m = std::make_unique<manager::ManagerImpl>(std::move(options));
  SP_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<CheckpointManager>(std::move(m));
}

ExceptionSaveGuard::ExceptionSaveGuard(CheckpointManager& manager)
    : manager_(manager), exceptions_(std::uncaught_exceptions()) {}

ExceptionSaveGuard::~ExceptionSaveGuard() {
  if (std::uncaught_exceptions() <= exceptions_) return;
  try {
    Status s = manager_.SaveBreakpoint();
    if (!s.ok()) spdlog::error("savepoint: exception save failed: {}", s.ToString());
  } catch (...) {
    spdlog::error("savepoint: exception save failed with an exception");
  }
}

}  // namespace savepoint
