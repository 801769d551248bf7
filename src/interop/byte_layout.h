// ByteLayout: a file to write, described as byte segments laid back to back from offset 0: header
// bytes the writer built (owned) and tensor bytes it borrows from a State. WriteByteLayout writes
// one in parallel 8 MiB pieces through aligned staging buffers, optionally with a zlib CRC-32 of a
// prefix whose value the last bytes of the file may carry (MindSpore's `.ckpt` trailer), or with
// the CRC-32 of every tensor segment, which a header written last may carry (MindSpore's
// safetensors `crc_num`).
//
// Used by the safetensors and MindSpore `.ckpt` writers. Thread safety: a ByteLayout is built by
// one thread; WriteByteLayout only reads it (and the trailer callback may rewrite owned bytes).
#ifndef SAVEPOINT_INTEROP_BYTE_LAYOUT_H_
#define SAVEPOINT_INTEROP_BYTE_LAYOUT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/io_options.h"
#include "savepoint/status.h"
#include "util/progress.h"

namespace savepoint::interop {

class ByteLayout {
 public:
  struct Segment {
    uint64_t offset = 0;
    std::span<const std::byte> bytes;
    bool payload = false;  // borrowed tensor bytes (counted by progress)
  };

  // Appends bytes the layout keeps (a header); returns their storage, which stays at the same
  // address and may be rewritten in place until the file is written (same size, without
  // reallocating: `replace`, not assignment, which may move the buffer).
  std::string* AddOwned(std::string bytes);
  // Appends borrowed tensor bytes; they must stay valid until the file is written.
  void AddBorrowed(std::span<const std::byte> bytes);

  const std::vector<Segment>& segments() const { return segments_; }
  uint64_t size() const { return size_; }
  uint64_t payload_bytes() const { return payload_bytes_; }

  // Copies bytes [begin, begin + dst.size()) of the file into `dst`; returns how many of them are
  // payload bytes.
  uint64_t Gather(uint64_t begin, std::span<std::byte> dst) const;
  // The index of the last segment starting at or before `offset` (0 when there is none).
  size_t SegmentAt(uint64_t offset) const;
  // The zlib CRC-32 of bytes [0, end), computed on `threads` threads from the segments in place.
  uint32_t Crc32(uint64_t end, int threads) const;

 private:
  std::deque<std::string> owned_;
  std::vector<Segment> segments_;
  uint64_t size_ = 0;
  uint64_t payload_bytes_ = 0;
};

// Bytes per staging piece and per write.
inline constexpr uint64_t kLayoutPieceBytes = uint64_t{8} << 20;

struct WriteLayoutOptions {
  // Computes the CRC-32 (zlib polynomial, as zlib's crc32) of the file's bytes [0, crc_end) when
  // crc_end > 0. Before the bytes from crc_end on are written, `trailer(crc)` is called once (it
  // may rewrite owned bytes that lie after crc_end, e.g. a trailer carrying the CRC).
  uint64_t crc_end = 0;
  std::function<void(uint32_t crc)> trailer = nullptr;
  // Counts the payload bytes of each piece written (may be null).
  Progress* progress = nullptr;
  // A header written last, when `head` is set (not together with crc_end): the pieces holding the
  // bytes before head_end are written after all others, and the CRC-32 (zlib) of every payload
  // segment is computed from the staged bytes on the way (the head pieces are staged twice, once
  // for it). Then `head(crcs)` is called once, crcs[i] the CRC-32 of segments()[i] (0 for owned
  // segments); it may rewrite owned bytes before head_end. Its error fails the write.
  uint64_t head_end = 0;
  std::function<Status(const std::vector<uint32_t>& segment_crcs)> head = nullptr;
};

// Creates `path` through io.fs, preallocates it and writes the layout on io.io_threads threads
// (with io.direct_io, O_DIRECT for every whole 4 KiB block and a second, buffered handle for a
// last partial block), then syncs and closes it. Sets *direct to whether O_DIRECT was in effect.
Status WriteByteLayout(const IoOptions& io, const std::string& path, const ByteLayout& layout,
                       const WriteLayoutOptions& options, bool* direct);

// How a single-file writer commits its file (CommitFile).
struct CommitFileOptions {
  bool overwrite = false;      // replace an existing file (else AlreadyExists)
  bool create_parents = true;  // create missing parent directories, durably
  uint64_t crc_end = 0;        // as WriteLayoutOptions
  std::function<void(uint32_t crc)> trailer = nullptr;
  uint64_t head_end = 0;  // as WriteLayoutOptions
  std::function<Status(const std::vector<uint32_t>& segment_crcs)> head = nullptr;
  ProgressFn progress = nullptr;  // payload bytes written / layout.payload_bytes()
  SaveStats* stats = nullptr;     // filled on success (bytes = payload bytes)
  // Writes the file instead of WriteByteLayout (e.g. encrypted), through `io` (the caller's, or
  // one that publishes the file only if absent); crc_end and trailer are then the writer's
  // business. Default: empty (WriteByteLayout).
  std::function<Status(const IoOptions& io, const std::string& tmp, Progress* progress,
                       bool* direct)>
      write = nullptr;
};

// The one path of the single-file writers (safetensors, MindSpore .ckpt): refuses a directory in
// the way or an existing file (unless overwriting), then the durable commit of a file
// (io/commit.h): the layout is written into a hidden temporary file beside `target` by
// WriteByteLayout, synced and renamed into place, and the directory synced. In object storage it
// is written in place and, unless overwriting, published only if absent (a writer that lost a
// race gets AlreadyExists). On an error nothing is left at `target` but what was there before.
// `context` prefixes errors; `start` is the call's start (statistics).
Status CommitFile(const IoOptions& io, const std::string& target, const ByteLayout& layout,
                  const CommitFileOptions& options, const std::string& context,
                  std::chrono::steady_clock::time_point start);

// zlib-compatible CRC-32 of `bytes`, continuing from `crc` (0 to start).
uint32_t Crc32Zlib(uint32_t crc, std::span<const std::byte> bytes);
// The CRC-32 of A followed by B from crc(A), crc(B) and B's length (zlib's crc32_combine).
uint32_t Crc32ZlibCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace savepoint::interop

#endif  // SAVEPOINT_INTEROP_BYTE_LAYOUT_H_
