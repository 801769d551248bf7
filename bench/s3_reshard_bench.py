#!/usr/bin/env python3
"""A resharded load from object storage: 4 gloo ranks save DTensors (Shard(0) over 4) into a
bucket, 3 ranks load them (Shard(0) over 3), each fetching only the byte ranges its rows need,
against s5cmd downloading the same checkpoint (the same bytes) from the same server in the same
run: SeaweedFS (`weed mini`) on 127.0.0.1, started here by tests/s3/seaweed.py.

    PYTHONPATH=build/python build/venv/bin/python bench/s3_reshard_bench.py [--mib 1024] [--trials 3]
        [--chunk-mib 8,2] [--tensors 8]

Reports the load's wall time (the slowest rank, between barriers), the bytes the 3 ranks received
against the bytes they needed (the whole state, once), and the requests per GiB, for checkpoints
saved with each chunk size (8 MiB is the default): a rank reads whole chunks, since each chunk's
CRC32C is checked, so a chunk that two ranks' rows share is read by both: at most one chunk more
per border between two loading ranks in each tensor, a share that falls as tensors grow (--tensors
2 makes them 4 times as large as the default 8). Medians.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

import savepoint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "s3"))
from seaweed import Seaweed  # noqa: E402

MIB = 1 << 20
COLS = 4096  # float32 columns: a row is 16 KiB


def rows_of(total_bytes, tensors):
    return max(12, total_bytes // tensors // (COLS * 4) // 12 * 12)  # divisible by 4 and by 3


def sharded(mesh, rank, world, rows, tensors, fill):
    """{name: DTensor} row-sharded over `world`; values a function of (tensor, row, column)."""
    out = {}
    per = rows // world
    for i in range(tensors):
        local = torch.zeros(per, COLS)
        if fill:
            r = torch.arange(rank * per, (rank + 1) * per, dtype=torch.float32).unsqueeze(1)
            local += r * 0.5 + i + torch.arange(COLS, dtype=torch.float32) * 1e-3
        out[f"layer{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    return out


def run(rank, world, mode, uri, rows, tensors, chunk, store, results):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        state = sharded(mesh, rank, world, rows, tensors, fill=(mode == "save"))
        before = savepoint._core.s3_requests()
        dist.barrier()
        t0 = time.perf_counter()
        if mode == "save":
            savepoint.save(state, uri, process_group=dist.group.WORLD, timeout=600,
                           chunk_bytes=chunk)
        else:
            savepoint.load(uri, like=state, process_group=dist.group.WORLD, timeout=600)
        dist.barrier()
        seconds = time.perf_counter() - t0
        after = savepoint._core.s3_requests()
        if mode == "load":
            per = rows // world
            got = state["layer1.weight"].to_local()
            want = torch.arange(rank * per, (rank + 1) * per, dtype=torch.float32).unsqueeze(1)
            want = want * 0.5 + 1 + torch.arange(COLS, dtype=torch.float32) * 1e-3
            assert torch.equal(got, want), f"rank {rank} loaded other values"
        results[rank] = (seconds, {k: after[k] - before[k] for k in after})
    finally:
        dist.destroy_process_group()


def ranks(world, mode, uri, rows, tensors, chunk, scratch):
    with mp.Manager() as manager:
        results = manager.dict()
        store = tempfile.mktemp(dir=scratch, prefix="pg-")
        mp.spawn(run, args=(world, mode, uri, rows, tensors, chunk, store, results), nprocs=world,
                 join=True)
        return dict(results)


def measure(s3, args, rows, chunk, scratch):
    """Medians of (load seconds, s5cmd download seconds, bytes received, requests)."""
    loads, downloads, received, requests = [], [], [], []
    for t in range(args.trials):
        uri = f"s3://bench/reshard-{chunk >> 20}-{t}"
        ranks(4, "save", uri, rows, args.tensors, chunk, scratch)
        got = ranks(3, "load", uri, rows, args.tensors, chunk, scratch)
        loads.append(max(s for s, _ in got.values()))
        received.append(sum(c["bytes_received"] for _, c in got.values()))
        requests.append(sum(sum(c[k] for k in ("get", "head", "list")) for _, c in got.values()))
        assert all(c["list"] == 0 for _, c in got.values()), "a load made a LIST"
        out = os.path.join(scratch, f"down-{t}")
        t0 = time.perf_counter()
        s3.s5cmd("cp", f"{uri}/*", f"{out}/")
        downloads.append(time.perf_counter() - t0)
        shutil.rmtree(out)
        s3.s5cmd("rm", f"{uri}/*")
    return tuple(statistics.median(v) for v in (loads, downloads, received, requests))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--chunk-mib", default="8,2")
    ap.add_argument("--tensors", type=int, default=8)
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="savepoint-s3-reshard-",
                               dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    rows = rows_of(args.mib * MIB, args.tensors)
    needed = rows * COLS * 4 * args.tensors
    gib = needed / (1 << 30)
    results = {}
    with Seaweed(bucket="bench") as s3:
        os.environ.update(s3.env)
        for mib in map(int, args.chunk_mib.split(",")):
            results[mib] = measure(s3, args, rows, mib * MIB, scratch)
    shutil.rmtree(scratch)
    print(f"s3 resharded load 4 -> 3 ranks: {needed / MIB:.0f} MiB in {args.tensors} DTensors of "
          f"{needed / args.tensors / MIB:.0f} MiB, SeaweedFS on "
          f"127.0.0.1, {args.trials} trials (medians)")
    print(f"| {'what':<36} | {'s':>6} | {'MiB/s':>6} | {'vs s5cmd':>8} | {'read/needed':>11} | "
          f"{'req/GiB':>7} |")
    print(f"|{'-' * 38}|{'-' * 8}|{'-' * 8}|{'-' * 10}|{'-' * 13}|{'-' * 9}|")
    for mib, (load, down, received, requests) in results.items():
        what = f"load 4 -> 3, {mib} MiB chunks"
        print(f"| {what:<36} | {load:6.2f} | {needed / MIB / load:6.0f} | {down / load:7.2f}x | "
              f"{received / needed:11.3f} | {requests / gib:7.0f} |")
        what = f"s5cmd download (same run)"
        print(f"| {what:<36} | {down:6.2f} | {needed / MIB / down:6.0f} | {'':>8} | {'':>11} | "
              f"{'':>7} |")
    print("no load made a LIST request")


if __name__ == "__main__":
    main()
