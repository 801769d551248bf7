// The messages of a distributed save and the coordinator's merge of per-rank descriptors into one
// global manifest.
//
// Each rank plans locally (which shards it writes, where in its own data file) and sends the
// coordinator one compact descriptor: its status, the format version it asks for, its file size,
// and per written shard the tensor name, dtype, global shape, box and extent. After writing it
// sends a second one with the shards' CRC32Cs. The coordinator never sees the other ranks' layouts
// or replicas: only the shards that will be in the manifest, which it needs anyway.
#ifndef SAVEPOINT_DISTRIBUTED_DESCRIPTOR_H_
#define SAVEPOINT_DISTRIBUTED_DESCRIPTOR_H_

#include <string>
#include <string_view>
#include <vector>

#include "crypto/aead.h"
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

// The plan cache's first round (SaveDistributed): instead of its plan, each rank sends the plan's
// digest (a u64 magic that no status code takes, then SHA-256(plan)); a coordinator that merged
// the same plans before decides from them, else its verdict asks for the plans (need_plans).
std::string EncodePlanDigest(std::string_view plan);
// Whether `plan` is the plan `digest` (EncodePlanDigest) was made of, by SHA-256: the second
// round's check that a rank sent the plan it digested, so that the merge may be cached under the
// first round's key.
bool PlanMatchesDigest(std::string_view plan, std::string_view digest);
// The digest a message carries: its SHA-256 for a digest message, else SHA-256 of the plan itself.
// *digest_only says which.
crypto::Sha256 PlanDigest(std::string_view message, bool* digest_only);

// The coordinator's verdict after planning.
struct Verdict {
  Status status;
  bool need_plans = false;  // the coordinator got digests it has no merge for: send the plans
  std::string tmp;          // temporary directory of the save
  uint64_t checkpoint_id = 0;
  // Per rank: the index of its data file, -1 when it writes none. The files are numbered in rank
  // order, so the message carries one bit per rank.
  std::vector<int64_t> file_index;
  std::string salt;  // encrypted saves: the checkpoint's salt (else empty)
  // The format version every rank writes: the one the ranks asked for, or the coordinator's
  // choice when they asked for 0 (SaveOptions::format_version). 0 in a verdict that decides no
  // save (an error, need_plans).
  uint32_t version = 0;
};
std::string EncodeVerdict(const Verdict& v);
Result<Verdict> DecodeVerdict(std::string_view bytes, int world);

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_DESCRIPTOR_H_
