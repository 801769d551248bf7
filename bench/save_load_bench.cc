// save_load_bench: end-to-end throughput of Save, Load, Verify and LoadInto on a real file system.
//
//   save_load_bench --dir DIR --bytes N [--tensors K] [--threads T] [--chunk-mb C] [--no-direct]
//                   [--json] [--phases LIST] [--keep-cache] [--seed S]
//                   [--compression none|zstd|lz4] [--fill random|f32|bf16|sparse]
//
// Generates a training-like state of N bytes (rounded down to a multiple of 4; K large tensors
// alternating F32 and BF16, default one per ~64 MiB, filled with xorshift data; plus four small
// odd-sized tensors and a few values), then runs the phases (default save,load,verify,loadinto, in
// the order given; save always runs first, and any phase may repeat):
//   save        Save to DIR/ckpt (durable when it returns: includes every fsync and the commit)
//   load        Load with CRC32C verification into freshly allocated tensors
//   verify      VerifyCheckpoint (re-reads and checksums every chunk, keeps nothing)
//   loadinto    LoadInto preallocated, already-touched aligned tensors (verified)
//   load-nocrc  Load with verify_checksums = false (isolates the checksum cost; not by default)
//   load-mmap   Load with LoadOptions::mmap (zero-copy views into the mapped data file, every chunk
//               verified, so every page is read; not by default)
//   mmap-one    cold: CheckpointReader::Open + MapTensor(first large tensor, verify = false) +
//               reading one byte of each of its 4 KiB pages; prints open_ms, map_ms, touch_ms
//               (not by default; bytes= is that tensor's size)
//   async       Checkpointer::SaveAsync twice to DIR/ckpt-async (removed in between): the first
//               save warms the staging pool, the second is timed: "async-stall" is the time the
//               caller is blocked in SaveAsync, "async-first-stall" the same for the first save,
//               "async-persist" the second save until durable (Wait) (not by default)
//   async-reserved  a new Checkpointer that first reserves staging memory for the state
//               (Checkpointer::Reserve, as a manager does when objects are registered) and is
//               given the time to finish it (training would run meanwhile; reserve_seconds=),
//               then one SaveAsync: "async-reserved-first-stall" (not by default)
//   memcpy      single-threaded memcpy of every tensor into one preallocated, already-touched
//               buffer: the reference for async-stall (not by default)
//   enc-save, enc-load, enc-verify, enc-loadinto  the same phases on an encrypted checkpoint
//               (SaveOptions::key / LoadOptions::key, a fixed 32-byte key; DIR/ckpt-enc). A phase
//               may be listed several times (enc-save replaces the encrypted checkpoint); at the
//               end a line "enc-ratio" gives, per phase, the median GB/s encrypted over the median
//               unencrypted (list both, interleaved, e.g.
//               save,enc-save,load,enc-load,load,enc-load; not by default)
// Before every read phase the checkpoint is dropped from the page cache: posix_fadvise(DONTNEED)
// on each of its files, plus `echo 1 > /proc/sys/vm/drop_caches` when that file is writable
// (unless --keep-cache). Every loaded byte is compared with the generated state; a mismatch
// exits 2. The checkpoint is removed at the end (also on failure).
//
// --compression saves with that codec (byte-shuffle auto, zstd level 1). --fill chooses the data:
// random (default: xorshift bytes, incompressible), f32 / bf16 (every large tensor of that dtype,
// holding weights-like values ~N(0, 0.02)), sparse (f32 weights, 99% zeros).
//
// Sizes accept a K/M/G/T suffix (binary). Throughput is tensor bytes / wall seconds of the call,
// in GB/s (1e9 bytes per second), the unit dd prints.
//
// Output: one line per measurement,
//   save       bytes=2147483648 seconds=1.2345 gbps=1.740 io_seconds=1.2301 chunks=256 direct=1
// or, with --json, one JSON object (see PrintJson).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "savepoint/savepoint.h"
#include "timer.h"

namespace {

using namespace savepoint;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Args {
  std::string dir;
  uint64_t bytes = 0;
  uint64_t tensors = 0;  // 0 = one per ~64 MiB
  int threads = IoOptions{}.io_threads;
  uint64_t chunk_bytes = SaveOptions{}.chunk_bytes;
  bool direct = true;
  bool json = false;
  bool drop_caches = true;
  uint64_t seed = 42;
  std::vector<std::string> phases = {"save", "load", "verify", "loadinto"};
  Compression compression;
  std::string fill = "random";

  // --threads and --no-direct, for every call and Checkpointer.
  IoOptions Io() const { return IoOptions{.io_threads = threads, .direct_io = direct}; }
};

struct Measurement {
  explicit Measurement(std::string n) : name(std::move(n)) {}
  std::string name;
  uint64_t bytes = 0;
  double seconds = 0;  // wall time around the call, as the caller sees it
  double io_seconds =
      0;  // SaveStats / LoadStats::seconds (the library's own timing of its data path)
  uint64_t chunks = 0;
  bool direct = false;
  uint64_t stored_bytes = 0;  // after compression
  double user_seconds = 0;    // CPU time of the whole process (all threads) during the call
  double sys_seconds = 0;
  std::string extra;  // more "key=value" fields for the line (phase-specific)
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(
      error.empty() ? stdout : stderr,
      "%s%s"
      "usage: save_load_bench --dir DIR --bytes N [--tensors K] [--threads T] "
      "[--chunk-mb C] [--no-direct] [--json] "
      "[--phases save,load,verify,loadinto,load-nocrc,load-mmap,mmap-one,async,memcpy] "
      "[--keep-cache] [--seed S]\n",
      error.empty() ? "" : "save_load_bench: ", error.empty() ? "" : (error + "\n").c_str());
  std::exit(error.empty() ? 0 : 64);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "save_load_bench: %s\n", what.c_str());
  std::exit(1);
}

std::optional<uint64_t> ParseSize(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || s[0] == '-') return std::nullopt;
  std::string suffix(end);
  int shift = 0;
  if (suffix.empty()) {
    shift = 0;
  } else if (suffix == "K" || suffix == "k" || suffix == "KiB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "t" || suffix == "TiB") {
    shift = 40;
  } else {
    return std::nullopt;
  }
  if (shift > 0 && v > (~uint64_t{0} >> shift)) return std::nullopt;
  return static_cast<uint64_t>(v) << shift;
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) Usage(fmt::format("{} needs a value", argv[i]));
    return argv[++i];
  };
  auto size = [&](int& i) -> uint64_t {
    std::string flag = argv[i];
    std::string v = value(i);
    std::optional<uint64_t> n = ParseSize(v);
    if (!n) Usage(fmt::format("{} {}: not a size", flag, v));
    return *n;
  };
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--dir") {
      a.dir = value(i);
    } else if (f == "--bytes") {
      a.bytes = size(i);
    } else if (f == "--tensors") {
      a.tensors = size(i);
    } else if (f == "--threads") {
      uint64_t t = size(i);
      if (t < 1 || t > 64) Usage("--threads must be in [1, 64]");
      a.threads = static_cast<int>(t);
    } else if (f == "--chunk-mb") {
      uint64_t c = size(i);
      if (c < 1 || c > 1024) Usage("--chunk-mb must be in [1, 1024]");
      a.chunk_bytes = c * kMiB;
    } else if (f == "--chunk-kb") {  // finer control (multiple of 4)
      uint64_t c = size(i);
      if (c < 4 || c % 4 != 0 || c > 1024 * 1024)
        Usage("--chunk-kb must be a multiple of 4 in [4, 1048576]");
      a.chunk_bytes = c << 10;
    } else if (f == "--compression") {
      std::string c = value(i);
      if (c != "none" && c != "zstd" && c != "lz4") Usage("--compression must be none|zstd|lz4");
      a.compression.codec = c == "zstd"  ? Compression::Codec::kZstd
                            : c == "lz4" ? Compression::Codec::kLz4
                                         : Compression::Codec::kNone;
    } else if (f == "--fill") {
      a.fill = value(i);
      if (a.fill != "random" && a.fill != "f32" && a.fill != "bf16" && a.fill != "sparse")
        Usage("--fill must be random|f32|bf16|sparse");
    } else if (f == "--no-direct") {
      a.direct = false;
    } else if (f == "--json") {
      a.json = true;
    } else if (f == "--keep-cache") {
      a.drop_caches = false;
    } else if (f == "--seed") {
      a.seed = size(i);
    } else if (f == "--phases") {
      a.phases = SplitComma(value(i));
      for (const auto& p : a.phases) {
        static const char* const kPhases[] = {
            "save",      "load",     "verify",     "loadinto",    "load-nocrc",
            "load-mmap", "mmap-one", "async",      "memcpy",      "async-reserved",
            "enc-save",  "enc-load", "enc-verify", "enc-loadinto"};
        if (std::find(std::begin(kPhases), std::end(kPhases), p) == std::end(kPhases)) {
          Usage(fmt::format("unknown phase {:?}", p));
        }
      }
    } else if (f == "-h" || f == "--help") {
      Usage("");
    } else {
      Usage(fmt::format("unknown argument {:?}", f));
    }
  }
  if (a.dir.empty()) Usage("--dir is required");
  if (a.bytes < kMiB) Usage("--bytes is required and must be at least 1 MiB");
  if (a.tensors == 0) a.tensors = std::max<uint64_t>(1, (a.bytes + 64 * kMiB - 1) / (64 * kMiB));
  // The four small tensors take 25064 bytes; every large one at least 4 KiB.
  if (a.tensors > (a.bytes - 25064) / 4096)
    Usage("--tensors too large for --bytes (tensors must be >= 4 KiB)");
  return a;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Fills m.seconds, m.user_seconds and m.sys_seconds from `t`.
void Stop(const bench::Timer& t, Measurement* m) {
  m->seconds = t.seconds();
  std::tie(m->user_seconds, m->sys_seconds) = t.cpu_seconds();
}

// xorshift64 fill: deterministic, fast (several GB/s per core), not compressible, never all zero.
void Fill(std::byte* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (x == 0) x = 1;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
}

// Weights-like values ~N(0, 0.02) (Irwin-Hall of 4 uniforms) as f32, or bf16 (truncated); with
// `sparse`, 99% of them are zero.
void FillWeights(const TensorView& t, uint64_t seed, bool sparse) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const bool bf16 = t.dtype() == DType::kBF16;
  const int64_t n = static_cast<int64_t>(t.nbytes() / (bf16 ? 2 : 4));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = next();
    float u = 0;
    for (int k = 0; k < 4; ++k) u += static_cast<float>((r >> (16 * k)) & 0xffff) / 65536.0f;
    float v = sparse && next() % 100 != 0 ? 0.0f : (u - 2.0f) * 1.7320508f * 0.02f;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (bf16) {
      uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(t.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(t.data() + 4 * i, &bits, 4);
    }
  }
}

struct Spec {
  std::string name;
  DType dtype;
  Shape shape;
};

// The tensors of the generated state: `bytes` in total, `k` large tensors plus four small ones.
std::vector<Spec> MakeSpecs(uint64_t bytes, uint64_t k, const std::string& fill) {
  // Small tensors, as in a real model (norm weights, biases, a step counter): odd sizes that are
  // not multiples of 4 KiB, so they take the library's staging-buffer path.
  std::vector<Spec> small = {
      {"model.final_norm.weight", DType::kF32, {1000}},
      {"model.lm_head.bias", DType::kBF16, {3, 778}},
      {"optimizer.state.step", DType::kI64, {}},
      {"model.layers.0.attn.rotary.inv_freq", DType::kF32, {4097}},
  };
  uint64_t small_bytes = 0;
  for (const auto& s : small) small_bytes += NumBytes(s.dtype, s.shape).value();
  uint64_t big = bytes - small_bytes;  // ParseArgs ensures bytes >= small_bytes + 4096 * k
  uint64_t per = big / k / 4096 * 4096;
  std::vector<Spec> specs;
  uint64_t used = 0;
  for (uint64_t i = 0; i < k; ++i) {
    DType dt = fill == "bf16"     ? DType::kBF16
               : fill == "random" ? (i % 2 == 0 ? DType::kF32 : DType::kBF16)
                                  : DType::kF32;
    uint64_t esize = DTypeSize(dt);
    uint64_t nb = i + 1 < k ? per : (big - used) / 4 * 4;
    int64_t elems = static_cast<int64_t>(nb / esize);
    Shape shape = elems % 1024 == 0 ? Shape{elems / 1024, 1024} : Shape{elems};
    std::string name = i % 4 == 0   ? fmt::format("model.layers.{}.mlp.fc.weight", i / 4)
                       : i % 4 == 1 ? fmt::format("model.layers.{}.attn.qkv.weight", i / 4)
                       : i % 4 == 2 ? fmt::format("optimizer.state.{}.exp_avg", i / 4)
                                    : fmt::format("optimizer.state.{}.exp_avg_sq", i / 4);
    specs.push_back({name, dt, shape});
    used += nb;
  }
  for (auto& s : small) specs.push_back(std::move(s));
  return specs;
}

State MakeState(const Args& a) {
  std::vector<Spec> specs = MakeSpecs(a.bytes, a.tensors, a.fill);
  std::vector<Tensor> tensors;
  for (const auto& s : specs) {
    Result<Tensor> t = Tensor::Empty(s.dtype, s.shape);
    if (!t.ok()) Die(t.status().ToString());
    tensors.push_back(std::move(t).value());
  }
  // Fill in parallel: tensor i on thread i % hw.
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < hw; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = w; i < tensors.size(); i += hw) {
        bool weights = a.fill != "random" && i < a.tensors;  // the large tensors
        if (weights) {
          FillWeights(tensors[i].view(), a.seed + i, a.fill == "sparse");
        } else {
          Fill(tensors[i].data(), tensors[i].nbytes(), a.seed + i);
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  State state;
  for (size_t i = 0; i < specs.size(); ++i) {
    Status s = state.Put(specs[i].name, std::move(tensors[i]));
    if (!s.ok()) Die(s.ToString());
  }
  auto put = [&](const std::string& n, Value v) {
    Status s = state.PutValue(n, std::move(v));
    if (!s.ok()) Die(s.ToString());
  };
  put("step", int64_t{1000});
  put("epoch", int64_t{3});
  put("optimizer.lr", 3e-4);
  put("rng.cpu", Bytes{std::vector<uint8_t>(5056, 7)});
  put("run.name", std::string("save_load_bench"));
  state.metadata() = Json{{"generator", "save_load_bench"}, {"bytes", a.bytes}, {"seed", a.seed}};
  return state;
}

// Drops the files under `dir` from the page cache. Returns the method used.
std::string DropCaches(const std::string& dir, bool global) {
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);  // dirty pages cannot be dropped
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  if (!global) return "fadvise";
  ::sync();
  FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (f == nullptr) return "fadvise";
  bool ok = std::fputs("1\n", f) >= 0;
  ok = std::fclose(f) == 0 && ok;
  return ok ? "fadvise+drop_caches" : "fadvise";
}

// Compares every tensor, value and the metadata of `got` with `want`. Exits 2 on a mismatch.
void Compare(const State& want, const State& got, const char* phase) {
  if (want.size() != got.size()) {
    std::fprintf(stderr, "save_load_bench: %s: %zu entries, expected %zu\n", phase, got.size(),
                 want.size());
    std::exit(2);
  }
  for (const auto& [name, e] : want.entries()) {
    const State::Entry* g = got.Find(name);
    bool same = g != nullptr && g->is_tensor() == e.is_tensor();
    if (same && e.is_tensor()) {
      const TensorView& a = e.tensor();
      const TensorView& b = g->tensor();
      same = a.dtype() == b.dtype() && a.shape() == b.shape() &&
             std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
    } else if (same) {
      same = e.value() == g->value();
    }
    if (!same) {
      std::fprintf(stderr, "save_load_bench: %s: entry \"%s\" differs from the generated state\n",
                   phase, name.c_str());
      std::exit(2);
    }
  }
  if (want.metadata() != got.metadata()) {
    std::fprintf(stderr, "save_load_bench: %s: metadata differs\n", phase);
    std::exit(2);
  }
}

// The checkpoints to remove at exit (normal or through Die/Compare's std::exit), with any hidden
// temporary or old directories a failed save left beside them.
std::vector<std::string> g_ckpts;

void RemoveOne(const std::string& ckpt) {
  std::error_code ec;
  fs::remove_all(ckpt, ec);
  fs::path parent = fs::path(ckpt).parent_path();
  std::string prefix = "." + fs::path(ckpt).filename().string() + ".savepoint-";
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
  }
}

void RemoveCheckpoint() {
  for (const std::string& c : g_ckpts) RemoveOne(c);
}

// Copies what the library measured into `m` (SaveStats or LoadStats).
template <typename Stats>
void Record(Measurement* m, const Stats& st) {
  m->bytes = st.bytes;
  m->io_seconds = st.seconds;
  m->chunks = st.chunks;
  m->direct = st.direct_io;
  m->stored_bytes = st.stored_bytes;
}

void PrintLine(const Measurement& m) {
  std::printf(
      "%-10s bytes=%llu seconds=%.4f gbps=%.3f io_seconds=%.4f chunks=%llu direct=%d "
      "user=%.3f sys=%.3f stored=%llu%s%s\n",
      m.name.c_str(), static_cast<unsigned long long>(m.bytes), m.seconds, m.gbps(), m.io_seconds,
      static_cast<unsigned long long>(m.chunks), m.direct ? 1 : 0, m.user_seconds, m.sys_seconds,
      static_cast<unsigned long long>(m.stored_bytes), m.extra.empty() ? "" : " ", m.extra.c_str());
  std::fflush(stdout);
}

void PrintJson(const Args& a, const std::string& cache_method, uint64_t tensor_bytes,
               size_t tensors, double gen_seconds, const std::vector<Measurement>& ms) {
  Json results = Json::array();
  for (const auto& m : ms) {
    results.push_back({{"name", m.name},
                       {"bytes", m.bytes},
                       {"seconds", m.seconds},
                       {"gbps", m.gbps()},
                       {"io_seconds", m.io_seconds},
                       {"chunks", m.chunks},
                       {"direct_io", m.direct},
                       {"user_seconds", m.user_seconds},
                       {"sys_seconds", m.sys_seconds},
                       {"stored_bytes", m.stored_bytes},
                       {"extra", m.extra}});
  }
  Json j = {{"dir", a.dir},
            {"bytes", tensor_bytes},
            {"tensors", tensors},
            {"threads", a.threads},
            {"chunk_bytes", a.chunk_bytes},
            {"direct_io_requested", a.direct},
            {"cache_drop", cache_method},
            {"generate_seconds", gen_seconds},
            {"results", results}};
  std::printf("%s\n", j.dump().c_str());
}

// Single-threaded memcpy of every tensor of `state` into one touched buffer (the reference for the
// async stall: the least a snapshot that copies the state can cost).
Measurement MemcpyPhase(const State& state) {
  const uint64_t total = state.tensor_bytes();
  std::byte* dst = static_cast<std::byte*>(std::aligned_alloc(4096, (total + 4095) / 4096 * 4096));
  if (dst == nullptr) Die("memcpy: out of memory");
  std::memset(dst, 1, total);
  Measurement m{"memcpy"};
  bench::Timer t;
  uint64_t off = 0;
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    std::memcpy(dst + off, e.tensor().data(), e.tensor().nbytes());
    off += e.tensor().nbytes();
  }
  Stop(t, &m);
  m.bytes = total;
  volatile std::byte sink = dst[total / 2];  // keep the copy observable
  (void)sink;
  std::free(dst);
  return m;
}

// Two SaveAsync calls (see the file comment); returns async-first-stall, async-stall and
// async-persist.
std::vector<Measurement> AsyncPhase(const Args& a, const State& state, const std::string& path,
                                    const std::function<void(const Status&, const char*)>& check) {
  Result<std::unique_ptr<Checkpointer>> ckptr = Checkpointer::Create({}, a.Io());
  check(ckptr.status(), "create checkpointer");
  std::vector<Measurement> out;
  for (const char* name : {"async-first-stall", "async-stall"}) {
    RemoveOne(path);
    Measurement stall{name};
    bench::Timer t;
    Result<SaveHandle> h = (*ckptr)->SaveAsync(state, path);
    Stop(t, &stall);
    check(h.status(), "SaveAsync");
    check(h->Wait(), "SaveAsync (background)");
    const SaveStats st = h->stats();
    stall.bytes = st.bytes;
    stall.direct = st.direct_io;
    stall.extra =
        fmt::format("blocked_seconds={:.4f} snapshot_seconds={:.4f} persist_seconds={:.4f}",
                    st.blocked_seconds, st.snapshot_seconds, st.seconds);
    out.push_back(stall);
    if (std::string(name) == "async-stall") {
      Measurement persist{"async-persist"};
      persist.bytes = st.bytes;
      persist.seconds = st.seconds;
      persist.direct = st.direct_io;
      out.push_back(persist);
    }
  }
  RemoveOne(path);
  return out;
}

// A fresh Checkpointer reserves staging memory for the state, then the first SaveAsync is timed.
Measurement AsyncReservedPhase(const Args& a, const State& state, const std::string& path,
                               const std::function<void(const Status&, const char*)>& check) {
  Result<std::unique_ptr<Checkpointer>> ckptr = Checkpointer::Create({}, a.Io());
  check(ckptr.status(), "create checkpointer");
  Checkpointer& c = **ckptr;
  const uint64_t want = std::min(state.tensor_bytes(), c.staging_cap_bytes());
  const auto t0 = std::chrono::steady_clock::now();
  c.Reserve(state.tensor_bytes());
  while (c.staging_allocated_bytes() < want) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double reserve_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RemoveOne(path);
  Measurement stall{"async-reserved-first-stall"};
  bench::Timer t;
  Result<SaveHandle> h = c.SaveAsync(state, path);
  Stop(t, &stall);
  check(h.status(), "SaveAsync");
  check(h->Wait(), "SaveAsync (background)");
  stall.bytes = h->stats().bytes;
  stall.direct = h->stats().direct_io;
  stall.extra = fmt::format("reserve_seconds={:.4f}", reserve_seconds);
  RemoveOne(path);
  return stall;
}

// Cold Open + MapTensor(verify = false) of the first large tensor + one read per 4 KiB page.
Measurement MmapOnePhase(const State& state, const std::string& ckpt,
                         const std::function<void(const Status&, const char*)>& check) {
  std::string name;
  const TensorView* want = nullptr;
  for (const auto& [n, e] : state.entries()) {
    if (e.is_tensor() && (want == nullptr || e.tensor().nbytes() > want->nbytes())) {
      name = n;
      want = &e.tensor();
    }
  }
  Measurement m{"mmap-one"};
  bench::Timer t;
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(ckpt);
  check(reader.status(), "mmap-one: open");
  const double open_s = Since(t0);
  Result<TensorView> view = (*reader)->MapTensor(name, /*verify=*/false);
  check(view.status(), "mmap-one: map");
  const double map_s = Since(t0) - open_s;
  const volatile std::byte* p = view->data();
  unsigned sum = 0;
  for (uint64_t i = 0; i < view->nbytes(); i += 4096) sum += static_cast<unsigned>(p[i]);
  Stop(t, &m);
  const double touch_s = m.seconds - open_s - map_s;
  if (std::memcmp(view->data(), want->data(), want->nbytes()) != 0) {
    Die(fmt::format("mmap-one: tensor {} differs from the generated state", name));
  }
  m.bytes = want->nbytes();
  m.extra = fmt::format("open_ms={:.2f} map_ms={:.2f} touch_ms={:.2f} tensor={} sum={}",
                        open_s * 1e3, map_s * 1e3, touch_s * 1e3, name, sum % 10);
  return m;
}

bool Has(const Args& a, const std::string& phase) {
  return std::find(a.phases.begin(), a.phases.end(), phase) != a.phases.end();
}

// The median GB/s of the measurements named `name` (0 when there is none).
double MedianGbps(const std::vector<Measurement>& ms, const std::string& name) {
  std::vector<double> v;
  for (const Measurement& m : ms) {
    if (m.name == name) v.push_back(m.gbps());
  }
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// "enc-ratio save=0.950 load=0.970 ...": encrypted / unencrypted median GB/s per phase measured
// both ways.
std::string EncryptionRatios(const std::vector<Measurement>& ms) {
  std::string out;
  for (const char* phase : {"save", "load", "verify", "loadinto"}) {
    const double plain = MedianGbps(ms, phase), enc = MedianGbps(ms, std::string("enc-") + phase);
    if (plain > 0 && enc > 0) out += fmt::format(" {}={:.3f}", phase, enc / plain);
  }
  return out.empty() ? out : "enc-ratio" + out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = ParseArgs(argc, argv);
  std::error_code ec;
  fs::create_directories(a.dir, ec);
  if (ec) Die(fmt::format("create {}: {}", a.dir, ec.message()));
  const std::string ckpt = (fs::path(a.dir) / "ckpt").string();
  if (fs::exists(ckpt)) Die(fmt::format("{} already exists; remove it first", ckpt));
  const std::string async_ckpt = ckpt + "-async";
  if (fs::exists(async_ckpt)) Die(fmt::format("{} already exists; remove it first", async_ckpt));
  const std::string enc_ckpt = ckpt + "-enc";
  if (fs::exists(enc_ckpt)) Die(fmt::format("{} already exists; remove it first", enc_ckpt));
  g_ckpts = {ckpt, async_ckpt, enc_ckpt};
  const EncryptionKey key =
      EncryptionKey::FromBytes(std::string("save_load_bench-key-0123456789ab"));
  std::atexit(RemoveCheckpoint);

  auto t0 = std::chrono::steady_clock::now();
  const State state = MakeState(a);
  const double gen_seconds = Since(t0);
  const uint64_t tensor_bytes = state.tensor_bytes();

  std::vector<Measurement> ms;
  std::string cache_method = "none";
  auto report = [&](Measurement m) {
    if (!a.json) PrintLine(m);
    ms.push_back(std::move(m));
  };
  auto check = [&](const Status& s, const char* what) {
    if (!s.ok()) Die(fmt::format("{}: {}", what, s.ToString()));
  };
  const IoOptions io = a.Io();
  auto cold = [&](const std::string& path) { cache_method = DropCaches(path, a.drop_caches); };
  // Saves to `path` (encrypted when `encrypt`), replacing what is there.
  auto save = [&](const std::string& name, const std::string& path, bool encrypt) {
    RemoveOne(path);
    SaveStats st;
    SaveOptions so;
    so.chunk_bytes = a.chunk_bytes;
    so.compression = a.compression;
    so.stats = &st;
    if (encrypt) so.key = key;
    Measurement m{name};
    bench::Timer t;
    check(Save(state, path, so, io), name.c_str());
    Stop(t, &m);
    Record(&m, st);
    return m;
  };

  // (a) Save.
  {
    Measurement m = save("save", ckpt, false);
    if (Has(a, "save")) report(m);
  }
  // (b)-(e) The read phases, in the order --phases lists them (a phase may be listed twice).
  bool saved = false;  // the first "save" is (a); a later one saves again
  for (const std::string& listed : a.phases) {
    if (listed == "save" || listed == "enc-save") {
      const bool enc = listed == "enc-save";
      if (enc || std::exchange(saved, true)) report(save(listed, enc ? enc_ckpt : ckpt, enc));
      continue;
    }
    // enc-<phase>: <phase> on the encrypted checkpoint (saved first if no enc-save came before).
    const bool enc = listed.rfind("enc-", 0) == 0;
    const std::string phase = enc ? listed.substr(4) : listed;
    const std::string& path = enc ? enc_ckpt : ckpt;
    if (enc && !fs::exists(enc_ckpt)) save("enc-save", enc_ckpt, true);
    if (phase == "memcpy") {
      report(MemcpyPhase(state));
      continue;
    }
    if (phase == "async") {
      for (Measurement& am : AsyncPhase(a, state, async_ckpt, check)) report(std::move(am));
      continue;
    }
    if (phase == "async-reserved") {
      report(AsyncReservedPhase(a, state, async_ckpt, check));
      continue;
    }
    if (phase == "mmap-one") {
      cold(ckpt);
      report(MmapOnePhase(state, ckpt, check));
      continue;
    }
    Measurement m{listed};
    LoadStats st;
    LoadOptions o;
    o.stats = &st;
    if (enc) o.key = key;
    if (phase == "load" || phase == "load-nocrc" || phase == "load-mmap") {
      // Load into fresh tensors (allocation and first-touch page faults are part of the cost), or
      // with mmap into views of the mapped file (page-cache faults instead).
      o.verify_checksums = phase != "load-nocrc";
      o.mmap = phase == "load-mmap";
      cold(path);
      bench::Timer t;
      Result<State> loaded = Load(path, o, io);
      Stop(t, &m);
      check(loaded.status(), phase.c_str());
      Compare(state, *loaded, phase.c_str());
    } else if (phase == "verify") {
      cold(path);
      bench::Timer t;
      check(VerifyCheckpoint(path, o, io), "verify");
      Stop(t, &m);
    } else if (phase == "loadinto") {
      // LoadInto preallocated, already-touched aligned tensors (a training loop resuming).
      State targets;
      for (const auto& [name, e] : state.entries()) {
        if (!e.is_tensor()) continue;
        Result<Tensor> t = Tensor::Zeros(e.tensor().dtype(), e.tensor().shape());
        check(t.status(), "allocate targets");
        check(targets.Put(name, std::move(t).value()), "allocate targets");
      }
      cold(path);
      bench::Timer t;
      check(LoadInto(path, targets, o, io), "loadinto");
      Stop(t, &m);
      Compare(state, targets, "loadinto");
    }
    Record(&m, st);
    report(m);
  }
  if (a.json) {
    PrintJson(a, cache_method, tensor_bytes, state.num_tensors(), gen_seconds, ms);
  } else {
    std::printf(
        "# %llu tensor bytes in %zu tensors, threads=%d chunk=%llu KiB direct_io=%s "
        "cache_drop=%s (generated in %.2f s)\n",
        static_cast<unsigned long long>(tensor_bytes), state.num_tensors(), a.threads,
        static_cast<unsigned long long>(a.chunk_bytes >> 10), a.direct ? "requested" : "off",
        cache_method.c_str(), gen_seconds);
    const std::string ratios = EncryptionRatios(ms);
    if (!ratios.empty()) std::printf("%s\n", ratios.c_str());
  }
  return 0;
}
