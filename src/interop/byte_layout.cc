// ByteLayout and WriteByteLayout (interop/byte_layout.h).
#include "interop/byte_layout.h"

#include <fmt/format.h>
#include <isa-l/crc.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "io/commit.h"
#include "io/direct_file.h"
#include "savepoint/filesystem.h"
#include "savepoint/tensor.h"
#include "util/parallel.h"

namespace savepoint::interop {

std::string* ByteLayout::AddOwned(std::string bytes) {
  owned_.push_back(std::move(bytes));
  std::string& s = owned_.back();
  segments_.push_back({size_, std::as_bytes(std::span(s)), false});
  size_ += s.size();
  return &s;
}

void ByteLayout::AddBorrowed(std::span<const std::byte> bytes) {
  segments_.push_back({size_, bytes, true});
  size_ += bytes.size();
  payload_bytes_ += bytes.size();
}

uint64_t ByteLayout::Gather(uint64_t begin, std::span<std::byte> dst) const {
  const uint64_t end = begin + dst.size();
  auto it = segments_.begin() + static_cast<ptrdiff_t>(SegmentAt(begin));
  uint64_t payload = 0;
  for (; it != segments_.end() && it->offset < end; ++it) {
    const uint64_t lo = std::max(begin, it->offset);
    const uint64_t hi = std::min(end, it->offset + it->bytes.size());
    if (lo >= hi) continue;
    std::memcpy(dst.data() + (lo - begin), it->bytes.data() + (lo - it->offset), hi - lo);
    if (it->payload) payload += hi - lo;
  }
  return payload;
}

uint32_t ByteLayout::Crc32(uint64_t end, int threads) const {
  constexpr uint64_t kRange = uint64_t{64} << 20;
  const uint64_t ranges = (end + kRange - 1) / kRange;
  std::vector<uint32_t> crcs(ranges, 0);
  Status s = ParallelFor(ranges, threads, [&](size_t r, int) {
    const uint64_t begin = r * kRange, stop = std::min(end, begin + kRange);
    auto it = std::upper_bound(segments_.begin(), segments_.end(), begin,
                               [](uint64_t b, const Segment& x) { return b < x.offset; });
    if (it != segments_.begin()) --it;
    uint32_t crc = 0;
    for (; it != segments_.end() && it->offset < stop; ++it) {
      const uint64_t lo = std::max(begin, it->offset);
      const uint64_t hi = std::min(stop, it->offset + it->bytes.size());
      if (lo < hi) crc = Crc32Zlib(crc, it->bytes.subspan(lo - it->offset, hi - lo));
    }
    crcs[r] = crc;
    return Status::OK();
  });
  s.IgnoreError();  // the body cannot fail
  uint32_t crc = 0;
  for (uint64_t r = 0; r < ranges; ++r) {
    crc = Crc32ZlibCombine(crc, crcs[r], std::min(kRange, end - r * kRange));
  }
  return crc;
}

size_t ByteLayout::SegmentAt(uint64_t offset) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), offset,
                             [](uint64_t b, const Segment& s) { return b < s.offset; });
  return it == segments_.begin() ? 0 : static_cast<size_t>(it - segments_.begin()) - 1;
}

uint32_t Crc32Zlib(uint32_t crc, std::span<const std::byte> bytes) {
  return crc32_gzip_refl(crc, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

uint32_t Crc32ZlibCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return static_cast<uint32_t>(crc32_combine64(crc_a, crc_b, static_cast<z_off64_t>(len_b)));
}

namespace {

// One writer: pieces of kLayoutPieceBytes, each gathered into a worker's aligned staging buffer.
class LayoutWriter {
 public:
  LayoutWriter(const ByteLayout& layout, const WriteLayoutOptions& o, io::DirectFile* f)
      : layout_(layout), o_(o), f_(f) {
    pieces_ = (layout.size() + kLayoutPieceBytes - 1) / kLayoutPieceBytes;
    crcs_.resize(pieces_, 0);
  }

  Status Run(int threads) {
    threads = static_cast<int>(std::clamp<uint64_t>(pieces_, 1, threads));
    for (int i = 0; i < threads; ++i) {
      SP_ASSIGN_OR_RETURN(Tensor t,
                          Tensor::Empty(DType::kU8, {static_cast<int64_t>(kLayoutPieceBytes)}));
      staging_.push_back(std::move(t));
    }
    if (o_.head) return RunHeadLast(threads);
    // Pieces holding bytes at or after crc_end wait for the CRC of everything before them.
    const uint64_t tail =
        o_.crc_end > 0 ? std::min(o_.crc_end / kLayoutPieceBytes, pieces_) : pieces_;
    SP_RETURN_IF_ERROR(
        ParallelFor(tail, threads, [&](size_t i, int w) { return WritePiece(i, w); }));
    if (o_.crc_end == 0) return Status::OK();
    uint32_t crc = 0;
    for (uint64_t i = 0; i < tail; ++i) {
      crc = Crc32ZlibCombine(crc, crcs_[i], kLayoutPieceBytes);
    }
    // The CRC of the tail's bytes before crc_end, from the layout (the trailer is not in them).
    std::span<std::byte> buf(staging_[0].data(), kLayoutPieceBytes);
    const uint64_t from = tail * kLayoutPieceBytes, n = o_.crc_end - from;
    layout_.Gather(from, buf.first(n));
    crc = Crc32ZlibCombine(crc, Crc32Zlib(0, buf.first(n)), n);
    if (o_.trailer) o_.trailer(crc);
    for (uint64_t i = tail; i < pieces_; ++i) SP_RETURN_IF_ERROR(WritePiece(i, 0));
    return Status::OK();
  }

 private:
  // WriteLayoutOptions::head: the pieces from the head's end on, with the segments' CRCs, then
  // the head pieces.
  Status RunHeadLast(int threads) {
    const uint64_t head =
        std::min(pieces_, (o_.head_end + kLayoutPieceBytes - 1) / kLayoutPieceBytes);
    parts_.resize(pieces_);
    SP_RETURN_IF_ERROR(ParallelFor(
        pieces_, threads, [&](size_t i, int w) { return WritePiece(i, w, /*write=*/i >= head); }));
    std::vector<uint32_t> crcs(layout_.segments().size(), 0);
    for (const std::vector<Part>& piece : parts_) {  // in file order: a segment's parts in order
      for (const Part& p : piece) crcs[p.segment] = Crc32ZlibCombine(crcs[p.segment], p.crc, p.len);
    }
    parts_.clear();
    SP_RETURN_IF_ERROR(o_.head(crcs));
    return ParallelFor(head, threads, [&](size_t i, int w) { return WritePiece(i, w); });
  }

  // Records the CRC of each payload segment's bytes in piece i (staged in `buf`).
  void SegmentCrcs(size_t i, uint64_t begin, std::span<const std::byte> buf) {
    const auto& segments = layout_.segments();
    const uint64_t end = begin + buf.size();
    for (size_t k = layout_.SegmentAt(begin); k < segments.size() && segments[k].offset < end;
         ++k) {
      const uint64_t lo = std::max(begin, segments[k].offset);
      const uint64_t hi = std::min(end, segments[k].offset + segments[k].bytes.size());
      if (lo >= hi || !segments[k].payload) continue;
      parts_[i].push_back({k, Crc32Zlib(0, buf.subspan(lo - begin, hi - lo)), hi - lo});
    }
  }

  // Stages piece i; computes the CRCs asked for; writes it unless `write` is false.
  Status WritePiece(size_t i, int worker, bool write = true) {
    const uint64_t begin = i * kLayoutPieceBytes;
    std::span<std::byte> buf(staging_[worker].data(),
                             std::min(kLayoutPieceBytes, layout_.size() - begin));
    const uint64_t payload = layout_.Gather(begin, buf);
    if (o_.crc_end >= begin + buf.size()) crcs_[i] = Crc32Zlib(0, buf);
    if (!parts_.empty()) SegmentCrcs(i, begin, buf);
    if (!write) return Status::OK();
    SP_RETURN_IF_ERROR(f_->WriteAt(begin, buf));
    if (o_.progress != nullptr) o_.progress->Add(payload);
    return Status::OK();
  }

  const ByteLayout& layout_;
  const WriteLayoutOptions& o_;
  io::DirectFile* f_;
  uint64_t pieces_ = 0;
  std::vector<uint32_t> crcs_;  // CRC of each whole piece before crc_end
  struct Part {
    size_t segment = 0;
    uint32_t crc = 0;
    uint64_t len = 0;
  };
  std::vector<std::vector<Part>> parts_;  // per piece, with `head` until it is called
  std::vector<Tensor> staging_;
};

}  // namespace

Status WriteByteLayout(const IoOptions& io, const std::string& path, const ByteLayout& layout,
                       const WriteLayoutOptions& options, bool* direct) {
  SP_ASSIGN_OR_RETURN(io::DirectFile f,
                      io::DirectFile::Create(FileSystemOf(io), path, io.direct_io, layout.size()));
  *direct = f.direct();
  LayoutWriter writer(layout, options, &f);
  SP_RETURN_IF_ERROR(writer.Run(io.io_threads));
  return f.Finish();
}

namespace {

// Refuses a directory in the way, and an existing file unless overwriting.
Status CheckTarget(FileSystem* fs, const std::string& path, bool overwrite) {
  Result<FileInfo> st = fs->Stat(path);
  if (!st.ok()) return st.status().code() == StatusCode::kNotFound ? Status::OK() : st.status();
  if (st->is_dir) return AlreadyExistsError(fmt::format("{}: a directory is in the way", path));
  if (!overwrite) {
    return AlreadyExistsError(fmt::format("{} exists (pass overwrite to replace it)", path));
  }
  return Status::OK();
}

// Opens `target` for writing only if absent (FileOptions::exclusive): a file written in place in
// object storage, where another writer may publish the same key meanwhile.
class ExclusiveTarget final : public ForwardingFileSystem {
 public:
  ExclusiveTarget(FileSystem* base, std::string target)
      : ForwardingFileSystem(base), target_(std::move(target)) {}
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override {
    FileOptions o = options;
    o.exclusive |= path == target_ && o.truncate;
    return base()->NewWritableFile(path, o);
  }

 private:
  const std::string target_;
};

}  // namespace

Status CommitFile(const IoOptions& io, const std::string& target, const ByteLayout& layout,
                  const CommitFileOptions& options, const std::string& context,
                  std::chrono::steady_clock::time_point start) {
  FileSystem* fs = FileSystemOf(io);
  SP_RETURN_IF_ERROR(CheckTarget(fs, target, options.overwrite).WithContext(context));
  io::CommitOptions co;
  co.overwrite = options.overwrite;
  co.create_parents = options.create_parents;
  Result<io::DurableCommit> commit =
      io::DurableCommit::Begin(fs, target, io::DurableCommit::Kind::kFile, co);
  if (!commit.ok()) return commit.status().WithContext(context);
  Progress progress(options.progress, layout.payload_bytes());
  WriteLayoutOptions wo{.crc_end = options.crc_end,
                        .trailer = options.trailer,
                        .progress = &progress,
                        .head_end = options.head_end,
                        .head = options.head};
  bool direct = false;
  ExclusiveTarget exclusive(fs, target);
  IoOptions wio = io;
  if (commit->tmp() == target && !options.overwrite) wio.fs = &exclusive;
  Status s = options.write ? options.write(wio, commit->tmp(), &progress, &direct)
                           : WriteByteLayout(wio, commit->tmp(), layout, wo, &direct);
  if (s.ok()) progress.Finish();
  if (s.ok()) s = commit->Commit();
  if (!s.ok()) {
    commit->Abandon();
    return s.WithContext(context);
  }
  if (options.stats != nullptr) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const uint64_t bytes = layout.payload_bytes();
    *options.stats = SaveStats{bytes, 0, seconds, direct, bytes, seconds, 0};
  }
  return Status::OK();
}

}  // namespace savepoint::interop
