// The synthetic training layout of the scale harness (bench/scale_bench.cc, bench/scale_dcp.py
// builds the same one): a 70B-parameter decoder-only transformer (80 layers, hidden 8192, FFN
// 28672, 8 key/value heads of 128, vocabulary 128256) trained with tensor parallel TP x pipeline
// parallel PP x data parallel DP = world / (TP * PP):
//  - bf16 weights "model.<param>": column-parallel matrices split on dim 0 over TP, row-parallel
//    ones on dim 1, norms whole; replicated over DP (norms over TP too);
//  - fp32 Adam state "optim.<state>.<param>" for state in master, exp_avg, exp_avg_sq: each
//    rank's TP box split again over DP along its longest dim (ZeRO-1), replicated over TP for the
//    norms only;
//  - per rank: "rng" (u8 [world, 5072], row = rank) and "loader" (i64 [world, 16]).
// Ranks are numbered tp fastest, then dp, then pp: rank = (pp * DP + dp) * TP + tp.
#ifndef SAVEPOINT_BENCH_SCALE_LAYOUT_H_
#define SAVEPOINT_BENCH_SCALE_LAYOUT_H_

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "distributed/shard.h"
#include "savepoint/distributed.h"

namespace scale {

using savepoint::DType;
using savepoint::Shape;
using savepoint::ShardSpec;

constexpr int64_t kLayers = 80, kHidden = 8192, kFfn = 28672, kKv = 1024, kVocab = 128256;
constexpr int64_t kRngBytes = 5072, kLoaderWords = 16;
constexpr std::array<const char*, 3> kAdamStates = {"master", "exp_avg", "exp_avg_sq"};

struct Param {
  std::string name;
  Shape shape;
  int split;  // TP split dim, -1 = whole on every TP rank
};

// The parameters of pipeline stage `pp` of `stages`.
inline std::vector<Param> StageParams(int pp, int stages) {
  std::vector<Param> out;
  if (pp == 0) out.push_back({"embed.weight", {kVocab, kHidden}, 0});
  for (int64_t l = pp * kLayers / stages; l < (pp + 1) * kLayers / stages; ++l) {
    const std::string p = fmt::format("layers.{:02}.", l);
    out.push_back({p + "attn.q.weight", {kHidden, kHidden}, 0});
    out.push_back({p + "attn.k.weight", {kKv, kHidden}, 0});
    out.push_back({p + "attn.v.weight", {kKv, kHidden}, 0});
    out.push_back({p + "attn.o.weight", {kHidden, kHidden}, 1});
    out.push_back({p + "mlp.gate.weight", {kFfn, kHidden}, 0});
    out.push_back({p + "mlp.up.weight", {kFfn, kHidden}, 0});
    out.push_back({p + "mlp.down.weight", {kHidden, kFfn}, 1});
    out.push_back({p + "input_norm.weight", {kHidden}, -1});
    out.push_back({p + "post_norm.weight", {kHidden}, -1});
  }
  if (pp == stages - 1) {
    out.push_back({"final_norm.weight", {kHidden}, -1});
    out.push_back({"lm_head.weight", {kVocab, kHidden}, 0});
  }
  return out;
}

// Part i of n of [0, s) as (offset, size): the cut of SplitDim, which the layout follows.
using savepoint::dist::SplitRange;

struct Grid {
  int world, tp, pp;
  int dp() const { return world / (tp * pp); }
  int Rank(int p, int d, int t) const { return (p * dp() + d) * tp + t; }
};

struct Entry {
  std::string name;
  DType dtype;
  ShardSpec spec;
};

// Every local tensor of `rank` with its box and replicas. `rows`: the world of the save, whose
// per-rank tensors have a row per saving rank (a load into a smaller world reads the first rows).
inline std::vector<Entry> RankEntries(const Grid& g, int rank, int64_t rows) {
  const int t = rank % g.tp, d = (rank / g.tp) % g.dp(), p = rank / (g.tp * g.dp());
  std::vector<Entry> out;
  for (const Param& prm : StageParams(p, g.pp)) {
    ShardSpec w{prm.shape, Shape(prm.shape.size(), 0), prm.shape, {}};
    if (prm.split >= 0) {
      auto [o, s] = SplitRange(prm.shape[prm.split], g.tp, t);
      w.offsets[prm.split] = o, w.sizes[prm.split] = s;
    }
    for (int dd = 0; dd < g.dp(); ++dd) {
      for (int tt = 0; tt < g.tp; ++tt) {
        if (prm.split < 0 || tt == t) w.replicas.push_back(g.Rank(p, dd, tt));
      }
    }
    ShardSpec o = w;  // the optimizer's box: the TP box cut over DP along its longest dim
    o.replicas.clear();
    const size_t dim = std::max_element(w.sizes.begin(), w.sizes.end()) - w.sizes.begin();
    auto [off, size] = SplitRange(w.sizes[dim], g.dp(), d);
    o.offsets[dim] += off, o.sizes[dim] = size;
    if (prm.split < 0) {
      for (int tt = 0; tt < g.tp; ++tt) o.replicas.push_back(g.Rank(p, d, tt));
    }
    out.push_back({"model." + prm.name, DType::kBF16, std::move(w)});
    for (const char* state : kAdamStates) {
      out.push_back({fmt::format("optim.{}.{}", state, prm.name), DType::kF32, o});
    }
  }
  out.push_back({"rng", DType::kU8, {{rows, kRngBytes}, {rank, 0}, {1, kRngBytes}, {}}});
  out.push_back({"loader", DType::kI64, {{rows, kLoaderWords}, {rank, 0}, {1, kLoaderWords}, {}}});
  return out;
}

}  // namespace scale

#endif  // SAVEPOINT_BENCH_SCALE_LAYOUT_H_
