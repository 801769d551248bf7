// The coordinator's side of a distributed save: merging the ranks' plans into one plan of the
// manifest (ManifestMerger -> MergedPlan), adding each save's checksums to it (SaveChecksums), and
// the plan cache, so that a save whose plans are those of an earlier one does not merge again.
//
// At 16,384 ranks a save has millions of shards, so a MergedPlan holds them compactly: the shard
// records of the sections (docs/FORMAT.md §15, §17; version 3's for a save of version 1 or 2)
// already encoded, tensors in name order and shards in box order, plus where each shard's chunk
// entries go. A save then only places the
// checksums it gathers and copies records.
#ifndef SAVEPOINT_DISTRIBUTED_MERGE_H_
#define SAVEPOINT_DISTRIBUTED_MERGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "crypto/aead.h"
#include "format/manifest.h"

namespace savepoint::dist {

class WireReader;  // distributed/wire.h

// A shard's chunk entries in a MergedPlan: the first one's index and their count (a manifest has
// fewer than 2^30).
struct ChunkSpan {
  uint32_t first = 0;
  uint32_t count = 0;
};

// The merged plans of one save's ranks; immutable, so shared by the saves that reuse it.
class MergedPlan {
 public:
  int world() const { return world_; }
  uint32_t version() const { return version_; }
  bool encrypted() const { return encrypted_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // Per rank: the index of its data file in the manifest, -1 when it writes none.
  const std::vector<int64_t>& file_index() const { return file_index_; }

 private:
  friend class ManifestMerger;
  friend class SaveChecksums;
  struct Tensor {
    std::string name;
    DType dtype = DType::kU8;
    Shape shape;
    uint64_t first_shard = 0;  // its shards are [first_shard, first_shard + shards)
    uint64_t shards = 0;
    std::unique_ptr<char[]> records;  // its shards' records, in box order
    uint64_t record_bytes = 0;
    uint32_t records_crc = 0;  // CRC32C of its records
    std::string_view view() const { return {records.get(), record_bytes}; }
  };
  int world_ = 0;
  uint32_t version_ = 0;
  bool encrypted_ = false;
  uint64_t chunk_bytes_ = 0;

  std::vector<Tensor> tensors_;       // in name order
  std::vector<uint64_t> chunk_at_;    // per shard (and one past the last): its first chunk entry
  std::vector<uint64_t> rank_first_;  // per rank (and one past the last): into rank_chunks_
  // Each rank's shards, in the order of its plan: their chunk entries (first, count).
  std::vector<ChunkSpan> rank_chunks_;
  std::vector<int64_t> file_index_;
  std::vector<format::FileRecord> files_;
};

// How many threads the coordinator merges and checks a save of `world` ranks on: 1 below 512
// ranks (a small save is done in milliseconds), else the host's hardware threads, at most 8.
int CoordinatorThreads(size_t world);

// The format version a save whose ranks leave it to the coordinator (SaveOptions::format_version
// 0) is written in: 4 (format::kCompactFormatVersion) when it has more shards than
// kIndexedAboveShards or more chunks than kIndexedAboveChunks, else 2. Version 2's JSON manifest
// is decoded whole by every loading rank (about 60 bytes a shard, 11 a chunk's CRC32C); version
// 4's is read by sections.
inline constexpr uint64_t kIndexedAboveShards = uint64_t{1} << 16;
inline constexpr uint64_t kIndexedAboveChunks = uint64_t{1} << 20;

// Merges per-rank plans (EncodePlan) into a MergedPlan. One merger is used by one thread at a
// time; MergePlans runs several on ranges of ranks and joins them (Absorb).
class ManifestMerger {
 public:
  explicit ManifestMerger(int world) : world_(world), ranks_(world) {}
  // Adds rank `rank`'s plan. Returns the status that rank reported (with its rank named), or an
  // error when the descriptor is malformed or contradicts earlier ones (dtype, global shape, box
  // rank, format version, whether the save is encrypted).
  Status AddPlan(int rank, std::string_view bytes);
  // Adds the plans `later` holds (of ranks it alone was given, all after those of this merger's),
  // with the checks of AddPlan across the two; `later` is spent.
  Status Absorb(ManifestMerger&& later);
  // After every plan: picks the format version when the plans left it to the coordinator
  // (kIndexedAboveShards, kIndexedAboveChunks), numbers the data files, places the tensors
  // (ResourceExhausted when the manifest would exceed format::kMaxManifestFileBytes or a section
  // its cap), then per tensor, on up to `threads` threads, checks that its shards tile it exactly
  // (InvalidArgument naming the tensor otherwise) and lays out their records and chunk entries. The
  // merger is spent.
  Result<std::shared_ptr<const MergedPlan>> Finish(int threads = 1);

 private:
  struct Merged {  // one tensor
    std::string name;
    DType dtype = DType::kU8;
    Shape shape;
    std::string shape_wire;  // the shape as a plan encodes it (WireWriter::Dims)
    // Its shards, in the order added, as their plans encode them (checked once): per shard its
    // rank, the box's offsets and sizes (each with its count) and the extent's offset and bytes,
    // all varints. More absorbed from later ranks follow in `later` (Absorb).
    std::string boxes;
    std::vector<std::string> later;
    uint64_t shards = 0;         // in boxes and later
    uint64_t chunks = 0;         // the chunk entries of its shards
    uint32_t next = UINT32_MAX;  // the tensor after it in the last plan that had it (a hint)
  };
  struct RankInfo {
    uint64_t file_bytes = 0;
    std::vector<std::pair<uint32_t, uint32_t>> shards;  // (tensor, shard) of each, in plan order
  };
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Where a tensor goes in the MergedPlan (Lay).
  struct Place {
    uint64_t index = 0;  // in MergedPlan::tensors_ (name order)
    uint64_t shard = 0;  // its first shard's index in the plan
    uint64_t chunk = 0;  // its first chunk entry
    uint64_t id = 0;     // its first shard's index in the merger's order of all shards
  };
  struct Scratch;  // one thread's buffers (LayTensor)
  // The tensor of the i-th shard of rank `rank`'s plan when Hinted gave none: found by name, added
  // when new, and the hint set to it; InvalidArgument when its dtype or shape differs from another
  // rank's.
  Result<Merged*> TensorOf(int rank, size_t i, std::string_view name, std::string_view dtype,
                           const int64_t* shape, size_t ndim);
  // The hint of the i-th shard (TensorOf) when it has `name` and `dtype` and `r` is at its shape's
  // encoding (then skipped), else null: the common case, decoded without a lookup.
  Merged* Hinted(size_t i, std::string_view name, std::string_view dtype, WireReader& r);
  Status AddShards(int rank, uint64_t n, WireReader& r);
  // The hint of the i-th shard of a plan: the first shard's tensor in the previous plan, else the
  // tensor that followed the previous shard's.
  uint32_t& HintOf(size_t i) { return i == 0 ? first_hint_ : tensors_[prev_].next; }
  // Checks that `version`, `encrypted` and `chunk_bytes` of rank `rank`'s plan are the first
  // plan's (adopted when this is the first).
  Status SameSettings(int rank, uint64_t version, bool encrypted, uint64_t chunk_bytes);
  // Places every tensor in name order and sizes the plan's arrays (Finish's first pass).
  // *over_cap: the first tensor whose chunk entries or section exceed the manifest's caps even
  // with its records at their smallest.
  Result<std::vector<Place>> PlaceTensors(MergedPlan* plan, Status* over_cap);
  // Checks tensor `ti`'s tiling, then (when `lay`) encodes its records and writes its chunk
  // offsets at `at` and its shards' chunk entries into `spans` (Finish's second pass, one
  // task per tensor).
  Status LayTensor(uint32_t ti, const Place& at, bool lay, Scratch& scratch, MergedPlan* plan,
                   std::vector<ChunkSpan>* spans);
  // The caps on the laid records (Finish's third pass): each section within
  // format::kMaxManifestBodyBytes, the whole manifest within kMaxManifestFileBytes.
  static Status CheckSections(const MergedPlan& plan);

  int world_;
  uint64_t version_ = 0;  // the format version of the first plan added (0: Finish picks), its rank
  int version_rank_ = 0;
  bool encrypted_ = false;    // whether that plan is encrypted
  uint64_t chunk_bytes_ = 0;  // and its chunk size (0 until a plan is added)
  std::vector<RankInfo> ranks_;
  std::vector<Merged> tensors_;
  std::unordered_map<std::string, uint32_t, NameHash, std::equal_to<>> index_;
  uint32_t first_hint_ = UINT32_MAX;  // the tensor of the previous plan's first shard
  // The bytes new tensors' names may still take. A front-coded name costs its plan a few bytes
  // however long it is: the names are held to kNameBytesPerPlanByte per byte of the plans added,
  // beyond kNameAllowance, so that a plan cannot make the merge hold hundreds of times its size.
  static constexpr uint64_t kNameAllowance = uint64_t{16} << 20;
  static constexpr uint64_t kNameBytesPerPlanByte = 16;
  uint64_t name_budget_ = kNameAllowance;
  uint32_t prev_ = UINT32_MAX;  // the tensor of the shard before (AddShards)
};

// Merges the plans of a save (plans[r] is rank r's): on `threads` threads, each merging a range
// of ranks, then joined in rank order. With `digests` (the first round's, SaveCoordinator::Decide),
// each plan is checked to be its digest's (CheckPlansAgainstDigests) just before it is decoded.
// The error is that of the first rank (in rank order) whose plan is not its digest's, else of the
// first whose plan fails or contradicts an earlier rank's.
Result<std::shared_ptr<const MergedPlan>> MergePlans(
    const std::vector<std::string>& plans, int threads,
    const std::vector<std::string>* digests = nullptr);

// One save's checksums (EncodeCrcs reports) on its MergedPlan, and the manifest they make.
class SaveChecksums {
 public:
  explicit SaveChecksums(std::shared_ptr<const MergedPlan> plan);
  // Adds rank `rank`'s report: checks its shard and chunk counts against the plan, and for an
  // encrypted save takes its GCM tags and checks that its key check is `key_check` (the
  // coordinator's: InvalidArgument when the rank was given another key).
  Status Add(int rank, std::string_view bytes, const format::KeyCheck* key_check = nullptr);
  // Add for every rank (reports[r] is rank r's), on `threads` threads (ranks fill disjoint
  // entries). The error is the first rank's, in rank order.
  Status AddAll(const std::vector<std::string>& reports, const format::KeyCheck* key_check,
                int threads);
  // After every Add: sets m's files and tensors, with their shards (tensors sorted by name, shards
  // by box). For manifests of versions 1 and 2.
  void TakeInto(format::Manifest* m) const;
  // After every Add, for a manifest of version 3 or 4: sets m's files and tensors (without shards)
  // and returns the whole MANIFEST as pieces to write back to back (authenticated with `keys` when
  // encrypted): header and head in *front, then each section as the plan's records and this
  // save's chunk entries, not copied (views of *front, the plan and this object). An encrypted
  // manifest is built whole in *front. *largest_section receives the largest section's size.
  std::vector<std::string_view> EncodeIndexed(format::Manifest* m,
                                              const format::CheckpointKeys* keys,
                                              std::string* front, uint64_t* largest_section) const;

 private:
  std::shared_ptr<const MergedPlan> plan_;
  std::vector<uint32_t> crcs_;        // per chunk entry (MergedPlan::chunk_at_)
  std::vector<crypto::GcmTag> tags_;  // encrypted saves: the same
};

// The plan cache: the MergedPlan of the last plans merged in this process, by their key
// (PlanKey); null when `key` is not it. Thread-safe. It holds one plan, so its memory is that of
// one merge (a few hundred megabytes at 16,384 ranks, on the coordinator only).
std::shared_ptr<const MergedPlan> CachedPlan(const crypto::Sha256& key);
void CachePlan(const crypto::Sha256& key, std::shared_ptr<const MergedPlan> plan);
// The key of a save's plans (or their digests, EncodePlanDigest): SHA-256 over the world size and
// each plan's SHA-256 (a plan holds its format version, chunk size, file size and shards), hashed
// on `threads` threads. *any_digest: whether a message was a digest.
crypto::Sha256 PlanKey(const std::vector<std::string>& plans, bool* any_digest, int threads = 1);
// Checks (on `threads` threads) that plans[r] is the plan digests[r] was made of
// (PlanMatchesDigest), so that the merge of the plans may be cached under the digests' key.
// InvalidArgument naming the first rank whose plan is another.
Status CheckPlansAgainstDigests(const std::vector<std::string>& plans,
                                const std::vector<std::string>& digests, int threads);

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_MERGE_H_
