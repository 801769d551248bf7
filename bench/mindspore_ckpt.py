#!/usr/bin/env python3
"""MindSpore .ckpt benchmark: savepoint's .ckpt writer and reader (savepoint.mindspore, the C++
core) against MindSpore's own save_checkpoint / load_checkpoint, on the same state in the same
run, with `dd oflag=direct` / `iflag=direct` of as many bytes as the disk's yardstick.

    build/ms-venv/bin/python bench/mindspore_ckpt.py [--gib 2] [--dir build/bench-ckpt] [--trials 3]
    (PYTHONPATH=build/python for the build tree's savepoint; the MindSpore venv: scripts/msvenv)

Saves are durable when their time stops (MindSpore's file gets an explicit fsync of the file and
its directory inside the timed region; savepoint syncs itself). Loads are cold (bench_util.evict).
Each trial runs the contenders in a rotated order. Loads are checked against the saved arrays
(not timed). Goals (issue 15): plain .ckpt save and load >= 0.9x dd; >= 5x faster than MindSpore.
"""

import argparse
import os
import statistics

import mindspore as ms
import numpy as np
from bench_util import COLD, dd, evict, fsync_tree, remove, timed
from mindspore import Parameter, Tensor

from savepoint import mindspore as spms

MIB = 1 << 20


def make_state(total_bytes, seed=0):
    """float32 and float16 matrices of 8-32 MiB plus small vectors, as numpy arrays."""
    rng = np.random.default_rng(seed)
    out, used, i = {}, 0, 0
    sizes = [32 * MIB, 8 * MIB, 16 * MIB]
    while used < total_bytes:
        dtype = np.float32 if i % 2 == 0 else np.float16
        rows = max(1, min(sizes[i % 3], total_bytes - used) // (1024 * np.dtype(dtype).itemsize))
        out[f"layers.{i}.w"] = rng.standard_normal((rows, 1024), dtype=np.float32).astype(dtype)
        out[f"layers.{i}.b"] = rng.standard_normal(1024, dtype=np.float32)
        used += out[f"layers.{i}.w"].nbytes + 4096
        i += 1
    return out, sum(a.nbytes for a in out.values())


def ms_save(arrays, path):
    params = [{"name": k, "data": Parameter(Tensor(v), name=k)} for k, v in arrays.items()]
    ms.save_checkpoint(params, path)
    fsync_tree(path)


def ms_load(path):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(path).items()}


def sp_save(arrays, path):
    spms.save_checkpoint(arrays, path)


def check(arrays, loaded, who):
    for k, v in arrays.items():
        if not np.array_equal(loaded[k], v):
            raise SystemExit(f"{who}: {k} differs after the round trip")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--dir", default="build/bench-ckpt")
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    ms.set_context(device_target="CPU")
    os.makedirs(args.dir, exist_ok=True)
    arrays, nbytes = make_state(int(args.gib * (1 << 30)))
    blocks = nbytes // MIB
    ddfile = os.path.join(args.dir, "dd.bin")
    contenders = {
        "dd direct": (lambda p: dd(["if=/dev/zero", f"of={p}", "bs=1M", f"count={blocks}",
                                    "oflag=direct", "conv=fsync"]),
                      lambda p: dd([f"if={p}", "of=/dev/null", "bs=1M", "iflag=direct"])),
        "savepoint": (lambda p: sp_save(arrays, p), spms.load_checkpoint),
        "MindSpore": (lambda p: ms_save(arrays, p), ms_load),
    }  # fmt: skip
    res = {}
    for trial in range(args.trials):
        names = list(contenders)
        names = names[trial % len(names):] + names[: trial % len(names)]
        for name in names:
            save, load = contenders[name]
            p = ddfile if name.startswith("dd") else os.path.join(args.dir, name + ".ckpt")
            remove(p)
            res.setdefault(("save", name), []).append(timed(lambda: save(p))[0])
            evict(p)
            secs, loaded = timed(lambda: load(p))
            res.setdefault(("load", name), []).append(secs)
            if loaded is not None and not name.startswith("dd"):
                check(arrays, loaded, name)
            remove(p)
    print(f"{nbytes / 2**30:.2f} GiB in {len(arrays)} arrays; median of {args.trials} trials; "
          f"cold reads: {COLD['method']}")  # fmt: skip
    print(f"{'op':<5} {'method':<10} {'seconds':>8} {'GB/s':>6} {'x dd':>6} {'x savepoint':>11}  trials")
    for (op, name), secs in res.items():
        m = statistics.median(secs)
        dd_s = statistics.median(res[(op, "dd direct")])
        sp_s = statistics.median(res[(op, "savepoint")])
        trials = " ".join(f"{s:.3f}" for s in secs)
        print(f"{op:<5} {name:<10} {m:8.3f} {nbytes / m / 1e9:6.2f} {m / dd_s:6.2f} {m / sp_s:11.2f}"
              f"  [{trials}]")  # fmt: skip
    for op in ("save", "load"):
        sp, d, mso = (statistics.median(res[(op, n)]) for n in ("savepoint", "dd direct", "MindSpore"))
        print(f"goal {op}: savepoint / dd speed = {d / sp:.2f} (>= 0.9: {'met' if d / sp >= 0.9 else 'NOT met'}); "
              f"MindSpore / savepoint time = {mso / sp:.2f} (>= 5: {'met' if mso / sp >= 5 else 'NOT met'})")  # fmt: skip


if __name__ == "__main__":
    main()
