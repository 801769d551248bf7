"""Round trips through savepoint.save / savepoint.load: every dtype, nested structures, scalars,
torch state dicts, mmap, names=, like=, map_location, async saves, info/verify/list."""

import collections
import gc
import json
import os
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import torch

import savepoint

TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.uint16, torch.int16, torch.uint32, torch.int32,
    torch.uint64, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64, torch.complex128,
]  # fmt: skip
NUMPY_DTYPES = [
    np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64,
    np.float16, ml_dtypes.bfloat16, np.float32, np.float64, ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2, np.complex64, np.complex128,
]  # fmt: skip


def random_bytes_tensor(dtype, shape, rng):
    """A torch tensor of `dtype` whose bytes are random (bool: 0/1)."""
    n = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    raw = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).view(shape)


def same_bytes(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_dtypes_bit_exact(tmp_path, dtype, seed):
    rng = np.random.default_rng(seed)
    state = {"t": random_bytes_tensor(dtype, (3, 5, 7), rng), "scalar": random_bytes_tensor(dtype, (), rng),
             "empty": torch.empty(0, 4, dtype=dtype)}  # fmt: skip
    savepoint.save(state, tmp_path / "c")
    for mmap in (False, True):
        back = savepoint.load(tmp_path / "c", mmap=mmap)
        for k in state:
            assert isinstance(back[k], torch.Tensor) and same_bytes(back[k], state[k]), k


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_dtypes_bit_exact(tmp_path, dtype, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    a = rng.integers(0, 256, 4 * 6 * dt.itemsize, dtype=np.uint8)
    if dt == np.bool_:
        a %= 2
    state = {"a": a.view(dt).reshape(4, 6), "s": a[: dt.itemsize].view(dt)[0]}
    savepoint.save(state, tmp_path / "c")
    for mmap in (False, True):
        back = savepoint.load(tmp_path / "c", mmap=mmap)
        assert type(back["a"]) is np.ndarray and same_bytes(back["a"], state["a"])
        assert type(back["s"]) is type(state["s"]) and back["s"].tobytes() == state["s"].tobytes()
    assert savepoint.info(tmp_path / "c")["tensors"][0]["dtype"] == {
        "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "uint32": "U32",
        "int32": "I32", "uint64": "U64", "int64": "I64", "float16": "F16", "bfloat16": "BF16",
        "float32": "F32", "float64": "F64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
        "complex64": "C64", "complex128": "C128"}[dt.name]  # fmt: skip


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_format_versions_round_trip(tmp_path, version):
    """savepoint.save(format_version=...) writes that version (the MANIFEST header's; 2 for 0,
    savepoint's choice for a single-process save) and reads back bit for bit; a version this build
    does not write, and one an asynchronous save cannot take, are InvalidArgumentError."""
    state = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "step": 5,
             "b": torch.ones(70000, dtype=torch.bfloat16)}  # fmt: skip
    path = tmp_path / "ckpt"
    savepoint.save(state, path, format_version=version)
    header = (path / "MANIFEST").read_bytes()[:12]
    assert int.from_bytes(header[8:12], "little") == (version or 2)
    back = savepoint.load(path)
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])
    assert back["step"] == 5
    for bad in (version + 5, True, 4.0, "4", -1, 2**32):
        with pytest.raises(savepoint.InvalidArgumentError, match="format_version"):
            savepoint.save(state, tmp_path / "bad", format_version=bad)
    if version not in (0, 2):
        with pytest.raises(savepoint.InvalidArgumentError, match="format_version"):
            savepoint.save(state, tmp_path / "async", async_=True, format_version=version)


def test_nested_structure_and_scalars(tmp_path):
    obj = {
        "a": [1, 2.5, True, None, "text", b"\x00\xff", (3, [4, {"x": -0.0}])],
        7: {"int keys": {0: "zero", -5: "minus five"}},
        "nan": float("nan"), "inf": float("-inf"), "big": -(2**100), "u64max": 2**64 - 1,
        "od": collections.OrderedDict([("z", 1), ("a", 2)]),
        "dots.in.key": 1, "dots": {"in": {"key": 2}},  # same joined name: disambiguated
        "ctl\nkey": 3, "": {"": 4}, "unicode ключ": "значение",
    }  # fmt: skip
    savepoint.save(obj, tmp_path / "c")
    back = savepoint.load(tmp_path / "c")
    assert list(back) == list(obj)
    assert back["a"] == obj["a"] and type(back["a"][6]) is tuple and type(back["a"][6][1]) is list
    assert back[7] == obj[7] and back["big"] == obj["big"] and back["u64max"] == obj["u64max"]
    assert np.isnan(back["nan"]) and back["inf"] == float("-inf")
    assert str(back["a"][6][1][1]["x"]) == "-0.0"
    assert type(back["od"]) is collections.OrderedDict and list(back["od"]) == ["z", "a"]
    assert back["dots.in.key"] == 1 and back["dots"]["in"]["key"] == 2
    assert back["ctl\nkey"] == 3 and back[""][""] == 4 and back["unicode ключ"] == "значение"
    # Every entry is visible to the C++ side under its dotted name.
    values = savepoint.info(tmp_path / "c")["values"]
    assert values["a.0"] == 1 and values["7.int keys.-5"] == "minus five"


def test_root_can_be_any_supported_object(tmp_path):
    for i, obj in enumerate([torch.arange(5), [np.zeros(2), 1], 42, None, ("a", {})]):
        savepoint.save(obj, tmp_path / f"c{i}")
        back = savepoint.load(tmp_path / f"c{i}")
        assert repr(back) == repr(obj)


def test_model_and_optimizer_state_dicts(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 8)).square().mean().backward()
        opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3}
    savepoint.save(state, tmp_path / "c")
    back = savepoint.load(tmp_path / "c")
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optimizer"])
    assert back["model"]._metadata == state["model"]._metadata
    for k, v in model.state_dict().items():
        assert same_bytes(v, model2.state_dict()[k])
    assert repr(opt2.state_dict()["param_groups"]) == repr(opt.state_dict()["param_groups"])
    for pid, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            assert same_bytes(v, opt2.state_dict()["state"][pid][k])


def test_noncontiguous_and_views_are_copied_documented(tmp_path):
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    a = np.arange(24, dtype=np.int64).reshape(4, 6)
    state = {"t": base.t(), "slice": base[:, 1::2], "conj": torch.randn(3, dtype=torch.complex64).conj(),
             "a": a.T, "neg": torch.ones(2, dtype=torch.complex64).conj().imag}  # fmt: skip
    savepoint.save(state, tmp_path / "c")
    back = savepoint.load(tmp_path / "c")
    for k in ("t", "slice", "conj", "neg"):
        assert torch.equal(back[k], state[k]) and back[k].is_contiguous(), k
    assert (back["a"] == a.T).all() and back["a"].flags.c_contiguous


def test_parameters_and_requires_grad(tmp_path):
    p = torch.nn.Parameter(torch.ones(3))
    g = torch.zeros(2, requires_grad=True)
    savepoint.save({"p": p, "g": g, "plain": torch.ones(1)}, tmp_path / "c")
    back = savepoint.load(tmp_path / "c")
    assert type(back["p"]) is torch.nn.Parameter and back["p"].requires_grad
    assert back["g"].requires_grad and not back["plain"].requires_grad


def test_names_selects_tensors(tmp_path):
    state = {"model": {"w": torch.ones(2), "b": torch.zeros(2)}, "opt": [torch.ones(3), 5], "step": 1}
    savepoint.save(state, tmp_path / "c")
    back = savepoint.load(tmp_path / "c", names=["model.*"])
    assert set(back["model"]) == {"w", "b"} and back["opt"] == [None, 5] and back["step"] == 1
    back = savepoint.load(tmp_path / "c", names="opt.0")
    assert back["model"] == {} and torch.equal(back["opt"][0], torch.ones(3))
    with pytest.raises(savepoint.NotFoundError, match="nothing matches 'nope.*'"):
        savepoint.load(tmp_path / "c", names=["nope.*"])


def test_like_loads_in_place(tmp_path):
    torch.manual_seed(1)
    src = torch.nn.Linear(64, 32)
    savepoint.save({"model": src.state_dict(), "arr": np.arange(6.0)}, tmp_path / "c")
    dst = torch.nn.Linear(64, 32)
    arr = np.zeros(6)
    sd = dst.state_dict()
    ptr = dst.weight.data_ptr()
    back = savepoint.load(tmp_path / "c", like={"model": sd, "arr": arr})
    assert dst.weight.data_ptr() == ptr and torch.equal(dst.weight, src.weight)
    assert torch.equal(dst.bias, src.bias) and back["model"]["weight"] is sd["weight"]
    assert back["arr"] is arr and (arr == np.arange(6.0)).all()
    # A non-contiguous target is filled by a copy; a mismatch names the path.
    wt = torch.zeros(32, 64).t().t().contiguous().t()  # [64, 32] non-contiguous
    back = savepoint.load(tmp_path / "c", like={"model": {"weight": wt.t()}})
    assert torch.equal(wt.t(), src.weight)
    with pytest.raises(ValueError, match=r"like\['model'\]\['bias'\] is F64 \[32\] but .* is F32 \[32\]"):
        savepoint.load(tmp_path / "c", like={"model": {"bias": torch.zeros(32, dtype=torch.float64)}})
    # Targets of tensors that names= leaves out are left alone.
    untouched = torch.zeros(32)
    back = savepoint.load(tmp_path / "c", names=["arr"], like={"model": {"bias": untouched}})
    assert back["model"] == {} and not untouched.any()
    with pytest.raises(savepoint.NotFoundError, match=r"no tensor for like\['extra'\]"):
        savepoint.load(tmp_path / "c", like={"extra": torch.zeros(1)})


def test_large_tensors_aligned_and_mmap_copy_on_write(tmp_path):
    t = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: aligned allocation + direct reads
    savepoint.save({"t": t, "n": t.numpy()}, tmp_path / "c")
    back = savepoint.load(tmp_path / "c")
    assert back["t"].data_ptr() % 4096 == 0 and torch.equal(back["t"], t)
    mm = savepoint.load(tmp_path / "c", mmap=True)
    assert torch.equal(mm["t"], t) and (mm["n"] == t.numpy()).all()
    mm["t"][0] = 42.0  # writable, private to this process
    mm["n"][1] = 43.0
    again = savepoint.load(tmp_path / "c", mmap=True)
    assert again["t"][0] == 0 and again["n"][1] == 1
    savepoint.verify(tmp_path / "c")


def _mappings_of(directory):
    """How many mappings of files under `directory` this process holds (/proc/self/maps)."""
    prefix = os.path.realpath(directory) + os.sep
    with open("/proc/self/maps", encoding="utf-8") as f:
        return sum(1 for line in f if line.rstrip("\n").split(" ")[-1].startswith(prefix))


def test_mmap_maps_each_data_file_once_through_the_core(tmp_path):
    state = {f"t{i}": torch.full((1 << 18,), float(i)) for i in range(4)}  # 1 MiB each
    savepoint.save(state, tmp_path / "c")
    data_files = [n for n in os.listdir(tmp_path / "c") if n.endswith(".spd")]
    mm = savepoint.load(tmp_path / "c", mmap=True)
    # One copy-on-write mapping per data file, made by the C++ reader (no second Python mapping).
    assert _mappings_of(tmp_path / "c") == len(data_files) >= 1
    assert all(torch.equal(mm[k], v) for k, v in state.items())
    del mm
    gc.collect()
    assert _mappings_of(tmp_path / "c") == 0  # the last tensor released the mapping


def test_map_location_and_saved_device(tmp_path):
    savepoint.save({"t": torch.ones(2)}, tmp_path / "c")
    assert savepoint.load(tmp_path / "c", map_location="cpu")["t"].device.type == "cpu"
    assert savepoint.load(tmp_path / "c", map_location=torch.device("meta"))["t"].is_meta
    # A tensor recorded as saved from an accelerator goes back there (like torch.load), or the
    # error says why and what to do. (Written through the extension: this machine has no GPU.)
    t = torch.ones(2)
    tree = {"version": 1, "root": {"dict": [["t", {"torch": "t", "device": "cuda:0"}]]}}
    savepoint._core.save(str(tmp_path / "gpu"), [("t", t.data_ptr(), "F32", [2])], [],
                         json.dumps({"savepoint.python": tree}), overwrite=False,
                         create_parents=True, direct_io=True, io_threads=1, chunk_bytes=8 << 20)  # fmt: skip
    if torch.cuda.is_available():
        assert savepoint.load(tmp_path / "gpu")["t"].device.type == "cuda"
    else:
        with pytest.raises(ValueError, match=r"cannot place obj\['t'\] on device 'cuda:0'.*map_location"):
            savepoint.load(tmp_path / "gpu")
    assert torch.equal(savepoint.load(tmp_path / "gpu", map_location="cpu")["t"], t)


def test_user_metadata_and_info(tmp_path):
    savepoint.save({"w": np.zeros((2, 3), np.float32)}, tmp_path / "c", metadata={"run": "exp-1", "n": [1, 2]})
    i = savepoint.info(tmp_path / "c")
    assert i["metadata"] == {"run": "exp-1", "n": [1, 2]}
    assert i["tensors"] == [{"name": "w", "dtype": "F32", "shape": [2, 3], "nbytes": 24}]
    with pytest.raises(ValueError, match="reserved"):
        savepoint.save({}, tmp_path / "d", metadata={"savepoint.python": 1})


def test_overwrite_and_list_checkpoints(tmp_path):
    savepoint.save({"step": 1, "w": torch.ones(1)}, tmp_path / "c")
    with pytest.raises(savepoint.AlreadyExistsError) as e:
        savepoint.save({"step": 2}, tmp_path / "c")
    assert isinstance(e.value, FileExistsError) and "already exists" in str(e.value)
    savepoint.save({"step": 2}, tmp_path / "c", overwrite=True)
    assert savepoint.load(tmp_path / "c") == {"step": 2}
    (listed,) = savepoint.list_checkpoints(tmp_path)
    assert listed["committed"] and listed["step"] == 2 and listed["name"] == "c"


def test_async_save_snapshot_semantics(tmp_path):
    t = torch.zeros(1 << 18)
    a = np.zeros(1000)
    fut = savepoint.save({"t": t, "a": a, "step": 9}, tmp_path / "c", async_=True)
    t.fill_(1.0)  # the snapshot was taken before save() returned
    a[:] = 1.0
    assert fut.wait(timeout=60) and fut.done() and fut.exception() is None
    s = fut.result()
    assert s["bytes"] == t.numel() * 4 + a.nbytes and s["blocked_seconds"] > 0
    assert s["seconds"] >= s["blocked_seconds"] and s["chunks"] > 0
    back = savepoint.load(tmp_path / "c")
    assert back["t"].sum() == 0 and back["a"].sum() == 0 and back["step"] == 9
    # One shape of save statistics, synchronous or not.
    sync = savepoint.save({"t": t}, tmp_path / "d")
    assert set(sync) == set(s) and sync["blocked_seconds"] == sync["seconds"] > 0


def test_async_errors_and_checkpointer_lifecycle(tmp_path):
    savepoint.save({"x": 1}, tmp_path / "c")
    with savepoint.AsyncCheckpointer(staging_bytes=1 << 20, slab_bytes=64 << 10) as ckpt:
        with pytest.raises(savepoint.AlreadyExistsError):
            ckpt.save({"x": 2}, tmp_path / "c")
        futs = [ckpt.save({"t": torch.full((100_000,), float(i))}, tmp_path / f"d{i}") for i in range(3)]
        ckpt.wait()
        assert all(f.done() for f in futs)
    with pytest.raises(savepoint.FailedPreconditionError):
        ckpt.save({}, tmp_path / "e")
    for i in range(3):
        assert savepoint.load(tmp_path / f"d{i}")["t"][0] == i


def test_async_io_settings_belong_to_the_checkpointer(tmp_path):
    """I/O threads, direct I/O and the chunk size are the checkpointer's: save(async_=True) refuses
    them instead of ignoring them, and an AsyncCheckpointer made with them uses them."""
    for kw in ({"io_threads": 1}, {"direct_io": False}, {"chunk_bytes": 1 << 20}):
        with pytest.raises(savepoint.InvalidArgumentError, match=f"{next(iter(kw))}.*AsyncCheckpointer"):
            savepoint.save({"t": torch.ones(4)}, tmp_path / "a", async_=True, **kw)
    assert not (tmp_path / "a").exists()
    with savepoint.AsyncCheckpointer(slab_bytes=64 << 10, io_threads=1, direct_io=False) as ckpt:
        stats = ckpt.save({"t": torch.ones(100_000)}, tmp_path / "b").result()
    assert stats["direct_io"] is False and stats["chunks"] == 7
    assert savepoint.load(tmp_path / "b")["t"].sum() == 100_000


def test_gil_released_during_io(tmp_path):
    """Another Python thread keeps running while a save and a load do their I/O."""
    state = {"t": torch.ones(32 << 20, dtype=torch.uint8)}
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    th = threading.Thread(target=ticker)
    th.start()
    try:
        time.sleep(0.02)
        n0 = len(ticks)
        s = savepoint.save(state, tmp_path / "c", io_threads=1)
        n1 = len(ticks)
        savepoint.load(tmp_path / "c", io_threads=1)
        n2 = len(ticks)
    finally:
        stop.set()
        th.join()
    # With the GIL held the ticker could not run at all during the call.
    assert n1 - n0 >= 3 and n2 - n1 >= 1, (n0, n1, n2, s)


def test_zero_copy_save_memory(tmp_path):
    """A synchronous save does not copy the tensors: peak RSS grows far less than their size."""
    from conftest import run_python

    out = run_python("rss_probe.py", tmp_path / "c", 256).stdout
    grow_save, grow_load = (int(x) for x in out.split())
    assert grow_save < 64 << 20, out  # staging buffers only (io_threads x chunk)
    assert grow_load < (256 << 20) + (64 << 20), out  # the destination tensor, no second copy


@pytest.mark.parametrize("compression", ["zstd", "lz4", {"codec": "zstd", "level": 3, "shuffle": "on"}],
                         ids=["zstd", "lz4", "zstd3-shuffle"])
def test_compressed_round_trip(tmp_path, compression):
    """Compressible tensors are stored smaller and load back bit-exactly (also with mmap=True,
    where compressed tensors are read instead of mapped, and through async saves)."""
    state = {"zeros": torch.zeros(1 << 20), "ramp": torch.arange(1 << 18, dtype=torch.bfloat16),
             "a": np.tile(np.arange(16, dtype=np.int64), 4096)}  # fmt: skip
    stats = savepoint.save(state, tmp_path / "c", compression=compression)
    assert stats["stored_bytes"] < stats["bytes"] // 4, stats
    savepoint.save(state, tmp_path / "d", compression=compression, async_=True).result(timeout=60)
    for p in ("c", "d"):
        for mmap in (False, True):
            back = savepoint.load(tmp_path / p, mmap=mmap)
            assert same_bytes(back["zeros"], state["zeros"]) and same_bytes(back["ramp"], state["ramp"])
            assert same_bytes(back["a"], state["a"])
        savepoint.verify(tmp_path / p)
