"""The first asynchronous save of a process against a copy into fresh memory (issue: the first
`savepoint.save(..., async_=True)` cannot know its size in advance, so its staging memory is new;
it should cost no more than `clone()`, which also faults in fresh memory).

Each trial is a fresh process (so the first save really is the first): it builds a state of
--mib MiB of f32 tensors (8 MiB to 64 MiB each, touched), then, in order:
  clone    torch clone() of every tensor (fresh memory: the reference for the first save)
  first    savepoint.save(async_=True): the time the call blocks (then waits for the commit)
  copy_    copy_() into the clones (touched memory: the reference for later saves)
  second   a second savepoint.save(async_=True) of the same state (recycled staging)
and prints one line of seconds per trial, then the medians and the ratios first/clone and
second/copy_.

    build/venv/bin/python bench/async_first.py --dir /tmp/af --mib 1024 --trials 5
(PYTHONPATH=build/python, or an installed savepoint.)
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def trial(directory, mib):
    import torch

    import savepoint

    sizes, left = [], mib
    while left > 0:
        n = min(left, 8 << (len(sizes) % 4))  # 8, 16, 32, 64 MiB, repeating
        sizes.append(n)
        left -= n
    state = {f"t{i}": torch.rand(n << 18) for i, n in enumerate(sizes)}  # f32: 2^18 per MiB
    out = {}
    t0 = time.perf_counter()
    clones = {k: v.clone() for k, v in state.items()}
    out["clone"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fut = savepoint.save(state, os.path.join(directory, "first"), async_=True)
    out["first"] = time.perf_counter() - t0
    fut.result()
    t0 = time.perf_counter()
    for k, v in state.items():
        clones[k].copy_(v)
    out["copy_"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fut = savepoint.save(state, os.path.join(directory, "second"), async_=True)
    out["second"] = time.perf_counter() - t0
    fut.result()
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.trial:
        trial(a.dir, a.mib)
        return
    rows = []
    for i in range(a.trials):
        d = os.path.join(a.dir, f"trial{i}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        cmd = [sys.executable, __file__, "--trial", "--dir", d, "--mib", str(a.mib)]
        row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        shutil.rmtree(d, ignore_errors=True)
        print(" ".join(f"{k}={v:.3f}s" for k, v in row.items()), flush=True)
        rows.append(row)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"median of {a.trials} ({a.mib} MiB): " + " ".join(f"{k}={v:.3f}s" for k, v in med.items()))
    print(f"first save / clone = {med['first'] / med['clone']:.2f}; "
          f"second save / copy_ = {med['second'] / med['copy_']:.2f}")


if __name__ == "__main__":
    main()
