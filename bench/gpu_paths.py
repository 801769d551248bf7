"""The other GPU paths, measured on a CUDA machine (docs/PERFORMANCE.md, "GPU").

In one run, with the physical references measured beside them:
  - manager: CheckpointManager(async_=True) saves of --gib GiB of CUDA tensors (cuda=True: straight
    into its page-locked staging slabs): the time save() blocks against a pinned device-to-host
    copy of the same bytes, and the time to the durable commit against dd write (O_DIRECT, fsync);
    cuda=False (to("cpu") first: the manager's path before) for comparison;
  - distributed: 2 gloo ranks on the one GPU, each holding half of --gib GiB as row-sharded CUDA
    DTensors, save synchronously (savepoint, then DCP's dcp.save of the same state dict) and load
    cold into the same DTensors: savepoint.load(like=, process_group=) through the pinned double
    buffers against dcp.load, and dd read of as many bytes;
  - sparse: a SparseTable of --rows rows x --dim float32 slot (and int64 ids) on the GPU, saved
    synchronously: the snapshot into pinned memory and the whole save, against a pinned copy of
    the same rows and dd write.
Usage: python bench/gpu_paths.py [--gib 8] [--rows 4000000] [--dim 128] [--dir /tmp/sp_gpu]
       [--sections manager,distributed,sparse]
With --dir on a tmpfs (/dev/shm) the storage is as fast as memory: what is left is each
library's own path (dd then runs without O_DIRECT, which tmpfs lacks).
"""

import argparse
import json
import os
import sys
import subprocess
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util  # noqa: E402
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import savepoint  # noqa: E402

GB = 1e9
RESERVE_WAIT_S = 15


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def pinned_copy(tensors, reps=2):
    """Best time of one non-blocking D2H copy of every tensor into page-locked host memory."""
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for h, t in zip(host, tensors):
            h.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def dd_pair(root, size):
    """dd write and read of `size` bytes in `root`: O_DIRECT, or buffered where the file system
    has no O_DIRECT (tmpfs)."""
    f = os.path.join(root, "dd.bin")
    count = max(1, size >> 26)
    write = ["if=/dev/zero", f"of={f}", "bs=64M", f"count={count}", "conv=fsync"]
    read = [f"if={f}", "of=/dev/null", "bs=64M"]
    try:
        w, _ = bench_util.timed(lambda: bench_util.dd(write + ["oflag=direct"]))
        read.append("iflag=direct")
    except subprocess.CalledProcessError:
        w, _ = bench_util.timed(lambda: bench_util.dd(write))
    bench_util.evict(f)
    r, _ = bench_util.timed(lambda: bench_util.dd(read))
    bench_util.remove(f)
    return w, r


def manager_saves(state, root, cuda, reps, reserve=False):
    """[{blocked_s, durable_s}] of `reps` manager saves (the first allocates the staging, unless
    `reserve`: then it was reserved when the manager opened, RESERVE_WAIT_S before)."""
    rows = []
    d = os.path.join(root, f"mgr-{cuda}")
    with savepoint.CheckpointManager(d, async_=True, staging_bytes=nbytes(state.values()),
                                     keep_last_n=1, cuda=cuda,
                                     reserve=state if reserve else None) as m:  # fmt: skip
        if reserve:
            time.sleep(RESERVE_WAIT_S)  # (training's first steps would run meanwhile)
        for step in range(1, reps + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m.save(step, state)
            blocked = time.perf_counter() - t0
            m.wait()
            rows.append({"blocked_s": blocked, "durable_s": time.perf_counter() - t0})
        back = m.restore(like={k: torch.empty_like(v) for k, v in state.items()})
        ok = all(torch.equal(back[k], v) for k, v in state.items())
    bench_util.remove(d)
    return rows, ok


def dist_rank(rank, world, root, gib, reps, out):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cuda", (world,))
    per = (gib << 30) // world // 32 // 4  # 32 tensors, float32, split over the ranks
    g = torch.Generator(device="cuda").manual_seed(7 + rank)

    def dtensors(fill):
        return {f"layer{i}.w": DTensor.from_local(
            torch.randn(per // 1024, 1024, device="cuda", generator=g) if fill else
            torch.empty(per // 1024, 1024, device="cuda"), mesh, [Shard(0)], run_check=False)
            for i in range(32)}  # fmt: skip

    state, like = dtensors(True), dtensors(False)
    rows = {}
    for who in ("savepoint", "dcp"):
        path = os.path.join(root, f"dist-{who}")
        t, _ = bench_util.timed_all(lambda: savepoint.save(
            state, path, process_group=dist.group.WORLD) if who == "savepoint" else
            dcp.save(state, checkpoint_id=path))  # fmt: skip
        if who == "dcp" and rank == 0:
            bench_util.fsync_tree(path)
        rows[f"{who}_save_s"] = t
        best = float("inf")
        for _ in range(reps):
            bench_util.cold(rank, path)
            for v in like.values():
                v.to_local().zero_()
            torch.cuda.synchronize()

            def load():
                if who == "savepoint":
                    savepoint.load(path, like=like, process_group=dist.group.WORLD)
                else:
                    dcp.load(like, checkpoint_id=path)
                torch.cuda.synchronize()

            t, _ = bench_util.timed_all(load)
            best = min(best, t)
        rows[f"{who}_load_s"] = best
        rows[f"{who}_equal"] = all(torch.equal(like[k].to_local(), v.to_local())
                                   for k, v in state.items())  # fmt: skip
        dist.barrier()
        if rank == 0:
            bench_util.remove(path)
        dist.barrier()
    rows["bytes"] = nbytes([v.to_local() for v in state.values()])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)


def distributed(root, gib, reps):
    out = tempfile.mkdtemp()
    store = tempfile.mktemp()
    mp.start_processes(bench_util.gloo_entry, args=(2, store, dist_rank, (root, gib, reps, out)),
                       nprocs=2, start_method="spawn")  # fmt: skip
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
    return {k: (max(r[k] for r in ranks) if k.endswith("_s") else
                sum(r[k] for r in ranks) if k == "bytes" else all(r[k] for r in ranks))
            for k in ranks[0]}  # fmt: skip


def sparse(root, rows, dim, reps):
    ids = torch.randperm(rows * 4, device="cuda")[:rows].to(torch.int64)
    emb = torch.randn(rows, dim, device="cuda")
    table = savepoint.SparseTable(ids, {"emb": emb})
    r = {"bytes": nbytes([ids, emb]), "pinned_s": pinned_copy([ids, emb], reps)}
    from savepoint import _sparse_io

    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        specs, owners = _sparse_io.table_specs([("t", table)])
        best = min(best, time.perf_counter() - t0)
        del specs, owners
    r["snapshot_s"] = best
    best = float("inf")
    for i in range(reps):
        path = os.path.join(root, f"sparse-{i}")
        torch.cuda.synchronize()
        t, _ = bench_util.timed(lambda: savepoint.save({"t": table}, path))
        best = min(best, t)
    back = savepoint.load(path)["t"]
    r["on_gpu"] = back.ids.is_cuda and back.slots["emb"].is_cuda
    order, want = torch.argsort(back.ids), torch.argsort(ids)
    r["equal"] = bool(torch.equal(back.slots["emb"][order], emb[want]))
    r["save_s"] = best
    for i in range(reps):
        bench_util.remove(os.path.join(root, f"sparse-{i}"))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dir", default="/tmp/sp_gpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sections", default="manager,distributed,sparse",
                    help="which sections to run (comma-separated)")  # fmt: skip
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    per = (a.gib << 30) // 64 // 4
    g = torch.Generator(device="cuda").manual_seed(1)
    state = {f"layer{i}.w": torch.randn(per, device="cuda", generator=g) for i in range(64)}
    size = nbytes(state.values())
    r = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bytes": size}
    print(f"{r['device']}, torch {r['torch']}, files in {a.dir}", flush=True)
    r["dd_write_s"], r["dd_read_s"] = dd_pair(a.dir, size)
    r["pinned_d2h_s"] = pinned_copy(list(state.values()), a.reps)
    sections = (
        ("manager", lambda: manager_section(r, state, a)),
        ("distributed", lambda: r.update(dist=distributed(a.dir, a.gib, 2))),
        ("sparse", lambda: r.update(sparse=sparse(a.dir, a.rows, a.dim, a.reps))),
    )
    for name, run in sections:
        if name not in a.sections.split(","):
            continue
        try:  # (each section reports on its own: one failing does not hide the others)
            run()
            REPORTS[name](r)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            print(f"{name}: FAILED", flush=True)
        if name == "manager":
            state.clear()
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


def manager_section(r, state, a):
    r["mgr_cuda"], r["mgr_cuda_equal"] = manager_saves(state, a.dir, True, a.reps)
    r["mgr_reserved"], _ = manager_saves(state, a.dir, True, 1, reserve=True)
    r["mgr_old"], r["mgr_old_equal"] = manager_saves(state, a.dir, False, 2)


def bw(s, gb):
    return f"{gb / s:6.1f} GB/s"


def report_manager(r):
    gb = r["bytes"] / GB
    pinned = r["pinned_d2h_s"]
    print(f"manager: {gb:.2f} GB of CUDA tensors (64)")
    print(f"  dd write / read (O_DIRECT)   {r['dd_write_s']:7.3f} / {r['dd_read_s']:.3f} s")
    print(f"  pinned D2H copy (reference)  {pinned:7.3f} s  {bw(pinned, gb)}")
    for key, label in (("mgr_cuda", "async, cuda=True"), ("mgr_old", "async, cuda=False")):
        rows = r[key]
        b = min(x["blocked_s"] for x in rows)
        c = min(x["durable_s"] for x in rows)
        print(f"  {label:28s} blocked {b:7.3f} s  {bw(b, gb)} ({pinned / b:4.0%} of pinned; first "
              f"save {rows[0]['blocked_s']:.3f} s); durable {c:6.2f} s "
              f"({r['dd_write_s'] / c:4.0%} of dd write's speed)")  # fmt: skip
    print(f"  async, cuda=True, reserve=state, {RESERVE_WAIT_S} s before the first save: "
          f"first save blocked {r['mgr_reserved'][0]['blocked_s']:.3f} s")
    print(f"  restored bytes equal: {r['mgr_cuda_equal']} / {r['mgr_old_equal']}", flush=True)


def report_dist(r):
    d = r["dist"]
    dgb = d["bytes"] / GB
    dd_read = r["dd_read_s"] * d["bytes"] / r["bytes"]  # (dd read scaled to these bytes)
    print(f"distributed: 2 ranks on one GPU, {dgb:.2f} GB of row-sharded CUDA DTensors")
    for who in ("savepoint", "dcp"):
        s, lo = d[f"{who}_save_s"], d[f"{who}_load_s"]
        print(f"  {who:10s} save {s:6.2f} s {bw(s, dgb)}; cold load {lo:6.2f} s {bw(lo, dgb)} "
              f"({dd_read / lo:4.0%} of dd read's speed); equal {d[f'{who}_equal']}")
    print(f"  savepoint load = {d['dcp_load_s'] / d['savepoint_load_s']:.2f}x dcp.load's speed; "
          f"save = {d['dcp_save_s'] / d['savepoint_save_s']:.2f}x dcp.save's", flush=True)


def report_sparse(r):
    s = r["sparse"]
    sgb = s["bytes"] / GB
    dd_write = r["dd_write_s"] * s["bytes"] / r["bytes"]
    print(f"sparse: one table on the GPU, {sgb:.2f} GB (ids + one slot)")
    print(f"  pinned copy of the rows      {s['pinned_s']:7.3f} s  {bw(s['pinned_s'], sgb)}")
    share = s["pinned_s"] / s["snapshot_s"]
    print(f"  snapshot into pinned memory  {s['snapshot_s']:7.3f} s  ({share:4.0%} of the pinned "
          "copy's speed)")  # fmt: skip
    print(f"  whole save (durable)         {s['save_s']:7.3f} s  ({dd_write / s['save_s']:4.0%} of "
          f"dd write's speed); loaded back on the GPU {s['on_gpu']}, equal {s['equal']}",
          flush=True)  # fmt: skip


REPORTS = {"manager": report_manager, "distributed": report_dist, "sparse": report_sparse}


if __name__ == "__main__":
    main()
