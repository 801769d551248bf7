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
  // The last segment starting at or before `begin`.
  auto it = std::upper_bound(segments_.begin(), segments_.end(), begin,
                             [](uint64_t b, const Segment& s) { return b < s.offset; });
  if (it != segments_.begin()) --it;
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
  // `tail`, when not null, writes the file's last, partial block (f is then in direct mode).
  LayoutWriter(const ByteLayout& layout, const WriteLayoutOptions& o, WritableFile* f,
               WritableFile* tail)
      : layout_(layout), o_(o), f_(f), tail_(tail) {
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
  Status WritePiece(size_t i, int worker) {
    const uint64_t begin = i * kLayoutPieceBytes;
    std::span<std::byte> buf(staging_[worker].data(),
                             std::min(kLayoutPieceBytes, layout_.size() - begin));
    const uint64_t payload = layout_.Gather(begin, buf);
    if (o_.crc_end >= begin + buf.size()) crcs_[i] = Crc32Zlib(0, buf);
    // Whole blocks through f_; a last partial block through the buffered tail handle.
    const uint64_t whole =
        tail_ != nullptr ? buf.size() / kDirectIOAlignment * kDirectIOAlignment : buf.size();
    if (whole > 0) SP_RETURN_IF_ERROR(f_->WriteAt(begin, buf.first(whole)));
    if (whole < buf.size()) SP_RETURN_IF_ERROR(tail_->WriteAt(begin + whole, buf.subspan(whole)));
    if (o_.progress != nullptr) o_.progress->Add(payload);
    return Status::OK();
  }

  const ByteLayout& layout_;
  const WriteLayoutOptions& o_;
  WritableFile* f_;
  WritableFile* tail_;
  uint64_t pieces_ = 0;
  std::vector<uint32_t> crcs_;  // CRC of each whole piece before crc_end
  std::vector<Tensor> staging_;
};

}  // namespace

Status WriteByteLayout(const IoOptions& io, const std::string& path, const ByteLayout& layout,
                       const WriteLayoutOptions& options, bool* direct) {
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f,
                      fs->NewWritableFile(path, {.direct_io = io.direct_io}));
  *direct = f->direct();
  SP_RETURN_IF_ERROR(f->Preallocate(layout.size()));
  // O_DIRECT writes whole blocks only: a file that ends in a partial block (a .ckpt file, most
  // often) writes that block through a second, buffered handle on the same file.
  std::unique_ptr<WritableFile> tail;
  if (f->direct() && layout.size() % kDirectIOAlignment != 0) {
    SP_ASSIGN_OR_RETURN(tail, fs->NewWritableFile(path, {.direct_io = false, .truncate = false}));
  }
  LayoutWriter writer(layout, options, f.get(), tail.get());
  SP_RETURN_IF_ERROR(writer.Run(io.io_threads));
  if (tail != nullptr) {
    SP_RETURN_IF_ERROR(tail->Sync());
    SP_RETURN_IF_ERROR(tail->Close());
  }
  SP_RETURN_IF_ERROR(f->Sync());
  return f->Close();
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
  WriteLayoutOptions wo{options.crc_end, options.trailer, &progress};
  bool direct = false;
  Status s = WriteByteLayout(io, commit->tmp(), layout, wo, &direct);
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
