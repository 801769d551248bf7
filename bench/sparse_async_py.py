#!/usr/bin/env python3
"""What an asynchronous save of a sparse table blocks a Python training loop for, against a copy
of the same bytes in the same run (docs/PERFORMANCE.md, "Asynchronous table saves").

    PYTHONPATH=build/python build/venv/bin/python bench/sparse_async_py.py --dir DIR
        [--rows 1048576,4194304] [--dim 32] [--reps 5] [--order hash|storage]

One table of --rows int64 ids and three f32 slots of --dim (8 + 12 * dim bytes a row), ids in hash
(random) order or in storage order (slice, id). Each rep, as a training loop does it: the table
is made anew from its arrays (savepoint.SparseTable), AsyncCheckpointer.save({"emb": table}) is
timed until it returns (the arrays may then change), the save is waited for, then the reference:
a numpy copy of the same arrays into one pre-touched buffer. Medians of --reps, the first save
shown apart (its staging memory is new). Prints per size
  rows R: save() blocked B ms (first F ms), copy C ms, ratio B/C
and ends with one line: "sparse async (python): ratios ..." (goal <= 1.2).
"""

import argparse
import os
import shutil
import statistics
import time

import numpy as np

import savepoint

SLOTS = ("embedding", "exp_avg", "exp_avg_sq")


def table_arrays(rows, dim, order):
    rng = np.random.default_rng(0)
    ids = rng.choice(np.int64(1) << 40, size=rows, replace=False).astype(np.int64)
    if order == "storage":
        ids = ids[np.lexsort((ids, ids & 0xFFFF))]
    slots = {s: np.full((rows, dim), k + 1.0, np.float32) for k, s in enumerate(SLOTS)}
    return ids, slots


def measure(args, rows):
    ids, slots = table_arrays(rows, args.dim, args.order)
    arrays = [ids, *slots.values()]
    dst = np.ones(sum(a.nbytes for a in arrays), np.uint8)  # pre-touched
    ck = savepoint.AsyncCheckpointer()
    blocked, copies = [], []
    try:
        for rep in range(args.reps):
            path = os.path.join(args.dir, f"async-{rows}-{rep}")
            t0 = time.perf_counter()
            fut = ck.save({"emb": savepoint.SparseTable(ids, slots)}, path)
            blocked.append(time.perf_counter() - t0)
            fut.wait()
            t0 = time.perf_counter()
            at = 0
            for a in arrays:
                b = a.reshape(-1).view(np.uint8)
                dst[at:at + b.size] = b
                at += b.size
            copies.append(time.perf_counter() - t0)
            shutil.rmtree(path)
    finally:
        ck.close()
    b, c = statistics.median(blocked), statistics.median(copies)
    print(f"rows {rows} ({sum(a.nbytes for a in arrays) / 1e6:.0f} MB, {args.order} order): "
          f"save() blocked {1e3 * b:.1f} ms (first {1e3 * blocked[0]:.1f} ms), copy "
          f"{1e3 * c:.1f} ms, ratio {b / c:.2f}", flush=True)  # fmt: skip
    return b / c


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--rows", default="1048576,4194304")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--order", choices=("hash", "storage"), default="hash")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    import torch  # noqa: F401, PLC0415 (imported as a training script has it, outside the timing)

    ratios = [measure(args, int(r)) for r in args.rows.split(",")]
    print("sparse async (python): ratios " + ", ".join(f"{r:.2f}" for r in ratios) +
          " (goal <= 1.2)")  # fmt: skip


if __name__ == "__main__":
    main()
