"""PyTorch DCP's default planners at 64 .. 16,384 simulated ranks, in one process, on the layout of
bench/scale_layout.h (the peer of bench/scale_bench.cc; docs/PERFORMANCE.md, "Scale").

    scale_dcp.py [--ranks 64,1024,4096,16384] [--tp 8] [--pp 8] [--load-tp 4] [--samples 3]

Each rank's tensors are boxes that speak DCP's checkpointable protocol (__create_write_items__,
__create_chunk_list__, size()), returning what a DTensor of that placement returns, so DCP's own
code runs unchanged:
  - per rank: DefaultSavePlanner.set_up_planner + create_local_plan, and the pickling of the plan
    that DCP's gather sends;
  - coordinator: unpickling the N plans and DefaultSavePlanner.create_global_plan (dedup_save_plans,
    create_default_global_save_plan, the global plan's validation); peak Python memory over it;
  - load (TP --load-tp, N / 2 ranks): unpickling the .metadata every rank reads, then
    DefaultLoadPlanner.set_up_planner + create_local_plan for one rank (median of --samples).
Prints one JSON object per N.
"""

import argparse
import gc
import json
import pickle
import resource
import sys
import time

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.metadata import TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

LAYERS, HIDDEN, FFN, KV, VOCAB = 80, 8192, 28672, 1024, 128256
RNG_BYTES, LOADER_WORDS = 5072, 16
ADAM = ("master", "exp_avg", "exp_avg_sq")
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "u8": torch.uint8, "i64": torch.int64}


def stage_params(pp, stages):
    out = [("embed.weight", (VOCAB, HIDDEN), 0)] if pp == 0 else []
    for layer in range(pp * LAYERS // stages, (pp + 1) * LAYERS // stages):
        p = f"layers.{layer:02}."
        out += [(p + "attn.q.weight", (HIDDEN, HIDDEN), 0), (p + "attn.k.weight", (KV, HIDDEN), 0),
                (p + "attn.v.weight", (KV, HIDDEN), 0), (p + "attn.o.weight", (HIDDEN, HIDDEN), 1),
                (p + "mlp.gate.weight", (FFN, HIDDEN), 0), (p + "mlp.up.weight", (FFN, HIDDEN), 0),
                (p + "mlp.down.weight", (HIDDEN, FFN), 1), (p + "input_norm.weight", (HIDDEN,), -1),
                (p + "post_norm.weight", (HIDDEN,), -1)]
    if pp == stages - 1:
        out += [("final_norm.weight", (HIDDEN,), -1), ("lm_head.weight", (VOCAB, HIDDEN), 0)]
    return out


def part(s, n, i):
    return i * s // n, (i + 1) * s // n - i * s // n


class Box:
    """One rank's box of a global tensor, as DCP sees a DTensor of that placement."""

    def __init__(self, dtype, shape, offsets, sizes):
        self.global_size = torch.Size(shape)
        self.chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        self.properties = TensorProperties(dtype=DTYPES[dtype])

    def size(self):
        return self.global_size

    def __create_write_items__(self, fqn, obj):
        return [WriteItem(index=MetadataIndex(fqn, self.chunk.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=self.chunk,
                                                      properties=self.properties,
                                                      size=self.global_size))]

    def __create_chunk_list__(self):
        return [self.chunk]


def rank_state(world, tp, pp, rank, rows):
    """The state dict of `rank` (the same boxes as scale::RankEntries)."""
    dp = world // (tp * pp)
    t, d, p = rank % tp, (rank // tp) % dp, rank // (tp * dp)
    out = {}
    for name, shape, split in stage_params(p, pp):
        offsets, sizes = [0] * len(shape), list(shape)
        if split >= 0:
            offsets[split], sizes[split] = part(shape[split], tp, t)
        out["model." + name] = Box("bf16", shape, offsets, sizes)
        dim = max(range(len(sizes)), key=lambda k: (sizes[k], -k))
        off, size = part(sizes[dim], dp, d)
        o_off, o_size = list(offsets), list(sizes)
        o_off[dim] += off
        o_size[dim] = size
        for state in ADAM:
            out[f"optim.{state}.{name}"] = Box("f32", shape, o_off, o_size)
    out["rng"] = Box("u8", (rows, RNG_BYTES), (rank, 0), (1, RNG_BYTES))
    out["loader"] = Box("i64", (rows, LOADER_WORDS), (rank, 0), (1, LOADER_WORDS))
    return out


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(world, a):
    row = {"ranks": world}
    blobs, plan_s = [], []
    for rank in range(world):
        planner = DefaultSavePlanner()
        t0 = time.perf_counter()
        planner.set_up_planner(rank_state(world, a.tp, a.pp, rank, world), None, rank == 0)
        blobs.append(pickle.dumps(planner.create_local_plan()))
        plan_s.append(time.perf_counter() - t0)
    row["rank_plan_ms_mean"] = 1e3 * sum(plan_s) / world
    row["plan_bytes"] = sum(len(b) for b in blobs)
    gc.collect()
    before = peak_mib()
    t0 = time.perf_counter()
    plans = [pickle.loads(b) for b in blobs]
    _, metadata = DefaultSavePlanner().create_global_plan(plans)
    row["coordinate_s"] = time.perf_counter() - t0
    row["coordinator_peak_growth_mib"] = peak_mib() - before  # ru_maxrss only grows
    del plans, blobs
    md = pickle.dumps(metadata)
    del metadata
    gc.collect()
    row["metadata_bytes"] = len(md)
    times = []
    load_world = world // 2
    for i in range(a.samples):
        rank = (load_world - 1) * i // max(1, a.samples - 1)
        state = rank_state(load_world, a.load_tp, a.pp, rank, world)
        t0 = time.perf_counter()
        planner = DefaultLoadPlanner()
        planner.set_up_planner(dict(state), pickle.loads(md), rank == 0)
        planner.state_dict = state  # _init_state_dict sets non-tensors to None
        planner.create_local_plan()
        times.append(time.perf_counter() - t0)
    row["load_plan_ms"] = 1e3 * sorted(times)[len(times) // 2]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="64,1024,4096,16384")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--load-tp", type=int, default=4)
    ap.add_argument("--samples", type=int, default=3)
    a = ap.parse_args()
    for world in (int(x) for x in a.ranks.split(",")):
        print(json.dumps(run(world, a)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
