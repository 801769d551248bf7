// The coordinator's merge (ManifestMerger, SaveChecksums) and the plan cache.
#include "distributed/merge.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "distributed/descriptor.h"
#include "distributed/wire.h"
#include "format/endian.h"
#include "format/manifest_index.h"
#include "io/mem_fs.h"
#include "savepoint/distributed.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;
using testing::OnRanks;

constexpr int kRanks = 4;

IoOptions Io(FileSystem* fs) { return IoOptions{.fs = fs, .io_threads = 2, .direct_io = false}; }

// Two tensors over kRanks ranks: "w" split along `dim` in kRanks parts, "b" whole on every rank
// (written once). Filled with distinct bytes.
struct Job {
  Tensor w = Tensor::Empty(DType::kF32, {8, 12}).value();
  Tensor b = Tensor::Empty(DType::kU8, {40}).value();
  Job() {
    for (uint64_t i = 0; i < w.nbytes(); ++i) w.data()[i] = static_cast<std::byte>(i * 7 + 1);
    for (uint64_t i = 0; i < b.nbytes(); ++i) b.data()[i] = static_cast<std::byte>(i + 3);
  }
  ShardLayout Layout(int rank, int dim) const {
    return {{"w", SplitDim(w.shape(), dim, kRanks, rank).value()}};
  }
  State Local(int rank, int dim) const {
    const ShardSpec spec = SplitDim(w.shape(), dim, kRanks, rank).value();
    Tensor part = Tensor::Empty(DType::kF32, spec.sizes).value();
    auto* out = reinterpret_cast<float*>(part.data());
    const auto* in = reinterpret_cast<const float*>(w.data());
    for (int64_t i = 0; i < spec.sizes[0]; ++i) {
      for (int64_t j = 0; j < spec.sizes[1]; ++j) {
        out[i * spec.sizes[1] + j] = in[(spec.offsets[0] + i) * 12 + spec.offsets[1] + j];
      }
    }
    State s;
    EXPECT_TRUE(s.Put("w", std::move(part)).ok());
    EXPECT_TRUE(s.Put("b", Tensor::CopyOf(b.view()).value()).ok());
    return s;
  }
  // The plans' key, as the coordinator computes it from the ranks' digests.
  crypto::Sha256 Key(int dim, const SaveOptions& o) const {
    std::vector<std::string> digests;
    for (int r = 0; r < kRanks; ++r) {
      RankSave save(r, kRanks);
      digests.push_back(dist::EncodePlanDigest(save.Plan(Local(r, dim), Layout(r, dim), o, {})));
    }
    bool any = false;
    crypto::Sha256 key = dist::PlanKey(digests, &any);
    EXPECT_TRUE(any);
    return key;
  }
};

Status SaveOn(const Job& job, int dim, const std::string& path, const SaveOptions& o,
              FileSystem* fs, int failing = -1) {
  std::vector<Status> st = OnRanks(kRanks, [&](Communicator& c) {
    ShardLayout layout = job.Layout(c.rank(), dim);
    if (c.rank() == failing) layout["w"].offsets[0] = 1000;  // outside the tensor: its plan fails
    DistributedSaveOptions d;
    d.save = o;
    return SaveDistributed(c, job.Local(c.rank(), dim), layout, path, d, Io(fs));
  });
  for (const Status& s : st) {
    if (!s.ok()) return s;
  }
  return Status::OK();
}

void ExpectWhole(const Job& job, const std::string& path, FileSystem* fs) {
  State got = Load(path, {}, Io(fs)).value();
  ASSERT_NE(got.FindTensor("w"), nullptr);
  ASSERT_NE(got.FindTensor("b"), nullptr);
  EXPECT_EQ(0, std::memcmp(got.FindTensor("w")->data(), job.w.data(), job.w.nbytes()));
  EXPECT_EQ(0, std::memcmp(got.FindTensor("b")->data(), job.b.data(), job.b.nbytes()));
}

class PlanCache : public ::testing::TestWithParam<uint32_t> {};

TEST_P(PlanCache, RepeatedLayoutIsNotMergedAgain) {
  MemFileSystem mem;
  Job job;
  const SaveOptions o{.chunk_bytes = 4096, .format_version = GetParam()};
  const crypto::Sha256 rows = job.Key(0, o), cols = job.Key(1, o);
  ASSERT_NE(rows, cols);
  dist::CachePlan({}, nullptr);  // empty
  SP_ASSERT_OK(SaveOn(job, 0, "/a", o, &mem));
  std::shared_ptr<const dist::MergedPlan> first = dist::CachedPlan(rows);
  ASSERT_NE(first, nullptr) << "the merged plan was not cached";
  // The same layout: decided from the digests, with the cached plan (not merged again).
  SP_ASSERT_OK(SaveOn(job, 0, "/b", o, &mem));
  EXPECT_EQ(dist::CachedPlan(rows), first);
  // Another layout is merged (and cached in its place); then the first one again.
  SP_ASSERT_OK(SaveOn(job, 1, "/c", o, &mem));
  EXPECT_EQ(dist::CachedPlan(rows), nullptr);
  EXPECT_NE(dist::CachedPlan(cols), nullptr);
  SP_ASSERT_OK(SaveOn(job, 0, "/d", o, &mem));
  // Another chunk size is another key.
  SP_ASSERT_OK(
      SaveOn(job, 0, "/e", SaveOptions{.chunk_bytes = 8192, .format_version = GetParam()}, &mem));
  EXPECT_EQ(dist::CachedPlan(rows), nullptr);
  for (const char* path : {"/a", "/b", "/c", "/d", "/e"}) {
    SCOPED_TRACE(path);
    ExpectWhole(job, path, &mem);
    auto reader = CheckpointReader::Open(path, {}, Io(&mem)).value();
    EXPECT_EQ(reader->format_version(), GetParam());
  }
}

TEST_P(PlanCache, FailingRankOfACachedLayoutIsReported) {
  MemFileSystem mem;
  Job job;
  const SaveOptions o{.chunk_bytes = 4096, .format_version = GetParam()};
  SP_ASSERT_OK(SaveOn(job, 0, "/a", o, &mem));
  // Rank 2's plan differs (it carries its error), so the coordinator asks for the plans.
  EXPECT_THAT(SaveOn(job, 0, "/b", o, &mem, /*failing=*/2),
              StatusIs(StatusCode::kInvalidArgument, "rank 2"));
  EXPECT_FALSE(mem.Exists("/b"));
  SP_ASSERT_OK(SaveOn(job, 0, "/c", o, &mem));
  ExpectWhole(job, "/c", &mem);
}

INSTANTIATE_TEST_SUITE_P(Versions, PlanCache, ::testing::Values(1u, 2u, 3u, 4u));

TEST(PlanCacheKey, PlansAndTheirDigestsHaveOneKey) {
  const std::vector<std::string> plans = {"plan of rank 0", "plan of rank 1"};
  std::vector<std::string> digests;
  for (const std::string& p : plans) digests.push_back(dist::EncodePlanDigest(p));
  bool any = true;
  const crypto::Sha256 key = dist::PlanKey(plans, &any);
  EXPECT_FALSE(any);
  EXPECT_EQ(dist::PlanKey(digests, &any), key);
  EXPECT_TRUE(any);
  EXPECT_NE(dist::PlanKey({plans[1], plans[0]}, &any), key);
  EXPECT_NE(dist::PlanKey({plans[0]}, &any), key);
}

// A one-shard plan of rank 0: tensor "t" of `shape` (U8), the whole box, at `offset` in a file of
// `file_bytes`, in format `version`.
std::string OneShardPlan(int64_t elements, uint64_t offset, uint64_t file_bytes,
                         uint64_t chunk_bytes = 4096, uint32_t version = format::kFormatVersion) {
  format::Manifest m;
  m.version = version;
  m.chunk_bytes = chunk_bytes;
  m.files.push_back({"data-00000-00000.spd", file_bytes});
  format::ShardRecord s;
  s.offsets = {0};
  s.sizes = {elements};
  s.offset = offset;
  s.bytes = static_cast<uint64_t>(elements);
  m.tensors.push_back({"t", DType::kU8, {elements}, {s}});
  return dist::EncodePlan(Status::OK(), m);
}

TEST(ManifestMergerTest, ExtentOutsideItsFileIsRejected) {
  dist::ManifestMerger ok(1);
  SP_EXPECT_OK(ok.AddPlan(0, OneShardPlan(100, 4096, 4196)));
  dist::ManifestMerger past(1);
  EXPECT_THAT(past.AddPlan(0, OneShardPlan(100, 4096, 4195)),
              StatusIs(StatusCode::kInvalidArgument, "in a file of 4195"));
  dist::ManifestMerger wraps(1);
  EXPECT_THAT(wraps.AddPlan(0, OneShardPlan(100, UINT64_MAX - 10, UINT64_MAX)),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(ManifestMergerTest, ManifestBeyondItsCapIsRefusedBeforeAnyAllocation) {
  // 2^42 chunks of 4 KiB: more entries than a manifest of 4 GiB holds.
  const int64_t n = int64_t{1} << 54;
  dist::ManifestMerger m(1);
  SP_ASSERT_OK(m.AddPlan(0, OneShardPlan(n, 4096, 4096 + uint64_t(n), 4096)));
  EXPECT_THAT(m.Finish().status(), StatusIs(StatusCode::kResourceExhausted, "chunk_bytes"));
  dist::ManifestMerger fine(1);
  SP_ASSERT_OK(fine.AddPlan(0, OneShardPlan(n, 4096, 4096 + uint64_t(n), uint64_t{1} << 30)));
  Result<std::shared_ptr<const dist::MergedPlan>> plan = fine.Finish();
  SP_ASSERT_OK(plan.status());
  EXPECT_EQ((*plan)->file_index(), std::vector<int64_t>{0});
}

// A plan written here field by field (docs/FORMAT.md §16): format `version`, not encrypted,
// chunks of 4096 bytes, a data file of `file_bytes`, `shards` shards, the k-th written by
// shard(w, k).
template <typename WriteShard>
std::string HandPlan(uint64_t file_bytes, int64_t shards, WriteShard shard,
                     uint32_t version = format::kCompactFormatVersion) {
  const std::string head = dist::EncodePlan(Status::OK(), format::Manifest{});
  dist::WireWriter w;
  w.U64(version);
  w.U64(0);     // not encrypted
  w.U64(4096);  // chunk size
  w.U64(file_bytes);
  w.U64(static_cast<uint64_t>(shards));
  for (int64_t k = 0; k < shards; ++k) shard(w, k);
  // (the status of EncodePlan's empty plan, then this plan's fields)
  return head.substr(0, head.size() - 40) + w.bytes();
}

// A plan of tensor "t" (U8) of n elements in n shards of one element, in format `version`.
std::string ElementPlan(int64_t n, uint32_t version = format::kCompactFormatVersion) {
  const int64_t one = 1;
  return HandPlan(
      4096 + static_cast<uint64_t>(n), n,
      [&](dist::WireWriter& w, int64_t k) {
        w.V64(k == 0 ? 0 : 1);  // the bytes of the name shared with the previous shard's
        w.VStr(k == 0 ? "t" : "");
        w.VStr(k == 0 ? "U8" : "");  // (empty: the previous shard's dtype)
        w.Dims(&n, 1);
        w.Dims(&k, 1);
        w.Dims(&one, 1);
        w.V64(4096 + static_cast<uint64_t>(k));
        w.V64(1);
      },
      version);
}

// A tensor of more shards than a manifest reader accepts (format::kMaxShardsPerTensor) is refused
// at the decision, naming it.
TEST(ManifestMergerTest, MoreShardsThanReadersAcceptAreRefused) {
  dist::ManifestMerger merger(1);
  SP_ASSERT_OK(merger.AddPlan(0, ElementPlan(int64_t{format::kMaxShardsPerTensor} + 1)));
  EXPECT_THAT(merger.Finish().status(),
              StatusIs(StatusCode::kResourceExhausted, "tensor \"t\": 1048577 shards"));
}

// Plans that leave the format version to the coordinator (SaveOptions::format_version 0) are
// merged into version 2, or 4 beyond dist::kIndexedAboveShards shards; a version asked for is
// kept; ranks that differ, or a version this build does not write, are refused.
TEST(ManifestMergerTest, CoordinatorPicksTheVersionWhenAskedTo) {
  auto version = [](int64_t shards, uint32_t asked) -> uint32_t {
    dist::ManifestMerger merger(1);
    EXPECT_TRUE(merger.AddPlan(0, ElementPlan(shards, asked)).ok());
    Result<std::shared_ptr<const dist::MergedPlan>> plan = merger.Finish();
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? (*plan)->version() : 0;
  };
  const auto most = static_cast<int64_t>(dist::kIndexedAboveShards);
  EXPECT_EQ(version(1, 0), format::kFormatVersion);
  EXPECT_EQ(version(most, 0), format::kFormatVersion);
  EXPECT_EQ(version(most + 1, 0), format::kCompactFormatVersion);
  EXPECT_EQ(version(most + 1, 2), 2u);
  EXPECT_EQ(version(most + 1, 3), 3u);
  EXPECT_EQ(version(1, 1), 1u);
  // Or more chunk entries than dist::kIndexedAboveChunks (one shard of 4 KiB chunks here).
  auto chunked = [](int64_t chunks) -> uint32_t {
    const int64_t bytes = int64_t{4096} * chunks;
    dist::ManifestMerger merger(1);
    EXPECT_TRUE(merger.AddPlan(0, OneShardPlan(bytes, 4096, 4096 + uint64_t(bytes), 4096, 0)).ok());
    Result<std::shared_ptr<const dist::MergedPlan>> plan = merger.Finish();
    return plan.ok() ? (*plan)->version() : 0;
  };
  const auto chunks = static_cast<int64_t>(dist::kIndexedAboveChunks);
  EXPECT_EQ(chunked(chunks), format::kFormatVersion);
  EXPECT_EQ(chunked(chunks + 1), format::kCompactFormatVersion);
  dist::ManifestMerger mixed(2);
  SP_ASSERT_OK(mixed.AddPlan(0, ElementPlan(1, 0)));
  EXPECT_THAT(mixed.AddPlan(1, ElementPlan(1, 4)),
              StatusIs(StatusCode::kInvalidArgument,
                       "rank 1 writes format version 4, rank 0 version 0 (savepoint's choice)"));
  EXPECT_THAT(dist::ManifestMerger(1).AddPlan(0, ElementPlan(1, format::kMaxFormatVersion + 1)),
              StatusIs(StatusCode::kInternal, "plan of rank 0: format version 5"));
}

// Four tensors of 24 elements over three ranks, each writing a third: the plans front-code the
// names and give a dtype only where it changes (docs/FORMAT.md §16).
struct ThirdsJob {
  const std::vector<std::pair<std::string, DType>> names = {{"block.0.attn.q", DType::kF32},
                                                            {"block.0.attn.v", DType::kF32},
                                                            {"block.0.mlp.up", DType::kBF16},
                                                            {"head", DType::kBF16}};
  // Rank `rank`'s local manifest (version 3: SaveChecksums::TakeInto reads its records), with the
  // checksums of its report; `shape` the global shape it claims.
  format::Manifest Plan(int rank, int64_t shape = 24) const {
    format::Manifest lm;
    lm.version = format::kIndexedFormatVersion;
    lm.chunk_bytes = 4096;
    lm.files.push_back({"data", 4096 + names.size() * 64});
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& [name, dtype] = names[i];
      format::ShardRecord s{{8 * rank}, {8}, 0, 4096 + i * 64, 8 * DTypeSize(dtype), {}};
      s.crc32c = {static_cast<uint32_t>(i)};
      lm.tensors.push_back({name, dtype, {shape}, {s}});
    }
    return lm;
  }
  std::string Encoded(int rank, int64_t shape = 24) const {
    return dist::EncodePlan(Status::OK(), Plan(rank, shape));
  }
};

// The merge rebuilds the names and dtypes. Rank 1's plan encodes each shape's 24 as the two
// bytes 0x98 0x00 (a varint with a redundant byte), so its shards take the decoded path; rank 2's
// plan, a writer's, those of the first hinted by rank 1's (their shapes' encodings compared);
// both make the same manifest. A hinted tensor of another shape is refused as any other.
TEST(ManifestMergerTest, ShardNamesAreFrontCoded) {
  const ThirdsJob job;
  const std::string plan = job.Encoded(0);
  auto count = [&](std::string_view what) {
    size_t n = 0;
    for (size_t at = plan.find(what); at != std::string::npos; at = plan.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("block.0."), 1u);
  EXPECT_EQ(count(DTypeName(DType::kF32)), 1u);
  EXPECT_EQ(count(DTypeName(DType::kBF16)), 1u);
  const std::string overlong = HandPlan(
      4096 + 4 * 64, 4,
      [&](dist::WireWriter& w, int64_t k) {
        w.V64(0);
        w.VStr(job.names[k].first);
        w.VStr(DTypeName(job.names[k].second));
        w.Raw(std::string("\x01\x98\x00", 3));  // one dimension: 24
        const int64_t off = 8, size = 8;
        w.Dims(&off, 1);
        w.Dims(&size, 1);
        w.V64(4096 + static_cast<uint64_t>(k) * 64);
        w.V64(8 * DTypeSize(job.names[k].second));
      },
      format::kIndexedFormatVersion);
  dist::ManifestMerger merger(3);
  SP_ASSERT_OK(merger.AddPlan(0, plan));
  SP_ASSERT_OK(merger.AddPlan(1, overlong));
  SP_ASSERT_OK(merger.AddPlan(2, job.Encoded(2)));
  auto merged = merger.Finish();
  SP_ASSERT_OK(merged.status());
  dist::SaveChecksums sums(*merged);
  for (int r = 0; r < 3; ++r)
    SP_ASSERT_OK(sums.Add(r, dist::EncodeCrcs(Status::OK(), job.Plan(r))));
  format::Manifest m;
  m.version = 2;
  sums.TakeInto(&m);
  ASSERT_EQ(m.tensors.size(), job.names.size());
  for (size_t i = 0; i < job.names.size(); ++i) {
    EXPECT_EQ(m.tensors[i].name, job.names[i].first);
    EXPECT_EQ(m.tensors[i].dtype, job.names[i].second);
    EXPECT_EQ(m.tensors[i].shape, Shape{24});
    ASSERT_EQ(m.tensors[i].shards.size(), 3u);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(m.tensors[i].shards[r].offsets, Shape{8 * r});
  }
  dist::ManifestMerger other(3);
  SP_ASSERT_OK(other.AddPlan(0, plan));
  SP_ASSERT_OK(other.AddPlan(1, job.Encoded(1)));
  EXPECT_THAT(other.AddPlan(2, job.Encoded(2, 25)),
              StatusIs(StatusCode::kInvalidArgument,
                       "tensor \"block.0.attn.q\": rank 2 has F32 [25] but another rank has F32 "
                       "[24]"));
}

// Front-coded names from an untrusted plan: a prefix longer than the previous name, a name over
// kMaxNameBytes and a first shard without a dtype are a malformed plan; names of 4096 bytes that
// cost the plan 19 bytes each are refused once they exceed the merge's budget for names.
TEST(ManifestMergerTest, HostileFrontCodedNamesAreRefused) {
  const int64_t one = 1, zero = 0;
  // Shard k's name: `shared` bytes of the previous one, then `rest`; dtype U8 unless `no_dtype`.
  auto plan = [&](int64_t shards, auto name) {
    return HandPlan(4096 + static_cast<uint64_t>(shards), shards,
                    [&](dist::WireWriter& w, int64_t k) {
                      const auto [shared, rest, dtype] = name(k);
                      w.V64(shared);
                      w.VStr(rest);
                      w.VStr(dtype);
                      w.Dims(&one, 1);
                      w.Dims(&zero, 1);
                      w.Dims(&one, 1);
                      w.V64(4096 + static_cast<uint64_t>(k));
                      w.V64(1);
                    });
  };
  using Name = std::tuple<uint64_t, std::string, std::string>;
  EXPECT_THAT(dist::ManifestMerger(1).AddPlan(
                  0, plan(2,
                          [](int64_t k) {
                            return Name{k == 0 ? 0 : 2, k == 0 ? "t" : "u", "U8"};
                          })),
              StatusIs(StatusCode::kInternal,
                       "plan of rank 0: shard 1: its name shares 2 bytes with a name of 1"));
  EXPECT_THAT(
      dist::ManifestMerger(1).AddPlan(
          0,
          plan(2,
               [](int64_t k) {
                 return Name{k == 0 ? 0 : 1, k == 0 ? "t" : std::string(kMaxNameBytes, 'u'), "U8"};
               })),
      StatusIs(StatusCode::kInternal,
               "plan of rank 0: shard 1: a name of 4097 bytes, over the limit of 4096"));
  EXPECT_THAT(dist::ManifestMerger(1).AddPlan(0, plan(1,
                                                      [](int64_t) {
                                                        return Name{0, "t", ""};
                                                      })),
              StatusIs(StatusCode::kInternal, "plan of rank 0: shard 0: no dtype"));
  // 5,000 names of 4,096 bytes (20 MB) in 99 KB of plan: over the budget (16 MiB, and 16 bytes per
  // plan byte) before the end.
  const std::string base(kMaxNameBytes - 6, 'n');
  const std::string bomb = plan(5000, [&](int64_t k) {
    return Name{k == 0 ? 0 : base.size(), (k == 0 ? base : "") + fmt::format("{:06}", k),
                k == 0 ? "U8" : ""};
  });
  EXPECT_LT(bomb.size(), 110'000u);
  EXPECT_THAT(dist::ManifestMerger(1).AddPlan(0, bomb),
              StatusIs(StatusCode::kResourceExhausted,
                       "rank 0's plans name new tensors in more bytes than the plans allow"));
}

// Version 4's records vary in size: a section that fits with its records at their smallest but
// not as laid is refused after the lay, naming the tensor.
TEST(ManifestMergerTest, CompactSectionBeyondItsCapIsRefusedAsLaid) {
  // 2^26 - 2 chunk entries of 4 bytes: 8 bytes under the cap, and the record takes more than 8.
  const int64_t n = ((int64_t{1} << 26) - 2) * 4096;
  for (uint32_t version : {3u, 4u}) {
    dist::ManifestMerger m(1);
    SP_ASSERT_OK(m.AddPlan(0, OneShardPlan(n, 4096, 4096 + uint64_t(n), 4096, version)));
    EXPECT_THAT(m.Finish().status(),
                StatusIs(StatusCode::kResourceExhausted, "tensor \"t\": its manifest section"))
        << version;
  }
}

TEST(ManifestMergerTest, ExtentMustHoldItsBox) {
  format::Manifest m;
  m.files.push_back({"data-00000-00000.spd", 8192});
  format::ShardRecord s{{0}, {100}, 0, 4096, 99, {}};
  m.tensors.push_back({"t", DType::kU8, {100}, {s}});
  EXPECT_THAT(dist::ManifestMerger(1).AddPlan(0, dist::EncodePlan(Status::OK(), m)),
              StatusIs(StatusCode::kInvalidArgument, "writes 99 bytes for a box of [100]"));
  // An empty box holds no bytes (whatever its other dimensions), as NumBytes says.
  SP_EXPECT_OK(dist::ManifestMerger(1).AddPlan(0, OneShardPlan(0, 4096, 4096)));
  // A chunk size no rank can have (its options are checked) is a malformed plan.
  EXPECT_THAT(dist::ManifestMerger(1).AddPlan(0, OneShardPlan(100, 4096, 4196, 64)),
              StatusIs(StatusCode::kInternal, "chunk size 64"));
}

// 40 shards planned in reverse box order, one chunk each: the manifest lists them in box order,
// each with its own checksum, whatever the order of the plan.
TEST(ManifestMergerTest, ShardsAreInBoxOrder) {
  constexpr int kShards = 40;
  format::Manifest plan, report;
  plan.chunk_bytes = 4096;
  plan.files.push_back({"data-00000-00000.spd", 4096 + kShards * 64});
  for (int i = kShards - 1; i >= 0; --i) {
    format::ShardRecord s{{i}, {1}, 0, 4096 + uint64_t(i) * 64, 4, {}};
    plan.tensors.push_back({"t", DType::kF32, {kShards}, {s}});
    s.crc32c = {1000u + static_cast<uint32_t>(i)};
    report.tensors.push_back({"t", DType::kF32, {kShards}, {s}});
  }
  dist::ManifestMerger merger(1);
  SP_ASSERT_OK(merger.AddPlan(0, dist::EncodePlan(Status::OK(), plan)));
  auto merged = merger.Finish().value();
  dist::SaveChecksums sums(merged);
  SP_ASSERT_OK(sums.Add(0, dist::EncodeCrcs(Status::OK(), report)));
  auto expect_ordered = [](const format::Manifest& m) {
    ASSERT_EQ(m.tensors.size(), 1u);
    ASSERT_EQ(m.tensors[0].shards.size(), size_t{kShards});
    for (int i = 0; i < kShards; ++i) {
      const format::ShardRecord& s = m.tensors[0].shards[i];
      EXPECT_EQ(s.offsets, Shape{i});
      EXPECT_EQ(s.offset, 4096 + uint64_t(i) * 64);
      EXPECT_EQ(s.crc32c, std::vector<uint32_t>{1000u + static_cast<uint32_t>(i)});
    }
  };
  format::Manifest v2;
  v2.version = 2;
  sums.TakeInto(&v2);
  expect_ordered(v2);
  // Version 3: the pieces make the manifest EncodeManifest writes for the same shards.
  format::Manifest v3;
  v3.version = 3;
  v3.chunk_bytes = 4096;
  std::string front;
  uint64_t largest = 0;
  std::string whole;
  for (std::string_view p : sums.EncodeIndexed(&v3, nullptr, &front, &largest)) whole += p;
  Result<format::Manifest> decoded = format::DecodeManifest(whole, "test");
  SP_ASSERT_OK(decoded.status());
  expect_ordered(*decoded);
  v3.tensors = decoded->tensors;
  EXPECT_EQ(format::EncodeManifest(v3), whole);
  EXPECT_EQ(largest, kShards * format::ShardRecordBytes(1) + kShards * 4);
}

// The plan of the one rank of a job saving a 4-element tensor.
std::string OneRankPlan(FileSystem* fs) {
  State s;
  static float w[4] = {1, 2, 3, 4};
  EXPECT_TRUE(s.PutView("w", TensorView(w, DType::kF32, {4})).ok());
  RankSave rank(0, 1);
  return rank.Plan(s, {}, {}, Io(fs));
}

TEST(PlanCacheKey, SecondDecisionLeavesTheFirst) {
  MemFileSystem mem;
  const std::string plan = OneRankPlan(&mem);
  SaveCoordinator c("/ckpt", 1, {}, Io(&mem));
  SP_ASSERT_OK(dist::DecodeVerdict(c.Decide({plan}), 1)->status);
  EXPECT_THAT(dist::DecodeVerdict(c.Decide({plan}), 1)->status,
              StatusIs(StatusCode::kFailedPrecondition, "already decided"));
  SP_EXPECT_OK(c.decided());
  // Plans of the wrong number of ranks.
  SaveCoordinator two("/two", 2, {}, Io(&mem));
  EXPECT_THAT(dist::DecodeVerdict(two.Decide({plan}), 2)->status,
              StatusIs(StatusCode::kInternal, "1 plans for 2 ranks"));
}

// The verdict gives the format version: a rank that asked for 0 writes the one given (of 2 to 4,
// which lay out a data file alike), a rank that asked for a version only that one.
TEST(SaveVerdictTest, RankWritesTheVersionItAskedOrWasGiven) {
  MemFileSystem mem;
  State s;
  static float w[4] = {1, 2, 3, 4};
  SP_ASSERT_OK(s.PutView("w", TensorView(w, DType::kF32, {4})));
  for (uint32_t asked : {0u, 1u}) {
    SCOPED_TRACE(asked);
    const SaveOptions o{.format_version = asked};
    RankSave rank(0, 1);
    const std::string plan = rank.Plan(s, {}, o, Io(&mem));
    SaveCoordinator c(fmt::format("/v{}", asked), 1, o, Io(&mem));
    SP_ASSERT_OK_AND_ASSIGN(dist::Verdict v, dist::DecodeVerdict(c.Decide({plan}), 1));
    EXPECT_EQ(v.version, asked == 0 ? format::kFormatVersion : asked);
    dist::Verdict other = v;
    other.version = asked == 0 ? 1 : format::kCompactFormatVersion;  // (1: another layout)
    SP_ASSERT_OK_AND_ASSIGN(std::string refused,
                            rank.Write(dist::EncodeVerdict(other), o, Io(&mem)));
    EXPECT_THAT(dist::DecodeStatus(refused, "report"),
                StatusIs(StatusCode::kInternal,
                         fmt::format("save verdict: format version {} for a rank that asked for {}",
                                     other.version, asked)));
    if (asked == 0) {
      v.version = format::kCompactFormatVersion;
      SP_ASSERT_OK_AND_ASSIGN(std::string report, rank.Write(dist::EncodeVerdict(v), o, Io(&mem)));
      SP_EXPECT_OK(dist::DecodeStatus(report, "report"));
    }
    for (uint32_t bad : {0u, format::kMaxFormatVersion + 1}) {  // (0: a verdict deciding no save)
      v.version = bad;
      EXPECT_THAT(
          dist::DecodeVerdict(dist::EncodeVerdict(v), 1),
          StatusIs(StatusCode::kInternal, fmt::format("save verdict: format version {}", bad)));
    }
  }
}

TEST(ManifestMergerTest, ChecksumReportsMustMatchThePlan) {
  dist::ManifestMerger merger(1);
  SP_ASSERT_OK(merger.AddPlan(0, OneShardPlan(5000, 4096, 9096)));
  auto plan = merger.Finish().value();  // two chunks of 4096 bytes
  format::Manifest m;
  format::ShardRecord s;
  s.crc32c = {1, 2};
  m.tensors.push_back({"t", DType::kU8, {5000}, {s}});
  const std::string good = dist::EncodeCrcs(Status::OK(), m);
  SP_EXPECT_OK(dist::SaveChecksums(plan).Add(0, good));
  m.tensors[0].shards[0].crc32c = {1};
  EXPECT_THAT(dist::SaveChecksums(plan).Add(0, dist::EncodeCrcs(Status::OK(), m)),
              StatusIs(StatusCode::kInternal, "bad chunk count"));
  for (size_t cut = 0; cut + 1 < good.size(); ++cut) {
    EXPECT_FALSE(dist::SaveChecksums(plan).Add(0, good.substr(0, cut)).ok()) << cut;
  }
  dist::SaveChecksums sums(plan);
  SP_ASSERT_OK(sums.Add(0, good));
  format::Manifest out;
  sums.TakeInto(&out);
  ASSERT_EQ(out.tensors.size(), 1u);
  EXPECT_EQ(out.tensors[0].shards[0].crc32c, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(out.tensors[0].shards[0].offset, 4096u);
  EXPECT_EQ(out.tensors[0].shards[0].sizes, Shape{5000});
}

// Rank `r`'s plan (or, with `crcs`, its checksum report) in a job of `world` ranks: "w" [2W, 6]
// F32 split by rows in reverse rank order, "b" [W] U8 one element per rank, "rng.<r>" of its own,
// and "half" [3 * floor(W/2)] I16 on the upper floor(W/2) ranks only. `w_dtype` replaces w's dtype.
format::Manifest JobPlan(int r, int world, bool crcs, DType w_dtype = DType::kF32,
                         uint32_t version = format::kFormatVersion) {
  format::Manifest m;
  m.version = version;
  m.chunk_bytes = 4096;
  uint64_t at = 4096;
  uint32_t crc = static_cast<uint32_t>(r) * 1000;
  auto add = [&](std::string name, DType dt, Shape shape, Shape offsets, Shape sizes) {
    format::ShardRecord s;
    s.offsets = std::move(offsets);
    s.sizes = std::move(sizes);
    s.offset = at;
    s.bytes = NumBytes(dt, s.sizes).value();
    at += (s.bytes + 63) / 64 * 64;  // (version 3 extents are 64-byte aligned)
    if (crcs) s.crc32c = {crc++};
    m.tensors.push_back({std::move(name), dt, std::move(shape), {s}});
  };
  add("b", DType::kU8, {world}, {r}, {1});
  add(fmt::format("rng.{}", r), DType::kU8, {4}, {0}, {4});
  const int upper = world - world / 2;  // (the first rank of the upper half)
  if (r >= upper) add("half", DType::kI16, {3 * (world / 2)}, {(r - upper) * 3}, {3});
  add("w", w_dtype, {2 * world, 6}, {2 * (world - 1 - r), 0}, {2, 6});
  m.files.push_back({"data", at});
  return m;
}

std::vector<std::string> JobPlans(int world, int bad = -1, DType bad_dtype = DType::kF32,
                                  uint32_t version = format::kFormatVersion) {
  std::vector<std::string> plans;
  for (int r = 0; r < world; ++r) {
    plans.push_back(dist::EncodePlan(
        Status::OK(),
        JobPlan(r, world, false, r >= bad && bad >= 0 ? bad_dtype : DType::kF32, version)));
  }
  return plans;
}

// The MANIFEST (of version 3, or 4 when the plans are) of the merge of `plans` on `threads`
// threads, with each rank's checksums.
std::string MergedManifest(const std::vector<std::string>& plans, int threads,
                           uint32_t version = format::kIndexedFormatVersion) {
  const int world = static_cast<int>(plans.size());
  auto merged = dist::MergePlans(plans, threads);
  EXPECT_TRUE(merged.ok()) << merged.status().ToString();
  if (!merged.ok()) return "";
  std::vector<std::string> reports;
  for (int r = 0; r < world; ++r) {
    reports.push_back(dist::EncodeCrcs(Status::OK(), JobPlan(r, world, true)));
  }
  dist::SaveChecksums sums(*merged);
  SP_EXPECT_OK(sums.AddAll(reports, nullptr, threads));
  format::Manifest m;
  m.version = version;
  m.chunk_bytes = 4096;
  std::string front, whole;
  uint64_t largest = 0;
  for (std::string_view p : sums.EncodeIndexed(&m, nullptr, &front, &largest)) whole += p;
  return whole;
}

// Ranges of ranks merged on several threads and joined make the manifest one merger makes.
TEST(MergePlansTest, RangesJoinedMakeTheSameManifest) {
  for (auto [world, version] : {std::pair{1, 3u}, {2, 3u}, {7, 3u}, {24, 3u}, {7, 4u}, {24, 4u}}) {
    SCOPED_TRACE(fmt::format("{} ranks, version {}", world, version));
    const std::vector<std::string> plans =
        JobPlans(world, -1, DType::kF32, version == 4 ? 4 : format::kFormatVersion);
    const std::string one = MergedManifest(plans, 1, version);
    EXPECT_EQ(format::GetU32(one, 8), version);
    Result<format::Manifest> m = format::DecodeManifest(one, "test");
    SP_ASSERT_OK(m.status());
    ASSERT_EQ(m->files.size(), static_cast<size_t>(world));
    const format::TensorRecord* w = nullptr;
    for (const format::TensorRecord& t : m->tensors) w = t.name == "w" ? &t : w;
    ASSERT_NE(w, nullptr);
    for (int k = 0; k < world; ++k) {  // in box order: rank world-1-k's shard, its checksum
      EXPECT_EQ(w->shards[k].offsets, (Shape{2 * k, 0}));
      EXPECT_EQ(w->shards[k].file, static_cast<uint32_t>(world - 1 - k));
      const uint32_t before = (world - 1 - k) >= world - world / 2 ? 3 : 2;  // (b, rng, half)
      EXPECT_EQ(w->shards[k].crc32c, std::vector<uint32_t>{(world - 1 - k) * 1000u + before});
    }
    for (int threads : {2, 3, 5, 8}) {
      EXPECT_EQ(MergedManifest(plans, threads, version), one) << threads;
    }
  }
}

// With the first round's digests each plan is checked as it is merged: a plan that is not its
// digest's is named before any merge error (rank 2's dtype conflict here), whatever the threads.
TEST(MergePlansTest, PlansAreCheckedAgainstTheirDigestsAsTheyAreMerged) {
  const std::vector<std::string> plans = JobPlans(24), bad = JobPlans(24, 2, DType::kF16);
  std::vector<std::string> digests, bad_digests;
  for (int r = 0; r < 24; ++r) {
    digests.push_back(dist::EncodePlanDigest(plans[r]));
    bad_digests.push_back(dist::EncodePlanDigest(bad[r]));
  }
  for (int threads : {1, 4}) {
    SCOPED_TRACE(threads);
    SP_EXPECT_OK(dist::MergePlans(plans, threads, &digests).status());
    EXPECT_THAT(dist::MergePlans(bad, threads, &bad_digests),
                StatusIs(StatusCode::kInvalidArgument, "rank 2 has F16"));
    std::vector<std::string> swapped = bad_digests;
    swapped[20] = digests[20];  // rank 20 sends a plan other than its digest's
    EXPECT_THAT(dist::MergePlans(bad, threads, &swapped),
                StatusIs(StatusCode::kInvalidArgument, "rank 20 sent a plan other than"));
    const std::vector<std::string> fewer(digests.begin(), digests.end() - 1);
    EXPECT_THAT(dist::MergePlans(plans, threads, &fewer),
                StatusIs(StatusCode::kInvalidArgument, "24 plans for 23 digests"));
  }
}

TEST(MergePlansTest, TheErrorIsTheFirstRanksWhateverTheThreads) {
  constexpr int kWorld = 12;
  for (int threads : {1, 4}) {
    SCOPED_TRACE(threads);
    // Ranks 6..11 disagree with 0..5 on w's dtype: with 4 threads, found when ranges are joined.
    EXPECT_THAT(dist::MergePlans(JobPlans(kWorld, 6, DType::kF16), threads).status(),
                StatusIs(StatusCode::kInvalidArgument,
                         "tensor \"w\": rank 6 has F16 [24, 6] but another rank has F32"));
    // A rank's own error, and a malformed plan: the first in rank order.
    std::vector<std::string> plans = JobPlans(kWorld);
    plans[10] = dist::EncodePlan(InvalidArgumentError("rank ten's own error"), {});
    plans[4] = plans[4].substr(0, plans[4].size() / 2);
    EXPECT_THAT(dist::MergePlans(plans, threads).status(),
                StatusIs(StatusCode::kInternal, "plan of rank 4"));
    plans[4] = JobPlans(kWorld)[4];
    EXPECT_THAT(dist::MergePlans(plans, threads).status(),
                StatusIs(StatusCode::kInvalidArgument, "rank 10: rank ten's own error"));
    // Ranks 9..11 write another format version and rank 10 fails on its own: rank 9's version is
    // the first error in rank order (with 4 threads, found only when ranges are joined).
    plans = JobPlans(kWorld);
    for (int r = 9; r < kWorld; ++r) {
      format::Manifest v1 = JobPlan(r, kWorld, false);
      v1.version = 1;
      plans[r] = dist::EncodePlan(Status::OK(), v1);
    }
    plans[10] = dist::EncodePlan(InvalidArgumentError("rank ten's own error"), {});
    EXPECT_THAT(dist::MergePlans(plans, threads).status(),
                StatusIs(StatusCode::kInvalidArgument, "rank 9 writes format version 1"));
    // Boxes that overlap across ranges.
    plans = JobPlans(kWorld);
    format::Manifest m = JobPlan(9, kWorld, false);
    m.tensors.back().shards[0].offsets = {2 * (kWorld - 1), 0};  // rank 0's rows
    plans[9] = dist::EncodePlan(Status::OK(), m);
    EXPECT_THAT(dist::MergePlans(plans, threads).status(),
                StatusIs(StatusCode::kInvalidArgument, "tensor \"w\""));
  }
}

TEST(MergePlansTest, ChecksumReportsOfManyRanksNameTheFirstBadOne) {
  constexpr int kWorld = 16;
  auto merged = dist::MergePlans(JobPlans(kWorld), 4).value();
  std::vector<std::string> reports;
  for (int r = 0; r < kWorld; ++r) {
    reports.push_back(dist::EncodeCrcs(Status::OK(), JobPlan(r, kWorld, true)));
  }
  reports[13] = "x";
  reports[5] = reports[5].substr(0, 9);
  EXPECT_THAT(dist::SaveChecksums(merged).AddAll(reports, nullptr, 4),
              StatusIs(StatusCode::kInternal, "checksums of rank 5"));
  reports.pop_back();
  EXPECT_THAT(dist::SaveChecksums(merged).AddAll(reports, nullptr, 4),
              StatusIs(StatusCode::kInternal, "15 checksum reports for 16 ranks"));
  // Every cut of a report, in any shard's counts or checksums, is refused naming its rank.
  const std::string whole = dist::EncodeCrcs(Status::OK(), JobPlan(3, kWorld, true));
  ASSERT_TRUE(dist::SaveChecksums(merged).Add(3, whole, nullptr).ok());
  for (size_t n = 0; n < whole.size(); ++n) {
    EXPECT_THAT(dist::SaveChecksums(merged).Add(3, whole.substr(0, n), nullptr),
                StatusIs(StatusCode::kInternal, "checksums of rank 3"))
        << n;
  }
}

// The second round of a decision must carry the plans whose digests the first carried: its
// merge is cached under the digests' key.
TEST(PlanCacheKey, SecondRoundMustCarryTheDigestedPlans) {
  MemFileSystem mem;
  const std::string plan = OneRankPlan(&mem);
  const std::string digest = dist::EncodePlanDigest(plan);
  EXPECT_TRUE(dist::PlanMatchesDigest(plan, digest));
  EXPECT_FALSE(dist::PlanMatchesDigest(plan + "x", digest));
  EXPECT_FALSE(dist::PlanMatchesDigest(plan, plan));
  for (const bool same : {false, true}) {
    dist::CachePlan({}, nullptr);  // empty
    SaveCoordinator c(same ? "/same" : "/other", 1, {}, Io(&mem));
    Result<dist::Verdict> v = dist::DecodeVerdict(c.Decide({digest}), 1);
    SP_ASSERT_OK(v.status());
    ASSERT_TRUE(v->need_plans);
    std::string other = plan;
    other.back() ^= 1;
    v = dist::DecodeVerdict(c.Decide({same ? plan : other}), 1);
    SP_ASSERT_OK(v.status());
    if (same) {
      SP_EXPECT_OK(v->status);
      bool any = false;
      EXPECT_NE(dist::CachedPlan(dist::PlanKey({digest}, &any)), nullptr);
    } else {
      EXPECT_THAT(v->status, StatusIs(StatusCode::kInvalidArgument,
                                      "rank 0 sent a plan other than the one it sent the digest"));
      bool any = false;
      EXPECT_EQ(dist::CachedPlan(dist::PlanKey({digest}, &any)), nullptr);
    }
  }
}

}  // namespace
}  // namespace savepoint
