#!/usr/bin/env python3
"""Peak memory of a sparse table's compaction and of its load into the caller's own storage,
against the whole-table paths they replace, in the same run (docs/PERFORMANCE.md, "Sparse tables:
memory").

    PYTHONPATH=build/python build/venv/bin/python bench/sparse_memory.py --dir DIR
        [--gib 6] [--deltas 10] [--dim 32] [--batch-mb 256]

The chain: one table of --gib GiB (int64 ids and three f32 slots of --dim: 8 + 12 * dim bytes a
row; ids spread evenly over the slices, as hashed ids are), saved full, then --deltas deltas, each
updating 1% of the rows, deleting 0.05% and inserting 0.05% new ids. Each measurement runs in a
fresh process, from a cold page cache (bench_util.evict), and reports its wall time and peak RSS
(VmHWM, whole process, the Python interpreter and libraries included; "baseline" is that of a
process that only imports them; the chain is built in another process):
  compact      savepoint.sparse.compact(head, dst, batch_bytes=--batch-mb): the streaming
               compaction (parts of slices, bounded memory)
  load + save  savepoint.sparse.load_tables(head) then savepoint.save of the table: what
               compaction did before it streamed (the whole chain in memory)
  load_into    savepoint.sparse.load_into(head, {"emb": target}) where target's
               __savepoint_set_table__ copies each batch into its own preallocated arrays (the
               caller's existing storage, a table's size)
  load + copy  load_tables(head), then the same copy into the same arrays: the load into new
               arrays the caller then inserts from
Each is checked: the row count of the result equals the chain's.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from bench_util import COLD, evict, remove

SLOTS = ("embedding", "exp_avg", "exp_avg_sq")


def ids_of(first, n):
    """n ids from `first`, spread evenly over the slices (id mod 65536 steps by one)."""
    return (np.arange(first, first + n, dtype=np.int64) * 65537 + 12345).astype(np.int64)


def rows_for(ids, dim, version):
    base = (ids % 1000).astype(np.float32)[:, None] + np.arange(dim, dtype=np.float32)
    return {s: base + (version + k) for k, s in enumerate(SLOTS)}


def build(args):
    """The chain under --dir; returns (head, final rows, table bytes)."""
    import savepoint
    from savepoint import sparse

    row_bytes = 8 + 12 * args.dim
    n = int(args.gib * (1 << 30)) // row_bytes
    rng = np.random.default_rng(1)
    ids = ids_of(0, n)
    savepoint.save({"emb": sparse.SparseTable(ids, rows_for(ids, args.dim, 0))},
                   os.path.join(args.dir, "base"))  # fmt: skip
    live = np.ones(n, bool)
    next_id, rows, prev = n, n, os.path.join(args.dir, "base")
    for d in range(1, args.deltas + 1):
        alive = np.flatnonzero(live)
        pick = rng.choice(alive, size=int(0.0105 * n), replace=False)
        touched, deleted = pick[: int(0.01 * n)], pick[int(0.01 * n) :]
        live[deleted] = False
        new = ids_of(next_id, int(0.0005 * n))
        next_id += len(new)
        t_ids = np.concatenate([ids[touched], new])
        table = sparse.SparseTable(t_ids, rows_for(t_ids, args.dim, d), deleted=ids[deleted])
        head = os.path.join(args.dir, f"d{d}")
        savepoint.save({"emb": table}, head, base=prev)
        prev, rows = head, rows - len(deleted) + len(new)
    return prev, rows, rows * row_bytes


class Target:
    """The caller's storage: preallocated arrays a batch is copied into (pages touched as filled)."""

    def __init__(self, capacity, dim):
        self.ids = np.empty(capacity, np.int64)
        self.slots = {s: np.empty((capacity, dim), np.float32) for s in SLOTS}
        self.n = 0

    def __savepoint_set_table__(self, batch):
        k = len(batch.ids)
        self.ids[self.n : self.n + k] = batch.ids
        for s in SLOTS:
            self.slots[s][self.n : self.n + k] = batch.slots[s]
        self.n += k


def peak_rss():
    """This process's peak RSS in bytes (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM in /proc/self/status")


def child(mode, head, out, rows, dim, batch):
    import savepoint
    from savepoint import sparse

    t0 = time.perf_counter()
    got = 0
    if mode == "compact":
        sparse.compact(head, out, batch_bytes=batch)
        got = rows  # the parent checks the result, outside the measurement
    elif mode == "load + save":
        t = sparse.load_tables(head)["emb"]
        got = len(t.ids)
        savepoint.save({"emb": t}, out)
    elif mode == "load_into":
        target = Target(rows, dim)
        got = sparse.load_into(head, {"emb": target}, batch_bytes=batch)["emb"]
    elif mode == "load + copy":
        target = Target(rows, dim)
        target.__savepoint_set_table__(sparse.load_tables(head)["emb"])
        got = target.n
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak": peak_rss(), "rows": int(got)}))


def run_child(args, mode, head, rows):
    out = os.path.join(args.dir, "out")
    remove(out)
    evict(args.dir)
    cmd = [sys.executable, __file__, "--child", mode, "--head", head, "--out", out,
           "--rows", str(rows), "--dim", str(args.dim), "--batch-mb", str(args.batch_mb)]  # fmt: skip
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if mode == "compact":  # check the result in this process (not measured)
        from savepoint import sparse

        res["rows"] = len(sparse.load_tables(out, slots="embedding")["emb"].ids)
    remove(out)
    if res["rows"] != rows:
        raise SystemExit(f"{mode}: {res['rows']} rows, the chain has {rows}")
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir")
    p.add_argument("--gib", type=float, default=6)
    p.add_argument("--deltas", type=int, default=10)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch-mb", type=int, default=256)
    p.add_argument("--child")
    p.add_argument("--head")
    p.add_argument("--out")
    p.add_argument("--rows", type=int)
    args = p.parse_args()
    if args.child:
        if args.child == "baseline":
            import savepoint  # noqa: F401

            print(json.dumps({"seconds": 0, "peak": peak_rss(), "rows": args.rows}))
            return
        if args.child == "build":
            t0 = time.perf_counter()
            head, rows, table = build(args)
            print(json.dumps([head, rows, table, time.perf_counter() - t0]))
            return
        child(args.child, args.head, args.out, args.rows, args.dim, args.batch_mb << 20)
        return
    os.makedirs(args.dir, exist_ok=True)
    cmd = [sys.executable, __file__, "--child", "build", "--dir", args.dir, "--gib", str(args.gib),
           "--deltas", str(args.deltas), "--dim", str(args.dim)]  # fmt: skip
    built = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    head, rows, table, seconds = json.loads(built)
    results = {m: run_child(args, m, head, rows)
               for m in ("baseline", "compact", "load + save", "load_into", "load + copy")}  # fmt: skip
    print(f"chain: {args.deltas} deltas on a table of {table / 2**30:.2f} GiB ({rows} rows of "
          f"{8 + 12 * args.dim} B), built in {seconds:.0f} s; parts of {args.batch_mb} MiB; reads "
          f"cold ({COLD['method']})")  # fmt: skip
    base = results["baseline"]["peak"]
    print(f"{'':14}{'seconds':>9}{'peak RSS':>11}{'peak - baseline':>17}{'/ table':>9}")
    for m, r in results.items():
        print(f"{m:14}{r['seconds']:9.2f}{r['peak'] / 2**30:9.2f} G{(r['peak'] - base) / 2**30:15.2f} G"
              f"{r['peak'] / table:9.2f}")  # fmt: skip
    c, ls = results["compact"], results["load + save"]
    print(f"compact: peak {c['peak'] / 2**30:.2f} GiB vs {ls['peak'] / 2**30:.2f} GiB for load + "
          f"save; time {c['seconds'] / ls['seconds']:.2f}x of load + save")  # fmt: skip
    li, lc = results["load_into"], results["load + copy"]
    print(f"load_into: peak {li['peak'] / table:.3f}x the table ({lc['peak'] / table:.3f}x for "
          "load + copy)")
    for d in ["base"] + [f"d{i}" for i in range(1, args.deltas + 1)]:
        remove(os.path.join(args.dir, d))


if __name__ == "__main__":
    main()
