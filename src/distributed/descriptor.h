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

#include <map>
#include <string>
#include <string_view>
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

// Merges per-rank descriptors (coordinator only).
class ManifestMerger {
 public:
  explicit ManifestMerger(int world) : world_(world), ranks_(world) {}
  // Adds rank `rank`'s plan. Returns the status that rank reported (with its rank named), or an
  // error when the descriptor is malformed or contradicts earlier ones (dtype, global shape,
  // format version, whether the save is encrypted).
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
  // Moves the merged files and tensors into `m` (tensors sorted by name, shards by box).
  void TakeInto(format::Manifest* m);

 private:
  struct RankInfo {
    uint64_t file_bytes = 0;
    std::vector<std::pair<format::TensorRecord*, size_t>> shards;  // where each shard went
  };
  int world_;
  uint64_t version_ = 0;  // the format version of the first plan added, and its rank
  int version_rank_ = 0;
  bool encrypted_ = false;  // whether that plan is encrypted
  std::vector<RankInfo> ranks_;
  std::map<std::string, format::TensorRecord, std::less<>> tensors_;
  std::vector<int64_t> file_index_;
  std::vector<format::FileRecord> files_;
};

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_DESCRIPTOR_H_
