"""Runs torch.distributed.checkpoint flows with savepoint's storage plug-in on N gloo ranks.

    python dcp_ranks.py save WORLD DIR   # dcp.save, dcp.async_save (thread and process executors)
    python dcp_ranks.py load WORLD DIR   # dcp.load of DIR/sync, async and process into another mesh
    python dcp_ranks.py fswrite WORLD DIR  # DCP's own FileSystemWriter into DIR/fs (for convert)
    python dcp_ranks.py solo WORLD DIR   # use_collectives=False: save into DIR/solo, load back

DIR may be a bucket prefix ("s3://bucket/run", settings from the AWS variables).

The state (expected() below) is the same whatever the world: DTensors sharded over a mesh
(even and uneven splits, two mesh dims, FSDP2 + TP's _StridedShard), a ShardedTensor with
several shards on every rank (two per rank saved, three per rank loaded), a plain tensor
replicated on every rank and non-tensor values. A Partial DTensor is refused by DCP's planner
before savepoint sees it, as with DCP's own writer, and nothing is written. Every rank checks
what it loaded against expected(); a failure exits non-zero.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

import savepoint.torch


def expected():
    g = torch.Generator().manual_seed(1234)
    return {
        "model.weight": torch.randn(8, 6, generator=g),
        "model.bias": torch.randn(7, generator=g).to(torch.bfloat16),
        "model.emb": torch.randint(-1000, 1000, (10, 4), generator=g, dtype=torch.int64),
        "rep": torch.randn(5, 3, generator=g, dtype=torch.float64),
        "model.chunks": torch.randn(24, 3, generator=g),
        "model.strided": torch.randn(8, 3, generator=g),
    }


def chunked(world, mode, fill):
    """model.chunks as a ShardedTensor of 2 (saving) or 3 (loading) row chunks per rank, rank i
    holding chunks i, i + world, ... (not adjacent: one rank, several boxes of one tensor)."""
    per_rank = 2 if mode in ("save", "fswrite") else 3
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{i % world}/cpu"
                                                for i in range(per_rank * world)])
    st = sharded_tensor.zeros(spec, 24, 3)
    full = expected()["model.chunks"]
    for shard in st.local_shards():
        first, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
        if fill:
            shard.tensor.copy_(full[first:first + rows])
    return st


def placements(world, mode):
    """(mesh shape, {name: placements}) of the saving or the loading job."""
    if mode in ("save", "fswrite") and world == 4:
        return (2, 2), {"model.weight": [Shard(0), Shard(1)], "model.bias": [Shard(0), Replicate()],
                        "model.emb": [Replicate(), Shard(0)],
                        "model.strided": [_StridedShard(0, split_factor=2), Shard(0)]}
    if mode in ("save", "fswrite"):
        return (world,), {"model.weight": [Shard(0)], "model.bias": [Shard(0)],
                          "model.emb": [Replicate()], "model.strided": [Shard(1)]}
    return (world,), {"model.weight": [Shard(1)], "model.bias": [Replicate()],
                      "model.emb": [Shard(0)], "model.strided": [Shard(0)]}


def state(world, mode, fill):
    mesh_shape, places = placements(world, mode)
    mesh = init_device_mesh("cpu", mesh_shape)
    full = expected()
    sd = {"model": {}, "rep": full["rep"] if fill else torch.zeros_like(full["rep"]),
          "step": 7 if fill else 0, "extra": {"lr": 0.5} if fill else {"lr": 0.0}}
    for name, p in places.items():
        t = full[name] if fill else torch.zeros_like(full[name])
        sd["model"][name.split(".")[1]] = distribute_tensor(t, mesh, p)
    sd["model"]["chunks"] = chunked(world, mode, fill)
    return sd


def check(sd, rank):
    full = expected()
    for shard in sd["model"].pop("chunks").local_shards():
        first, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
        if not torch.equal(shard.tensor, full["model.chunks"][first:first + rows]):
            raise AssertionError(f"rank {rank}: model.chunks rows {first}+{rows} differ")
    for k, v in sd["model"].items():
        got = v.full_tensor()
        if not torch.equal(got, full["model." + k]):
            raise AssertionError(f"rank {rank}: model.{k} differs")
    if not torch.equal(sd["rep"], full["rep"]):
        raise AssertionError(f"rank {rank}: rep differs")
    if sd["step"] != 7 or sd["extra"] != {"lr": 0.5}:
        raise AssertionError(f"rank {rank}: values {sd['step']} {sd['extra']}")


def refuse_partial(world, path):
    """A Partial DTensor: DCP's planner raises on every rank; no checkpoint, no directory."""
    mesh = init_device_mesh("cpu", (world,))
    t = DTensor.from_local(torch.ones(2, 2), mesh, [Partial()])
    try:
        dcp.save({"t": t}, storage_writer=savepoint.torch.StorageWriter(path))
    except dcp.CheckpointException as e:
        if "partial" not in str(e):
            raise AssertionError(f"Partial refused for another reason: {e}") from None
    else:
        raise AssertionError("a Partial DTensor was saved")
    if os.path.exists(path):
        raise AssertionError(f"{path} exists after a refused save")


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
            fut = dcp.async_save(state(world, mode, True),
                                 storage_writer=savepoint.torch.StorageWriter(
                                     os.path.join(root, "process")),
                                 async_checkpointer_type=AsyncCheckpointerType.PROCESS)
            fut.result()
            refuse_partial(world, os.path.join(root, "partial"))
        elif mode == "solo":
            path = os.path.join(root, "solo")
            dcp.save(state(world, "save", True),
                     storage_writer=savepoint.torch.StorageWriter(path), use_collectives=False)
            dist.barrier()
            sd = state(world, "save", False)
            dcp.load(sd, storage_reader=savepoint.torch.StorageReader(path))
            check(sd, rank)
        elif mode == "fswrite":
            dcp.save(state(world, mode, True),
                     storage_writer=dcp.FileSystemWriter(os.path.join(root, "fs")))
        else:
            for name in ("sync", "async", "process"):
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
    # DCP's process executor joins its background processes over a TCP store on MASTER_ADDR (the
    # host's name when unset): the loopback address only.
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    mp.spawn(run, args=(world, mode, root, store), nprocs=world, join=True)
