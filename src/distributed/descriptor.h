// The messages of a distributed save and the coordinator's merge of per-rank descriptors into one
// global manifest.
//
// Each rank plans locally (which shards it writes, where in its own data file) and sends the
// coordinator one compact descriptor: its status, the format version it writes, its file size, and
// per written shard the tensor name, dtype, global shape, box and extent. After writing it sends a
// second one with the shards' CRC32Cs. The coordinator never sees the other ranks' layouts or
// replicas: only the shards that will be in the manifest, which it needs anyway.
#ifndef SAVEPOINT_DISTRIBUTED_DESCRIPTOR_H_
#define SAVEPOINT_DISTRIBUTED_DESCRIPTOR_H_

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "format/manifest.h"

namespace savepoint::dist {

// `lm` is a rank's local manifest: files[0] is its data file, tensors[i].shards[0] the shards it
// writes (with global shapes and boxes). The encoded status travels with the plan: a rank that
// failed to plan still takes part in the exchange, so the error reaches the coordinator.
// `encrypted`: whether the rank was given SaveOptions::key. The CRC report of an encrypted save
// carries the rank's key check and the chunks' GCM tags (lm.encryption and the shards' tags).
std::string EncodePlan(const Status& status, const format::Manifest& lm, bool encrypted = false);
std::string EncodeCrcs(const Status& status, const format::Manifest& lm);

// Status <-> bytes (for the coordinator's verdicts and results).
void EncodeStatus(const Status& s, std::string* out);
Status DecodeStatus(std::string_view bytes, std::string_view where);

// The coordinator's verdict after planning.
struct Verdict {
  Status status;
  std::string tmp;  // temporary directory of the save
  uint64_t checkpoint_id = 0;
  std::vector<int64_t> file_index;  // per rank: index of its data file, -1 when it writes none
  std::string salt;                 // encrypted saves: the checkpoint's salt (else empty)
};
std::string EncodeVerdict(const Verdict& v);
Result<Verdict> DecodeVerdict(std::string_view bytes, int world);

// Merges per-rank descriptors (coordinator only; merge.cc). The shards are held compactly (boxes
// flat, extents and checksums in arrays: a 16,384-rank save has millions), and a version 3
// manifest's sections are written straight from them (EncodeIndexed).
class ManifestMerger {
 public:
  explicit ManifestMerger(int world) : world_(world), ranks_(world) {}
  // Adds rank `rank`'s plan. Returns the status that rank reported (with its rank named), or an
  // error when the descriptor is malformed or contradicts earlier ones (dtype, global shape, box
  // rank, format version, whether the save is encrypted).
  Status AddPlan(int rank, std::string_view bytes);
  // Whether the ranks' plans are encrypted (after every AddPlan succeeded).
  bool encrypted() const { return encrypted_; }
  // After every plan: checks that the shards of every tensor tile it exactly (InvalidArgument
  // naming the tensor otherwise) and numbers the data files. Returns file indices per rank.
  Result<std::vector<int64_t>> Finish();
  // Adds rank `rank`'s CRC32Cs (after Finish), checking their counts against `chunk_bytes`, and
  // for an encrypted save its GCM tags and that its key check is `key_check` (the coordinator's:
  // InvalidArgument when the rank was given another key).
  Status AddCrcs(int rank, std::string_view bytes, uint64_t chunk_bytes,
                 const format::KeyCheck* key_check = nullptr);
  // After every AddCrcs: moves the merged files and tensors into `m` (tensors sorted by name,
  // shards by box).
  void TakeInto(format::Manifest* m);
  // After every AddCrcs, for a manifest of version 3: sets m's files and tensors (without shards)
  // and returns the whole MANIFEST (authenticated with `keys` when encrypted), its sections written
  // from the merged shards; *largest_section receives the largest section's size.
  std::string EncodeIndexed(format::Manifest* m, const format::CheckpointKeys* keys,
                            uint64_t* largest_section);

 private:
  struct Extent {
    uint64_t offset = 0, bytes = 0;  // in the rank's data file
    uint64_t crc_at = 0;             // first checksum (and tag) in crcs_ (tags_)
    uint32_t rank = 0;
    uint32_t chunks = 0;
  };
  struct Merged {  // one tensor
    std::string name;
    DType dtype = DType::kU8;
    Shape shape;
    std::vector<int64_t> boxes;  // 2 * ndim values per shard: the offsets, then the sizes
    std::vector<Extent> extents;
  };
  struct RankInfo {
    uint64_t file_bytes = 0;
    std::vector<std::pair<uint32_t, uint32_t>> shards;  // (tensor, shard) of each, in plan order
  };
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // The tensor of the i-th shard of rank `rank`'s plan, added when new; InvalidArgument when its
  // dtype or shape differs from another rank's.
  Result<Merged*> TensorOf(int rank, size_t i, std::string_view name, std::string_view dtype,
                           const int64_t* shape, size_t ndim);
  // The shards of `t` in box order.
  std::vector<uint32_t> BoxOrder(const Merged& t) const;
  // Tensors in name order.
  std::vector<uint32_t> NameOrder() const;

  int world_;
  uint64_t version_ = 0;  // the format version of the first plan added, and its rank
  int version_rank_ = 0;
  bool encrypted_ = false;  // whether that plan is encrypted
  std::vector<RankInfo> ranks_;
  std::vector<Merged> tensors_;
  std::unordered_map<std::string, uint32_t, NameHash, std::equal_to<>> index_;
  std::vector<uint32_t> hints_;  // the tensor of the previous plan's i-th shard
  std::vector<uint32_t> crcs_;
  std::vector<crypto::GcmTag> tags_;  // encrypted saves: one per checksum
  std::vector<int64_t> file_index_;
  std::vector<format::FileRecord> files_;
};

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_DESCRIPTOR_H_
