// Distributed save and load under the thread communicator: random layouts saved with N ranks and
// loaded with M, replica dedup, failing and dead ranks, bad layouts, missing files.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "distributed/descriptor.h"
#include "distributed/merge.h"
#include "engine/box.h"
#include "engine/reader.h"
#include "format/manifest.h"
#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/distributed.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"
#include "testutil/write_hook_fs.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using namespace std::chrono_literals;

IoOptions Io(FileSystem* fs) { return IoOptions{.fs = fs, .io_threads = 3, .direct_io = false}; }

using testing::OnRanks;

// Counts the bytes written to data files.
class CountingFs final : public testing::WriteHookFileSystem {
 public:
  using WriteHookFileSystem::WriteHookFileSystem;
  void OnWrite(const std::string& path, uint64_t bytes) override {
    if (path.find("/data-") != std::string::npos) written += bytes;
  }
  std::atomic<uint64_t> written{0};
};

// A random job: global tensors and, for a world size, each rank's layout and local tensors.
struct Job {
  std::map<std::string, Tensor> global;

  // A DP x TP layout over `world` ranks: every tensor is split (unevenly) along a random dim into
  // tp parts; ranks with equal r % tp are replicas. One tensor stays unsharded (no layout).
  std::vector<ShardLayout> Layouts(int world, std::mt19937_64& rng) const {
    std::vector<int> divisors;
    for (int d = 1; d <= world; ++d) {
      if (world % d == 0) divisors.push_back(d);
    }
    int tp = divisors[rng() % divisors.size()];
    std::vector<ShardLayout> out(world);
    for (const auto& [name, t] : global) {
      if (name == "unsharded" || t.shape().empty()) continue;
      int dim = static_cast<int>(rng() % t.shape().size());
      for (int r = 0; r < world; ++r) {
        std::vector<int> reps;
        for (int q = r % tp; q < world; q += tp) reps.push_back(q);
        out[r][name] = SplitDim(t.shape(), dim, tp, r % tp, reps).value();
      }
    }
    return out;
  }

  // The local state of a rank: copies of its boxes (and the unsharded tensors whole).
  State Local(const ShardLayout& layout) const {
    State s;
    for (const auto& [name, g] : global) {
      auto it = layout.find(name);
      if (it == layout.end()) {
        EXPECT_TRUE(s.Put(name, Tensor::CopyOf(g.view()).value()).ok());
        continue;
      }
      Tensor t = Tensor::Empty(g.dtype(), it->second.sizes).value();
      Shape zero(g.shape().size(), 0);
      engine::CopyRegion({g.data(), g.shape(), it->second.offsets, 0},
                         {t.data(), t.shape(), zero, 0}, it->second.sizes, DTypeSize(g.dtype()));
      EXPECT_TRUE(s.Put(name, std::move(t)).ok());
    }
    EXPECT_TRUE(s.PutValue("step", Value(int64_t{42})).ok());
    return s;
  }

  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& [name, t] : global) n += t.nbytes();
    return n;
  }
};

Job RandomJob(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Job job;
  DType dtypes[] = {DType::kF32, DType::kU8, DType::kBF16, DType::kF64};
  int n = 2 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    Shape shape(1 + rng() % 3);
    for (auto& d : shape) d = 1 + static_cast<int64_t>(rng() % 37);
    Tensor t = Tensor::Empty(dtypes[rng() % 4], shape).value();
    testing::FillPattern(t.view(), rng());
    job.global.emplace("t" + std::to_string(i), std::move(t));
  }
  Tensor u = Tensor::Empty(DType::kI32, {5}).value();
  testing::FillPattern(u.view(), seed);
  job.global.emplace("unsharded", std::move(u));
  return job;
}

Status SaveJob(const Job& job, const std::vector<ShardLayout>& layouts, const std::string& path,
               const DistributedSaveOptions& o, const IoOptions& io) {
  std::vector<State> locals;
  for (const auto& l : layouts) locals.push_back(job.Local(l));
  auto st = OnRanks(static_cast<int>(layouts.size()), [&](Communicator& c) {
    return SaveDistributed(c, locals[c.rank()], layouts[c.rank()], path, o, io);
  });
  for (const auto& s : st) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

// Loads every rank's layout and compares with the global tensors.
void ExpectLoadsMatch(const Job& job, const std::vector<ShardLayout>& layouts,
                      const std::string& path, FileSystem* fs) {
  for (size_t r = 0; r < layouts.size(); ++r) {
    State want = job.Local(layouts[r]);
    State got;
    for (const auto& [name, e] : want.entries()) {
      if (e.is_tensor()) {
        ASSERT_TRUE(
            got.Put(name, Tensor::Zeros(e.tensor().dtype(), e.tensor().shape()).value()).ok());
      }
    }
    SP_ASSERT_OK(LoadDistributed(path, got, layouts[r], {}, Io(fs)));
    EXPECT_TRUE(testing::StatesEqual(want, got)) << "rank " << r;
  }
}

TEST(DistributedTest, RandomLayoutsSaveNLoadM) {
  uint64_t seed = testing::TestSeed("DistributedTest.RandomLayoutsSaveNLoadM");
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 12; ++iter) {
    MemFileSystem mem;
    Job job = RandomJob(rng());
    int n = 1 + static_cast<int>(rng() % 6), m = 1 + static_cast<int>(rng() % 6);
    auto save_layouts = job.Layouts(n, rng);
    CountingFs fs(&mem);
    DistributedSaveOptions o;
    // Packed small shards, the classic layout, and the indexed manifest (fixed and compact).
    const uint32_t version = std::array<uint32_t, 4>{2, 1, 3, 4}[iter % 4];
    o.save = SaveOptions{.chunk_bytes = 4096, .format_version = version};
    SCOPED_TRACE(
        fmt::format("iteration {}: {} ranks -> {} ranks, format version {}", iter, n, m, version));
    SP_ASSERT_OK(
        SaveJob(job, save_layouts, "/ckpt", o, {.fs = &fs, .io_threads = 2, .direct_io = false}));
    // Every byte written once: data = headers + each tensor's shards (version 1: 4 KiB-aligned
    // extents; version 2: shards below 64 KiB packed at 64 bytes, which takes no more room).
    auto reader = CheckpointReader::Open("/ckpt", {}, Io(&mem)).value();
    EXPECT_EQ(reader->format_version(), version);
    uint64_t files = 0, shard_bytes = 0, padded = 0;
    for (const auto& f : reader->manifest_json()["files"]) files += f["bytes"].get<uint64_t>();
    for (const auto& t : reader->manifest_json()["tensors"]) {
      for (const auto& s : t["shards"]) {
        shard_bytes += s["bytes"].get<uint64_t>();
        padded += (s["bytes"].get<uint64_t>() + 4095) / 4096 * 4096;
        EXPECT_EQ(s["offset"].get<uint64_t>() % (version == 1 ? 4096 : 64), 0u);
      }
    }
    EXPECT_EQ(shard_bytes, job.bytes());
    EXPECT_EQ(fs.written.load(), files);
    const uint64_t headers = 4096 * reader->manifest_json()["files"].size();
    if (version == 1) {
      EXPECT_EQ(files, padded + headers);
    } else {
      EXPECT_LE(files, padded + headers);
    }
    ExpectLoadsMatch(job, job.Layouts(m, rng), "/ckpt", &mem);
    // A plain single-process Load assembles the full tensors.
    State full = Load("/ckpt", {}, Io(&mem)).value();
    for (const auto& [name, t] : job.global) {
      ASSERT_NE(full.FindTensor(name), nullptr) << name;
      EXPECT_EQ(0, std::memcmp(full.FindTensor(name)->data(), t.data(), t.nbytes())) << name;
    }
    ASSERT_NE(full.FindValue("step"), nullptr);
  }
}

TEST(DistributedTest, ReplicatedTensorWrittenOnceBalanced) {
  // 4 ranks, pure data parallel: 8 equal tensors, each held by all. Each rank writes 2.
  MemFileSystem mem;
  Job job;
  for (int i = 0; i < 8; ++i) {
    Tensor t = Tensor::Empty(DType::kU8, {8192}).value();
    testing::FillPattern(t.view(), i);
    job.global.emplace("p" + std::to_string(i), std::move(t));
  }
  std::vector<ShardLayout> layouts(4);  // no entries: every tensor replicated on every rank
  SP_ASSERT_OK(SaveJob(job, layouts, "/ckpt", {}, {.fs = &mem, .direct_io = false}));
  for (int r = 0; r < 4; ++r) {
    auto st = mem.Stat(fmt::format("/ckpt/data-{:05}-00000.spd", r));
    ASSERT_TRUE(st.ok()) << "rank " << r;
    EXPECT_EQ(st->size, 4096u + 2 * 8192u) << "rank " << r;
  }
  ExpectLoadsMatch(job, {ShardLayout{}}, "/ckpt", &mem);
}

TEST(DistributedTest, ReadPlanNamesOnlyNeededFiles) {
  MemFileSystem mem;
  Job job;
  Tensor t = Tensor::Empty(DType::kF32, {64, 1024}).value();  // 4 KiB per row
  testing::FillPattern(t.view(), 7);
  job.global.emplace("w", std::move(t));
  std::vector<ShardLayout> save(4);
  for (int r = 0; r < 4; ++r) save[r]["w"] = SplitDim({64, 1024}, 0, 4, r).value();
  DistributedSaveOptions o;
  o.save = SaveOptions{.chunk_bytes = 4096};
  SP_ASSERT_OK(SaveJob(job, save, "/ckpt", o, {.fs = &mem, .direct_io = false}));
  // Rows 20..30 lie in the files of ranks 1 (16..32) only; 10 rows = 10 chunks.
  ShardLayout want{{"w", ShardSpec{{64, 1024}, {20, 0}, {10, 1024}, {}}}};
  auto plan = PlanDistributedLoad("/ckpt", want, &mem);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->files, std::vector<std::string>{"data-00001-00000.spd"});
  EXPECT_EQ(plan->source_ranks, std::vector<int>{1});
  EXPECT_EQ(plan->bytes, 10u * 4096);
  // A column split needs every file; the load reads it right.
  std::vector<ShardLayout> cols(3);
  for (int r = 0; r < 3; ++r) cols[r]["w"] = SplitDim({64, 1024}, 1, 3, r).value();
  plan = PlanDistributedLoad("/ckpt", cols[1], &mem);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->source_ranks, (std::vector<int>{0, 1, 2, 3}));
  ExpectLoadsMatch(job, cols, "/ckpt", &mem);
}

// A version 3 manifest is read in parts: a load's reader holds only the shards that overlap its
// boxes, and only of the tensors it loads; the load and the plan are those of a whole read.
class IndexedManifest : public ::testing::TestWithParam<uint32_t> {};

INSTANTIATE_TEST_SUITE_P(Versions, IndexedManifest, ::testing::Values(3u, 4u));

TEST_P(IndexedManifest, IsReadInParts) {
  MemFileSystem mem;
  Job job;
  for (const char* name : {"w", "v"}) {
    Tensor t = Tensor::Empty(DType::kF32, {64, 1024}).value();
    testing::FillPattern(t.view(), name[0]);
    job.global.emplace(name, std::move(t));
  }
  std::vector<ShardLayout> save(8);
  for (int r = 0; r < 8; ++r) {
    for (const char* name : {"w", "v"}) save[r][name] = SplitDim({64, 1024}, 0, 8, r).value();
  }
  DistributedSaveOptions o;
  o.save = SaveOptions{.chunk_bytes = 4096, .format_version = GetParam()};
  SP_ASSERT_OK(SaveJob(job, save, "/ckpt", o, {.fs = &mem, .direct_io = false}));
  // Rows 20..30 of "w": the shards of ranks 2 (16..24) and 3 (24..32).
  ShardLayout want{{"w", ShardSpec{{64, 1024}, {20, 0}, {10, 1024}, {}}}};
  const engine::ShardFilter only = {{"w", {{{20, 0}, {10, 1024}}}}};
  auto reader = engine::Reader::OpenImpl("/ckpt", {}, Io(&mem), &only).value();
  ASSERT_EQ(reader->manifest().tensors.size(), 2u);  // every tensor is listed
  for (const auto& t : reader->manifest().tensors) {
    EXPECT_EQ(t.shards.size(), t.name == "w" ? 2u : 0u) << t.name;
  }
  auto whole = engine::Reader::OpenImpl("/ckpt", {}, Io(&mem)).value();
  EXPECT_EQ(whole->manifest().tensors[1].shards.size(), 8u);
  auto plan = PlanDistributedLoad("/ckpt", want, &mem);
  SP_ASSERT_OK(plan.status());
  EXPECT_EQ(plan->source_ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(plan->bytes, 10u * 4096);
  std::vector<ShardLayout> cols(3);
  for (int r = 0; r < 3; ++r) cols[r]["v"] = SplitDim({64, 1024}, 1, 3, r).value();
  for (int r = 0; r < 3; ++r) cols[r]["w"] = SplitDim({64, 1024}, 0, 3, r).value();
  ExpectLoadsMatch(job, cols, "/ckpt", &mem);
}

// Row blocks are read straight into the targets (no assembly buffer), with O_DIRECT on a real
// file system: shards whose sizes are not multiples of the I/O alignment, target borders inside
// chunks (those chunks go through a bounce buffer), and targets at unaligned addresses.
TEST(DistributedTest, RowBlocksReadStraightIntoTargetsWithDirectIo) {
  testing::TempDir dir;
  Job job;
  Tensor w = Tensor::Empty(DType::kF32, {37, 100}).value();  // 400-byte rows
  testing::FillPattern(w.view(), 11);
  job.global.emplace("w", std::move(w));
  Tensor b = Tensor::Empty(DType::kBF16, {5000}).value();
  testing::FillPattern(b.view(), 12);
  job.global.emplace("b", std::move(b));
  // Shards of about 146 chunks: a batched read (up to engine::kReadBatchBytes of chunks) holds
  // more chunks than an io_uring has entries (kUringQueueDepth).
  Tensor big = Tensor::Empty(DType::kF32, {300, 1000}).value();
  testing::FillPattern(big.view(), 13);
  job.global.emplace("big", std::move(big));
  std::vector<ShardLayout> save(2);
  for (int r = 0; r < 2; ++r) {
    for (const auto& [name, t] : job.global) save[r][name] = SplitDim(t.shape(), 0, 2, r).value();
  }
  DistributedSaveOptions o;
  o.save = SaveOptions{.chunk_bytes = 4096};
  ASSERT_GT(engine::ReadBatchChunks(4096), 146u);
  const std::string path = dir.Sub("ckpt");
  SP_ASSERT_OK(SaveJob(job, save, path, o, {.io_threads = 2, .direct_io = true}));
  IoOptions io;
  for (auto [m, threads] : {std::pair{1, 1}, {1, 3}, {2, 1}, {3, 3}, {5, 2}}) {
    SCOPED_TRACE(fmt::format("2 ranks -> {} ranks, {} threads", m, threads));
    io.io_threads = threads;
    for (int r = 0; r < m; ++r) {
      ShardLayout layout;
      for (const auto& [name, t] : job.global) layout[name] = SplitDim(t.shape(), 0, m, r).value();
      State want = job.Local(layout);
      for (size_t skew : {size_t{0}, size_t{64}}) {  // aligned and unaligned target addresses
        // Each target is followed by guard bytes that the load must leave alone.
        constexpr size_t kGuard = 8192;
        std::vector<std::pair<Tensor, uint64_t>> memory;  // buffer, target bytes
        State got;
        for (const auto& [name, spec] : layout) {
          uint64_t bytes = NumBytes(job.global.at(name).dtype(), spec.sizes).value();
          Tensor m = Tensor::Zeros(DType::kU8, {int64_t(skew + bytes + kGuard)}).value();
          std::memset(m.data() + skew + bytes, 0xAB, kGuard);
          SP_ASSERT_OK(
              got.PutView(name, {m.data() + skew, job.global.at(name).dtype(), spec.sizes}));
          memory.emplace_back(std::move(m), bytes);
        }
        SP_ASSERT_OK(LoadDistributed(path, got, layout, {}, io));
        EXPECT_TRUE(testing::StatesEqual(want, got)) << "rank " << r << " skew " << skew;
        for (const auto& [m, bytes] : memory) {
          const std::byte* guard = m.data() + skew + bytes;
          EXPECT_EQ(std::count(guard, guard + kGuard, std::byte{0xAB}), int64_t(kGuard))
              << "rank " << r << " skew " << skew << ": a read spilled past a target's end";
        }
      }
    }
  }
}

// Format version 2 packs small shards: hundreds of tiny shards per rank, written and read with
// O_DIRECT, round-trip through resharded loads, a plain Load and Verify, in a few KiB per rank
// instead of one 4 KiB block each.
TEST(DistributedTest, SmallShardsArePackedWithDirectIo) {
  testing::TempDir dir;
  Job job;
  for (int i = 0; i < 300; ++i) {
    Tensor t = Tensor::Empty(DType::kF32, {4, 4}).value();
    testing::FillPattern(t.view(), 100 + i);
    job.global.emplace(fmt::format("opt.{}.exp_avg", i), std::move(t));
  }
  Tensor big = Tensor::Empty(DType::kF32, {64, 1024}).value();  // 256 KiB: stays 4096-aligned
  testing::FillPattern(big.view(), 7);
  job.global.emplace("big", std::move(big));
  std::vector<ShardLayout> save(3);
  for (int r = 0; r < 3; ++r) {
    for (const auto& [name, t] : job.global) save[r][name] = SplitDim(t.shape(), 0, 3, r).value();
  }
  DistributedSaveOptions o;
  o.save = SaveOptions{.chunk_bytes = 4096};
  const std::string path = dir.Sub("ckpt");
  SP_ASSERT_OK(SaveJob(job, save, path, o, {.io_threads = 2, .direct_io = true}));
  auto reader = CheckpointReader::Open(path).value();
  EXPECT_EQ(reader->format_version(), 2u);
  uint64_t data_bytes = 0;
  for (const auto& f : reader->manifest_json()["files"]) data_bytes += f["bytes"].get<uint64_t>();
  EXPECT_LT(data_bytes, uint64_t{400} << 10);  // version 1: 900 small shards alone take 3.6 MB
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct I/O" : "buffered");
    IoOptions io;
    io.direct_io = direct;
    for (int m : {1, 2}) {
      for (int r = 0; r < m; ++r) {
        ShardLayout layout;
        for (const auto& [name, t] : job.global) {
          layout[name] = SplitDim(t.shape(), 0, m, r).value();
        }
        State want = job.Local(layout), got;
        for (const auto& [name, e] : want.entries()) {
          if (!e.is_tensor()) continue;
          SP_ASSERT_OK(
              got.Put(name, Tensor::Zeros(e.tensor().dtype(), e.tensor().shape()).value()));
        }
        SP_ASSERT_OK(LoadDistributed(path, got, layout, {}, io));
        EXPECT_TRUE(testing::StatesEqual(want, got)) << m << " ranks, rank " << r;
      }
    }
    State full = Load(path, {}, io).value();
    for (const auto& [name, t] : job.global) {
      ASSERT_NE(full.FindTensor(name), nullptr) << name;
      EXPECT_EQ(0, std::memcmp(full.FindTensor(name)->data(), t.data(), t.nbytes())) << name;
    }
  }
  SP_EXPECT_OK(VerifyCheckpoint(path));
}

// Every rank must write the same format version (its data file header carries it); a mismatch
// fails the save on every rank before anything is written.
TEST(DistributedTest, RanksMustAgreeOnTheFormatVersion) {
  MemFileSystem mem;
  Job job = RandomJob(5);
  std::vector<ShardLayout> layouts(2);
  std::vector<State> locals;
  for (const auto& l : layouts) locals.push_back(job.Local(l));
  auto st = OnRanks(2, [&](Communicator& c) {
    DistributedSaveOptions o;
    o.save = SaveOptions{.format_version = c.rank() == 1 ? 1u : 2u};
    o.timeout = 10s;
    return SaveDistributed(c, locals[c.rank()], layouts[c.rank()], "/ckpt", o,
                           {.fs = &mem, .direct_io = false});
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(st[r], StatusIs(StatusCode::kInvalidArgument));
    EXPECT_NE(st[r].message().find("SaveOptions.format_version"), std::string::npos)
        << st[r].ToString();
  }
  EXPECT_TRUE(mem.ListDir("/")->empty()) << "something was written";
}

// Row-block loads (straight into the targets, batched, partial chunks through a bounce buffer)
// still verify every chunk: a flipped byte in an inner or a border chunk, and a truncated data
// file, fail the load with the tensor and chunk named, for whichever ranks need that chunk.
TEST(DistributedTest, CorruptOrTruncatedDataFailsRowBlockLoads) {
  testing::TempDir dir;
  Job job;
  Tensor w = Tensor::Empty(DType::kF32, {64, 1024}).value();  // 4 KiB rows
  testing::FillPattern(w.view(), 21);
  job.global.emplace("w", std::move(w));
  std::vector<ShardLayout> save(2);
  for (int r = 0; r < 2; ++r) save[r]["w"] = SplitDim({64, 1024}, 0, 2, r).value();
  DistributedSaveOptions o;
  o.save = SaveOptions{.chunk_bytes = 16 << 10};
  const std::string path = dir.Sub("ckpt");
  SP_ASSERT_OK(SaveJob(job, save, path, o, {.io_threads = 2, .direct_io = true}));
  // Rows 0..32 (8 chunks of 4 rows): where they lie.
  Json m = CheckpointReader::Open(path).value()->manifest_json();
  const Json* first = nullptr;
  for (const Json& s : m["tensors"][0]["shards"]) {
    if (s["offsets"][0].get<int64_t>() == 0) first = &s;
  }
  ASSERT_NE(first, nullptr);
  const std::string file =
      path + "/" + m["files"][first->at("file").get<int>()]["name"].get<std::string>();
  const uint64_t base = first->at("offset").get<uint64_t>();
  auto flip = [&](uint64_t at) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(at));
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  };
  auto load = [&](int world, int rank) {
    ShardLayout l{{"w", SplitDim({64, 1024}, 0, world, rank).value()}};
    return LoadDistributedAlloc(path, l, LoadOptions{}).status();
  };
  // Chunk 1 (rows 4..8) lies inside every box that needs it; chunk 5 (rows 20..24) straddles the
  // border of a 3-way split (rows 0..22 | 22..43).
  for (uint64_t chunk : {1u, 5u}) {
    SCOPED_TRACE(fmt::format("chunk {} corrupted", chunk));
    flip(base + chunk * (16 << 10) + 100);
    std::string want = fmt::format("tensor \"w\" chunk {} ", chunk);
    for (auto [world, rank] : {std::pair{1, 0}, {2, 0}, {3, 0}}) {
      Status s = load(world, rank);
      EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, want))
          << world << " ranks, rank " << rank << ": " << s.ToString();
    }
    if (chunk == 5) {
      Status s = load(3, 1);  // the other side of the border reads the same chunk
      EXPECT_THAT(s, StatusIs(StatusCode::kCorruption));
    }
    SP_EXPECT_OK(load(2, 1));               // rows 32..64 need none of it
    flip(base + chunk * (16 << 10) + 100);  // mend
  }
  SP_ASSERT_OK(load(3, 1));
  // Truncated inside chunk 6 of the first row block.
  std::filesystem::resize_file(file, base + 6 * (16 << 10) + 512);
  Status s = load(2, 0);
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "tensor \"w\" chunk 6 "));
}

TEST(DistributedTest, BadLayoutRejectedBeforeWriting) {
  MemFileSystem mem;
  Job job;
  job.global.emplace("w", Tensor::Zeros(DType::kF32, {8, 4}).value());
  std::vector<ShardLayout> layouts(2);
  layouts[0]["w"] = SplitDim({8, 4}, 0, 2, 0).value();
  layouts[1]["w"] = SplitDim({8, 4}, 0, 2, 0).value();  // both claim rows 0..4: overlap + gap
  Status s = SaveJob(job, layouts, "/ckpt", {}, {.fs = &mem, .direct_io = false});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "\"w\""));
  EXPECT_TRUE(mem.ListDir("/")->empty()) << "something was written";
}

TEST(DistributedTest, FailingRankMeansNoCommitAndEveryRankSeesIt) {
  MemFileSystem mem;
  FaultInjectionFileSystem faulty(&mem);
  faulty.FailNth(FaultInjectionFileSystem::Op::kWrite, 2, EIO);
  Job job;  // 4 equal tensors replicated on 4 ranks: each rank writes one
  for (int i = 0; i < 4; ++i)
    job.global.emplace("p" + std::to_string(i), Tensor::Zeros(DType::kU8, {9000}).value());
  std::vector<ShardLayout> layouts(4);
  std::vector<State> locals;
  for (const auto& l : layouts) locals.push_back(job.Local(l));
  auto st = OnRanks(4, [&](Communicator& c) {
    DistributedSaveOptions o;
    o.timeout = 10s;
    return SaveDistributed(
        c, locals[c.rank()], layouts[c.rank()], "/ckpt", o,
        {.fs = c.rank() == 2 ? static_cast<FileSystem*>(&faulty) : &mem, .direct_io = false});
  });
  EXPECT_EQ(faulty.count(FaultInjectionFileSystem::Op::kWrite), 2u);  // header, then data
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(st[r], StatusIs(StatusCode::kIOError, "rank 2"));
  }
  EXPECT_TRUE(mem.ListDir("/")->empty()) << "debris or a commit was left";
}

// Saves a random job on `n` thread ranks (memory file system) with `timeout`: rank `dead` never
// calls the save and rank `slow` calls it `delay` late. Returns each rank's status.
std::vector<Status> SaveWithDeadRank(MemFileSystem* mem, int n, int dead, int slow,
                                     std::chrono::milliseconds delay, Timeout timeout) {
  Job job = RandomJob(n + 2);
  std::vector<ShardLayout> layouts(n);
  std::vector<State> locals;
  for (const auto& l : layouts) locals.push_back(job.Local(l));
  return OnRanks(n, [&](Communicator& c) -> Status {
    if (c.rank() == dead) return Status::OK();  // dies before the save
    if (c.rank() == slow) std::this_thread::sleep_for(delay);
    DistributedSaveOptions o;
    o.timeout = timeout;
    return SaveDistributed(c, locals[c.rank()], layouts[c.rank()], "/ckpt", o,
                           {.fs = mem, .direct_io = false});
  });
}

TEST(DistributedTest, DeadRankTimesOutWithoutCommitOrHang) {
  MemFileSystem mem;
  auto start = std::chrono::steady_clock::now();
  auto st = SaveWithDeadRank(&mem, 3, /*dead=*/1, /*slow=*/-1, 0ms, 300ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (int r : {0, 2}) {
    EXPECT_THAT(st[r], StatusIs(StatusCode::kDeadlineExceeded));
  }
  EXPECT_NE(st[0].message().find("ranks [1]"), std::string::npos) << st[0].ToString();
  EXPECT_TRUE(mem.ListDir("/")->empty());
}

// The coordinator arrives 300 ms after rank 1 and rank 2 never comes: rank 1, already waiting for
// the coordinator's verdict, must not time out first (which would name the coordinator); every
// rank's error names rank 2. (CI saw this race with 8 oversubscribed MPI ranks.)
TEST(DistributedTest, SlowCoordinatorStillNamesTheMissingRank) {
  MemFileSystem mem;
  auto st = SaveWithDeadRank(&mem, 3, /*dead=*/2, /*slow=*/0, 300ms, 500ms);
  for (int r : {0, 1}) {
    EXPECT_THAT(st[r], StatusIs(StatusCode::kDeadlineExceeded, "ranks [2]"));
  }
  EXPECT_TRUE(mem.ListDir("/")->empty());
}

TEST(DistributedTest, LoadErrorsNameWhatIsMissing) {
  MemFileSystem mem;
  Job job;
  Tensor t = Tensor::Empty(DType::kF32, {16, 8}).value();
  testing::FillPattern(t.view(), 9);
  job.global.emplace("w", std::move(t));
  std::vector<ShardLayout> save(2);
  for (int r = 0; r < 2; ++r) save[r]["w"] = SplitDim({16, 8}, 0, 2, r).value();
  SP_ASSERT_OK(SaveJob(job, save, "/ckpt", {}, {.fs = &mem, .direct_io = false}));
  const IoOptions io = Io(&mem);
  // A tensor the checkpoint lacks.
  ShardLayout other{{"nope", ShardSpec{{4}, {0}, {4}, {}}}};
  auto r = LoadDistributedAlloc("/ckpt", other, {}, io);
  EXPECT_THAT(r, StatusIs(StatusCode::kNotFound, "nope"));
  // A box outside the tensor; a wrong global shape.
  ShardLayout outside{{"w", ShardSpec{{16, 8}, {12, 0}, {8, 8}, {}}}};
  EXPECT_EQ(LoadDistributedAlloc("/ckpt", outside, {}, io).status().code(),
            StatusCode::kInvalidArgument);
  ShardLayout wrong{{"w", ShardSpec{{16, 9}, {0, 0}, {8, 9}, {}}}};
  EXPECT_EQ(LoadDistributedAlloc("/ckpt", wrong, {}, io).status().code(),
            StatusCode::kInvalidArgument);
  // Rows 0..8 need only rank 0's file: losing rank 1's file does not matter to them...
  SP_ASSERT_OK(mem.RemoveFile("/ckpt/data-00001-00000.spd"));
  SP_EXPECT_OK(LoadDistributedAlloc("/ckpt", save[0], {}, io).status());
  // ...but rows 8..16 fail, naming the file and its rank.
  r = LoadDistributedAlloc("/ckpt", save[1], {}, io);
  EXPECT_THAT(r, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(r.status().message().find("data-00001-00000.spd (written by rank 00001)"),
            std::string::npos)
      << r.status().ToString();
}

// With the default SaveOptions::format_version (0), a save of more than dist::kIndexedAboveShards
// shards is written in format version 4, manifest and data files alike, and loads back whole
// (the small saves of the tests above are written in version 2).
TEST(DistributedTest, SaveOfManyShardsIsIndexedByDefault) {
  MemFileSystem mem;
  const int64_t per_rank = static_cast<int64_t>(dist::kIndexedAboveShards) / 2 + 1;
  Tensor t = Tensor::Empty(DType::kU8, {2 * per_rank}).value();
  testing::FillPattern(t.view(), 3);
  std::vector<ShardLayout> layouts(2);
  std::vector<State> locals(2);
  for (int r = 0; r < 2; ++r) {
    for (int64_t k = 0; k < per_rank; ++k) {  // one row per shard, each a local view of it
      const int64_t row = r * per_rank + k;
      const std::string name = fmt::format("t.{}", row);
      layouts[r][name] = ShardSpec{{2 * per_rank}, {row}, {1}, {}, "t"};
      SP_ASSERT_OK(locals[r].PutView(name, TensorView(t.data() + row, DType::kU8, {1})));
    }
  }
  for (const Status& s : OnRanks(2, [&](Communicator& c) {
         return SaveDistributed(c, locals[c.rank()], layouts[c.rank()], "/ckpt", {},
                                {.fs = &mem, .io_threads = 2, .direct_io = false});
       })) {
    SP_ASSERT_OK(s);
  }
  auto reader = CheckpointReader::Open("/ckpt", {}, {.fs = &mem, .direct_io = false}).value();
  EXPECT_EQ(reader->format_version(), format::kCompactFormatVersion);
  SP_ASSERT_OK_AND_ASSIGN(State back, Load("/ckpt", {}, {.fs = &mem, .direct_io = false}));
  ASSERT_NE(back.FindTensor("t"), nullptr);
  EXPECT_EQ(0, std::memcmp(back.FindTensor("t")->data(), t.data(), t.nbytes()));
  SP_EXPECT_OK(VerifyCheckpoint("/ckpt", {}, {.fs = &mem, .direct_io = false}));
}

TEST(DistributedTest, HostileDescriptorsAreRejected) {
  dist::ManifestMerger m(2);
  Status s = m.AddPlan(0, "garbage");
  EXPECT_FALSE(s.ok());
  std::string plan = dist::EncodePlan(Status::OK(), format::Manifest{});
  SP_EXPECT_OK(m.AddPlan(1, plan));
  for (size_t cut = 0; cut + 1 < plan.size(); ++cut) {
    dist::ManifestMerger m2(1);
    EXPECT_FALSE(m2.AddPlan(0, plan.substr(0, cut)).ok()) << cut;
  }
  std::string huge =
      plan.substr(0, plan.size() - 8) + std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
  EXPECT_FALSE(dist::ManifestMerger(1).AddPlan(0, huge).ok());
  EXPECT_FALSE(dist::DecodeVerdict("\x01", 2).ok());
}

}  // namespace
}  // namespace savepoint

namespace savepoint {
namespace {

TEST(DistributedTest, MergeWritesWholeTensors) {
  MemFileSystem mem;
  std::mt19937_64 rng(11);
  Job job = RandomJob(11);
  SP_ASSERT_OK(SaveJob(job, job.Layouts(4, rng), "/sharded", {SaveOptions{.chunk_bytes = 4096}},
                       {.fs = &mem, .direct_io = false}));
  MergeOptions o;
  SP_ASSERT_OK(MergeCheckpoint("/sharded", "/merged", o, Io(&mem)));
  auto r = CheckpointReader::Open("/merged", {}, Io(&mem)).value();
  EXPECT_EQ(r->manifest_json()["files"].size(), 1u);
  for (const TensorInfo& t : r->tensors()) EXPECT_EQ(t.num_shards, 1u) << t.name;
  State a = Load("/sharded", {}, Io(&mem)).value();
  State b = Load("/merged", {}, Io(&mem)).value();
  EXPECT_TRUE(testing::StatesEqual(a, b));
  EXPECT_THAT(MergeCheckpoint("/sharded", "/merged", o, Io(&mem)),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(MergeCheckpoint("/nothing", "/m2", o, Io(&mem)), StatusIs(StatusCode::kNotFound));
}

// Each file loads on its own with the values; together they hold exactly the full tensors.
void ExpectSafetensorsMerge(MemFileSystem& mem, const Job& job, const std::string& dir,
                            const std::vector<std::string>& files) {
  std::set<std::string> seen;
  for (const std::string& f : files) {
    auto st = LoadSafetensors(dir + "/" + f, {}, {.fs = &mem});
    SP_ASSERT_OK(st.status());
    ASSERT_NE(st->FindValue("step"), nullptr) << f;
    EXPECT_EQ(st->FindValue("step")->as_int(), 42) << f;
    for (const auto& [name, e] : st->entries()) {
      if (!e.is_tensor()) continue;
      EXPECT_TRUE(seen.insert(name).second) << name;
      ASSERT_TRUE(job.global.count(name)) << name;
      const Tensor& g = job.global.at(name);
      EXPECT_EQ(e.tensor().shape(), g.shape()) << name;
      EXPECT_EQ(0, std::memcmp(e.tensor().data(), g.data(), g.nbytes())) << name;
    }
  }
  EXPECT_EQ(seen.size(), job.global.size());
}

TEST(DistributedTest, MergeToSafetensorsSingleAndCapped) {
  MemFileSystem mem;
  std::mt19937_64 rng(12);
  Job job = RandomJob(12);
  SP_ASSERT_OK(SaveJob(job, job.Layouts(3, rng), "/sharded", {SaveOptions{.chunk_bytes = 4096}},
                       {.fs = &mem, .direct_io = false}));
  MergeSafetensorsOptions o;
  SP_ASSERT_OK(MergeToSafetensors("/sharded", "/single", o, Io(&mem)));
  ExpectSafetensorsMerge(mem, job, "/single", {kSafetensorsSingleFile});
  EXPECT_FALSE(mem.Exists(std::string("/single/") + kSafetensorsIndexFile));
  EXPECT_EQ(MergeToSafetensors("/sharded", "/single", o, Io(&mem)).code(),
            StatusCode::kAlreadyExists);

  // Cap = the largest tensor: several files, none over the cap.
  uint64_t cap = 0;
  for (const auto& [name, t] : job.global) cap = std::max(cap, t.nbytes());
  o.max_file_bytes = cap;
  SP_ASSERT_OK(MergeToSafetensors("/sharded", "/capped", o, Io(&mem)));
  Json index =
      Json::parse(mem.ReadFile(std::string("/capped/") + kSafetensorsIndexFile, 1 << 20).value());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), job.bytes());
  std::set<std::string> files;
  for (const auto& [t, f] : index["weight_map"].items()) files.insert(f.get<std::string>());
  EXPECT_EQ(index["weight_map"].size(), job.global.size());
  ASSERT_GT(files.size(), 1u);
  EXPECT_EQ(*files.begin(), fmt::format("model-00001-of-{:05}.safetensors", files.size()));
  for (const std::string& f : files) {
    auto info = InspectSafetensors("/capped/" + f, &mem).value();
    uint64_t n = 0;
    for (const auto& t : info.tensors) {
      EXPECT_EQ(index["weight_map"][t.name], f) << t.name;
      n += t.nbytes();
    }
    EXPECT_LE(n, cap) << f;
  }
  ExpectSafetensorsMerge(mem, job, "/capped", {files.begin(), files.end()});

  // A cap of 1 byte: one tensor per file.
  o.max_file_bytes = 1;
  SP_ASSERT_OK(MergeToSafetensors("/sharded", "/tiny", o, Io(&mem)));
  auto tiny = mem.ListDir("/tiny").value();
  EXPECT_EQ(tiny.size(), job.global.size() + 1);
  o.save.overwrite = true;
  EXPECT_THAT(MergeToSafetensors("/sharded", "/x", o, Io(&mem)),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(mem.Exists("/x"));
}

}  // namespace
}  // namespace savepoint

namespace savepoint {
namespace {

// A sharded checkpoint whose manifest was edited to drop a shard (as a partial save would leave
// it), or to point a shard at a file that does not exist: loading fails, naming the tensor.
TEST(DistributedTest, TamperedManifestsFailLoadClearly) {
  MemFileSystem mem;
  Job job;
  job.global.emplace("w", Tensor::Zeros(DType::kF32, {16, 8}).value());
  std::vector<ShardLayout> save(2);
  for (int r = 0; r < 2; ++r) save[r]["w"] = SplitDim({16, 8}, 0, 2, r).value();
  SP_ASSERT_OK(SaveJob(job, save, "/ckpt", {}, {.fs = &mem, .direct_io = false}));
  std::string bytes = mem.ReadFile("/ckpt/MANIFEST", 1 << 20).value();
  auto fresh = [&] { return format::DecodeManifest(bytes, "MANIFEST").value(); };
  ASSERT_EQ(fresh().tensors[0].shards.size(), 2u);
  auto rewrite = [&](const format::Manifest& edited) {
    SP_ASSERT_OK(mem.RemoveFile("/ckpt/MANIFEST"));
    SP_ASSERT_OK(mem.WriteFileSynced("/ckpt/MANIFEST", format::EncodeManifest(edited)));
  };
  format::Manifest partial = fresh();
  partial.tensors[0].shards.pop_back();
  rewrite(partial);
  auto r = LoadDistributedAlloc("/ckpt", save[0], {}, Io(&mem));
  EXPECT_THAT(r, StatusIs(StatusCode::kCorruption));
  EXPECT_NE(r.status().message().find("tensor \"w\": shards cover 64 of 128"), std::string::npos)
      << r.status().ToString();
  format::Manifest bad_file = fresh();
  bad_file.tensors[0].shards[1].file = 7;
  rewrite(bad_file);
  r = LoadDistributedAlloc("/ckpt", save[1], {}, Io(&mem));
  EXPECT_THAT(r, StatusIs(StatusCode::kCorruption));
  rewrite(fresh());
  SP_EXPECT_OK(LoadDistributedAlloc("/ckpt", save[1], {}, Io(&mem)).status());
}

}  // namespace
}  // namespace savepoint
