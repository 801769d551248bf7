// Shared-memory snapshots (snapshot.h).
#include "failover/rpc/snapshot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>

#include "savepoint/filesystem.h"

namespace savepoint::failover {
namespace {

constexpr char kRecordKey[] = "failover.snapshot";

std::string SnapshotName(const StepInfo& at) {
  return fmt::format("step_{}_{}_{}", at.step, at.epoch, at.step_in_epoch);
}

// Parses "step_{n}_{epoch}_{step_in_epoch}" (non-negative decimals); false otherwise.
bool ParseName(std::string_view name, StepInfo* at) {
  if (!name.starts_with("step_")) return false;
  name.remove_prefix(5);
  int64_t v[3];
  for (int i = 0; i < 3; ++i) {
    auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v[i]);
    if (ec != std::errc() || end == name.data() || v[i] < 0) return false;
    name.remove_prefix(end - name.data());
    if (i < 2) {
      if (!name.starts_with('_')) return false;
      name.remove_prefix(1);
    }
  }
  if (!name.empty()) return false;
  *at = {v[0], v[1], v[2]};
  return true;
}

Json LayoutToJson(const ShardLayout& layout) {
  Json out = Json::object();
  for (const auto& [name, spec] : layout) {
    out[name] = {{"global_shape", spec.global_shape},
                 {"offsets", spec.offsets},
                 {"sizes", spec.sizes},
                 {"replicas", spec.replicas}};
    if (!spec.tensor.empty()) out[name]["tensor"] = spec.tensor;
  }
  return out;
}

Result<ShardLayout> LayoutFromJson(const Json& j) {
  if (!j.is_object()) return CorruptionError("snapshot layout is not an object");
  ShardLayout out;
  try {
    for (const auto& [name, spec] : j.items()) {
      ShardSpec s;
      s.global_shape = spec.at("global_shape").get<Shape>();
      s.offsets = spec.at("offsets").get<Shape>();
      s.sizes = spec.at("sizes").get<Shape>();
      s.replicas = spec.at("replicas").get<std::vector<int>>();
      s.tensor = spec.value("tensor", std::string());
      out.emplace(name, std::move(s));
    }
  } catch (const Json::exception& e) {
    return CorruptionError(fmt::format("snapshot layout: {}", e.what()));
  }
  return out;
}

}  // namespace

Status MakePrivateDir(const std::string& dir) {
  SP_RETURN_IF_ERROR(DefaultFileSystem()->CreateDirs(dir));
  std::error_code ec;  // other users of the host must not read the job's state
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace, ec);
  if (ec) return IOError(fmt::format("chmod {}: {}", dir, ec.message()));
  return Status::OK();
}

std::string SnapshotRankDir(const std::string& dir, int rank) {
  return fmt::format("{}/rank_{}", dir, rank);
}

std::vector<StepInfo> ListSnapshots(const std::string& dir, int rank, FileSystem* fs) {
  if (fs == nullptr) fs = DefaultFileSystem();
  const std::string rank_dir = SnapshotRankDir(dir, rank);
  std::vector<StepInfo> out;
  Result<std::vector<FileInfo>> entries = fs->ListDir(rank_dir);
  if (!entries.ok()) return out;
  for (const FileInfo& e : *entries) {
    StepInfo at;
    // A committed checkpoint directory has its MANIFEST (the rename comes after it is written).
    if (e.is_dir && ParseName(e.name, &at) && fs->Exists(rank_dir + "/" + e.name + "/MANIFEST")) {
      out.push_back(at);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StepInfo& a, const StepInfo& b) { return a.step < b.step; });
  return out;
}

namespace {

// A data file of a snapshot, written through a shared mapping of the file: once Preallocate has
// sized it, WriteAt is a memcpy into its tmpfs pages (no system call, and no inode lock, which
// serialises buffered writes to one file); ranges outside the mapping are written with pwrite.
class MappedDataFile final : public WritableFile {
 public:
  static Result<std::unique_ptr<WritableFile>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return IOError(fmt::format("open {}: {}", path, std::strerror(errno)));
    return std::unique_ptr<WritableFile>(new MappedDataFile(fd, path));
  }
  ~MappedDataFile() override { Close().IgnoreError(); }

  Status Preallocate(uint64_t bytes) override {
    Extend(bytes);
    if (map_ != nullptr || bytes == 0) return Status::OK();
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) return Errno("truncate");
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0);
    if (m == MAP_FAILED) return Errno("map");
    map_ = static_cast<std::byte*>(m);
    mapped_ = bytes;
    return Status::OK();
  }
  Status WriteAt(uint64_t off, std::span<const std::byte> d) override {
    Extend(off + d.size());
    if (map_ != nullptr && off + d.size() <= mapped_) {
      std::memcpy(map_ + off, d.data(), d.size());
      return Status::OK();
    }
    for (size_t done = 0; done < d.size();) {
      const ssize_t n = ::pwrite(fd_, d.data() + done, d.size() - done, off + done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno("write");
      done += static_cast<size_t>(n);
    }
    return Status::OK();
  }
  Status Sync() override { return ::fdatasync(fd_) == 0 ? Status::OK() : Errno("sync"); }
  Status Close() override {
    if (fd_ < 0) return Status::OK();
    if (map_ != nullptr) ::munmap(map_, mapped_);
    map_ = nullptr;
    // A recycled file may be longer than what was written this time.
    Status s =
        ::ftruncate(fd_, static_cast<off_t>(end_.load())) == 0 ? Status::OK() : Errno("truncate");
    ::close(fd_);
    fd_ = -1;
    return s;
  }
  bool direct() const override { return false; }
  const std::string& path() const override { return path_; }

 private:
  MappedDataFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status Errno(const char* what) const {
    return IOError(fmt::format("{} {}: {}", what, path_, std::strerror(errno)));
  }
  void Extend(uint64_t end) {
    uint64_t cur = end_.load();
    while (end > cur && !end_.compare_exchange_weak(cur, end)) {
    }
  }

  int fd_;
  const std::string path_;
  std::byte* map_ = nullptr;
  uint64_t mapped_ = 0;
  std::atomic<uint64_t> end_{0};
};

}  // namespace

// The snapshot directory's file system: POSIX, except for data files (".spd"): a removed one
// becomes a spare, and a new one takes a spare's place (renamed: its tmpfs pages are kept) and is
// written through a mapping (MappedDataFile).
class SnapshotWriter::RecyclingFs final : public ForwardingFileSystem {
 public:
  RecyclingFs(FileSystem* base, std::string spare_dir)
      : ForwardingFileSystem(base), spare_dir_(std::move(spare_dir)) {}

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const FileOptions& o) override {
    if (!IsData(p) || !o.truncate || base()->Exists(p)) return base()->NewWritableFile(p, o);
    if (!spares_.empty()) {
      const std::string spare = spares_.back();
      spares_.pop_back();
      if (!base()->Rename(spare, p).ok()) base()->RemoveFile(spare).IgnoreError();
    }
    return MappedDataFile::Open(p);
  }
  Status RemoveFile(const std::string& p) override {
    if (!IsData(p)) return base()->RemoveFile(p);
    if (!base()->Exists(spare_dir_)) SP_RETURN_IF_ERROR(base()->CreateDir(spare_dir_));
    const std::string spare = fmt::format("{}/{}", spare_dir_, next_spare_++);
    SP_RETURN_IF_ERROR(base()->Rename(p, spare));
    spares_.push_back(spare);
    return Status::OK();
  }

 private:
  static bool IsData(const std::string& p) { return p.ends_with(".spd"); }

  const std::string spare_dir_;
  std::vector<std::string> spares_;
  uint64_t next_spare_ = 0;
};

SnapshotWriter::SnapshotWriter(std::string dir, int rank, int world, SaveOptions save, IoOptions io)
    : dir_(std::move(dir)),
      rank_dir_(SnapshotRankDir(dir_, rank)),
      rank_(rank),
      world_(world),
      save_(std::move(save)),
      io_(io),
      fs_(std::make_unique<RecyclingFs>(DefaultFileSystem(), rank_dir_ + "/.spare")) {
  io_.fs = fs_.get();
  io_.direct_io = false;   // a memory-backed file system
  save_.overwrite = true;  // a snapshot of the same step again (a resumed job) replaces it
  save_.create_parents = false;
  save_.stats = nullptr;
  save_.progress = nullptr;
}

SnapshotWriter::~SnapshotWriter() = default;

Status SnapshotWriter::Write(const DumpSource& src, const StepInfo& at) {
  if (!fs_->Exists(rank_dir_)) {
    Status made = fs_->CreateDir(rank_dir_);
    if (!made.ok() && made.code() != StatusCode::kAlreadyExists) {
      return made.WithContext("snapshot directory");
    }
  }
  // Only the newest stays while this one is written (its data files become the spares).
  std::vector<StepInfo> before = ListSnapshots(dir_, rank_, fs_.get());
  for (size_t i = 0; i + 1 < before.size(); ++i) {
    fs_->RemoveAll(rank_dir_ + "/" + SnapshotName(before[i])).IgnoreError();
  }
  State snap;
  for (const auto& [name, entry] : src.state.entries()) {
    SP_RETURN_IF_ERROR(entry.is_tensor() ? snap.PutView(name, entry.tensor())
                                         : snap.PutValue(name, entry.value()));
  }
  snap.metadata() = src.state.metadata().is_object() ? src.state.metadata() : Json::object();
  snap.metadata()[kRecordKey] = {
      {"rank", rank_}, {"world", world_}, {"layout", LayoutToJson(src.layout)}};
  SP_RETURN_IF_ERROR(Save(snap, rank_dir_ + "/" + SnapshotName(at), save_, io_));
  committed_.clear();
  if (!before.empty() && before.back().step != at.step) committed_.push_back(before.back());
  committed_.push_back(at);
  return Status::OK();
}

Result<DumpSource> ReadSnapshot(const std::string& dir, int rank, int64_t step, StepInfo* at,
                                const IoOptions& io_in) {
  IoOptions io = io_in;
  io.fs = nullptr;  // local shared memory
  FileSystem* fs = DefaultFileSystem();
  for (const StepInfo& s : ListSnapshots(dir, rank, fs)) {
    if (s.step != step) continue;
    const std::string path = SnapshotRankDir(dir, rank) + "/" + SnapshotName(s);
    LoadOptions lo;
    lo.mmap = true;  // tmpfs pages are memory already: map instead of copying
    Result<State> loaded = Load(path, lo, io);
    if (!loaded.ok()) {
      return loaded.status().WithContext(fmt::format("rank {}'s snapshot of step {}", rank, step));
    }
    State state = *std::move(loaded);
    DumpSource out;
    const Json record = state.metadata().is_object() && state.metadata().contains(kRecordKey)
                            ? state.metadata()[kRecordKey]
                            : Json();
    if (!record.is_object() || !record.contains("layout") || !record.contains("rank") ||
        !record["rank"].is_number_integer() || record["rank"].get<int64_t>() != rank) {
      return CorruptionError(fmt::format("snapshot {}: no record of rank {}", path, rank));
    }
    Result<ShardLayout> layout = LayoutFromJson(record["layout"]);
    if (!layout.ok()) return layout.status().WithContext("snapshot " + path);
    out.layout = *std::move(layout);
    state.metadata().erase(kRecordKey);
    out.state = std::move(state);
    *at = s;
    return out;
  }
  return NotFoundError(fmt::format("no snapshot of step {} of rank {} in {}", step, rank, dir));
}

}  // namespace savepoint::failover
