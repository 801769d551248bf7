// The manager's stores (manager/store.h): native checkpoint directories, safetensors files and
// MindSpore .ckpt files.
#include "manager/store.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/snapshot.h"
#include "interop/ckpt_cipher.h"
#include "savepoint/async.h"
#include "savepoint/catalog.h"
#include "savepoint/mindspore.h"
#include "savepoint/safetensors.h"
#include "sparse/chain.h"
#include "store/store.h"
#include "util/parallel.h"

namespace savepoint::manager {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool Hidden(const FileInfo& e) { return e.name.empty() || e.name[0] == '.'; }

// --- Native checkpoint directories. ---

class HandleInFlight final : public InFlight {
 public:
  explicit HandleInFlight(SaveHandle h) : h_(std::move(h)) {}
  bool Poll() override { return h_.Poll(); }
  Status Wait() override { return h_.Wait(); }
  SaveStats stats() override { return h_.stats(); }

 private:
  SaveHandle h_;
};

class NativeStore final : public Store {
 public:
  explicit NativeStore(const ManagerOptions& o) : o_(o), fs_(FileSystemOf(o.io)) {}

  Status Init() {
    if (!o_.async_save.enabled) return Status::OK();
    SP_ASSIGN_OR_RETURN(async_, Checkpointer::Create(o_.async_save.checkpointer, o_.io));
    return Status::OK();
  }

  std::string EntryName(std::string_view name) const override { return std::string(name); }
  std::optional<std::string> NameOf(const FileInfo& e) const override {
    if (!e.is_dir || Hidden(e)) return std::nullopt;
    return e.name;
  }

  Status Save(const State& state, const std::string& path, SaveStats* stats) override {
    SaveOptions so = SaveOpts();
    so.stats = stats;
    return savepoint::Save(state, path, so, o_.io);
  }
  Result<std::shared_ptr<InFlight>> SaveAsync(const State& state,
                                              const std::string& path) override {
    SP_ASSIGN_OR_RETURN(SaveHandle h, async_->SaveAsync(state, path, SaveOpts()));
    return std::shared_ptr<InFlight>(std::make_shared<HandleInFlight>(std::move(h)));
  }
  Result<State> Load(const std::string& path, LoadStats* stats) override {
    LoadOptions lo = LoadOpts();
    lo.stats = stats;
    lo.format = Format::kNative;  // (no detection: the manager knows what it wrote)
    return savepoint::Load(path, lo, o_.io);
  }
  Result<std::unique_ptr<EntrySource>> OpenSource(const std::string& path) override {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(path, LoadOpts(), o_.io));
    return SourceOf(std::move(reader));
  }
  Result<StoredFacts> Describe(const std::string& path, bool metadata) override {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(path, {}, {.fs = fs_}));
    StoredFacts f{reader->created_ns(), reader->total_file_bytes(), Json(), std::nullopt};
    if (!metadata) return f;
    f.metadata = reader->values().metadata();
    if (const Value* v = reader->values().FindValue("step"); v != nullptr && v->is_int()) {
      f.step_value = v->as_int();
    }
    return f;
  }
  Status Delete(const std::string& path) override { return DeleteCheckpoint(path, fs_); }
  void Reserve(uint64_t bytes) override {
    if (async_) async_->Reserve(bytes);
  }
  Status SaveDelta(const State& state, const std::string& path, const std::string& base,
                   SaveStats* stats) override {
    SparseSaveOptions so{.save = SaveOpts(), .base = base};
    so.save.stats = stats;
    return SaveSparse(state, path, so, o_.io);
  }
  Result<std::shared_ptr<InFlight>> SaveDeltaAsync(const State& state, const std::string& path,
                                                   const std::string& base) override {
    const SparseSaveOptions so{.save = SaveOpts(), .base = base};
    SP_ASSIGN_OR_RETURN(SaveHandle h, async_->SaveAsync(state, path, so));
    return std::shared_ptr<InFlight>(std::make_shared<HandleInFlight>(std::move(h)));
  }
  Status Compact(const std::string& path) override {
    return CompactSparse(path, path, {.save = SaveOpts()}, LoadOpts(), o_.io);
  }
  Result<std::optional<std::string>> BaseOf(const std::string& path) override {
    return sparse::BaseOfCheckpoint(path, {.fs = fs_});
  }
  Result<std::vector<SparseChainLink>> Chain(const std::string& path) override {
    return SparseChain(path, {.fs = fs_});
  }

 private:
  SaveOptions SaveOpts() const {
    SaveOptions so;
    so.overwrite = true;  // a name repeats only when training went back to an older step
    so.key = o_.storage.key;
    return so;
  }
  LoadOptions LoadOpts() const {
    LoadOptions lo;
    lo.verify_checksums = o_.storage.verify_checksums;
    lo.key = o_.storage.key;
    return lo;
  }

  const ManagerOptions& o_;
  FileSystem* const fs_;
  std::unique_ptr<Checkpointer> async_;
};

// --- Files: safetensors and MindSpore .ckpt. ---

// A copy of `state` in fresh memory (values and metadata too), copied on up to `threads` threads.
Result<State> Snapshot(const State& state, int threads) {
  State out;
  out.metadata() = state.metadata();
  std::vector<std::pair<const std::string*, const TensorView*>> tensors;
  for (const auto& [name, e] : state.entries()) {
    if (e.is_tensor()) {
      tensors.emplace_back(&name, &e.tensor());
    } else {
      SP_RETURN_IF_ERROR(out.PutValue(name, e.value()));
    }
  }
  std::vector<Tensor> copies(tensors.size());
  SP_RETURN_IF_ERROR(ParallelFor(tensors.size(), threads, [&](size_t i, int) -> Status {
    SP_ASSIGN_OR_RETURN(copies[i], Tensor::CopyOf(*tensors[i].second));
    return Status::OK();
  }));
  for (size_t i = 0; i < tensors.size(); ++i) {
    SP_RETURN_IF_ERROR(out.Put(*tensors[i].first, std::move(copies[i])));
  }
  return out;
}

// A file save running on its own thread.
class ThreadInFlight final : public InFlight {
 public:
  // Runs save(snapshot) on a new thread; `blocked` is the snapshot time.
  ThreadInFlight(State snapshot, std::function<Status(const State&, SaveStats*)> save,
                 double blocked)
      : start_(Clock::now()) {
    stats_.blocked_seconds = blocked;
    thread_ = std::thread([this, s = std::move(snapshot), save = std::move(save), blocked] {
      SaveStats st;
      Status result = save(s, &st);
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = st;
      stats_.blocked_seconds = blocked;
      stats_.seconds = blocked + SecondsSince(start_);
      result_ = std::move(result);
      done_ = true;
      cv_.notify_all();
    });
  }
  ~ThreadInFlight() override { thread_.join(); }

  bool Poll() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return result_;
  }
  SaveStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  const Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  Status result_;      // guarded by mu_
  SaveStats stats_;    // guarded by mu_
  std::thread thread_;
};

int SnapshotThreads(const CheckpointerOptions& o) {
  return o.snapshot_threads > 0 ? o.snapshot_threads : engine::DefaultSnapshotThreads(o.copier);
}

class FileStore final : public Store {
 public:
  explicit FileStore(const ManagerOptions& o)
      : o_(o),
        fs_(FileSystemOf(o.io)),
        ckpt_(o.storage.format == CheckpointFormat::kMindSporeCkpt),
        ext_(ckpt_ ? ".ckpt" : ".safetensors") {}
  ~FileStore() override {
    if (last_) last_->Wait().IgnoreError();  // the manager reaps every save before this
  }

  std::string EntryName(std::string_view name) const override { return std::string(name) + ext_; }
  std::optional<std::string> NameOf(const FileInfo& e) const override {
    if (e.is_dir || Hidden(e) || !e.name.ends_with(ext_) || e.name.size() == ext_.size()) {
      return std::nullopt;
    }
    return e.name.substr(0, e.name.size() - ext_.size());
  }

  // Through the store seam (src/store/): the file formats' writers and readers.
  Status Save(const State& state, const std::string& path, SaveStats* stats) override {
    engine::WriteRequest r;
    r.path = path;
    r.options.overwrite = true;
    r.options.key = o_.storage.key;
    r.options.stats = stats;
    r.io = o_.io;
    SP_ASSIGN_OR_RETURN(
        std::unique_ptr<store::Writer> w,
        store::OpenWrite(r, o_.storage.format,
                         {.file_checksum = o_.storage.file_checksum, .cipher = o_.storage.cipher}));
    return w->Commit(state);
  }
  Result<std::shared_ptr<InFlight>> SaveAsync(const State& state,
                                              const std::string& path) override {
    if (last_) {
      last_->Wait().IgnoreError();  // its result is the manager's to report
      last_.reset();
    }
    const Clock::time_point t0 = Clock::now();
    SP_ASSIGN_OR_RETURN(State snapshot,
                        Snapshot(state, SnapshotThreads(o_.async_save.checkpointer)));
    auto save = [this, path](const State& s, SaveStats* st) { return Save(s, path, st); };
    last_ = std::make_shared<ThreadInFlight>(std::move(snapshot), save, SecondsSince(t0));
    return std::shared_ptr<InFlight>(last_);
  }
  Result<State> Load(const std::string& path, LoadStats* stats) override {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Reader> reader,
                        store::OpenRead(path, o_.storage.format,
                                        {.verify_checksums = o_.storage.verify_checksums,
                                         .stats = stats,
                                         .key = o_.storage.key},
                                        o_.io));
    return reader->Read({});
  }
  Result<std::unique_ptr<EntrySource>> OpenSource(const std::string& path) override {
    SP_ASSIGN_OR_RETURN(State state, Load(path, nullptr));
    return SourceOf(std::move(state), path);
  }
  Result<StoredFacts> Describe(const std::string& path, bool metadata) override {
    SP_ASSIGN_OR_RETURN(FileInfo info, fs_->Stat(path));
    StoredFacts f{info.mtime_ns, info.size, Json(), std::nullopt};
    if (!metadata) return f;
    if (ckpt_) {
      SP_ASSIGN_OR_RETURN(f.metadata, CkptMetadata(path));
    } else {
      SP_ASSIGN_OR_RETURN(SafetensorsInfo st, InspectSafetensors(path, fs_));
      f.metadata = st.values.metadata();
    }
    return f;
  }
  Status Delete(const std::string& path) override {
    SP_RETURN_IF_ERROR(DeleteCheckpoint(path, fs_));
    if (!ckpt_) return Status::OK();
    const std::string sidecar = interop::ckpt::MacSidecarPath(path);  // CBC files' MACs
    if (fs_->Exists(sidecar)) return fs_->RemoveFile(sidecar);
    return Status::OK();
  }
  void Reserve(uint64_t) override {}

 private:
  // The savepoint metadata of a .ckpt file (null for a file MindSpore wrote). An encrypted file
  // whose key the manager lacks (or has another of) is listed without it: null, so the record
  // comes from the file name. A file that is not a readable .ckpt is an error (Reconcile skips
  // it).
  Result<Json> CkptMetadata(const std::string& path) {
    Result<MindSporeCheckpointInfo> info = InspectMindSporeCheckpoint(path, fs_, o_.storage.key);
    if (info.ok()) return info->values.metadata();
    if (!o_.storage.key) return info.status();
    SP_ASSIGN_OR_RETURN(MindSporeCheckpointInfo keyless, InspectMindSporeCheckpoint(path, fs_));
    if (keyless.cipher.empty()) return info.status();  // not encrypted: the file is bad
    return Json();
  }

  const ManagerOptions& o_;
  FileSystem* const fs_;
  const bool ckpt_;
  const std::string ext_;
  std::shared_ptr<ThreadInFlight> last_;  // the newest async save
};

}  // namespace

Result<std::unique_ptr<Store>> Store::Create(const ManagerOptions& options) {
  if (options.storage.format != CheckpointFormat::kNative) {
    return std::unique_ptr<Store>(std::make_unique<FileStore>(options));
  }
  auto store = std::make_unique<NativeStore>(options);
  SP_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<Store>(std::move(store));
}

namespace {
Status NeedsNative(std::string_view what, const std::string& path) {
  return InvalidArgumentError(fmt::format(
      "{} {}: sparse delta chains need ManagerOptions.storage.format = kNative", what, path));
}
}  // namespace

Status Store::SaveDelta(const State&, const std::string& path, const std::string&, SaveStats*) {
  return NeedsNative("delta save", path);
}
Result<std::shared_ptr<InFlight>> Store::SaveDeltaAsync(const State&, const std::string& path,
                                                        const std::string&) {
  return NeedsNative("delta save", path);
}
Status Store::Compact(const std::string& path) { return NeedsNative("compaction of", path); }
Result<std::optional<std::string>> Store::BaseOf(const std::string&) {
  return std::optional<std::string>();
}
Result<std::vector<SparseChainLink>> Store::Chain(const std::string& path) {
  return NeedsNative("the chain of", path);
}

}  // namespace savepoint::manager
