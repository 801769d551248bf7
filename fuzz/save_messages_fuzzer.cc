// Fuzz target for the messages of a distributed save (src/distributed/descriptor.h, merge.h,
// docs/FORMAT.md §16): what the coordinator decodes from other ranks. The first byte picks the
// message and how the input makes it:
//   bits 0-1: 0 a plan (ManifestMerger::AddPlan as rank 1 of 2, rank 0's plan real, then Finish;
//               and MergePlans on 2 threads, which must agree),
//             1 a checksum report (SaveChecksums::Add on the merged plan of two real plans),
//             2 a verdict (DecodeVerdict for 2 ranks), 3 a plan or digest (PlanKey, PlanDigest,
//               PlanMatchesDigest);
//   bit 2:    0 the rest of the input is the message; 1 it edits the real message of that kind:
//             3-byte patches (position low, high, value), the message cut at the length the first
//             two bytes give (mod its length + 1).
// Any input must give OK or a clean error: no crash, no sanitizer report, no huge allocation. A
// report that is accepted must make a manifest that names every shard of the plan.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/descriptor.h"
#include "distributed/merge.h"
#include "savepoint/distributed.h"

namespace {

using namespace savepoint;

struct Real {
  std::vector<std::string> plans, reports;
  std::string verdict;
  std::shared_ptr<const dist::MergedPlan> merged;
};

// Two ranks' plans and reports of a small save (a split tensor and a replicated one), made once.
const Real& Messages() {
  static const Real real = [] {
    Real r;
    static float w[8][6];
    static uint8_t b[20];
    for (int rank = 0; rank < 2; ++rank) {
      State s;
      ShardLayout layout{{"w", SplitDim({8, 6}, 0, 2, rank).value()}};
      if (!s.PutView("w", TensorView(w[4 * rank], DType::kF32, {4, 6})).ok()) std::abort();
      if (!s.PutView("b", TensorView(b, DType::kU8, {20})).ok()) std::abort();
      RankSave save(rank, 2);
      r.plans.push_back(save.Plan(s, layout, SaveOptions{.chunk_bytes = 4096}, {}));
      if (!save.planned().ok()) std::abort();
      format::Manifest m;  // the report of the plan: one checksum per shard (one chunk each)
      for (int shard = 0; shard < (rank == 0 ? 2 : 1); ++shard) {
        format::ShardRecord sh;
        sh.crc32c = {0x1234u + static_cast<uint32_t>(shard)};
        m.tensors.push_back({"t", DType::kU8, {1}, {sh}});
      }
      r.reports.push_back(dist::EncodeCrcs(Status::OK(), m));
    }
    dist::ManifestMerger merger(2);
    for (int rank = 0; rank < 2; ++rank) {
      if (!merger.AddPlan(rank, r.plans[rank]).ok()) std::abort();
    }
    r.merged = merger.Finish().value();
    dist::SaveChecksums sums(r.merged);
    if (!sums.Add(0, r.reports[0]).ok() || !sums.Add(1, r.reports[1]).ok()) std::abort();
    dist::Verdict v;
    v.tmp = "/tmp/.x.savepoint-tmp";
    v.checkpoint_id = 7;
    v.file_index = r.merged->file_index();
    v.version = r.merged->version();
    v.salt = std::string(16, 's');
    r.verdict = dist::EncodeVerdict(v);
    return r;
  }();
  return real;
}

// The message the input makes from `real` (bit 2 of the first byte: edits of it).
std::string Message(const uint8_t* data, size_t size, const std::string& real) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if ((data[0] & 4) == 0) return std::string(in.substr(1));
  std::string m = real;
  if (size < 3) return m;
  const size_t cut = (data[1] | size_t{data[2]} << 8) % (m.size() + 1);
  for (size_t at = 3; at + 3 <= size && !m.empty(); at += 3) {
    m[(data[at] | size_t{data[at + 1]} << 8) % m.size()] = static_cast<char>(data[at + 2]);
  }
  m.resize(cut == 0 ? m.size() : cut);
  return m;
}

// Merged by one merger, and by two joined (MergePlans on 2 threads): both accept it or neither.
void Plan(const std::string& msg) {
  const Real& real = Messages();
  dist::ManifestMerger merger(2);
  if (!merger.AddPlan(0, real.plans[0]).ok()) std::abort();
  Status added = merger.AddPlan(1, msg);
  Result<std::shared_ptr<const dist::MergedPlan>> plan =
      added.ok() ? merger.Finish() : Result<std::shared_ptr<const dist::MergedPlan>>(added);
  Result<std::shared_ptr<const dist::MergedPlan>> joined =
      dist::MergePlans({real.plans[0], msg}, 2);
  if (plan.ok() != joined.ok()) std::abort();
  if (!plan.ok()) return;
  if ((*plan)->file_index() != (*joined)->file_index()) std::abort();
  if ((*plan)->version() != (*joined)->version()) std::abort();
  if ((*plan)->file_index().size() != 2) std::abort();
}

void Report(const std::string& msg) {
  const Real& real = Messages();
  dist::SaveChecksums sums(real.merged);
  if (!sums.Add(0, msg).ok() || !sums.Add(1, real.reports[1]).ok()) return;
  format::Manifest m;
  sums.TakeInto(&m);
  size_t shards = 0;
  for (const format::TensorRecord& t : m.tensors) shards += t.shards.size();
  if (shards != 3) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Real& real = Messages();
  switch (data[0] & 3) {
    case 0:
      Plan(Message(data, size, real.plans[1]));
      break;
    case 1:
      Report(Message(data, size, real.reports[0]));
      break;
    case 2:
      dist::DecodeVerdict(Message(data, size, real.verdict), 2).status().IgnoreError();
      break;
    default: {
      bool any = false;
      const std::string msg = Message(data, size, dist::EncodePlanDigest(real.plans[0]));
      dist::PlanKey({msg, real.plans[1]}, &any);
      dist::PlanMatchesDigest(real.plans[0], msg);
      break;
    }
  }
  return 0;
}
