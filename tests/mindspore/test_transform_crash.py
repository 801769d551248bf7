"""A `savepoint transform` killed part-way (SIGKILL at random moments; the seed is printed, and
SAVEPOINT_CRASH_SEED replays it) never leaves a destination file under its final name that is not
byte-equal to the file an uninterrupted run writes, and a re-run completes the job with every file
equal to the uninterrupted run's and no hidden debris of the killed runs left behind. Sources are cut by savepoint's transform (bit-exact with
MindSpore's, test_transform.py) from a ~100 MiB model, so that a run lasts long enough to be
killed inside it."""
import os
import random
import subprocess
import time

import numpy as np
from test_transform import lay, write_strategy

from savepoint import mindspore as spms

CLI = os.environ["SAVEPOINT_CLI"]
ROWS, COLS = 512, 4096  # 8 MiB per float32 parameter
SRC = {**{f"w{i}": lay([2, 4], [0, -1]) for i in range(6)},
       **{f"adam_m.w{i}": lay([2, 4], [0, -1], k=2, step=4) for i in range(6)}}  # fmt: skip
DST = {**{f"w{i}": lay([4], [-1, 0]) for i in range(6)},
       **{f"adam_m.w{i}": lay([4], [0, -1]) for i in range(6)}}  # fmt: skip


def make_source(tmp_path):
    rng = np.random.default_rng(1)
    model = {n: rng.standard_normal((ROWS, COLS), dtype=np.float32) for n in SRC}
    model["global_step"] = np.array([3], np.int32)
    (tmp_path / "whole" / "rank_0").mkdir(parents=True)
    spms.save_checkpoint(model, str(tmp_path / "whole" / "rank_0" / "m.ckpt"))
    src = write_strategy(tmp_path / "src.ckpt", SRC)
    spms.transform_checkpoints(str(tmp_path / "whole"), str(tmp_path / "src"), "s", None, src)
    return str(tmp_path / "src"), src, write_strategy(tmp_path / "dst.ckpt", DST)


def command(src_dir, src, dst, out):
    # A small memory budget: destination files are written one or two at a time.
    return [CLI, "transform", "--src", src_dir, "--dst", str(out), "--src-strategy", src,
            "--dst-strategy", dst, "--prefix", "d", "--memory-budget", str(48 << 20),
            "--threads", "2"]  # fmt: skip


def final_files(root):
    """{relative path: bytes} of every file under root that is not hidden (a writer's temporary
    files are hidden)."""
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if not f.startswith("."):
                p = os.path.join(d, f)
                out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


def test_killed_transform_leaves_whole_files_and_rerun_completes(tmp_path):
    src_dir, src, dst = make_source(tmp_path)
    t = time.perf_counter()
    subprocess.run(command(src_dir, src, dst, tmp_path / "ref"), check=True, capture_output=True)
    full = time.perf_counter() - t
    want = final_files(tmp_path / "ref")
    assert sorted(want) == [f"rank_{r}/d{r}.ckpt" for r in range(4)]
    seed = int(os.environ.get("SAVEPOINT_CRASH_SEED", random.randrange(1 << 32)))
    print(f"seed={seed} uninterrupted={full:.3f}s")
    rng = random.Random(seed)
    out = tmp_path / "out"
    for _ in range(6):
        p = subprocess.Popen(command(src_dir, src, dst, out), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(rng.uniform(0, full))
        p.kill()
        p.wait()
        for name, data in final_files(out).items():
            assert name in want and data == want[name], (name, seed)
    subprocess.run(command(src_dir, src, dst, out), check=True, capture_output=True)
    assert final_files(out) == want, seed
    hidden = [f for _, _, fs in os.walk(out) for f in fs if f.startswith(".")]
    assert hidden == [], (hidden, seed)
