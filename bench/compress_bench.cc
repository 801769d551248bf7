// compress_bench: compression ratio and single-thread speed of the per-chunk codecs
// (src/codec/codec.h) on realistic model weights.
//
//   compress_bench [--mib N] [--chunk-mib C] [--reps R] [--seed S]
//
// Generates three tensors (N MiB of f32 each, default 256; the bf16 one is half that):
//   f32         values drawn from N(0, 0.02), like freshly initialised transformer weights
//   bf16        the same values rounded to bfloat16 (round to nearest even)
//   sparse-f32  90% zeros, the rest drawn from N(0, 0.02)
// and for each of them, each codec {zstd-1, zstd-3, lz4} and each filter {none, shuffle},
// compresses the tensor in C-MiB chunks (default 8) with CompressChunk and decompresses it back
// with DecompressChunk, on one thread, checking every byte. A chunk CompressChunk reports
// incompressible is stored raw and "decompressed" with a memcpy, as the load path would.
//
// Prints a table: ratio = raw bytes / stored bytes; compress and decompress GB/s = raw bytes /
// wall seconds (best of R repetitions, default 2; includes the filter); memcpy GB/s = the same
// bytes copied chunk by chunk with memcpy (best of 3), as a reference; raw = chunks stored raw.
// Then a second table with the speed of Shuffle / Unshuffle alone. GB/s is 1e9 bytes per second.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "codec/codec.h"

namespace {

using savepoint::codec::Codec;
using savepoint::codec::CodecOptions;
using savepoint::codec::Filter;
using Bytes = std::vector<std::byte>;
using Clock = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;

struct Args {
  size_t mib = 256;
  size_t chunk_mib = 8;
  int reps = 2;
  uint64_t seed = 1;
};

[[noreturn]] void Die(const std::string& what) {
  fmt::print(stderr, "compress_bench: {}\n", what);
  std::exit(1);
}

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die("missing value for " + flag);
    const uint64_t v = std::strtoull(argv[++i], nullptr, 10);
    if (flag == "--mib") {
      args.mib = v;
    } else if (flag == "--chunk-mib") {
      args.chunk_mib = v;
    } else if (flag == "--reps") {
      args.reps = static_cast<int>(v);
    } else if (flag == "--seed") {
      args.seed = v;
    } else {
      Die("unknown flag " + flag +
          "\nusage: compress_bench [--mib N] [--chunk-mib C] [--reps R] [--seed S]");
    }
  }
  if (args.mib == 0 || args.chunk_mib == 0 || args.reps <= 0) Die("values must be positive");
  return args;
}

struct Tensor {
  std::string name;
  size_t elem_size;
  Bytes bytes;
};

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even (no NaNs here)
  return static_cast<uint16_t>(u >> 16);
}

std::vector<Tensor> MakeTensors(const Args& args) {
  const size_t count = args.mib * kMiB / 4;
  std::mt19937_64 rng(args.seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<Tensor> t = {{"f32", 4, Bytes(count * 4)},
                           {"bf16", 2, Bytes(count * 2)},
                           {"sparse-f32", 4, Bytes(count * 4)}};
  for (size_t i = 0; i < count; ++i) {
    const float v = normal(rng);
    const uint16_t h = ToBf16(v);
    std::memcpy(t[0].bytes.data() + 4 * i, &v, 4);
    std::memcpy(t[1].bytes.data() + 2 * i, &h, 2);
    const float s = rng() % 10 == 0 ? normal(rng) : 0.0f;
    std::memcpy(t[2].bytes.data() + 4 * i, &s, 4);
  }
  return t;
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Gbps(size_t bytes, double seconds) { return bytes / seconds / 1e9; }

// Calls fn() `reps` times and returns the fastest wall time.
template <typename Fn>
double Best(int reps, Fn fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const Clock::time_point start = Clock::now();
    fn();
    best = std::min(best, Seconds(start));
  }
  return best;
}

// Per-chunk output of one compression pass.
struct Chunk {
  std::span<const std::byte> raw;
  Bytes out;
  size_t stored = 0;
  bool compressed = false;
};

std::vector<Chunk> SplitChunks(const Bytes& data, size_t chunk_bytes, const CodecOptions& o) {
  std::vector<Chunk> chunks;
  for (size_t pos = 0; pos < data.size(); pos += chunk_bytes) {
    Chunk c;
    c.raw = std::span(data).subspan(pos, std::min(chunk_bytes, data.size() - pos));
    c.out.resize(savepoint::codec::MaxCompressedSize(o, c.raw.size()));
    chunks.push_back(std::move(c));
  }
  return chunks;
}

void CompressAll(const CodecOptions& o, size_t elem_size, std::vector<Chunk>& chunks,
                 Bytes& scratch) {
  for (Chunk& c : chunks) {
    auto r = savepoint::codec::CompressChunk(o, elem_size, c.raw, c.out, scratch);
    if (!r.ok()) Die("CompressChunk: " + r.status().ToString());
    c.stored = r->stored_bytes;
    c.compressed = r->compressed;
  }
}

void DecompressAll(const CodecOptions& o, size_t elem_size, const std::vector<Chunk>& chunks,
                   Bytes& dest, Bytes& scratch) {
  size_t pos = 0;
  for (const Chunk& c : chunks) {
    std::span<std::byte> out = std::span(dest).subspan(pos, c.raw.size());
    const savepoint::Status s =
        c.compressed ? savepoint::codec::DecompressChunk(
                           o, elem_size, std::span(c.out).first(c.stored), out, scratch)
                     : savepoint::codec::DecompressChunk({}, elem_size, c.raw, out, scratch);
    if (!s.ok()) Die("DecompressChunk: " + s.ToString());
    pos += c.raw.size();
  }
}

double MemcpyGbps(const Bytes& data, Bytes& dest, size_t chunk_bytes) {
  const double s = Best(3, [&] {
    for (size_t pos = 0; pos < data.size(); pos += chunk_bytes) {
      std::memcpy(dest.data() + pos, data.data() + pos, std::min(chunk_bytes, data.size() - pos));
    }
  });
  return Gbps(data.size(), s);
}

struct Config {
  std::string name;
  CodecOptions options;
};

void BenchOne(const Args& args, const Tensor& t, const Config& cfg, double memcpy_gbps, Bytes& dest,
              Bytes& scratch) {
  std::vector<Chunk> chunks = SplitChunks(t.bytes, args.chunk_mib * kMiB, cfg.options);
  const double cs =
      Best(args.reps, [&] { CompressAll(cfg.options, t.elem_size, chunks, scratch); });
  std::fill(dest.begin(), dest.end(), std::byte{0});
  const double ds =
      Best(args.reps, [&] { DecompressAll(cfg.options, t.elem_size, chunks, dest, scratch); });
  if (std::memcmp(dest.data(), t.bytes.data(), t.bytes.size()) != 0) {
    Die("round trip mismatch for " + t.name + " " + cfg.name);
  }
  size_t stored = 0;
  size_t raw_chunks = 0;
  for (const Chunk& c : chunks) {
    stored += c.stored;
    raw_chunks += c.compressed ? 0 : 1;
  }
  fmt::print("| {:<10} | {:<6} | {:<7} | {:>6.2f} | {:>13.2f} | {:>15.2f} | {:>11.2f} | {:>6} |\n",
             t.name, cfg.name, savepoint::codec::FilterName(cfg.options.filter),
             static_cast<double>(t.bytes.size()) / stored, Gbps(t.bytes.size(), cs),
             Gbps(t.bytes.size(), ds), memcpy_gbps,
             fmt::format("{}/{}", raw_chunks, chunks.size()));
  std::fflush(stdout);
}

void BenchShuffle(const Args& args, const std::vector<Tensor>& tensors, Bytes& dest) {
  fmt::print("\n| data       | elem | shuffle GB/s | unshuffle GB/s |\n");
  fmt::print("|------------|------|--------------|----------------|\n");
  const size_t chunk = args.chunk_mib * kMiB;
  Bytes tmp(chunk);
  for (const Tensor& t : tensors) {
    const Bytes& data = t.bytes;
    auto pass = [&](bool shuffle) {
      for (size_t pos = 0; pos < data.size(); pos += chunk) {
        const size_t n = std::min(chunk, data.size() - pos);
        if (shuffle) {
          savepoint::codec::Shuffle(t.elem_size, std::span(data).subspan(pos, n),
                                    std::span(dest).subspan(pos, n));
        } else {
          savepoint::codec::Unshuffle(t.elem_size, std::span(dest).subspan(pos, n),
                                      std::span(tmp).first(n));
        }
      }
    };
    const double s = Best(3, [&] { pass(true); });
    const double u = Best(3, [&] { pass(false); });
    fmt::print("| {:<10} | {:>4} | {:>12.2f} | {:>14.2f} |\n", t.name, t.elem_size,
               Gbps(data.size(), s), Gbps(data.size(), u));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  fmt::print("compress_bench: {} MiB of f32 (bf16: half), {} MiB chunks, best of {}, 1 thread\n",
             args.mib, args.chunk_mib, args.reps);
  const std::vector<Tensor> tensors = MakeTensors(args);
  const std::vector<Config> configs = {{"zstd-1", {Codec::kZstd, Filter::kNone, 1}},
                                       {"zstd-3", {Codec::kZstd, Filter::kNone, 3}},
                                       {"lz4", {Codec::kLz4, Filter::kNone, 1}}};
  Bytes dest(tensors[0].bytes.size());
  Bytes scratch(args.chunk_mib * kMiB);
  fmt::print("\n| {:<10} | {:<6} | {:<7} | {:>6} | {:>13} | {:>15} | {:>11} | {:>6} |\n", "data",
             "codec", "filter", "ratio", "compress GB/s", "decompress GB/s", "memcpy GB/s", "raw");
  fmt::print("|{:-<12}|{:-<8}|{:-<9}|{:-<8}|{:-<15}|{:-<17}|{:-<13}|{:-<8}|\n", "", "", "", "", "",
             "", "", "");
  for (const Tensor& t : tensors) {
    const double memcpy_gbps = MemcpyGbps(t.bytes, dest, args.chunk_mib * kMiB);
    for (const Config& c : configs) {
      for (Filter f : {Filter::kNone, Filter::kShuffle}) {
        Config cf = c;
        cf.options.filter = f;
        BenchOne(args, t, cf, memcpy_gbps, dest, scratch);
      }
    }
  }
  BenchShuffle(args, tensors, dest);
  return 0;
}
