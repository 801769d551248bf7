"""Asynchronous distributed saves of CUDA state: the stall per rank (docs/PERFORMANCE.md, "GPU").

2 ranks (gloo, both on GPU 0) each hold --gib GiB of CUDA tensors as their own state
(savepoint.PerRank) and save asynchronously: savepoint.save(..., process_group=WORLD,
async_=True) against torch.distributed.checkpoint.async_save of the same tensors, with a plain
pinned device-to-host copy of the same bytes as the reference, in the same run. Prints, per
contender, the longest time a rank's call blocked and the time until the save was durable.

    python bench/gpu_dist.py [--gib 4] [--dir /tmp/sp_gpu_dist] [--reps 2]
"""

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def pinned_copy(tensors):
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for h, t in zip(host, tensors):
        h.copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def rank_main(rank, world, store, root, gib, reps, out):
    import savepoint
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    n = (gib << 30) // 16 // 4
    tensors = [torch.randn(n, device="cuda") for _ in range(16)]
    rows = {"pinned": [], "savepoint": [], "dcp": []}
    for rep in range(reps):
        rows["pinned"].append({"blocked": pinned_copy(tensors)})
        for who in ("savepoint", "dcp"):
            path = os.path.join(root, f"{who}-{rep}")
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if who == "savepoint":
                state = {"w": savepoint.PerRank({f"t{i}": t for i, t in enumerate(tensors)})}
                fut = savepoint.save(state, path, process_group=dist.group.WORLD, async_=True)
            else:
                state = {f"r{rank}.t{i}": t for i, t in enumerate(tensors)}
                fut = dcp.async_save(state, checkpoint_id=path)
            blocked = time.perf_counter() - t0
            fut.result()
            if who == "dcp" and rank == 0:
                bench_util.fsync_tree(path)
            dist.barrier()
            rows[who].append({"blocked": blocked, "durable": time.perf_counter() - t0})
            dist.barrier()
            if rank == 0:
                bench_util.remove(path)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/sp_gpu_dist")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    out = tempfile.mkdtemp()
    store = tempfile.mktemp()
    mp.start_processes(rank_main, args=(2, store, a.dir, a.gib, a.reps, out), nprocs=2,
                       start_method="spawn")  # fmt: skip
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
    gb = 2 * (a.gib << 30) / 1e9
    print(f"{torch.cuda.get_device_name()}: 2 ranks x {a.gib} GiB of CUDA tensors ({gb:.1f} GB)")
    for who in ("pinned", "savepoint", "dcp"):
        blocked = min(max(r[who][i]["blocked"] for r in ranks) for i in range(a.reps))
        line = f"  {who:10s} blocked {blocked:7.3f} s"
        if who != "pinned":
            durable = min(max(r[who][i]["durable"] for r in ranks) for i in range(a.reps))
            line += f"; durable {durable:6.2f} s"
        print(line)


if __name__ == "__main__":
    main()
