#!/usr/bin/env python3
"""Checkpoints in object storage against s5cmd, the reference S3 client, moving the same bytes to
and from the same server in the same run: SeaweedFS (`weed mini`) on 127.0.0.1, started here by
tests/s3/seaweed.py.

    PYTHONPATH=build/python build/venv/bin/python bench/s3_bench.py [--mib 1024] [--trials 3]
        [--uploads-only]

Per trial: savepoint.save(state, "s3://...") from memory against `s5cmd cp` uploading the same
checkpoint from a local directory (in the page cache); savepoint.load("s3://...") into new memory,
into the caller's arrays (like=), and savepoint.verify (every chunk read and checked, nothing kept)
against `s5cmd cp` downloading it into a local directory (tmpfs when /dev/shm is there, so neither
side waits for a disk). `savepoint cp` uploads the committed local checkpoint and downloads it again
(the CLI: $SAVEPOINT_CLI, default build/tools/savepoint), against the same s5cmd copies. Medians of
the trials; throughput in MiB/s of checkpoint bytes.

boto3's transfer manager (the second reference client; installed into this Python if missing)
uploads and downloads the same files with 16 MiB parts and 16 threads. Requests per GiB of the
savepoint calls come from the client's own counts (savepoint._core.s3_requests()), LIST included.
An asynchronous save straight into the bucket (save(..., async_=True)) reports the time the caller
is blocked against the same save into a local directory.

The manager's remote tier: a CheckpointManager with async saves into a local directory (tmpfs),
without and with remote="s3://...": the time save() blocks the caller (the snapshot copy; the
upload runs in the background) and the background upload's time per checkpoint.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np
from bench_util import timed

import savepoint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "s3"))
from seaweed import Seaweed  # noqa: E402

MIB = 1 << 20
CLI = os.environ.get("SAVEPOINT_CLI", os.path.join(HERE, "..", "build", "tools", "savepoint"))


def cp(source, target):
    subprocess.run([CLI, "cp", source, target], check=True, capture_output=True)


def boto3_manager(env):
    """An s3transfer TransferManager on a boto3 client of the server in `env`."""
    try:
        import boto3
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "boto3"], check=True)
        import boto3
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    config = TransferConfig(multipart_threshold=16 * MIB, multipart_chunksize=16 * MIB,
                            max_concurrency=16)
    return TransferManager(client, config)


def boto3_copy(tm, local, bucket, prefix, upload):
    """Uploads the files of `local` to bucket/prefix/, or downloads them back into `local`."""
    names = os.listdir(local) if upload else [
        o["Key"][len(prefix) + 1:] for o in tm.client.list_objects_v2(
            Bucket=bucket, Prefix=prefix + "/")["Contents"]]
    os.makedirs(local, exist_ok=True)
    futures = [tm.upload(os.path.join(local, n), bucket, f"{prefix}/{n}") if upload
               else tm.download(bucket, f"{prefix}/{n}", os.path.join(local, n)) for n in names]
    for f in futures:
        f.result()


def counted(fn):
    """(seconds, S3 requests made) of fn()."""
    before = savepoint._core.s3_requests()
    seconds, _ = timed(fn)
    after = savepoint._core.s3_requests()
    kinds = ("get", "put", "head", "list", "delete", "post")
    return seconds, {k: after[k] - before[k] for k in kinds}


def make_state(total_bytes, seed=0):
    rng = np.random.default_rng(seed)
    out, used, i = {}, 0, 0
    while used < total_bytes:
        n = min(64 * MIB, total_bytes - used) // 4
        out[f"layer{i}.weight"] = rng.standard_normal(n, dtype=np.float32)
        used += n * 4
        i += 1
    return out


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def manager_run(scratch, state, trials, remote):
    """Blocked seconds per async save (median) and the upload seconds of each checkpoint."""
    directory = tempfile.mkdtemp(dir=scratch)
    blocked = []
    kw = {"remote": remote, "remote_options": {"keep_last_n": 1}} if remote else {}
    with savepoint.CheckpointManager(directory, async_=True, keep_last_n=1, **kw) as mgr:
        for step in range(1, trials + 1):
            blocked.append(timed(lambda: mgr.save(step, state))[0])
            mgr.wait()  # durable (and uploaded) before the next one
        uploads = [st["seconds"] for st in mgr.stats() if st["action"] == "checkpoint_upload"]
    shutil.rmtree(directory)
    return statistics.median(blocked), uploads


def uploads_only(args, state, local, nbytes):
    """--uploads-only: the upload of a large checkpoint (a save from memory and `savepoint cp` of
    the committed files) against s5cmd's, each trial's objects removed before the next."""
    rows = {"save (savepoint, from memory)": [], "upload (savepoint cp, from files)": [],
            "upload (s5cmd cp, from files)": []}
    with Seaweed(bucket="bench") as s3:
        os.environ.update(s3.env)
        for t in range(args.trials):
            for what, fn in (("save (savepoint, from memory)",
                              lambda: savepoint.save(state, f"s3://bench/sp-{t}")),
                             ("upload (s5cmd cp, from files)",
                              lambda: s3.s5cmd("cp", f"{local}/*", f"s3://bench/ref-{t}/")),
                             ("upload (savepoint cp, from files)",
                              lambda: cp(local, f"s3://bench/cp-{t}"))):
                rows[what].append(timed(fn)[0])
                s3.s5cmd("rm", "s3://bench/*")
    ref = statistics.median(rows["upload (s5cmd cp, from files)"])
    print(f"s3 uploads: {nbytes / MIB:.0f} MiB checkpoint, {args.trials} trials (medians)")
    for what, v in rows.items():
        s = statistics.median(v)
        print(f"| {what:<40} | {s:7.2f} | {nbytes / MIB / s:7.0f} | {ref / s:7.2f}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--uploads-only", action="store_true",
                    help="only the uploads (for checkpoints larger than the other rows fit)")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="savepoint-s3-bench-",
                               dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    state = make_state(args.mib * MIB)
    local = os.path.join(scratch, "local")
    savepoint.save(state, local)
    nbytes = dir_bytes(local)
    if args.uploads_only:
        uploads_only(args, state, local, nbytes)
        shutil.rmtree(scratch)
        return
    rows = {"save (savepoint, from memory)": [], "upload (s5cmd cp, from files)": [],
            "load (savepoint, into new memory)": [], "load (savepoint, into the state, like=)": [],
            "verify (savepoint, read + check all)": [], "download (s5cmd cp, into files)": [],
            "upload (savepoint cp, from files)": [], "download (savepoint cp, into files)": []}
    rows.update({"upload (boto3 transfer manager)": [], "download (boto3 transfer manager)": []})
    requests, blocked = {}, {"local": [], "bucket": []}
    with Seaweed(bucket="bench") as s3:
        os.environ.update(s3.env)
        tm = boto3_manager(s3.env)
        for t in range(args.trials):
            uri = f"s3://bench/sp-{t}"
            seconds, requests["save"] = counted(lambda: savepoint.save(state, uri))
            rows["save (savepoint, from memory)"].append(seconds)
            rows["upload (s5cmd cp, from files)"].append(
                timed(lambda: s3.s5cmd("cp", f"{local}/*", f"s3://bench/ref-{t}/"))[0])
            rows["upload (boto3 transfer manager)"].append(
                timed(lambda: boto3_copy(tm, local, "bench", f"boto-{t}", True))[0])
            seconds, requests["load"] = counted(lambda: savepoint.load(uri))
            rows["load (savepoint, into new memory)"].append(seconds)
            rows["load (savepoint, into the state, like=)"].append(
                timed(lambda: savepoint.load(uri, like=state))[0])
            rows["verify (savepoint, read + check all)"].append(
                timed(lambda: savepoint.verify(uri))[0])
            out = os.path.join(scratch, f"down-{t}")
            rows["download (s5cmd cp, into files)"].append(
                timed(lambda: s3.s5cmd("cp", f"s3://bench/ref-{t}/*", f"{out}/"))[0])
            shutil.rmtree(out)
            rows["download (boto3 transfer manager)"].append(
                timed(lambda: boto3_copy(tm, out, "bench", f"boto-{t}", False))[0])
            shutil.rmtree(out)
            for where, target in (("local", os.path.join(scratch, f"async-{t}")),
                                  ("bucket", f"s3://bench/async-{t}")):
                stats = savepoint.save(state, target, async_=True).result()
                blocked[where].append(stats["blocked_seconds"])
            shutil.rmtree(os.path.join(scratch, f"async-{t}"))
            s3.s5cmd("rm", "s3://bench/*")  # the server's disk holds one trial at a time
            rows["upload (savepoint cp, from files)"].append(
                timed(lambda: cp(local, f"s3://bench/cp-{t}"))[0])
            rows["download (savepoint cp, into files)"].append(
                timed(lambda: cp(f"s3://bench/cp-{t}", out))[0])
            shutil.rmtree(out)
        local_blocked, _ = manager_run(scratch, state, args.trials, None)
        tier_blocked, uploads = manager_run(scratch, state, args.trials, "s3://bench/tier")
        rows["manager upload (remote tier, background)"] = uploads
    shutil.rmtree(scratch)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"s3 bench: {nbytes / MIB:.0f} MiB checkpoint, SeaweedFS on 127.0.0.1, "
          f"{args.trials} trials (medians)")
    print(f"| {'what':<40} | {'s':>7} | {'MiB/s':>7} | {'vs s5cmd':>8} |")
    print(f"|{'-' * 42}|{'-' * 9}|{'-' * 9}|{'-' * 10}|")
    down = "download (s5cmd cp, into files)"
    pairs = {"save (savepoint, from memory)": "upload (s5cmd cp, from files)",
             "load (savepoint, into new memory)": down,
             "load (savepoint, into the state, like=)": down,
             "verify (savepoint, read + check all)": down,
             "upload (savepoint cp, from files)": "upload (s5cmd cp, from files)",
             "download (savepoint cp, into files)": down,
             "manager upload (remote tier, background)": "upload (s5cmd cp, from files)",
             "upload (boto3 transfer manager)": "upload (s5cmd cp, from files)",
             "download (boto3 transfer manager)": down}
    for k, s in med.items():
        ref = pairs.get(k)
        ratio = f"{med[ref] / s:.2f}x" if ref else ""
        print(f"| {k:<40} | {s:7.2f} | {nbytes / MIB / s:7.0f} | {ratio:>8} |")
    up = med["upload (s5cmd cp, from files)"] / med["save (savepoint, from memory)"]
    print(f"s3: save {up:.2f}x s5cmd upload, load {med[down] / med['load (savepoint, into new memory)']:.2f}x"
          f" (into the state {med[down] / med['load (savepoint, into the state, like=)']:.2f}x) s5cmd "
          f"download")
    gib = nbytes / (1 << 30)
    for what, counts in requests.items():
        total = sum(counts.values())
        print(f"requests per GiB, {what}: {total / gib:.0f} ({', '.join(f'{k} {v}' for k, v in counts.items() if v)})")
    b_local, b_bucket = statistics.median(blocked["local"]), statistics.median(blocked["bucket"])
    print(f"async save, blocked: {b_local:.3f} s into a local directory, {b_bucket:.3f} s straight "
          f"into the bucket ({b_bucket / b_local:.2f}x)")
    print(f"manager async save, blocked: {local_blocked:.3f} s local only, {tier_blocked:.3f} s with "
          f"the remote tier ({tier_blocked / local_blocked:.2f}x)")


if __name__ == "__main__":
    main()
