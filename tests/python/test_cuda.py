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


@pytest.mark.parametrize("batch_bytes", [4096, 1 << 20])
def test_staged_load_in_batches(tmp_path, batch_bytes, seed):
    """load_staged with CPU targets: tensors grouped into buffer-sized batches (one tensor larger
    than a buffer gets a buffer of its size), each batch read and copied out."""
    state = _state(seed)
    savepoint.save(state, tmp_path / "c")
    info = savepoint._load._Info(str(tmp_path / "c"), 2, False, None)
    targets = {k: torch.empty_like(v) for k, v in state.items()}
    staged = [(k, targets[k], info.tensors[k]) for k in state]
    _cuda.load_staged(str(tmp_path / "c"), staged, verify=True, io_threads=2, direct_io=False,
                      key=None, batch_bytes=batch_bytes)  # fmt: skip
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
        _cuda.load_staged(str(tmp_path / "c"), [("w", target, info.tensors["w"])], verify=True,
                          io_threads=2, direct_io=False, key=None, batch_bytes=4096)  # fmt: skip


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
