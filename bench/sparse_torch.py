#!/usr/bin/env python3
"""Sharded sparse-table save: savepoint against the baseline a RecIS user has today, torch.save of
each shard's ids and rows (one file per shard), on the same data in the same run, with `dd` as the
physical reference. The Python complement of bench/sparse_bench.cc (same table, same ids).

    PYTHONPATH=build/python build/venv/bin/python bench/sparse_torch.py --dir DIR
        [--rows 1048576] [--dim 64] [--shards 4] [--reps 3] [--fsync | --no-fsync]

The table: --rows int64 ids x --dim f32 with three slots ("embedding", "exp_avg", "exp_avg_sq"),
held by --shards gloo ranks (processes, CPU tensors). Shard r owns the ids of its RecIS slice range
savepoint.gen_slice(r, N): its i-th id is (i // width) * 65536 + begin + i % width, the ids in
random (hash-table) order, the rows random floats; every rank generates its own shard.

Measured per repetition, each from a barrier before to a barrier after on rank 0 (the slowest
rank's wall time):
  savepoint   savepoint.save({"emb": SparseTable(ids, slots)}, DIR/sp-<rep>, process_group=WORLD)
              (durable when it returns: files, directories and the commit are fsynced)
  torch.save  torch.save({"ids", "embedding", "exp_avg", "exp_avg_sq"}, DIR/torch-<rep>/
              shard-<r>.pt) on every rank, then (with --fsync, the default) fsync of the file and
              its directory inside the timed region, so that both saves are durable
  dd          dd if=/dev/zero bs=8M oflag=direct conv=fsync of savepoint's byte count, from rank 0
              alone while the others wait
and the loads with the same number of ranks (N -> N), cold (bench_util.evict first):
  savepoint   savepoint.load(DIR/sp-<rep>, process_group=WORLD, framework="pt") (checksums
              verified), every rank getting the rows it owns
  torch.load  torch.load(DIR/torch-<rep>/shard-<r>.pt) on every rank
Loads are checked (ids and row count, not timed). The order alternates between repetitions
(ABBA: savepoint, torch.save, dd; then dd, torch.save, savepoint); every repetition's outputs are
removed after it (with --no-fsync, the page cache is synced untimed after torch.save, so that its
writeback does not land on the next contender). The table shows medians; GiB/s are of the table's
bytes (ids and rows). Then the speed ratios within each repetition (median and range: the disk of
a shared machine is noisy) and, last, every ratio of the medians' speeds (above 1: the first is
faster).
"""

import argparse
import json
import os
import statistics
import tempfile

import savepoint
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bench_util import COLD, cold, dd, fsync_path, gloo_entry, remove, timed_all

SLOTS = ("embedding", "exp_avg", "exp_avg_sq")
DD_BLOCK = 8 << 20


# ----------------------------------------------------------------------------- the data


def make_shard(rank, world, rows, dim):
    """Shard `rank` of `world`: {"ids": int64 [n] in random order, slot: f32 [n, dim]}."""
    begin, end = savepoint.gen_slice(rank, world)
    n, width = rows // world, end - begin
    g = torch.Generator().manual_seed(rank)
    i = torch.arange(n, dtype=torch.int64)
    ids = (i // width) * 65536 + begin + i % width
    shard = {"ids": ids[torch.randperm(n, generator=g)]}
    for s in SLOTS:
        shard[s] = torch.rand(n, dim, generator=g)
    return shard


def table_bytes(rows, dim):
    return rows * (8 + 4 * dim * len(SLOTS))


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ----------------------------------------------------------------------------- the contenders


def sp_save(shard, path):
    table = savepoint.SparseTable(ids=shard["ids"], slots={s: shard[s] for s in SLOTS})
    savepoint.save({"emb": table}, path, process_group=dist.group.WORLD)


def torch_save(shard, path, fsync):
    if not fsync:
        torch.save(shard, path)
        return
    with open(path, "wb") as f:
        torch.save(shard, f)
        f.flush()
        os.fsync(f.fileno())
    for d in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        fsync_path(d)  # its directory entry, and the directory's in the parent


def dd_write(rank, root, nbytes):
    """dd of `nbytes` (rounded up to 8 MiB) from rank 0 alone; the file is removed untimed."""
    p = os.path.join(root, "dd")
    if rank == 0:
        count = max(1, -(-nbytes // DD_BLOCK))
        dd(["if=/dev/zero", f"of={p}", "bs=8M", f"count={count}", "oflag=direct", "conv=fsync"])
    return p


def sp_load(path):
    got = savepoint.load(path, process_group=dist.group.WORLD, framework="pt")["emb"]
    return got.ids, got.num_rows


def torch_load(path):
    got = torch.load(path)
    return got["ids"], got["ids"].shape[0]


def check_load(shard, got, what):
    ids, n = got
    assert n == shard["ids"].shape[0], f"{what}: {n} rows, expected {shard['ids'].shape[0]}"
    assert torch.equal(torch.sort(torch.as_tensor(ids)).values, torch.sort(shard["ids"]).values), \
        f"{what}: the ids differ"  # fmt: skip


# ----------------------------------------------------------------------------- the ranks


def on_rank0(rank, fn):
    dist.barrier()
    if rank == 0:
        fn()
    dist.barrier()


def one_rep(rank, shard, a, rep, nbytes):
    """One repetition's times: {"savepoint save": s, ...}; `nbytes` is dd's byte count."""
    sp_path = os.path.join(a.dir, f"sp-{rep}")
    pt_dir = os.path.join(a.dir, f"torch-{rep}")
    pt_path = os.path.join(pt_dir, f"shard-{rank}.pt")
    os.makedirs(pt_dir, exist_ok=True)
    res = {}

    def run_sp():
        res["savepoint save"] = timed_all(lambda: sp_save(shard, sp_path))[0]
        res["savepoint bytes"] = dir_bytes(sp_path)

    def run_pt():
        res["torch.save"] = timed_all(lambda: torch_save(shard, pt_path, a.fsync))[0]
        res["torch.save bytes"] = dir_bytes(pt_dir)
        if not a.fsync:  # untimed: its dirty pages must not slow down the next contender
            on_rank0(rank, os.sync)

    def run_dd():
        n = res.get("savepoint bytes", nbytes)  # this repetition's when savepoint ran first
        res["dd write"], p = timed_all(lambda: dd_write(rank, a.dir, n))
        on_rank0(rank, lambda: remove(p))

    for fn in (run_sp, run_pt, run_dd) if rep % 2 == 0 else (run_dd, run_pt, run_sp):
        fn()
    res.update(loads(rank, shard, sp_path, pt_path, pt_dir, rep))
    on_rank0(rank, lambda: (remove(sp_path), remove(pt_dir)))
    return res


def loads(rank, shard, sp_path, pt_path, pt_dir, rep):
    """The cold N -> N loads of this repetition's two saves (ABBA), checked after timing."""
    res = {}
    order = [("savepoint load", sp_path, lambda: sp_load(sp_path)),
             ("torch.load", pt_dir, lambda: torch_load(pt_path))]  # fmt: skip
    for name, root, fn in order if rep % 2 == 0 else order[::-1]:
        cold(rank, root)
        secs, got = timed_all(fn)
        res[name] = secs
        check_load(shard, got, name)
        del got
    return res


def ranks(rank, world, a, out):
    shard = make_shard(rank, world, a.rows, a.dim)
    nbytes = table_bytes(shard["ids"].shape[0] * world, a.dim)
    rows = {}
    for rep in range(a.reps):
        res = one_rep(rank, shard, a, rep, rows.get("savepoint bytes", [nbytes])[-1])
        for k, v in res.items():
            rows.setdefault(k, []).append(v)
        if rank == 0:
            times = ", ".join(f"{k} {v:.3f}s" for k, v in res.items() if "bytes" not in k)
            print(f"rep {rep + 1}/{a.reps}: {times}", flush=True)
    if rank == 0:
        rows["cold"] = COLD["method"]
        with open(out, "w") as f:
            json.dump(rows, f)


# ----------------------------------------------------------------------------- main


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="scratch directory (emptied of this run's files)")
    ap.add_argument("--rows", type=int, default=1 << 20, help="ids in the table (default 1048576)")
    ap.add_argument("--dim", type=int, default=64, help="f32 columns of every slot (default 64)")
    ap.add_argument("--shards", type=int, default=4, help="gloo ranks, one shard each (default 4)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions; medians (default 3)")
    ap.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                    help="fsync each torch.save file and its directory (default: on)")  # fmt: skip
    a = ap.parse_args()
    if a.shards < 1 or a.reps < 1 or a.rows < a.shards:
        ap.error("need --shards >= 1, --reps >= 1, --rows >= --shards")
    return a


def report(rows, a):
    med = {k: statistics.median(v) for k, v in rows.items()}
    rows_saved = a.rows // a.shards * a.shards
    gib = table_bytes(rows_saved, a.dim) / 2**30
    print(f"on disk: savepoint {med['savepoint bytes'] / 2**30:.3f} GiB, torch.save "
          f"{med['torch.save bytes'] / 2**30:.3f} GiB; cold reads: {COLD['method']}")  # fmt: skip
    print(f"medians of {a.reps} repetitions (ABBA); each run's seconds in brackets")
    for k in ("dd write", "savepoint save", "torch.save", "savepoint load", "torch.load"):
        runs = " ".join(f"{v:.3f}" for v in rows[k])
        print(f"{k:15} {med[k]:8.3f} s {gib / med[k]:7.2f} GiB/s  [{runs}]")
    print("per-repetition speed ratios, median [min-max]: " + "; ".join(
        spread(rows, f, s) for f, s in (("savepoint save", "torch.save"),
                                        ("savepoint save", "dd write"),
                                        ("torch.save", "dd write"),
                                        ("savepoint load", "torch.load"))))  # fmt: skip
    sp, pt, ddw = med["savepoint save"], med["torch.save"], med["dd write"]
    print(f"ratios: savepoint/torch.save speed {pt / sp:.2f}; savepoint/dd speed {ddw / sp:.2f}; "
          f"torch.save/dd speed {ddw / pt:.2f}; load savepoint/torch.load speed "
          f"{med['torch.load'] / med['savepoint load']:.2f}")  # fmt: skip


def spread(rows, fast, slow):
    """The speed ratio of two contenders within each repetition: "fast/slow r [lo-hi]"."""
    r = [rows[slow][i] / rows[fast][i] for i in range(len(rows[fast]))]
    return f"{fast}/{slow} {statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]"


def main():
    a = parse()
    a.dir = os.path.abspath(a.dir)
    os.makedirs(a.dir, exist_ok=True)
    rows_saved = a.rows // a.shards * a.shards
    print(f"savepoint {savepoint.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs; "
          f"table {rows_saved} ids x {a.dim} f32 x {len(SLOTS)} slots = "
          f"{table_bytes(rows_saved, a.dim) / 2**30:.2f} GiB over {a.shards} gloo ranks; "
          f"torch.save {'with' if a.fsync else 'WITHOUT'} fsync; dir {a.dir}",
          flush=True)  # fmt: skip
    store = tempfile.mktemp(prefix="savepoint-bench-store-")
    out = os.path.join(a.dir, "result.json")
    mp.start_processes(gloo_entry, args=(a.shards, store, ranks, (a, out)), nprocs=a.shards, start_method="fork")
    with open(out) as f:
        rows = json.load(f)
    remove(out)
    COLD["method"] = rows.pop("cold")
    report(rows, a)


if __name__ == "__main__":
    main()
