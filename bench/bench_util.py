"""Helpers of the Python benchmarks (bench/peers.py, bench/mindspore_ckpt.py): durable saves,
cold reads, dd as the disk's yardstick, timing."""

import os
import shutil
import subprocess
import time

def _files(path):
    if os.path.isfile(path):
        return [path]
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def fsync_path(path):
    """fsync one file or directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path):
    """fsync every file under `path`, every directory, and the parent directory."""
    for f in _files(path):
        fsync_path(f)
    dirs = [path] if os.path.isdir(path) else []
    dirs += [d for d, _, _ in os.walk(path)][1:] if os.path.isdir(path) else []
    for d in dirs + [os.path.dirname(os.path.abspath(path))]:
        fsync_path(d)


def evict(path):
    """Drops the (clean, synced) pages of `path`'s files from the page cache: the next read is cold.
    posix_fadvise(DONTNEED) on every file, then, where this process may (root), the whole page cache
    through /proc/sys/vm/drop_caches, which also catches pages fadvise leaves behind."""
    for f in _files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        COLD["method"] = "fadvise(DONTNEED) + drop_caches"
    except OSError:
        COLD["method"] = "fadvise(DONTNEED) only (not root: drop_caches refused)"


COLD = {"method": "none yet"}  # how the last evict() made reads cold


def remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def timed_all(fn):
    """Seconds from a torch.distributed barrier before fn to one after it (the slowest rank's
    time), and fn's result."""
    import torch.distributed as dist  # noqa: PLC0415 (only the distributed benchmarks need it)

    dist.barrier()
    t = time.perf_counter()
    out = fn()
    dist.barrier()
    return time.perf_counter() - t, out


def cold(rank, path):
    """Every rank waits while rank 0 evicts `path` from the page cache (evict)."""
    import torch.distributed as dist  # noqa: PLC0415

    dist.barrier()
    if rank == 0:
        evict(path)
    dist.barrier()


def gloo_entry(rank, world, store, fn, args):
    """A spawned rank: joins the gloo group through the file `store`, runs fn(rank, world,
    *args), leaves the group."""
    import datetime  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=30))  # fmt: skip
    fn(rank, world, *args)
    dist.destroy_process_group()


def dd(args):
    subprocess.run(["dd", *args, "status=none"], check=True)


