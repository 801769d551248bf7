"""GPU state in savepoint, measured on a CUDA machine (docs/PERFORMANCE.md, "GPU").

In one run, for a state of --gib GiB of CUDA tensors:
  - the physical references: dd write/read of the same bytes (O_DIRECT) and a plain
    device-to-host copy into page-locked memory (tensor.copy_ non-blocking into one pinned
    buffer, the best the host link gives);
  - savepoint's snapshot (AsyncCheckpointer(cuda=True): staging slabs page-locked once, driver
    copies on side streams): the time save() blocks, its D2H bandwidth as a share of the pinned
    copy's (goal >= 80%), and the time to the durable commit; with the staging cap >= the state
    and with a cap of a quarter of it;
  - the old path (cuda=False: tensor.to("cpu") first, then staged), and torch.distributed.
    checkpoint.async_save of the same state (no process group), for the stall;
  - loads into CUDA tensors (like=, through the pinned double buffers), cold (direct I/O: the
    page cache is not used), against dd read.
Usage: python bench/gpu_snapshot.py [--gib 8] [--dir /tmp/sp_gpu] [--reps 3] [--json out.json]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util  # noqa: E402
import torch  # noqa: E402

import savepoint  # noqa: E402

GB = 1e9


def make_state(gib, n):
    per = (gib << 30) // n // 4
    g = torch.Generator(device="cuda").manual_seed(1)
    return {f"layer{i}.w": torch.randn(per, device="cuda", generator=g) for i in range(n)}


def pinned_copy(state, reps):
    total = sum(t.numel() * t.element_size() for t in state.values())
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    s = torch.cuda.Stream()
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        at = 0
        with torch.cuda.stream(s):
            for t in state.values():
                n = t.numel() * t.element_size()
                host[at : at + n].view(t.dtype).copy_(t, non_blocking=True)
                at += n
        s.synchronize()
        best = min(best, time.perf_counter() - t0)
    back = time.perf_counter()
    at = 0
    for t in state.values():  # host-to-device from pinned memory, for the loads
        n = t.numel() * t.element_size()
        t.copy_(host[at : at + n].view(t.dtype), non_blocking=True)
        at += n
    torch.cuda.synchronize()
    h2d = time.perf_counter() - back
    del host
    return best, h2d


def pageable_copy(state, reps):
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = {k: v.to("cpu") for k, v in state.items()}
        best = min(best, time.perf_counter() - t0)
        del out
    return best


def savepoint_saves(state, root, reps, staging, cuda, label, threads=0):
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    rows = []
    with savepoint.AsyncCheckpointer(staging_bytes=staging, cuda=cuda, reserve=nbytes,
                                     snapshot_threads=threads) as ckpt:  # fmt: skip
        deadline = time.monotonic() + 120
        while ckpt.staging_allocated_bytes < min(staging, nbytes) and time.monotonic() < deadline:
            time.sleep(0.05)
        for i in range(reps):
            path = os.path.join(root, f"{label}-{i}")
            bench_util.remove(path)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fut = ckpt.save(state, path)
            blocked = time.perf_counter() - t0
            stats = fut.result()
            rows.append({"blocked_s": blocked, "commit_s": time.perf_counter() - t0,
                         "snapshot_s": stats.get("snapshot_seconds")})  # fmt: skip
            if i < reps - 1:
                bench_util.remove(path)
    return rows, os.path.join(root, f"{label}-{reps - 1}")


def dcp_async(state, root):
    try:
        import torch.distributed.checkpoint as dcp

        path = os.path.join(root, "dcp")
        bench_util.remove(path)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=path)
        blocked = time.perf_counter() - t0
        fut.result()
        bench_util.fsync_tree(path)
        done = time.perf_counter() - t0
        bench_util.remove(path)
        return {"blocked_s": blocked, "commit_s": done}
    except Exception as e:  # noqa: BLE001 (reported in the output)
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def loads(state, path, reps):
    like = {k: torch.empty_like(v) for k, v in state.items()}
    out = {}
    for mode in ("cold",):
        best = float("inf")
        for _ in range(reps):
            if mode == "cold":
                bench_util.evict(path)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            savepoint.load(path, like=like)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[mode] = best
    ok = all(torch.equal(like[k], v) for k, v in state.items())
    return out, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--dir", default="/tmp/sp_gpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    state = make_state(a.gib, a.tensors)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    r = {"device": torch.cuda.get_device_name(), "bytes": nbytes, "torch": torch.__version__}

    ddf = os.path.join(a.dir, "dd.bin")
    count = nbytes >> 26
    r["dd_write_s"], _ = bench_util.timed(lambda: bench_util.dd(
        ["if=/dev/zero", f"of={ddf}", "bs=64M", f"count={count}", "oflag=direct", "conv=fsync"]))
    bench_util.evict(ddf)
    r["dd_read_s"], _ = bench_util.timed(lambda: bench_util.dd(
        [f"if={ddf}", "of=/dev/null", "bs=64M", "iflag=direct"]))
    bench_util.remove(ddf)

    r["pinned_d2h_s"], r["pinned_h2d_s"] = pinned_copy(state, a.reps)
    r["pageable_to_cpu_s"] = pageable_copy(state, a.reps)
    r["sp_gpu"], last = savepoint_saves(state, a.dir, a.reps, nbytes, True, "gpu")
    for n in (4, 12, 16):
        r[f"sp_gpu_threads{n}"], _ = savepoint_saves(state, a.dir, 2, nbytes, True, f"t{n}", n)
    r["sp_gpu_quarter_cap"], _ = savepoint_saves(state, a.dir, 1, nbytes // 4, True, "quarter")
    r["sp_old_path"], _ = savepoint_saves(state, a.dir, a.reps, nbytes, False, "old")
    r["dcp_async_save"] = dcp_async(state, a.dir)
    r["sp_load_like_cuda_s"], r["load_equal"] = loads(state, last, a.reps)
    for d in os.listdir(a.dir):
        bench_util.remove(os.path.join(a.dir, d))
    report(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


def report(r):
    gb = r["bytes"] / GB
    bw = lambda s: f"{gb / s:6.1f} GB/s"  # noqa: E731
    best = lambda rows, k: min(x[k] for x in rows)  # noqa: E731
    pinned = r["pinned_d2h_s"]
    print(f"{r['device']}, torch {r['torch']}, state {gb:.2f} GB of CUDA tensors")
    print(f"  dd write (O_DIRECT, fsync)         {r['dd_write_s']:7.3f} s  {bw(r['dd_write_s'])}")
    print(f"  dd read (O_DIRECT)                 {r['dd_read_s']:7.3f} s  {bw(r['dd_read_s'])}")
    print(f"  pinned D2H copy (reference)        {pinned:7.3f} s  {bw(pinned)}")
    print(f"  pinned H2D copy (reference)        {r['pinned_h2d_s']:7.3f} s  {bw(r['pinned_h2d_s'])}")
    print(f"  tensor.to('cpu'), pageable         {r['pageable_to_cpu_s']:7.3f} s  "
          f"{bw(r['pageable_to_cpu_s'])}")  # fmt: skip
    for key, label in (("sp_gpu", "savepoint cuda=True, cap >= state"),
                       ("sp_gpu_threads4", "  the same, snapshot_threads=4"),
                       ("sp_gpu_threads12", "  the same, snapshot_threads=12"),
                       ("sp_gpu_threads16", "  the same, snapshot_threads=16"),
                       ("sp_gpu_quarter_cap", "savepoint cuda=True, cap = state/4"),
                       ("sp_old_path", "savepoint cuda=False (to('cpu'))")):  # fmt: skip
        b, c = best(r[key], "blocked_s"), best(r[key], "commit_s")
        print(f"  {label:34s} blocked {b:7.3f} s  {bw(b)}  ({pinned / b:4.0%} of pinned copy); "
              f"durable {c:6.2f} s ({r['dd_write_s'] / c:4.0%} of dd)")  # fmt: skip
    d = r["dcp_async_save"]
    if "error" in d:
        print(f"  DCP async_save                     failed: {d['error']}")
    else:
        sp = best(r["sp_gpu"], "blocked_s")
        print(f"  DCP async_save                     blocked {d['blocked_s']:7.3f} s; durable "
              f"{d['commit_s']:6.2f} s; savepoint's stall = {sp / d['blocked_s']:.2f}x DCP's")
    lc = r["sp_load_like_cuda_s"]["cold"]
    print(f"  savepoint.load(like=cuda) cold     {lc:7.3f} s  {bw(lc)}  "
          f"({r['dd_read_s'] / lc:4.0%} of dd read); bytes equal: {r['load_equal']}")


if __name__ == "__main__":
    main()
