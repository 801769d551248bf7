#!/usr/bin/env python3
"""MindSpore distributed-checkpoint transform benchmark: savepoint.mindspore.transform_checkpoints
against mindspore.parallel.transform_checkpoints on the same 8-rank source, in the same run, with
`dd` of the destination's bytes (read and written, direct I/O) as the disk's yardstick.

    PYTHONPATH=build/python /work/ms-venv/bin/python bench/mindspore_transform.py \\
        [--gib 0.25] [--dir build/bench-transform] [--trials 1] [--threads 4]

The source is a whole model of --gib GiB (float32 matrices, 1024 columns, and their adam_m state)
cut by MindSpore's own transform_checkpoints into 8 ranks (dev_matrix [2, 4]) of three kinds of
layouts: model parallel over all 8 ranks, model parallel over 4 ranks with the optimizer state
sharded over the other 2, and model parallel over 4 ranks (replicated twice). It is transformed
to 4 ranks (every matrix split by rows) and to a 2 x 4 pipeline (the first half of the layers in
stage 0, the rest in stage 1; strategies merged by MindSpore's merge_pipeline_strategys).

Each contender runs in its own child process (page cache dropped before: bench_util.evict):
wall time of the call, the child's peak RSS (VmHWM, the interpreter and imports included:
MindSpore's child imports mindspore, ours only savepoint and numpy), and the bytes it read
(/proc/self/io around the call: read_bytes from the device, rchar through read calls). "needed"
is the destination's tensor bytes (what a reader must read at the least). Outputs are checked
equal (names, dtypes, shapes, bytes) between the contenders. Goals (issue 16): >= 5x faster than
MindSpore, peak RSS <= 1/4 of MindSpore's, bytes read <= 1.1x needed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np
from bench_util import COLD, dd, evict, remove

MIB = 1 << 20
COLS = 1024


def lay(dev, tmap, k=0, step=0):
    return {"dev_matrix": dev, "tensor_map": tmap, "opt_weight_shard_size": k,
            "opt_weight_shard_step": step}  # fmt: skip


def model_names(gib):
    """[(name, rows)]: 8-32 MiB float32 weights and their adam_m state, ~gib GiB in all."""
    total, out, i = int(gib * (1 << 30)), [], 0
    while sum(2 * r * COLS * 4 for _, r in out) < total:
        rows = [8192, 2048, 4096][i % 3]
        out.append((f"layers.{i}.w", rows))
        i += 1
    return out


def src_layouts(names):
    """Three kinds, in turn: mp 8 (both dims), mp 4 rows + optimizer shard 2, mp 4 columns."""
    kinds = [lay([2, 4], [1, 0]), lay([2, 4], [0, -1], k=2, step=4), lay([2, 4], [-1, 0])]
    out = {}
    for i, (n, _) in enumerate(names):
        out[n] = out["adam_m." + n] = kinds[i % 3]
    return out


def write_strategy(path, layouts, stage=0):
    from mindspore.train import node_strategy_pb2 as pb
    m = pb.ParallelStrategyMap()
    m.current_stage = stage
    item = m.parallel_strategy_item.add()
    item.node_name = f"op{stage}"
    item.parallel_strategys.stage = stage
    item.parallel_strategys.parallel_strategy.add().dim.extend([1])
    for name, l in layouts.items():
        p = m.parallel_layout_item.add()
        p.param_name = name
        p.parallel_layouts.dev_matrix.add().dim.extend(l["dev_matrix"])
        p.parallel_layouts.tensor_map.add().dim.extend(l["tensor_map"])
        p.parallel_layouts.param_split_shape.add()
        p.parallel_layouts.indices_offset.add()
        p.parallel_layouts.field = 0
        p.parallel_layouts.opt_weight_shard_step = l["opt_weight_shard_step"]
        p.parallel_layouts.opt_weight_shard_size = l["opt_weight_shard_size"]
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def prepare(args):
    """The source directory and the strategy files (built once per --gib and kept)."""
    import mindspore as ms
    from mindspore.parallel import merge_pipeline_strategys, transform_checkpoints

    from savepoint import mindspore as spms
    d = os.path.join(args.dir, f"gib{args.gib}")
    names = model_names(args.gib)
    files = {k: os.path.join(d, k) for k in ("src.ckpt", "dst4.ckpt", "pp.ckpt", "src")}
    if os.path.exists(os.path.join(d, "ready")):
        return files
    remove(d)
    os.makedirs(os.path.join(d, "whole", "rank_0"))
    os.makedirs(os.path.join(d, "stages"))
    rng = np.random.default_rng(0)
    model = {}
    for n, rows in names:
        model[n] = rng.standard_normal((rows, COLS), dtype=np.float32)
        model["adam_m." + n] = np.abs(model[n][:, ::-1]).copy()
    model["global_step"] = np.array([1000], np.int32)
    spms.save_checkpoint(model, os.path.join(d, "whole", "rank_0", "model.ckpt"))
    del model
    write_strategy(files["src.ckpt"], src_layouts(names))
    rows4 = {n: lay([4], [0, -1]) for n, _ in names}
    rows4.update({"adam_m." + n: l for n, l in rows4.items()})
    write_strategy(files["dst4.ckpt"], rows4)
    half = len(names) // 2
    for stage, part in ((0, names[:half]), (1, names[half:])):
        sl = {k: v for k, v in rows4.items() if k.removeprefix("adam_m.") in dict(part)}
        write_strategy(os.path.join(d, "stages", f"s{stage}.ckpt"), sl, stage)
    ms.set_context(device_target="CPU")
    merge_pipeline_strategys(os.path.join(d, "stages"), files["pp.ckpt"])
    transform_checkpoints(os.path.join(d, "whole"), files["src"], "src", None, files["src.ckpt"])
    remove(os.path.join(d, "whole"))
    open(os.path.join(d, "ready"), "w").close()
    return files


def io_counters():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def peak_rss():
    """VmHWM: this process's peak resident set since its exec (wait4's ru_maxrss would carry the
    forking parent's peak over the exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def child(spec):
    """Runs one transform (spec: JSON) and prints {seconds, read_bytes, rchar}."""
    import time
    s = json.loads(spec)
    if s["who"] == "MindSpore":
        import mindspore as ms
        from mindspore.parallel import transform_checkpoints as fn
        ms.set_context(device_target="CPU")
        kw = {}
    else:
        from savepoint.mindspore import transform_checkpoints as fn
        kw = {"io_threads": s["threads"]}
    before, t = io_counters(), time.perf_counter()
    fn(s["src"], s["out"], "dst", s["src_strategy"], s["dst_strategy"], **kw)
    seconds, after = time.perf_counter() - t, io_counters()
    print(json.dumps({"seconds": seconds, "read_bytes": after["read_bytes"] - before["read_bytes"],
                      "rchar": after["rchar"] - before["rchar"], "rss": peak_rss()}))  # fmt: skip


def run_child(spec):
    """(result dict, peak RSS bytes) of one child."""
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"{spec['who']} failed ({r.returncode})")
    res = json.loads(r.stdout.splitlines()[-1])
    return res, res["rss"]


def tensor_bytes(root):
    """{relative path: {name: (dtype, shape, bytes)}} and the tensor bytes of a transform's files."""
    from savepoint import mindspore as spms
    out, total = {}, 0
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".ckpt") and not f.startswith("."):
                p = os.path.join(d, f)
                arrays = spms.load_checkpoint(p)
                out[os.path.relpath(p, root)] = {k: (str(v.dtype), v.shape, v.tobytes())
                                                 for k, v in arrays.items()}  # fmt: skip
                total += sum(v.nbytes for v in arrays.values())
    return out, total


def dd_time(args, nbytes):
    """Seconds to write then (cold) read `nbytes` with dd and direct I/O."""
    import time
    p = os.path.join(args.dir, "dd.bin")
    t = time.perf_counter()
    dd(["if=/dev/zero", f"of={p}", "bs=1M", f"count={nbytes // MIB}", "oflag=direct",
        "conv=fsync"])  # fmt: skip
    evict(p)
    dd([f"if={p}", "of=/dev/null", "bs=1M", "iflag=direct"])
    secs = time.perf_counter() - t
    remove(p)
    return secs


def bench_case(args, files, dst_key, label):
    rows = {}
    outs = {}
    for trial in range(args.trials):
        order = ["savepoint", "MindSpore"][:: 1 if trial % 2 == 0 else -1]
        for who in order:
            if who == "MindSpore" and args.no_mindspore:
                continue
            out = os.path.join(args.dir, f"out-{who}")
            remove(out)
            evict(files["src"])
            spec = {"who": who, "src": files["src"], "out": out, "src_strategy": files["src.ckpt"],
                    "dst_strategy": files[dst_key], "threads": args.threads}  # fmt: skip
            res, rss = run_child(spec)
            rows.setdefault(who, []).append((res, rss))
            if trial == 0:
                outs[who] = tensor_bytes(out)
            remove(out)
    contents, needed = outs["savepoint"]
    if "MindSpore" in outs and outs["MindSpore"][0] != contents:
        raise SystemExit(f"{label}: savepoint's files differ from MindSpore's")
    dd_s = statistics.median(dd_time(args, needed) for _ in range(args.trials))
    return rows, needed, dd_s


def report(label, rows, needed, dd_s):
    print(f"\n{label}: destination {needed / 2**30:.3f} GiB of tensors; dd write+read of that: "
          f"{dd_s:.3f} s")  # fmt: skip
    print(f"{'who':<10} {'seconds':>8} {'x dd':>6} {'peak RSS MiB':>13} {'read_bytes':>11} "
          f"{'rchar':>8}  trials")  # fmt: skip
    med = {}
    for who, rs in rows.items():
        secs = statistics.median(r["seconds"] for r, _ in rs)
        rss = max(m for _, m in rs)
        rb = statistics.median(r["read_bytes"] for r, _ in rs) / needed
        rc = statistics.median(r["rchar"] for r, _ in rs) / needed
        med[who] = (secs, rss, rb)
        trials = " ".join(f"{r['seconds']:.3f}" for r, _ in rs)
        print(f"{who:<10} {secs:8.3f} {secs / dd_s:6.2f} {rss / MIB:13.0f} {rb:10.2f}x {rc:7.2f}x"
              f"  [{trials}]")  # fmt: skip
    if "MindSpore" in med:
        (s, r, b), (ms_s, ms_r, _) = med["savepoint"], med["MindSpore"]
        ok = lambda c: "met" if c else "NOT met"  # noqa: E731
        print(f"goal: MindSpore / savepoint time = {ms_s / s:.2f} (>= 5: {ok(ms_s / s >= 5)}); "
              f"peak RSS savepoint / MindSpore = {r / ms_r:.3f} (<= 0.25: {ok(r / ms_r <= 0.25)}); "
              f"read_bytes / needed = {b:.3f} (<= 1.1: {ok(b <= 1.1)})")  # fmt: skip


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=0.25)
    ap.add_argument("--dir", default="build/bench-transform")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--threads", type=int, default=4, help="savepoint's io_threads")
    ap.add_argument("--no-mindspore", action="store_true", help="savepoint and dd only")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    files = prepare(args)
    print(f"source: {args.gib} GiB model, 8 ranks (cut by MindSpore), "
          f"median of {args.trials} trials; cold reads: ", end="")  # fmt: skip
    results = [(label, *bench_case(args, files, key, label))
               for key, label in (("dst4.ckpt", "8 -> 4 ranks"), ("pp.ckpt", "8 -> 2x4 pipeline"))]  # fmt: skip
    print(COLD["method"])
    for r in results:
        report(*r)


if __name__ == "__main__":
    main()
