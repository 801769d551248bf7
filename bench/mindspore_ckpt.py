#!/usr/bin/env python3
"""MindSpore .ckpt benchmark: savepoint's .ckpt writer and reader (savepoint.mindspore, the C++
core) against MindSpore's own save_checkpoint / load_checkpoint, on the same state in the same
run, with `dd oflag=direct` / `iflag=direct` of as many bytes as the disk's yardstick.

    build/ms-venv/bin/python bench/mindspore_ckpt.py [--gib 2] [--dir build/bench-ckpt] [--trials 3]
    (PYTHONPATH=build/python for the build tree's savepoint; the MindSpore venv: scripts/msvenv)

Saves are durable when their time stops (MindSpore's file gets an explicit fsync of the file and
its directory inside the timed region; savepoint syncs itself). Loads are cold (bench_util.evict).
Each trial runs the contenders in a rotated order. Loads are checked against the saved arrays
(not timed). AES-GCM rows encrypt with a 32-byte key (MindSpore's enc_key / dec_key, and
savepoint's on the same files' format). Goals (issue 15): plain .ckpt save and load >= 0.9x dd;
AES-GCM >= 0.8x of savepoint's plain speed; >= 5x faster than MindSpore on each.
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
KEY = bytes(range(7, 39))  # 32 bytes: AES-256-GCM


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


def ms_save(arrays, path, **kw):
    params = [{"name": k, "data": Parameter(Tensor(v), name=k)} for k, v in arrays.items()]
    ms.save_checkpoint(params, path, **kw)
    fsync_tree(path)


def ms_load(path, **kw):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(path, **kw).items()}


def sp_save(arrays, path, **kw):
    spms.save_checkpoint(arrays, path, **kw)


def check(arrays, loaded, who):
    for k, v in arrays.items():
        if not np.array_equal(loaded[k], v):
            raise SystemExit(f"{who}: {k} differs after the round trip")


def arg_parser(default_dir):
    """The options the MindSpore benchmarks share: --gib, --dir, --trials, --no-mindspore."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--dir", default=default_dir)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-mindspore", action="store_true", help="savepoint and dd only")
    return ap


def run_trials(contenders, arrays, trials, path_of, cold=True):
    """{(op, name): [seconds per trial]}: every contender saves then loads (cold unless told),
    in an order rotated per trial; loads are checked against `arrays` (untimed)."""
    res = {}
    for trial in range(trials):
        names = list(contenders)
        names = names[trial % len(names):] + names[: trial % len(names)]
        for name in names:
            save, load = contenders[name]
            p = path_of(name)
            remove(p)
            res.setdefault(("save", name), []).append(timed(lambda: save(p))[0])
            if cold:
                evict(p)
            secs, loaded = timed(lambda: load(p))
            res.setdefault(("load", name), []).append(secs)
            if loaded is not None and not name.startswith("dd"):
                check(arrays, loaded, name)
            remove(p)
    return res


def print_table(res, nbytes, ours):
    """One row per (op, contender): median seconds, GB/s, x dd and x `ours`, every trial."""
    print(f"{'op':<5} {'method':<10} {'seconds':>8} {'GB/s':>6} {'x dd':>6} {'x ' + ours:>11}  trials")  # fmt: skip
    for (op, name), secs in res.items():
        m = statistics.median(secs)
        dd_s, sp_s = statistics.median(res[(op, "dd direct")]), statistics.median(res[(op, ours)])
        trials = " ".join(f"{s:.3f}" for s in secs)
        print(f"{op:<5} {name:<10} {m:8.3f} {nbytes / m / 1e9:6.2f} {m / dd_s:6.2f} {m / sp_s:11.2f}"
              f"  [{trials}]")  # fmt: skip


def main():
    args = arg_parser("build/bench-ckpt").parse_args()
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
        "sp AES-GCM": (lambda p: sp_save(arrays, p, enc_key=KEY),
                       lambda p: spms.load_checkpoint(p, dec_key=KEY)),
        "MS AES-GCM": (lambda p: ms_save(arrays, p, enc_key=KEY),
                       lambda p: ms_load(p, dec_key=KEY)),
    }  # fmt: skip
    if args.no_mindspore:
        del contenders["MindSpore"], contenders["MS AES-GCM"]
    def path_of(name):
        return ddfile if name.startswith("dd") else os.path.join(args.dir, name.replace(" ", "-") + ".ckpt")

    res = run_trials(contenders, arrays, args.trials, path_of)
    print(f"{nbytes / 2**30:.2f} GiB in {len(arrays)} arrays; median of {args.trials} trials; "
          f"cold reads: {COLD['method']}")  # fmt: skip
    print_table(res, nbytes, "savepoint")
    med = {k: statistics.median(v) for k, v in res.items()}
    for op in ("save", "load"):
        sp, d, enc = med[(op, "savepoint")], med[(op, "dd direct")], med[(op, "sp AES-GCM")]
        print(f"goal {op}: savepoint / dd speed = {d / sp:.2f} (>= 0.9: {'met' if d / sp >= 0.9 else 'NOT met'}); "
              f"AES-GCM / plain speed = {sp / enc:.2f} (>= 0.8: {'met' if sp / enc >= 0.8 else 'NOT met'})")  # fmt: skip
        for ours, theirs in (("savepoint", "MindSpore"), ("sp AES-GCM", "MS AES-GCM")):
            if (op, theirs) in med:
                r = med[(op, theirs)] / med[(op, ours)]
                print(f"goal {op}: {theirs} / {ours} time = {r:.2f} (>= 5: {'met' if r >= 5 else 'NOT met'})")  # fmt: skip


if __name__ == "__main__":
    main()
