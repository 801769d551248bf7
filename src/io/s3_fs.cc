// S3FileSystem (io/s3_fs.h): files as objects, directories as key prefixes.
#include "io/s3_fs.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "util/crc32c.h"
#include "util/parallel.h"

namespace savepoint::io {
namespace {

constexpr uint64_t kMaxParts = 10000;
// ReadAtMany: ranges closer than this share one GET (the bytes between are read and dropped), up
// to kMaxCoalesced bytes per GET.
constexpr uint64_t kCoalesceGap = 256 << 10;
constexpr uint64_t kMaxCoalesced = 64 << 20;
// ListDir stops a listing longer than this (a server whose listing never ends).
constexpr size_t kMaxListed = 10'000'000;

// A file being written: parts buffered until complete, then uploaded (see s3_fs.h).
class S3WritableFile final : public WritableFile {
 public:
  S3WritableFile(S3Client* client, S3Location loc, std::string path, bool exclusive)
      : c_(client),
        loc_(std::move(loc)),
        path_(std::move(path)),
        exclusive_(exclusive),
        part_bytes_(client->options().part_bytes) {}

  ~S3WritableFile() override {
    if (!published_ && !upload_id_.empty()) {
      c_->AbortMultipart(loc_, upload_id_).IgnoreError();
    }
  }

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    while (!data.empty()) {
      const uint64_t k = offset / part_bytes_;
      const uint64_t in = offset - k * part_bytes_;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(data.size(), part_bytes_ - in));
      SP_RETURN_IF_ERROR(WritePart(k, in, data.first(n)));
      offset += n;
      data = data.subspan(n);
    }
    return Status::OK();
  }

  Status Preallocate(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (parts_.empty() && done_.empty() && bytes > kMaxParts * part_bytes_) {
      const uint64_t base = c_->options().part_bytes;
      const uint64_t need = (bytes + kMaxParts - 1) / kMaxParts;
      part_bytes_ = (need + base - 1) / base * base;
    }
    return Status::OK();
  }

  Status Sync() override { return Publish(); }
  Status Close() override {
    if (closed_) return FailedPreconditionError(fmt::format("close {}: already closed", path_));
    Status s = Publish();
    closed_ = true;
    return s;
  }
  bool direct() const override { return false; }
  const std::string& path() const override { return path_; }

 private:
  struct Part {
    std::unique_ptr<std::byte[]> buf;
    uint64_t filled = 0;
  };

  Status Sticky(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = s;
    return s;
  }

  Status CheckOpen(const char* what) {
    if (published_ || closed_) {
      return FailedPreconditionError(fmt::format(
          "{} {}: the object is published; a file in object storage is written once", what, path_));
    }
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  Status WritePart(uint64_t k, uint64_t in, std::span<const std::byte> data) {
    SP_RETURN_IF_ERROR(CheckOpen("write"));
    if (k >= kMaxParts) {
      return ResourceExhaustedError(fmt::format(
          "write {}: offset {} needs more than {} parts of {} bytes (announce the size with "
          "Preallocate, or raise S3Options::part_bytes)",
          path_, k * part_bytes_ + in, kMaxParts, part_bytes_));
    }
    std::byte* buf = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (uploaded_.count(k) != 0) return Rewrite(k);
      size_ = std::max(size_, k * part_bytes_ + in + data.size());
      Part& p = parts_[k];
      if (p.buf == nullptr && data.size() == part_bytes_) {  // a whole part: no copy
        parts_.erase(k);
        uploaded_.insert(k);
      } else {
        if (p.buf == nullptr) {
          p.buf.reset(new std::byte[part_bytes_]);
          std::memset(p.buf.get(), 0, part_bytes_);
        }
        buf = p.buf.get();
      }
    }
    if (buf == nullptr) return Upload(k, data);
    std::memcpy(buf + in, data.data(), data.size());  // ranges of concurrent writes are disjoint
    std::unique_ptr<std::byte[]> full;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Part& p = parts_[k];
      p.filled += data.size();
      if (p.filled > part_bytes_) return Rewrite(k);  // some range was written twice
      if (p.filled < part_bytes_) return Status::OK();
      uploaded_.insert(k);
      full = std::move(p.buf);
      parts_.erase(k);
    }
    return Upload(k, std::span<const std::byte>(full.get(), part_bytes_));
  }

  // A write into bytes already written: parts are uploaded once, so it cannot be honoured.
  Status Rewrite(uint64_t k) {
    return FailedPreconditionError(fmt::format(
        "write {}: part {} (bytes [{}, {})) was written before; a file in object storage is "
        "written once, each byte once",
        path_, k + 1, k * part_bytes_, (k + 1) * part_bytes_));
  }

  Status Start() {
    std::lock_guard<std::mutex> lock(start_mu_);
    if (!upload_id_.empty()) return Status::OK();
    Result<std::string> id = c_->CreateMultipart(loc_);
    if (!id.ok()) return Sticky(id.status());
    upload_id_ = *id;
    return Status::OK();
  }

  Status Upload(uint64_t k, std::span<const std::byte> data) {
    SP_RETURN_IF_ERROR(Start());
    const std::string crc = S3Crc32c(data);
    Result<std::string> etag = c_->UploadPart(loc_, upload_id_, static_cast<int>(k + 1), data, crc);
    if (!etag.ok()) return Sticky(etag.status());
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back({static_cast<int>(k + 1), *etag, crc});
    return Status::OK();
  }

  // The bytes of part k (its buffer, or zeros for a hole), `len` of them.
  std::span<const std::byte> Pending(uint64_t k, uint64_t len) {
    Part& p = parts_[k];
    if (p.buf == nullptr) {
      p.buf.reset(new std::byte[part_bytes_]);
      std::memset(p.buf.get(), 0, part_bytes_);
    }
    return {p.buf.get(), static_cast<size_t>(len)};
  }

  Status Publish() {
    if (published_) return Status::OK();
    SP_RETURN_IF_ERROR(CheckOpen("publish"));
    Status s;
    if (upload_id_.empty() && size_ <= part_bytes_) {
      std::span<const std::byte> body =
          size_ == 0 ? std::span<const std::byte>() : Pending(0, size_);
      s = c_->Put(loc_, body, S3Crc32c(body), exclusive_);
    } else {
      s = PublishMultipart();
    }
    if (!s.ok()) {
      Sticky(s).IgnoreError();
      if (!upload_id_.empty()) c_->AbortMultipart(loc_, upload_id_).IgnoreError();
      upload_id_.clear();
      return s.WithContext(fmt::format("publish {}", path_));
    }
    parts_.clear();
    published_ = true;
    return Status::OK();
  }

  Status PublishMultipart() {
    const uint64_t count = (size_ + part_bytes_ - 1) / part_bytes_;
    std::vector<bool> have(count, false);
    for (const S3Part& p : done_) have[static_cast<size_t>(p.number - 1)] = true;
    for (uint64_t k = 0; k < count; ++k) {
      if (have[k]) continue;
      SP_RETURN_IF_ERROR(Upload(k, Pending(k, std::min(part_bytes_, size_ - k * part_bytes_))));
      parts_.erase(k);
    }
    std::sort(done_.begin(), done_.end(),
              [](const S3Part& a, const S3Part& b) { return a.number < b.number; });
    return c_->CompleteMultipart(loc_, upload_id_, done_, exclusive_);
  }

  S3Client* const c_;
  const S3Location loc_;
  const std::string path_;
  const bool exclusive_;
  uint64_t part_bytes_;
  std::mutex mu_;        // parts_, done_, size_, error_
  std::mutex start_mu_;  // upload_id_ while it is being created
  std::map<uint64_t, Part> parts_;
  std::set<uint64_t> uploaded_;  // parts complete (being or been uploaded)
  std::vector<S3Part> done_;
  uint64_t size_ = 0;
  Status error_;
  std::string upload_id_;
  bool published_ = false;
  bool closed_ = false;
};

class S3ReadableFile final : public RandomAccessFile {
 public:
  S3ReadableFile(S3Client* client, S3Location loc, std::string path, uint64_t size)
      : c_(client), loc_(std::move(loc)), path_(std::move(path)), size_(size) {}

  Status ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    const ReadOp op{offset, dst};
    return ReadGroup(std::span<const ReadOp>(&op, 1));
  }

  // Sorted by offset, ranges closer than kCoalesceGap share one GET; the GETs run in parallel.
  Status ReadAtMany(std::span<const ReadOp> ops) const override {
    std::vector<ReadOp> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const ReadOp& a, const ReadOp& b) { return a.offset < b.offset; });
    std::vector<std::span<const ReadOp>> groups;
    size_t begin = 0;
    for (size_t i = 1; i <= sorted.size(); ++i) {
      const ReadOp& first = sorted[begin];
      const uint64_t end = sorted[i - 1].offset + sorted[i - 1].dst.size();
      if (i < sorted.size() && sorted[i].offset >= end && sorted[i].offset - end <= kCoalesceGap &&
          sorted[i].offset + sorted[i].dst.size() - first.offset <= kMaxCoalesced) {
        continue;
      }
      groups.emplace_back(sorted.data() + begin, i - begin);
      begin = i;
    }
    const int threads =
        static_cast<int>(std::min<size_t>(groups.size(), c_->options().max_connections));
    return ParallelFor(groups.size(), threads, [&](size_t g, int) { return ReadGroup(groups[g]); });
  }

  uint64_t size() const override { return size_; }
  bool direct() const override { return false; }
  const std::string& path() const override { return path_; }

 private:
  // One GET for non-overlapping `ops` sorted by offset, scattering into their destinations.
  Status ReadGroup(std::span<const ReadOp> ops) const {
    const uint64_t first = ops.front().offset;
    const uint64_t end = ops.back().offset + ops.back().dst.size();
    if (end > size_ || end < first) {
      return OutOfRangeError(fmt::format("read {}: bytes [{}, {}) lie past its end ({} bytes)",
                                         path_, first, end, size_));
    }
    uint64_t pos = first;  // file offset of the next byte the GET delivers
    size_t op = 0;
    auto sink = [&](const std::byte* p, size_t n) {
      if (p == nullptr) {  // a retry starts again
        pos = first;
        op = 0;
        return;
      }
      const uint64_t stop = pos + n;
      while (pos < stop && op < ops.size()) {
        const ReadOp& o = ops[op];
        const uint64_t o_end = o.offset + o.dst.size();
        if (pos >= o_end) {
          ++op;
          continue;
        }
        const uint64_t from = std::max(pos, o.offset);
        const uint64_t to = std::min(stop, o_end);
        if (from < to) {
          std::memcpy(o.dst.data() + (from - o.offset), p + (from - pos), to - from);
        }
        p += to - pos;
        pos = to;
      }
      pos = stop;
    };
    Status s = c_->GetRange(loc_, first, end - first, sink);
    return s.ok() ? s : s.WithContext(fmt::format("read {}", path_));
  }

  S3Client* const c_;
  const S3Location loc_;
  const std::string path_;
  const uint64_t size_;
};

// The key prefix that lists the entries of directory `loc` ("" for the bucket).
std::string DirPrefix(const S3Location& loc) { return loc.key.empty() ? "" : loc.key + "/"; }

}  // namespace

Result<std::unique_ptr<S3FileSystem>> S3FileSystem::Create(const S3Options& options) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(options));
  return std::unique_ptr<S3FileSystem>(new S3FileSystem(std::move(client)));
}

Result<std::unique_ptr<WritableFile>> S3FileSystem::NewWritableFile(const std::string& path,
                                                                    const FileOptions& options) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  if (loc.key.empty()) {
    return InvalidArgumentError(fmt::format("open {} for writing: it names a bucket", path));
  }
  if (!options.truncate) {
    return InvalidArgumentError(fmt::format(
        "open {} for writing in place (FileOptions::truncate = false): an object is written "
        "whole, once",
        path));
  }
  return std::unique_ptr<WritableFile>(
      std::make_unique<S3WritableFile>(client_.get(), std::move(loc), path, options.exclusive));
}

Result<std::unique_ptr<RandomAccessFile>> S3FileSystem::NewRandomAccessFile(
    const std::string& path, const FileOptions& options) {
  (void)options;
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  Result<S3Head> head = client_->Head(loc);
  if (!head.ok()) return head.status().WithContext(fmt::format("open {} for reading", path));
  return std::unique_ptr<RandomAccessFile>(
      std::make_unique<S3ReadableFile>(client_.get(), std::move(loc), path, head->size));
}

Status S3FileSystem::CreateDir(const std::string& path) { return ParseS3Uri(path).status(); }

Status AppendListedChildren(const S3ListPage& page, std::string_view prefix, std::string_view path,
                            std::vector<FileInfo>* out) {
  // (The listing asked for '/' as the delimiter.)
  auto child = [&](const std::string& key, bool dir) -> Result<std::string> {
    std::string_view rest(key);
    const bool under = rest.starts_with(prefix) && (!dir || rest.ends_with('/'));
    if (under) rest.remove_prefix(prefix.size());
    if (under && dir && !rest.empty()) rest.remove_suffix(1);
    if (under && rest.find('/') == std::string_view::npos) return std::string(rest);
    return CorruptionError(
        fmt::format("list {}: the server listed {:?}, which is not a{} directly under {:?}", path,
                    key, dir ? " directory" : "n object", prefix));
  };
  for (const S3ObjectEntry& o : page.objects) {
    SP_ASSIGN_OR_RETURN(std::string name, child(o.key, false));
    if (!name.empty()) out->push_back({std::move(name), false, o.size, o.mtime_ns});
  }  // (an empty name: a "directory marker" object)
  for (const std::string& p : page.prefixes) {
    SP_ASSIGN_OR_RETURN(std::string name, child(p, true));
    if (!name.empty()) out->push_back({std::move(name), true, 0, 0});
  }
  return Status::OK();
}

Result<std::vector<FileInfo>> S3FileSystem::ListDir(const std::string& path) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  const std::string prefix = DirPrefix(loc);
  std::vector<FileInfo> out;
  std::string token;
  do {
    const std::string asked = token;
    SP_ASSIGN_OR_RETURN(S3ListPage page, client_->List(loc.bucket, prefix, true, 1000, token));
    if (page.truncated && (page.next_token == asked || out.size() > kMaxListed)) {
      return CorruptionError(fmt::format(
          "list {}: the server's listing does not end (a repeated continuation token, or more "
          "than {} entries)",
          path, kMaxListed));
    }
    SP_RETURN_IF_ERROR(AppendListedChildren(page, prefix, path, &out));
    token = page.truncated ? page.next_token : std::string();
  } while (!token.empty());
  if (out.empty() && !loc.key.empty()) {
    return NotFoundError(fmt::format("list {}: no such directory (no object under it)", path));
  }
  return out;
}

Result<bool> S3FileSystem::AnyUnder(const S3Location& dir) {
  SP_ASSIGN_OR_RETURN(S3ListPage page, client_->List(dir.bucket, DirPrefix(dir), false, 1, ""));
  return !page.objects.empty();
}

Result<FileInfo> S3FileSystem::Stat(const std::string& path) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  const std::string name = loc.key.empty() ? loc.bucket : Basename(loc.key);
  if (loc.key.empty()) {
    SP_RETURN_IF_ERROR(client_->HeadBucket(loc.bucket));
    return FileInfo{name, true, 0, 0};
  }
  Result<S3Head> head = client_->Head(loc);
  if (head.ok()) return FileInfo{name, false, head->size, head->mtime_ns};
  if (head.status().code() != StatusCode::kNotFound) return head.status();
  SP_ASSIGN_OR_RETURN(bool dir, AnyUnder(loc));
  if (dir) return FileInfo{name, true, 0, 0};
  return NotFoundError(fmt::format("stat {}: no such object or prefix", path));
}

Status S3FileSystem::RemoveFile(const std::string& path) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  return client_->Delete(loc);
}

Result<VersionedFile> S3FileSystem::ReadVersioned(const std::string& path, uint64_t max_bytes) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  SP_ASSIGN_OR_RETURN(S3Object object, client_->GetObject(loc, max_bytes));
  return VersionedFile{std::move(object.data), std::move(object.etag)};
}

Result<std::string> S3FileSystem::WriteIfVersion(const std::string& path, std::string_view contents,
                                                 const std::string& version) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  const auto bytes = std::as_bytes(std::span<const char>(contents.data(), contents.size()));
  return client_->PutIfMatch(loc, bytes, S3Crc32c(bytes), version);
}

Status S3FileSystem::RemoveDir(const std::string& path) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(path));
  SP_ASSIGN_OR_RETURN(bool any, AnyUnder(loc));
  if (any) return FailedPreconditionError(fmt::format("remove {}: directory not empty", path));
  return Status::OK();
}

Status S3FileSystem::Rename(const std::string& from, const std::string& to) {
  return UnimplementedError(fmt::format(
      "rename {} to {}: object storage has no atomic rename (savepoint commits there without one)",
      from, to));
}

Status S3FileSystem::SyncDir(const std::string& path) { return ParseS3Uri(path).status(); }

bool S3FileSystem::IsObjectStore(const std::string& path) {
  (void)path;
  return true;
}

Result<std::vector<std::string>> S3FileSystem::AbortAbandonedWrites(const std::string& root,
                                                                    int64_t before_ns,
                                                                    bool dry_run) {
  SP_ASSIGN_OR_RETURN(S3Location loc, ParseS3Uri(root));
  const std::string prefix = DirPrefix(loc);
  std::vector<std::string> done;
  std::string key_marker, upload_marker;
  size_t listed = 0;
  while (true) {
    SP_ASSIGN_OR_RETURN(S3UploadsPage page,
                        client_->ListMultipart(loc.bucket, prefix, key_marker, upload_marker));
    listed += page.uploads.size();
    const bool stuck =
        page.next_key_marker == key_marker && page.next_upload_id_marker == upload_marker;
    if (page.truncated && (stuck || listed > kMaxListed)) {
      return CorruptionError(fmt::format(
          "list the multipart uploads under {}: the server's listing does not end", root));
    }
    for (const S3UploadEntry& u : page.uploads) {
      if (u.initiated_ns <= 0 || u.initiated_ns >= before_ns) continue;  // young, or age unknown
      if (!dry_run) {
        Status s = client_->AbortMultipart(S3Location{loc.bucket, u.key}, u.upload_id);
        if (s.code() == StatusCode::kNotFound) continue;  // completed or aborted meanwhile
        SP_RETURN_IF_ERROR(s);
      }
      done.push_back(fmt::format("s3://{}/{} (upload {})", loc.bucket, u.key, u.upload_id));
    }
    if (!page.truncated) return done;
    key_marker = page.next_key_marker;
    upload_marker = page.next_upload_id_marker;
  }
}

}  // namespace savepoint::io

namespace savepoint {

Result<std::unique_ptr<FileSystem>> NewS3FileSystem(const S3Options& options) {
  SP_ASSIGN_OR_RETURN(S3Options resolved, ResolveS3Options(options));
  SP_ASSIGN_OR_RETURN(std::unique_ptr<io::S3FileSystem> fs, io::S3FileSystem::Create(resolved));
  return std::unique_ptr<FileSystem>(std::move(fs));
}

}  // namespace savepoint
