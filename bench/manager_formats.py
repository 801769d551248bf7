#!/usr/bin/env python3
"""CheckpointManager per format: how long a save blocks training and how long until it is durable,
for native checkpoints, MindSpore .ckpt files and safetensors files, synchronous and async, on the
same state in the same run, against a memcpy of the state (what an async save cannot beat) and
`dd oflag=direct` of as many bytes (what a durable save cannot beat).

    PYTHONPATH=build/python build/venv/bin/python bench/manager_formats.py [--gib 1] [--trials 3]
        [--dir build/bench-manager]

Each row is the median of the trials: "blocked" is the time save() held the caller, "durable" the
time until the checkpoint was committed (save() for synchronous managers, save() + wait() for
async ones). Every save is a new checkpoint of a fresh manager directory.
"""

import argparse
import os
import statistics

import numpy as np
from bench_util import dd, remove, timed

import savepoint

MIB = 1 << 20


def make_state(total_bytes, seed=0):
    rng = np.random.default_rng(seed)
    out, used, i = {}, 0, 0
    while used < total_bytes:
        rows = max(1, min(16 * MIB, total_bytes - used) // 4096)
        out[f"layers.{i}.w"] = rng.standard_normal((rows, 1024), dtype=np.float32)
        used += out[f"layers.{i}.w"].nbytes
        i += 1
    return out, used


def run_manager(state, directory, fmt, async_):
    remove(directory)
    with savepoint.CheckpointManager(directory, format=fmt, async_=async_, keep_last_n=1) as mgr:
        blocked, _ = timed(lambda: mgr.save(1, state))
        rest, _ = timed(mgr.wait)
    return blocked, blocked + rest


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--dir", default="build/bench-manager")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    state, nbytes = make_state(int(a.gib * (1 << 30)))
    dst = {k: np.empty_like(v) for k, v in state.items()}
    rows = {}
    for _ in range(a.trials):
        t, _ = timed(lambda: [np.copyto(dst[k], v) for k, v in state.items()])
        rows.setdefault("memcpy", []).append((t, t))
        raw = os.path.join(a.dir, "dd.bin")
        t, _ = timed(lambda: dd(["if=/dev/zero", f"of={raw}", "bs=8M",
                                 f"count={nbytes // (8 * MIB)}", "oflag=direct",
                                 "conv=fsync"]))  # fmt: skip
        remove(raw)
        rows.setdefault("dd oflag=direct", []).append((t, t))
        for fmt in ("native", "ckpt", "safetensors"):
            for async_ in (False, True):
                name = f"{fmt} {'async' if async_ else 'sync'}"
                rows.setdefault(name, []).append(
                    run_manager(state, os.path.join(a.dir, "m"), fmt, async_))
    remove(os.path.join(a.dir, "m"))
    gib = nbytes / (1 << 30)
    memcpy = statistics.median(b for b, _ in rows["memcpy"])
    ddt = statistics.median(d for _, d in rows["dd oflag=direct"])
    print(f"CheckpointManager save of {gib:.2f} GiB, median of {a.trials} trials")
    print(f"{'':22} {'blocked s':>10} {'durable s':>10} {'blocked/memcpy':>15} {'dd/durable':>11}")
    for name, vals in rows.items():
        b = statistics.median(v[0] for v in vals)
        d = statistics.median(v[1] for v in vals)
        print(f"{name:22} {b:10.3f} {d:10.3f} {b / memcpy:15.2f} {ddt / d:11.2f}")


if __name__ == "__main__":
    main()
