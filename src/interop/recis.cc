// LoadRecisCheckpoint, IsRecisCheckpoint (savepoint/recis.h; ImportRecis is in src/api/): a RecIS
// checkpoint directory read into a State. The index is planned by recis_layout.cc; here every data
// file's safetensors header is validated (InspectSafetensors), each table's shards are checked
// against each other and read straight into one owned tensor per slot (shard after shard, blocks
// read in parallel), ids are checked for duplicates across blocks, and what is not imported is
// listed.
#include "savepoint/recis.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <numeric>

#include "interop/recis_layout.h"
#include "savepoint/filesystem.h"
#include "savepoint/safetensors.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint {
namespace {

using interop::RecisBlock;
using interop::RecisPlan;
using interop::RecisShardBlocks;

constexpr uint64_t kPieceBytes = uint64_t{8} << 20;  // read granularity (progress)

// One block read into its place in an owned tensor.
struct ReadJob {
  std::string file;
  uint64_t offset = 0;  // in the file
  std::byte* dst = nullptr;
  uint64_t bytes = 0;
};

// A table being assembled: its tensors and, for the duplicate check, where each shard's rows
// start.
struct TableParts {
  Tensor ids;
  std::vector<std::pair<std::string, Tensor>> slots;
  std::vector<uint64_t> row_begin;  // [shards + 1]
};

class RecisReader {
 public:
  RecisReader(std::string dir, const RecisLoadOptions& o, const IoOptions& io)
      : dir_(std::move(dir)), o_(o), fs_(FileSystemOf(io)), threads_(io.io_threads) {}

  Result<RecisCheckpoint> Read();

 private:
  std::string Path(std::string_view name) const { return JoinPath(dir_, name); }
  Result<std::string> ReadSmall(const std::string& name) {
    return fs_->ReadFile(Path(name), o_.max_index_bytes);
  }
  Status OpenFiles();
  Result<const SafetensorsTensorInfo*> Find(const RecisBlock& b) const;
  Status PlanTable(const std::string& name, const interop::RecisTablePlan& t, TableParts* out);
  Status PlanSlot(const std::string& table, const std::string& slot,
                  const std::vector<RecisShardBlocks>& shards, const std::vector<uint64_t>& rows,
                  TableParts* out);
  void AddJob(const RecisBlock& b, const SafetensorsTensorInfo& info, std::byte* dst);
  Status ReadAll();
  Status CheckDuplicates(const std::string& name, const interop::RecisTablePlan& t,
                         const TableParts& parts) const;
  Status AddTables(State* state);
  Status AddDense(State* state);
  std::vector<std::string> Skipped() const;

  std::string dir_;
  RecisLoadOptions o_;
  FileSystem* fs_;
  int threads_;
  RecisPlan plan_;
  std::map<std::string, SafetensorsInfo> infos_;  // data file -> its header
  std::map<std::string, std::unique_ptr<RandomAccessFile>> files_;
  std::vector<ReadJob> jobs_;
  std::map<std::string, TableParts> tables_;
  std::map<std::string, Tensor> dense_;
};

// The block naming `file` first (for messages).
std::string AnyBlockOf(const RecisPlan& plan, const std::string& file) {
  for (const auto& [name, b] : plan.dense) {
    if (b.file == file) return b.name;
  }
  for (const auto& [name, t] : plan.tables) {
    for (const RecisShardBlocks& s : t.shards) {
      if (s.ids.file == file) return s.ids.name;
      for (const auto& [slot, b] : s.slots) {
        if (b.file == file) return b.name;
      }
    }
  }
  return "?";
}

Status RecisReader::OpenFiles() {
  for (const std::string& f : plan_.files) {
    const std::string path = Path(f);
    const std::string ctx = fmt::format("data file {} (named by block {:?} of {})", path,
                                        AnyBlockOf(plan_, f), Path(interop::kRecisIndexFile));
    Result<SafetensorsInfo> info = InspectSafetensors(path, fs_);
    if (!info.ok()) return info.status().WithContext(ctx);
    Result<std::unique_ptr<RandomAccessFile>> file = fs_->NewRandomAccessFile(path, {});
    if (!file.ok()) return file.status().WithContext(ctx);
    infos_.emplace(f, std::move(info).value());
    files_.emplace(f, std::move(file).value());
  }
  return Status::OK();
}

Result<const SafetensorsTensorInfo*> RecisReader::Find(const RecisBlock& b) const {
  const SafetensorsInfo& info = infos_.at(b.file);
  auto it = std::lower_bound(
      info.tensors.begin(), info.tensors.end(), b.name,
      [](const SafetensorsTensorInfo& t, const std::string& n) { return t.name < n; });
  if (it == info.tensors.end() || it->name != b.name) {
    return NotFoundError(
        fmt::format("{}: block {:?}, which the index places there, is missing", info.path, b.name));
  }
  return &*it;
}

void RecisReader::AddJob(const RecisBlock& b, const SafetensorsTensorInfo& info, std::byte* dst) {
  jobs_.push_back({b.file, infos_.at(b.file).data_offset + info.begin, dst, info.nbytes()});
}

std::string Describe(const SafetensorsTensorInfo& t) {
  return fmt::format("{} {}", DTypeName(t.dtype), fmt::join(t.shape, "x"));
}

Status RecisReader::PlanTable(const std::string& name, const interop::RecisTablePlan& t,
                              TableParts* out) {
  std::vector<uint64_t> rows;
  out->row_begin.assign(1, 0);
  for (const RecisShardBlocks& s : t.shards) {
    SP_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* ids, Find(s.ids));
    if (ids->dtype != DType::kI64 || ids->shape.size() != 1) {
      return CorruptionError(
          fmt::format("{}: id block {:?} of table {:?} is {}, expected I64 [rows]",
                      Path(s.ids.file), s.ids.name, name, Describe(*ids)));
    }
    rows.push_back(static_cast<uint64_t>(ids->shape[0]));
    out->row_begin.push_back(out->row_begin.back() + rows.back());  // bounded by the file sizes
  }
  SP_ASSIGN_OR_RETURN(out->ids,
                      Tensor::Empty(DType::kI64, {static_cast<int64_t>(out->row_begin.back())}));
  for (size_t i = 0; i < t.shards.size(); ++i) {
    SP_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* ids, Find(t.shards[i].ids));
    AddJob(t.shards[i].ids, *ids, out->ids.data() + out->row_begin[i] * sizeof(int64_t));
  }
  for (const auto& [slot, b] : t.shards[0].slots) {
    SP_RETURN_IF_ERROR(PlanSlot(name, slot, t.shards, rows, out));
  }
  return Status::OK();
}

Status RecisReader::PlanSlot(const std::string& table, const std::string& slot,
                             const std::vector<RecisShardBlocks>& shards,
                             const std::vector<uint64_t>& rows, TableParts* out) {
  SP_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* first, Find(shards[0].slots.at(slot)));
  if (first->shape.empty()) {
    return CorruptionError(fmt::format("{}: slot block {:?} of table {:?} is a scalar",
                                       Path(shards[0].slots.at(slot).file),
                                       shards[0].slots.at(slot).name, table));
  }
  Shape shape = first->shape;
  shape[0] = static_cast<int64_t>(out->row_begin.back());
  // Valid blocks may concatenate to a shape that is not: two [1, 2^63-1, 0] make [2, 2^63-1, 0].
  if (Result<uint64_t> n = NumBytes(first->dtype, shape); !n.ok()) {
    return CorruptionError(fmt::format(
        "{}: slot block {:?} of table {:?} is {}: the {} rows of the table's {} shards make the "
        "invalid shape {} ({})",
        Path(shards[0].slots.at(slot).file), shards[0].slots.at(slot).name, table, Describe(*first),
        shape[0], shards.size(), ShapeToString(shape), n.status().message()));
  }
  SP_ASSIGN_OR_RETURN(Tensor whole, Tensor::Empty(first->dtype, shape));
  const uint64_t row_bytes = SparseTable::RowBytes(whole.view());
  for (size_t i = 0; i < shards.size(); ++i) {
    const RecisBlock& b = shards[i].slots.at(slot);
    SP_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(b));
    const std::string where =
        fmt::format("{}: slot block {:?} of table {:?}", Path(b.file), b.name, table);
    if (info->shape.empty() || static_cast<uint64_t>(info->shape[0]) != rows[i]) {
      return CorruptionError(fmt::format("{} is {}, but its id block {:?} has {} rows", where,
                                         Describe(*info), shards[i].ids.name, rows[i]));
    }
    if (info->dtype != first->dtype || !std::equal(info->shape.begin() + 1, info->shape.end(),
                                                   first->shape.begin() + 1, first->shape.end())) {
      return CorruptionError(fmt::format("{} is {}, but shard 0's block {:?} is {}", where,
                                         Describe(*info), shards[0].slots.at(slot).name,
                                         Describe(*first)));
    }
    AddJob(b, *info, whole.data() + out->row_begin[i] * row_bytes);
  }
  out->slots.emplace_back(slot, std::move(whole));
  return Status::OK();
}

Status RecisReader::ReadAll() {
  uint64_t total = 0;
  for (const ReadJob& j : jobs_) total += j.bytes;
  Progress progress(o_.progress, total);
  SP_RETURN_IF_ERROR(ParallelFor(jobs_.size(), threads_, [&](size_t i, int) -> Status {
    const ReadJob& j = jobs_[i];
    for (uint64_t done = 0; done < j.bytes;) {
      const uint64_t n = std::min(kPieceBytes, j.bytes - done);
      SP_RETURN_IF_ERROR(files_.at(j.file)->ReadAt(j.offset + done, {j.dst + done, n}));
      done += n;
      progress.Add(n);
    }
    return Status::OK();
  }));
  progress.Finish();
  return Status::OK();
}

Status RecisReader::CheckDuplicates(const std::string& name, const interop::RecisTablePlan& t,
                                    const TableParts& parts) const {
  std::span<const int64_t> ids = parts.ids.as<const int64_t>();
  std::vector<uint64_t> order(ids.size());
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::sort(order.begin(), order.end(),
            [&](uint64_t a, uint64_t b) { return ids[a] != ids[b] ? ids[a] < ids[b] : a < b; });
  const auto block_of = [&](uint64_t row) {
    auto it = std::upper_bound(parts.row_begin.begin(), parts.row_begin.end(), row);
    const RecisBlock& b = t.shards[static_cast<size_t>(it - parts.row_begin.begin() - 1)].ids;
    return fmt::format("{:?} ({})", b.name, b.file);
  };
  for (size_t i = 1; i < order.size(); ++i) {
    if (ids[order[i]] == ids[order[i - 1]]) {
      return CorruptionError(fmt::format("{}: table {:?}: id {} is in block {} and in block {}",
                                         dir_, name, ids[order[i]], block_of(order[i - 1]),
                                         block_of(order[i])));
    }
  }
  return Status::OK();
}

Status RecisReader::AddTables(State* state) {
  for (auto& [name, parts] : tables_) {
    SP_RETURN_IF_ERROR(CheckDuplicates(name, plan_.tables.at(name), parts));
    const std::string ctx = fmt::format("{}: table {:?}", dir_, name);
    Result<SparseTable> t = SparseTable::FromTensors(std::move(parts.ids), std::move(parts.slots));
    if (!t.ok()) return t.status().WithContext(ctx);
    SP_RETURN_IF_ERROR(state->PutTable(name, std::move(t).value()).WithContext(ctx));
  }
  return Status::OK();
}

Status RecisReader::AddDense(State* state) {
  for (auto& [name, tensor] : dense_) {
    const std::string ctx = fmt::format("{}: dense block {:?}", dir_, plan_.dense.at(name).name);
    SP_RETURN_IF_ERROR(state->Put(name, std::move(tensor)).WithContext(ctx));
  }
  return Status::OK();
}

// Why a file of the directory is not imported (empty: it was read).
std::string SkipReason(const std::string& name) {
  if (name == "model.pt") {
    return "torch pickle of the dense parameters: not read by the C++ import "
           "(savepoint.recis.import_checkpoint in Python adds its tensors)";
  }
  if (name == "extra.pt") return "torch pickle of the registered objects: not imported";
  if (name == "io_state_count") {
    return "worker count of the IO states: not read by the C++ import "
           "(savepoint.recis.import_checkpoint in Python can add the IO states)";
  }
  if (name.starts_with("io_state_") && name.ends_with(".pt")) {
    return "IO state of the dataset readers (torch pickle): not read by the C++ import "
           "(savepoint.recis.import_checkpoint in Python can add it)";
  }
  if (name == "torch_rank_weights_embs_table_multi_shard.json") {
    return "RecIS's summary of the blocks: not needed";
  }
  if (name.ends_with(".safetensors")) return "a data file the index does not name: not imported";
  return "not part of a RecIS checkpoint: not imported";
}

std::vector<std::string> RecisReader::Skipped() const {
  std::vector<std::string> out;
  Result<std::vector<FileInfo>> entries = fs_->ListDir(dir_);
  if (entries.ok()) {
    std::sort(entries->begin(), entries->end(),
              [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
    for (const FileInfo& e : *entries) {
      if (e.name == interop::kRecisIndexFile || e.name == interop::kRecisTensorKeyFile ||
          infos_.count(e.name) > 0) {
        continue;
      }
      out.push_back(fmt::format("{}{}: {}", e.name, e.is_dir ? "/" : "", SkipReason(e.name)));
    }
  }
  for (const auto& [file, info] : infos_) {  // tensors of a data file the index does not name
    size_t named = 0;
    for (const auto& [n, b] : plan_.dense) named += b.file == file;
    for (const auto& [n, t] : plan_.tables) {
      for (const RecisShardBlocks& s : t.shards) {
        named += s.ids.file == file;
        for (const auto& [slot, b] : s.slots) named += b.file == file;
      }
    }
    if (info.tensors.size() > named) {
      out.push_back(fmt::format("{}: {} tensors the index does not name: not imported", file,
                                info.tensors.size() - named));
    }
  }
  return out;
}

Result<RecisCheckpoint> RecisReader::Read() {
  const std::string index_path = Path(interop::kRecisIndexFile);
  SP_ASSIGN_OR_RETURN(std::string index, ReadSmall(interop::kRecisIndexFile));
  std::map<std::string, std::string> keys;
  if (fs_->Exists(Path(interop::kRecisTensorKeyFile))) {
    SP_ASSIGN_OR_RETURN(std::string text, ReadSmall(interop::kRecisTensorKeyFile));
    SP_ASSIGN_OR_RETURN(
        keys, interop::ParseRecisTensorKeys(text, Path(interop::kRecisTensorKeyFile), o_));
  }
  SP_ASSIGN_OR_RETURN(plan_, interop::PlanRecis(index, index_path, keys, o_));
  SP_RETURN_IF_ERROR(OpenFiles());
  for (const auto& [name, t] : plan_.tables) {
    SP_RETURN_IF_ERROR(PlanTable(name, t, &tables_[name]));
  }
  for (const auto& [name, b] : plan_.dense) {
    SP_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(b));
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info->dtype, info->shape));
    AddJob(b, *info, t.data());
    dense_.emplace(name, std::move(t));
  }
  SP_RETURN_IF_ERROR(ReadAll());
  RecisCheckpoint out;
  SP_RETURN_IF_ERROR(AddTables(&out.state));
  SP_RETURN_IF_ERROR(AddDense(&out.state));
  out.path = dir_;
  out.shard_num = plan_.shard_num;
  out.files = static_cast<int>(plan_.files.size());
  out.skipped = Skipped();
  out.state.metadata() = Json{
      {"recis", Json{{"source", dir_}, {"shard_num", out.shard_num}, {"skipped", out.skipped}}}};
  for (const std::string& s : out.skipped) spdlog::info("RecIS import {}: skipped {}", dir_, s);
  return out;
}

// `dir` itself when it holds an index, else the newest id listed in `dir/checkpoint`.
Result<std::string> ResolveDir(const std::string& dir, FileSystem* fs, uint64_t max_bytes) {
  if (fs->Exists(JoinPath(dir, interop::kRecisIndexFile))) return dir;
  const std::string list = JoinPath(dir, interop::kRecisCheckpointList);
  if (!fs->Exists(list)) {
    return NotFoundError(fmt::format("{}: not a RecIS checkpoint (no {} file, no {} list)", dir,
                                     interop::kRecisIndexFile, interop::kRecisCheckpointList));
  }
  SP_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(list, max_bytes));
  std::string newest;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view line = std::string_view(text).substr(pos, end - pos);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (!line.empty()) newest = std::string(line);
    pos = end + 1;
  }
  if (newest.empty()) return NotFoundError(fmt::format("{}: lists no checkpoint", list));
  if (!interop::IsPlainFileName(newest)) {
    return CorruptionError(fmt::format("{}: {:?} is not a checkpoint name", list, newest));
  }
  const std::string path = JoinPath(dir, newest);
  if (!fs->Exists(JoinPath(path, interop::kRecisIndexFile))) {
    return NotFoundError(fmt::format("{}: the newest checkpoint {} has no {} file", list, path,
                                     interop::kRecisIndexFile));
  }
  return path;
}

}  // namespace

bool IsRecisCheckpoint(const std::string& dir, FileSystem* fs) {
  if (fs == nullptr) fs = DefaultFileSystem();
  if (!fs->Exists(JoinPath(dir, interop::kRecisIndexFile))) return false;
  Result<std::vector<FileInfo>> entries = fs->ListDir(dir);
  if (!entries.ok()) return false;
  return std::any_of(entries->begin(), entries->end(), [](const FileInfo& e) {
    return !e.is_dir && e.name.starts_with("model-") && e.name.ends_with(".safetensors") &&
           e.name.find("-of-") != std::string::npos;
  });
}

Result<RecisCheckpoint> LoadRecisCheckpoint(const std::string& dir, const RecisLoadOptions& options,
                                            const IoOptions& io) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, "LoadRecisCheckpoint"));
  SP_ASSIGN_OR_RETURN(std::string path, ResolveDir(dir, FileSystemOf(io), options.max_index_bytes));
  RecisReader reader(path, options, io);
  return reader.Read();
}

}  // namespace savepoint
