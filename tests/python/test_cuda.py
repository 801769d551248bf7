"""CUDA tensors in savepoint: snapshots straight from GPU memory into the page-locked staging
pool (AsyncCheckpointer(cuda=...)) and loads into GPU memory through reusable pinned buffers.

What runs everywhere: the option's errors (no CUDA driver here is a clear error, not a crash)
and the batched, double-buffered load path with CPU tensors standing in for device ones. What
needs a GPU (skipped, saying so, where torch sees none; run on the H100 machine, docs/
PERFORMANCE.md "GPU"): the snapshot and load round trips against real device memory."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import savepoint  # noqa: E402
from savepoint import _cuda  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_option_is_checked():
    with pytest.raises(savepoint.InvalidArgumentError, match="cuda='yes'"):
        savepoint.AsyncCheckpointer(cuda="yes")
    with savepoint.AsyncCheckpointer(staging_bytes=4 << 20, slab_bytes=1 << 20) as ckpt:
        assert ckpt.cuda == torch.cuda.is_available()  # default: where torch has CUDA
    with savepoint.AsyncCheckpointer(staging_bytes=4 << 20, slab_bytes=1 << 20, cuda=False) as c:
        assert not c.cuda
    with pytest.raises(savepoint.InvalidArgumentError, match="cuda=0"):  # (0 == False, not bool)
        savepoint.AsyncCheckpointer(cuda=0)
    with pytest.raises(savepoint.InvalidArgumentError, match="snapshot_threads = 65"):
        savepoint.AsyncCheckpointer(snapshot_threads=65)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA driver is present")
def test_cuda_without_a_driver_is_a_clear_error():
    with pytest.raises(savepoint.FailedPreconditionError, match="CUDA"):
        savepoint.AsyncCheckpointer(cuda=True)


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(1000, 37, generator=g),
        "b16": torch.randn(333, generator=g).to(torch.bfloat16),
        "mask": torch.rand(77, generator=g) > 0.5,
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "c": torch.randn(5, 3, dtype=torch.complex64, generator=g),
    }


def _read_into(path):
    """The reader load_staged calls for a single-process checkpoint at `path`."""
    return lambda specs: savepoint._core.load_into(str(path), specs, verify=True, io_threads=2,
                                                   direct_io=False, key=None)  # fmt: skip


@pytest.mark.parametrize("batch_bytes", [4096, 1 << 20])
def test_staged_load_in_batches(tmp_path, batch_bytes, seed):
    """load_staged with CPU targets: tensors grouped into buffer-sized batches (one tensor larger
    than a buffer gets a buffer of its size), each batch read and copied out."""
    state = _state(seed)
    savepoint.save(state, tmp_path / "c")
    info = savepoint._load._Info(str(tmp_path / "c"), 2, False, None)
    targets = {k: torch.empty_like(v) for k, v in state.items()}
    staged = [(k, targets[k], info.tensors[k][1]) for k in state]
    _cuda.load_staged(staged, _read_into(tmp_path / "c"), batch_bytes=batch_bytes)
    for k, v in state.items():
        assert torch.equal(targets[k], v), k


def test_staged_load_names_a_corrupt_chunk(tmp_path):
    """A flipped byte under the pinned-buffer load path fails the load naming tensor and chunk."""
    import os

    savepoint.save({"w": torch.arange(3 << 18, dtype=torch.float32)}, tmp_path / "c",
                   chunk_bytes=1 << 20)  # fmt: skip
    (data,) = [f for f in os.listdir(tmp_path / "c") if f.endswith(".spd")]
    with open(tmp_path / "c" / data, "r+b") as f:  # data at 4096; chunk 1 is [1 MiB, 2 MiB)
        f.seek(4096 + (1 << 20) + 7)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    info = savepoint._load._Info(str(tmp_path / "c"), 2, False, None)
    target = torch.empty(3 << 18)
    with pytest.raises(savepoint.CorruptCheckpointError, match=r'tensor "w" chunk 1'):
        _cuda.load_staged([("w", target, info.tensors["w"][1])], _read_into(tmp_path / "c"),
                          batch_bytes=4096)  # fmt: skip


@needs_gpu
def test_snapshot_from_gpu_memory_round_trips(tmp_path, seed):
    dev = torch.device("cuda", torch.cuda.current_device())
    state = {k: v.to(dev) for k, v in _state(seed).items()}
    state["strided"] = torch.randn(64, 64, device=dev).t()  # non-contiguous: copied on the GPU
    state["cpu"] = torch.arange(10)
    state["big"] = torch.randn(3 << 20, device=dev)  # 12 MiB: more than the staging cap
    expect = {k: v.cpu().clone() for k, v in state.items()}
    with savepoint.AsyncCheckpointer(staging_bytes=4 << 20, slab_bytes=1 << 20) as ckpt:
        assert ckpt.cuda
        fut = ckpt.save(state, tmp_path / "c")
        for v in state.values():  # the snapshot is taken: changes now are not in it
            v.zero_() if v.dtype != torch.bool else v.fill_(False)
        fut.result()
    back = savepoint.load(tmp_path / "c")  # on the devices they were saved from
    for k, v in expect.items():
        assert back[k].device == state[k].device, k
        assert torch.equal(back[k].cpu(), v), k
    like = {k: torch.empty_like(v) for k, v in state.items() if k != "strided"}
    got = savepoint.load(tmp_path / "c", like=like, strict=False)
    for k, t in like.items():
        assert got[k] is t and torch.equal(t.cpu(), expect[k]), k


@needs_gpu
def test_default_async_save_uses_the_gpu_path(tmp_path):
    dev = torch.device("cuda", torch.cuda.current_device())
    state = {"x": torch.arange(1 << 16, device=dev, dtype=torch.int32)}
    savepoint.save(state, tmp_path / "c", async_=True).result()
    assert savepoint.default_checkpointer().cuda
    np.testing.assert_array_equal(savepoint.load(tmp_path / "c", map_location="cpu")["x"].numpy(),
                                  np.arange(1 << 16, dtype=np.int32))


def _save_cuda_async(rank, n, path):
    import torch.distributed as dist

    state = {"w": torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 0.5,
             "step": 7}  # fmt: skip
    fut = savepoint.save(state, path, process_group=dist.group.WORLD, async_=True)
    state["w"].zero_()  # after the snapshot: not in the checkpoint
    return fut.result()["bytes"]


@needs_gpu
def test_distributed_async_save_of_cuda_tensors(tmp_path):
    """Two gloo ranks sharing the GPU: their CUDA tensors are snapshotted into pinned memory."""
    from test_torch_distributed import run_ranks

    results = run_ranks(tmp_path, 2, _save_cuda_async, str(tmp_path / "c"))
    assert [r[0] for r in results.values()] == ["ok", "ok"], results
    assert sum(r[1] for r in results.values()) == 4 << 20  # the replicated tensor written once
    back = savepoint.load(tmp_path / "c", map_location="cpu")
    assert back["step"] == 7
    assert torch.equal(back["w"], torch.arange(1 << 20, dtype=torch.float32) * 0.5)


def test_manager_cuda_option_is_checked(tmp_path):
    with pytest.raises(savepoint.InvalidArgumentError, match="cuda=True applies to async_=True"):
        savepoint.CheckpointManager(tmp_path / "a", cuda=True)
    with pytest.raises(savepoint.InvalidArgumentError, match="format='safetensors'"):
        savepoint.CheckpointManager(tmp_path / "b", async_=True, format="safetensors", cuda=True)
    with pytest.raises(savepoint.InvalidArgumentError, match="CheckpointManager: cuda='yes'"):
        savepoint.CheckpointManager(tmp_path / "c", async_=True, cuda="yes")
    with pytest.raises(savepoint.InvalidArgumentError, match="cuda=1"):  # not silently ignored
        savepoint.CheckpointManager(tmp_path / "c", cuda=1)
    with savepoint.CheckpointManager(tmp_path / "d", async_=True, staging_bytes=4 << 20) as m:
        assert m.cuda == torch.cuda.is_available()  # default: where torch has CUDA
    with savepoint.CheckpointManager(tmp_path / "e") as m:
        assert not m.cuda  # synchronous: nothing to stage


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA driver is present")
def test_manager_cuda_without_a_driver_is_a_clear_error(tmp_path):
    with pytest.raises(savepoint.FailedPreconditionError, match="CUDA"):
        savepoint.CheckpointManager(tmp_path, async_=True, cuda=True)


@needs_gpu
def test_manager_async_save_of_cuda_tensors(tmp_path, seed):
    """The manager's async saves snapshot GPU memory into its pinned staging slabs."""
    dev = torch.device("cuda", torch.cuda.current_device())
    state = {k: v.to(dev) for k, v in _state(seed).items()}
    state["big"] = torch.randn(3 << 20, device=dev)  # 12 MiB: more than the staging cap
    state["step"] = 5
    expect = {k: v.cpu().clone() for k, v in state.items() if k != "step"}
    with savepoint.CheckpointManager(tmp_path, async_=True, staging_bytes=4 << 20,
                                     async_options={"slab_bytes": 1 << 20}) as m:  # fmt: skip
        assert m.cuda
        assert m.save(1, state)
        for k in expect:  # the snapshot is taken: changes now are not in it
            state[k].zero_() if state[k].dtype != torch.bool else state[k].fill_(False)
        m.wait()
        back = m.restore()
        like_dev = {k: torch.empty_like(v, device=dev) for k, v in expect.items()}
        got = m.restore(like=like_dev)
    assert back["step"] == 5
    for k, v in expect.items():
        assert back[k].device == dev and torch.equal(back[k].cpu(), v), k
        assert got[k] is like_dev[k] and torch.equal(like_dev[k].cpu(), v), k


@needs_gpu
def test_manager_async_save_with_tables_on_the_gpu(tmp_path):
    """An async manager stages a state with sparse tables like any other: its dense CUDA tensors
    go through the copier, the tables' CUDA ids and slots through pinned host memory; the dense
    tensor changed after save() returns does not reach the checkpoint."""
    dev = torch.device("cuda", torch.cuda.current_device())
    ids = torch.arange(6, device=dev)
    table = savepoint.SparseTable(ids, {"emb": torch.randn(6, 4, device=dev)})
    dense = torch.randn(8, device=dev)
    with savepoint.CheckpointManager(tmp_path, async_=True, staging_bytes=4 << 20) as m:
        assert m.cuda
        assert m.save(1, {"t": table, "w": dense})
        want = dense.cpu()
        dense.fill_(-1.0)
        back = m.restore()
    assert torch.equal(back["w"].cpu(), want) and back["t"].ids.device == dev


@needs_gpu
def test_sparse_table_on_the_gpu_round_trips(tmp_path):
    """A SparseTable with CUDA ids and slots: copied through pinned memory, loaded back onto the
    GPU it was saved from (or where map_location says)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    ids = torch.tensor([9, -4, 1 << 40, 7], dtype=torch.int64, device=dev)
    emb = torch.randn(4, 16, device=dev)
    acc = torch.rand(4, 16, device=dev, dtype=torch.float64)
    table = savepoint.SparseTable(ids, {"emb": emb, "acc": acc[:, ::2]})  # a strided slot too
    savepoint.save({"table": table, "dense": torch.ones(3, device=dev)}, tmp_path / "c")
    back = savepoint.load(tmp_path / "c")["table"]
    assert back.ids.device == dev and back.slots["emb"].device == dev
    order = torch.argsort(back.ids.cpu())
    want = torch.argsort(ids.cpu())
    assert torch.equal(back.ids.cpu()[order], ids.cpu()[want])
    assert torch.equal(back.slots["emb"].cpu()[order], emb.cpu()[want])
    assert torch.equal(back.slots["acc"].cpu()[order], acc[:, ::2].cpu()[want])
    on_cpu = savepoint.load(tmp_path / "c", map_location="cpu")["table"]
    assert on_cpu.ids.device.type == "cpu"


def _dtensors_on_gpu(rank, n, path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cuda", (n,))
    full = torch.arange(64 * 8, dtype=torch.float32).view(64, 8)
    rows = DTensor.from_local(full.chunk(n)[rank].cuda(), mesh, [Shard(0)], run_check=False)
    mine = savepoint.PerRank(torch.full((3,), float(rank), device="cuda"))
    state = {"w": rows, "b": torch.full((5,), 2.5, device="cuda"), "step": 3, "mine": mine}
    savepoint.save(state, path, process_group=dist.group.WORLD)  # synchronous: pinned copies
    cols = DTensor.from_local(torch.zeros(64, 8 // n, device="cuda"), mesh, [Shard(1)],
                              run_check=False)  # fmt: skip
    like = {"w": cols, "b": torch.zeros(5, device="cuda")}
    got = savepoint.load(path, like=like, process_group=dist.group.WORLD)
    local = got["w"].to_local()
    back = got["mine"]  # (no like target: allocated on its GPU, filled through the pinned buffers)
    return (local.is_cuda and torch.equal(local.cpu(), full.chunk(n, dim=1)[rank])
            and back.is_cuda and torch.equal(back.cpu(), torch.full((3,), float(rank)))
            and got["b"] is like["b"] and torch.equal(like["b"].cpu(), torch.full((5,), 2.5))
            and got["step"] == 3)  # fmt: skip


@needs_gpu
def test_distributed_save_and_load_of_cuda_dtensors(tmp_path):
    """Two gloo ranks sharing the GPU: a synchronous save of row-sharded CUDA DTensors and a
    per-rank CUDA tensor (copied through pinned memory), loaded into column-sharded CUDA DTensors
    and a CUDA tensor, and the per-rank part onto the GPU, through the pinned buffers."""
    from test_torch_distributed import run_ranks

    results = run_ranks(tmp_path, 2, _dtensors_on_gpu, str(tmp_path / "c"))
    assert all(r[0] == "ok" and r[1] is True for r in results.values()), results


@needs_gpu
def test_dcp_plugin_with_cuda_tensors(tmp_path, seed):
    """The DCP plug-in (savepoint.torch.StorageWriter / StorageReader) with CUDA state: shards
    copied into pinned memory for the write, boxes read into pinned memory for the load."""
    import warnings

    import torch.distributed.checkpoint as dcp

    import savepoint.torch as spt

    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(seed)
    state = {"w": torch.randn(300, 17, generator=g).to(dev),
             "t": torch.randn(40, 64, generator=g).to(dev).t(),  # non-contiguous
             "h": torch.arange(9, dtype=torch.int16).to(dev), "cpu": torch.ones(4), "step": 3}
    expect = {k: v.cpu().clone() if torch.is_tensor(v) else v for k, v in state.items()}
    path = str(tmp_path / "dcp")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=spt.StorageWriter(path))
        out = {k: torch.zeros_like(v) if torch.is_tensor(v) else 0 for k, v in state.items()}
        dcp.load(out, storage_reader=spt.StorageReader(path))
    for k, v in expect.items():
        if torch.is_tensor(v):
            assert out[k].device == state[k].device and torch.equal(out[k].cpu(), v), k
    assert out["step"] == 3
    np.testing.assert_array_equal(savepoint.load(path)["w"], expect["w"].numpy())  # native
