"""savepoint.save / savepoint.load against torch.save / torch.load on many tiny tensors (the format
version 2 packing case) and on a few large ones (which packing must leave as fast as before).

Each implementation runs in its own worker process (two builds of savepoint cannot share one
interpreter), and the workers take turns round by round, so that the page cache and the disk see
the same mix for all of them. Reported: bytes on disk (sum of file sizes) and the median of every
timed save and load (the first of each worker is a warm-up and dropped).

    PYTHONPATH=build-pack/python python bench/small_tensors.py \
        --impl after=build-pack/python --impl before=/tmp/sp-before-build/python

savepoint.save returns once the checkpoint is durable (fsync of data, manifest and directories);
torch.save does not sync, so its column "torch.save+fsync" adds an fsync of the file. savepoint.load
reads with O_DIRECT (cold, as after a restart) and verifies every CRC32C; torch.load reads through
the page cache the save just filled.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import fsync_path  # noqa: E402

CASES = {
    # Adam's per-parameter `step` and similar: 5,000 tensors of 16 f32 elements.
    "small": lambda torch: {f"state.{i}.step": torch.randn(16) for i in range(5000)},
    # A few large tensors: 4 x 64 MiB of f32.
    "large": lambda torch: {f"layer.{i}.weight": torch.randn(4096, 4096) for i in range(4)},
}


def dir_bytes(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def worker(args):
    """Runs reps + 1 saves and loads of one case with one implementation; prints JSON."""
    import torch

    torch.manual_seed(0)
    state = CASES[args.case](torch)
    out = {"save": [], "load": [], "bytes": 0}
    target = os.path.join(args.dir, f"ckpt-{args.case}")  # one name: torch.save stores it
    for rep in range(args.reps + 1):
        shutil.rmtree(target, ignore_errors=True)
        if os.path.isfile(target):
            os.remove(target)
        if args.impl.startswith("torch"):
            t0 = time.perf_counter()
            torch.save(state, target)
            if args.impl == "torch+fsync":
                fsync_path(target)
            t1 = time.perf_counter()
            back = torch.load(target)
            t2 = time.perf_counter()
        else:
            import savepoint

            t0 = time.perf_counter()
            savepoint.save(state, target)
            t1 = time.perf_counter()
            back = savepoint.load(target)
            t2 = time.perf_counter()
        if rep == 0:  # warm-up: check the round trip instead of timing it
            assert back.keys() == state.keys()
            assert all(torch.equal(back[k], v) for k, v in state.items())
            out["bytes"] = dir_bytes(target)
            continue
        out["save"].append(t1 - t0)
        out["load"].append(t2 - t1)
    shutil.rmtree(target, ignore_errors=True)
    if os.path.isfile(target):
        os.remove(target)
    print(json.dumps(out))


def run_worker(impl, pythonpath, case, reps, directory):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, __file__, "--worker", "--impl", impl, "--case", case, "--reps",
           str(reps), "--dir", directory]  # fmt: skip
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"worker {impl} {case} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--impl", action="append", default=[],
                   help="LABEL=PYTHONPATH of a savepoint build (repeatable)")  # fmt: skip
    p.add_argument("--cases", default="small,large")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per worker")
    p.add_argument("--dir", default="/tmp/savepoint-small-tensors")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.impl = args.impl[0]
        return worker(args)
    os.makedirs(args.dir, exist_ok=True)
    impls = [("torch", None), ("torch+fsync", None)]
    for spec in args.impl:
        label, _, path = spec.partition("=")
        impls.append((label, os.path.abspath(path)))
    for case in args.cases.split(","):
        results = {label: {"save": [], "load": [], "bytes": 0} for label, _ in impls}
        for _ in range(args.rounds):
            for label, path in impls:
                kind = label if label.startswith("torch") else "savepoint"
                r = run_worker(kind, path, case, args.reps, args.dir)
                results[label]["save"] += r["save"]
                results[label]["load"] += r["load"]
                results[label]["bytes"] = r["bytes"]
        print(f"\ncase {case}: median of {args.rounds} x {args.reps} runs")
        print(f"{'implementation':<16} {'bytes on disk':>14} {'save ms':>9} {'load ms':>9}")
        for label, _ in impls:
            r = results[label]
            print(f"{label:<16} {r['bytes']:>14,} {statistics.median(r['save']) * 1e3:>9.1f} "
                  f"{statistics.median(r['load']) * 1e3:>9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
