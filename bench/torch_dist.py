#!/usr/bin/env python3
"""PyTorch distributed benchmark: savepoint's sharded save / load against
torch.distributed.checkpoint (DCP) with its FileSystemWriter / FileSystemReader, 4 gloo ranks on
the CPU holding a DTensor state dict sharded 2 x 2, in the same run, with `dd` as the disk's
yardstick.

    PYTHONPATH=build/python build/venv/bin/python bench/torch_dist.py [--gib 2] [--trials 1]
        [--dir build/bench-torch-dist]

Measured (every time from a barrier before to a barrier after, on rank 0, so it is the slowest
rank's): the synchronous save (both durable when they return: savepoint fsyncs and commits, DCP's
FileSystemWriter fsyncs its files); the cold load into the same DTensors (4 -> 4); the
asynchronous save's stall (the longest time a rank's save call blocked) and its time to durable
commit, against DCP's async_save; and the resharded load into a 2-rank job with a 1-D mesh and
the other dim sharded (4 -> 2), against the 4 -> 4 load of the same bytes. Loads are cold: the
page cache is dropped first (bench_util.evict); their results are checked (not timed). The
contenders alternate order between trials. dd writes (oflag=direct, conv=fsync) and reads
(iflag=direct) the same number of bytes with 64 MiB blocks.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import COLD, cold, dd, evict, gloo_entry, remove, timed, timed_all  # noqa: E402

import savepoint  # noqa: E402

COLS = 4096
ROWS = 4096  # 64 MiB per f32 tensor


def placements(world):
    from torch.distributed.tensor import Shard

    return (Shard(0), Shard(1)) if world == 4 else (Shard(1),)


def make_state(world, n_tensors, zero=False):
    """{"layers.i.w": DTensor [ROWS, COLS] f32} built from local shards (no rank holds a whole
    tensor); element (r, c) of tensor i is (r * COLS + c + i) as f32, or 0 with `zero`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = init_device_mesh("cpu", (2, 2) if world == 4 else (world,))
    sd = {}
    for i in range(n_tensors):
        shape, off = compute_local_shape_and_global_offset((ROWS, COLS), mesh, placements(world))
        local = torch.zeros(shape) if zero else expected(i, shape, off)
        sd[f"layers.{i}.w"] = DTensor.from_local(local, mesh, placements(world),
                                                 shape=(ROWS, COLS), stride=(COLS, 1))  # fmt: skip
    return sd


def expected(i, shape, off):
    rows = torch.arange(off[0], off[0] + shape[0], dtype=torch.float64)[:, None] * COLS
    return (rows + torch.arange(off[1], off[1] + shape[1], dtype=torch.float64)[None, :] + i).float()


def check(sd):
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    for i, t in enumerate(sd.values()):
        shape, off = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        assert torch.equal(t.to_local(), expected(i, shape, off)), f"tensor {i} differs"


def zero(sd):
    for t in sd.values():
        t.to_local().zero_()


def max_over_ranks(x):
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, x)
    return max(got)


# ----------------------------------------------------------------------------- the contenders


def sp_save(sd, p):
    savepoint.save(sd, p, process_group=dist.group.WORLD)


def dcp_save(sd, p):
    import torch.distributed.checkpoint as dcp

    dcp.save(sd, storage_writer=dcp.FileSystemWriter(p))


def sp_load(sd, p):
    savepoint.load(p, like=sd, process_group=dist.group.WORLD)


def dcp_load(sd, p):
    import torch.distributed.checkpoint as dcp

    dcp.load(sd, storage_reader=dcp.FileSystemReader(p))


def sp_async(sd, p):
    t = time.perf_counter()
    fut = savepoint.save(sd, p, process_group=dist.group.WORLD, async_=True)
    blocked = time.perf_counter() - t
    fut.wait()
    return blocked


def dcp_async(sd, p):
    import torch.distributed.checkpoint as dcp

    t = time.perf_counter()
    fut = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter(p))
    blocked = time.perf_counter() - t
    fut.result()
    return blocked


CONTENDERS = {"savepoint": (sp_save, sp_load, sp_async), "DCP": (dcp_save, dcp_load, dcp_async)}


def four_ranks(rank, world, root, n_tensors, trial, out):
    sd = make_state(world, n_tensors)
    res = {}
    names = list(CONTENDERS) if trial % 2 == 0 else list(CONTENDERS)[::-1]
    for name in names:
        save, load, async_save = CONTENDERS[name]
        p = os.path.join(root, name)
        res[f"{name} save"] = timed_all(lambda: save(sd, p))[0]
        zero(sd)
        cold(rank, p)
        res[f"{name} load 4->4"] = timed_all(lambda: load(sd, p))[0]
        check(sd)
        q = p + "-async"
        secs, blocked = timed_all(lambda: async_save(sd, q))
        res[f"{name} async stall"] = max_over_ranks(blocked)
        res[f"{name} async to commit"] = secs
        dist.barrier()
        if rank == 0:
            remove(q)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)


def two_ranks(rank, world, root, n_tensors, trial, out):
    sd = make_state(world, n_tensors, zero=True)
    res = {}
    names = list(CONTENDERS) if trial % 2 == 0 else list(CONTENDERS)[::-1]
    for name in names:
        p = os.path.join(root, name)
        cold(rank, p)
        res[f"{name} load 4->2"] = timed_all(lambda: CONTENDERS[name][1](sd, p))[0]
        check(sd)
        zero(sd)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)


def run(world, fn, *args):
    store = tempfile.mktemp(prefix="savepoint-bench-store-")
    mp.start_processes(gloo_entry, args=(world, store, fn, args), nprocs=world, start_method="fork")


def dd_trial(root, nbytes):
    p = os.path.join(root, "dd")
    count = max(1, nbytes // (64 << 20))
    write = timed(lambda: dd(["if=/dev/zero", f"of={p}", "bs=64M", f"count={count}",
                              "oflag=direct", "conv=fsync"]))[0]  # fmt: skip
    evict(p)
    read = timed(lambda: dd([f"if={p}", "of=/dev/null", "bs=64M", "iflag=direct"]))[0]
    remove(p)
    return {"dd write": write, "dd read": read}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="state size in GiB (default 2)")
    ap.add_argument("--dir", default="build/bench-torch-dist", help="scratch directory")
    ap.add_argument("--trials", type=int, default=1, help="repetitions; the table shows medians")
    args = ap.parse_args()
    n_tensors = max(1, int(args.gib * 2**30) // (ROWS * COLS * 4))
    nbytes = n_tensors * ROWS * COLS * 4
    os.makedirs(args.dir, exist_ok=True)
    print(f"savepoint {savepoint.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{n_tensors} DTensors of [{ROWS}, {COLS}] f32 = {nbytes / 2**30:.2f} GiB sharded 2 x 2 "
          f"over 4 gloo ranks, dir {args.dir}")  # fmt: skip
    rows = {}
    for trial in range(args.trials):
        res = {}
        if trial % 2 == 0:
            res.update(dd_trial(args.dir, nbytes))
        out = os.path.join(args.dir, "result.json")
        run(4, four_ranks, args.dir, n_tensors, trial, out)
        with open(out) as f:
            res.update(json.load(f))
        run(2, two_ranks, args.dir, n_tensors, trial, out)
        with open(out) as f:
            res.update(json.load(f))
        if trial % 2 == 1:
            res.update(dd_trial(args.dir, nbytes))
        for name in CONTENDERS:
            remove(os.path.join(args.dir, name))
        for k, v in res.items():
            rows.setdefault(k, []).append(v)
        print(f"trial {trial + 1}/{args.trials}: " + ", ".join(f"{k} {v:.2f}s" for k, v in res.items()),
              flush=True)  # fmt: skip
    report(rows, nbytes)


def report(rows, nbytes):
    med = {k: statistics.median(v) for k, v in rows.items()}
    gib = nbytes / 2**30
    print(f"cold reads: {COLD['method']}")
    print(f"{'operation':34} {'seconds':>8} {'GiB/s':>7} {'x dd':>6}")
    for k, v in med.items():
        ref = med["dd read"] if "load" in k or k == "dd read" else med["dd write"]
        print(f"{k:34} {v:8.3f} {gib / v:7.2f} {v / ref:6.2f}")
    print("goals (issue 17; save and load: >= 2x DCP, or savepoint at >= 0.9x dd's speed);")
    print("ratios of the same trial's times, median [min-max] over trials:")
    for what, num, den, goal in (
            ("save: DCP / savepoint (>= 2)", "DCP save", "savepoint save", 2.0),
            ("save: dd / savepoint (>= 0.9)", "dd write", "savepoint save", 0.9),
            ("load 4->4: DCP / savepoint (>= 2)", "DCP load 4->4", "savepoint load 4->4", 2.0),
            ("load 4->4: dd / savepoint (>= 0.9)", "dd read", "savepoint load 4->4", 0.9),
            ("async stall: savepoint / DCP (<= 1/3)", "savepoint async stall", "DCP async stall",
             1 / 3),
            ("load 4->2 / 4->4, savepoint (<= 1.2)", "savepoint load 4->2", "savepoint load 4->4",
             1.2)):  # fmt: skip
        ratios = [a / b for a, b in zip(rows[num], rows[den])]
        r = statistics.median(ratios)
        ok = r <= goal if "<=" in what else r >= goal
        print(f"  {what:42} {r:6.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
              f"{'met' if ok else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
