"""Runs torch.distributed.checkpoint flows with savepoint's storage plug-in on N gloo ranks.

    python dcp_ranks.py save WORLD DIR   # dcp.save and dcp.async_save of a DTensor state
    python dcp_ranks.py load WORLD DIR   # dcp.load of DIR/sync and DIR/async into another mesh
    python dcp_ranks.py fswrite WORLD DIR  # DCP's own FileSystemWriter into DIR/fs (for convert)

DIR may be a bucket prefix ("s3://bucket/run", settings from the AWS variables).

The state (expected() below) is the same whatever the world: DTensors sharded over a mesh
(even and uneven splits, two mesh dims), a plain tensor replicated on every rank and non-tensor
values. Every rank checks what it loaded against expected(); a failure exits non-zero.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import savepoint.torch


def expected():
    g = torch.Generator().manual_seed(1234)
    return {
        "model.weight": torch.randn(8, 6, generator=g),
        "model.bias": torch.randn(7, generator=g).to(torch.bfloat16),
        "model.emb": torch.randint(-1000, 1000, (10, 4), generator=g, dtype=torch.int64),
        "rep": torch.randn(5, 3, generator=g, dtype=torch.float64),
    }


def placements(world, mode):
    """(mesh shape, {name: placements}) of the saving or the loading job."""
    if mode in ("save", "fswrite") and world == 4:
        return (2, 2), {"model.weight": [Shard(0), Shard(1)], "model.bias": [Shard(0), Replicate()],
                        "model.emb": [Replicate(), Shard(0)]}
    if mode in ("save", "fswrite"):
        return (world,), {"model.weight": [Shard(0)], "model.bias": [Shard(0)],
                          "model.emb": [Replicate()]}
    return (world,), {"model.weight": [Shard(1)], "model.bias": [Replicate()],
                      "model.emb": [Shard(0)]}


def state(world, mode, fill):
    mesh_shape, places = placements(world, mode)
    mesh = init_device_mesh("cpu", mesh_shape)
    full = expected()
    sd = {"model": {}, "rep": full["rep"] if fill else torch.zeros_like(full["rep"]),
          "step": 7 if fill else 0, "extra": {"lr": 0.5} if fill else {"lr": 0.0}}
    for name, p in places.items():
        t = full[name] if fill else torch.zeros_like(full[name])
        sd["model"][name.split(".")[1]] = distribute_tensor(t, mesh, p)
    return sd


def check(sd, rank):
    full = expected()
    for k, v in sd["model"].items():
        got = v.full_tensor()
        if not torch.equal(got, full["model." + k]):
            raise AssertionError(f"rank {rank}: model.{k} differs")
    if not torch.equal(sd["rep"], full["rep"]):
        raise AssertionError(f"rank {rank}: rep differs")
    if sd["step"] != 7 or sd["extra"] != {"lr": 0.5}:
        raise AssertionError(f"rank {rank}: values {sd['step']} {sd['extra']}")


def run(rank, world, mode, root, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        if mode == "save":
            dcp.save(state(world, mode, True),
                     storage_writer=savepoint.torch.StorageWriter(os.path.join(root, "sync")))
            fut = dcp.async_save(state(world, mode, True),
                                 storage_writer=savepoint.torch.StorageWriter(
                                     os.path.join(root, "async")))
            fut.result()
        elif mode == "fswrite":
            dcp.save(state(world, mode, True),
                     storage_writer=dcp.FileSystemWriter(os.path.join(root, "fs")))
        else:
            for name in ("sync", "async"):
                sd = state(world, mode, False)
                dcp.load(sd, storage_reader=savepoint.torch.StorageReader(os.path.join(root, name)))
                check(sd, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mode, world, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # A fresh rendezvous file, beside the checkpoints unless they go to a bucket (s3://...).
    where = tempfile.gettempdir() if "://" in root else root
    store = os.path.join(where, f"pg-{mode}-{world}-{os.getpid()}")
    mp.spawn(run, args=(world, mode, root, store), nprocs=world, join=True)
