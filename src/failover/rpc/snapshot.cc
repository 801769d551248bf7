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
#include <limits>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "distributed/shard.h"
#include "savepoint/filesystem.h"
#include "savepoint/sparse.h"

namespace savepoint::failover {
namespace {

constexpr char kRecordKey[] = "failover.snapshot";

std::string SnapshotName(const StepInfo& at) {
  return fmt::format("step_{}_{}_{}", at.step, at.epoch, at.step_in_epoch);
}

// A JSON array of integers (nothing else: 1.5 or "1" would not read back as written).
template <typename T>
std::vector<T> IntArray(const Json& spec, const char* key) {
  const Json& a = spec.at(key);
  if (!a.is_array()) throw std::invalid_argument(fmt::format("{} is not an array", key));
  std::vector<T> out;
  for (const Json& v : a) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
      throw std::invalid_argument(fmt::format("{} holds {}, not an integer", key, v.dump()));
    }
    out.push_back(static_cast<T>(std::clamp<int64_t>(
        v.get<int64_t>(), std::numeric_limits<T>::min(), std::numeric_limits<T>::max())));
  }
  return out;
}

Result<ShardSpec> SpecFromJson(const std::string& name, const Json& spec, int world) {
  ShardSpec s;
  try {
    if (!spec.is_object()) throw std::invalid_argument("not an object");
    s.global_shape = IntArray<int64_t>(spec, "global_shape");
    s.offsets = IntArray<int64_t>(spec, "offsets");
    s.sizes = IntArray<int64_t>(spec, "sizes");
    s.replicas = IntArray<int>(spec, "replicas");
    if (spec.contains("tensor")) {
      if (!spec["tensor"].is_string()) throw std::invalid_argument("tensor is not a string");
      s.tensor = spec["tensor"].get<std::string>();
    }
  } catch (const std::exception& e) {  // Json::exception or the above
    return CorruptionError(fmt::format("tensor {:?}: {}", name, e.what()));
  }
  // The box lies inside the global shape (as dist::CheckBox, which libsavepoint keeps hidden).
  bool inside = NumElements(s.global_shape).ok() && s.offsets.size() == s.global_shape.size() &&
                s.sizes.size() == s.global_shape.size();
  for (size_t d = 0; inside && d < s.global_shape.size(); ++d) {
    const int64_t dim = s.global_shape[d], off = s.offsets[d];
    inside = off >= 0 && off <= dim && s.sizes[d] >= 0 && s.sizes[d] <= dim - off;
  }
  if (!inside) {
    return CorruptionError(fmt::format(
        "tensor {:?}: the box {} + {} is outside the global shape {}", name,
        ShapeToString(s.offsets), ShapeToString(s.sizes), ShapeToString(s.global_shape)));
  }
  for (int r : s.replicas) {
    if (r < 0 || r >= world) {
      return CorruptionError(
          fmt::format("tensor {:?}: replica {} of a world of {}", name, r, world));
    }
  }
  return s;
}

// Whether the checkpoint at `path` holds sparse tables (its manifest requires the "sparse"
// feature: docs/FORMAT.md).
Result<bool> HoldsTables(const std::string& path, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> r, CheckpointReader::Open(path, {}, io));
  const Json features = r->manifest_json().value("required_features", Json::array());
  return features.is_array() &&
         std::find(features.begin(), features.end(), "sparse") != features.end();
}

}  // namespace

bool ParseSnapshotName(std::string_view name, StepInfo* at) {
  if (!name.starts_with("step_")) return false;
  name.remove_prefix(5);
  int64_t v[3];
  for (int i = 0; i < 3; ++i) {
    if (name.empty() || name[0] < '0' || name[0] > '9') return false;  // no sign
    if (name[0] == '0' && name.size() > 1 && name[1] >= '0' && name[1] <= '9') return false;
    auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), v[i]);
    if (ec != std::errc()) return false;
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

Json SnapshotRecordToJson(const SnapshotRecord& record) {
  Json layout = Json::object();
  for (const auto& [name, spec] : record.layout) {
    layout[name] = {{"global_shape", spec.global_shape},
                    {"offsets", spec.offsets},
                    {"sizes", spec.sizes},
                    {"replicas", spec.replicas}};
    if (!spec.tensor.empty()) layout[name]["tensor"] = spec.tensor;
  }
  return {{"rank", record.rank}, {"world", record.world}, {"layout", std::move(layout)}};
}

Result<SnapshotRecord> ParseSnapshotRecord(const Json& j, std::string_view where) {
  auto bad = [&](std::string_view what) {
    return CorruptionError(fmt::format("{}: snapshot record: {}", where, what));
  };
  if (!j.is_object()) return bad("not an object");
  const auto small_int = [&](const char* key, int64_t lo, int64_t hi) -> std::optional<int> {
    if (!j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
    if (j[key].is_number_unsigned() && j[key].get<uint64_t>() > INT64_MAX) return std::nullopt;
    const int64_t v = j[key].get<int64_t>();
    if (v < lo || v > hi) return std::nullopt;
    return static_cast<int>(v);
  };
  SnapshotRecord out;
  const std::optional<int> world = small_int("world", 1, dist::kMaxWorld);
  if (!world) return bad("\"world\" is not an integer in [1, 2^20]");
  const std::optional<int> rank = small_int("rank", 0, *world - 1);
  if (!rank) return bad(fmt::format("\"rank\" is not an integer in [0, {})", *world));
  out.world = *world;
  out.rank = *rank;
  if (!j.contains("layout") || !j["layout"].is_object()) return bad("\"layout\" is not an object");
  for (const auto& [name, spec] : j["layout"].items()) {
    Result<ShardSpec> s = SpecFromJson(name, spec, out.world);
    if (!s.ok()) return bad(s.status().message());
    out.layout.emplace(name, *std::move(s));
  }
  return out;
}

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
    if (e.is_dir && ParseSnapshotName(e.name, &at) &&
        fs->Exists(rank_dir + "/" + e.name + "/MANIFEST")) {
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
  for (const auto& [name, t] : src.state.tables()) {  // a table: the rank's rows, borrowed
    SP_ASSIGN_OR_RETURN(SparseTable rows, SparseTable::FromViews(t->ids_view(), t->slots()));
    SP_RETURN_IF_ERROR(snap.PutTable(name, std::move(rows)));
  }
  snap.metadata() = src.state.metadata().is_object() ? src.state.metadata() : Json::object();
  snap.metadata()[kRecordKey] = SnapshotRecordToJson({rank_, world_, src.layout});
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
    // tmpfs pages are memory already: map instead of copying (tables are read: their rows are
    // sorted into storage order, not the order the rank held them in).
    Result<bool> tables = HoldsTables(path, io);
    if (!tables.ok()) {
      return tables.status().WithContext(fmt::format("rank {}'s snapshot of step {}", rank, step));
    }
    lo.mmap = !*tables;
    Result<State> loaded = Load(path, lo, io);
    if (!loaded.ok()) {
      return loaded.status().WithContext(fmt::format("rank {}'s snapshot of step {}", rank, step));
    }
    State state = *std::move(loaded);
    DumpSource out;
    const Json record = state.metadata().is_object() && state.metadata().contains(kRecordKey)
                            ? state.metadata()[kRecordKey]
                            : Json();
    Result<SnapshotRecord> parsed = ParseSnapshotRecord(record, "snapshot " + path);
    if (!parsed.ok()) return parsed.status();
    if (parsed->rank != rank) {
      return CorruptionError(
          fmt::format("snapshot {}: its record is of rank {}, not {}", path, parsed->rank, rank));
    }
    out.layout = std::move(parsed->layout);
    state.metadata().erase(kRecordKey);
    out.state = std::move(state);
    *at = s;
    return out;
  }
  return NotFoundError(fmt::format("no snapshot of step {} of rank {} in {}", step, rank, dir));
}

}  // namespace savepoint::failover
