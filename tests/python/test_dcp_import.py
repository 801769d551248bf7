"""`savepoint convert` of directories written by PyTorch DCP's own FileSystemWriter: fixtures made
at test time by the real torch, converted by the CLI, compared bit for bit; hostile `.metadata`
and torch.save pickles refused without running anything."""

import io
import os
import pickle
import subprocess
import sys
import warnings
import zipfile

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import savepoint  # noqa: E402
import savepoint.torch as spt  # noqa: E402
from conftest import run_python  # noqa: E402

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def _state():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 8, generator=g)
    return {
        "model": {
            "w": torch.randn(64, 33, generator=g),
            "b": torch.randn(5, generator=g).to(torch.bfloat16),
            "view": base[:, 2:5],  # a strided view: torch.save keeps the whole storage
            "i8": torch.randint(-100, 100, (7,), dtype=torch.int8, generator=g),
            "u16": torch.arange(9, dtype=torch.int32).to(torch.uint16),  # _rebuild_tensor_v3
            "f8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
            "c": torch.randn(2, 2, dtype=torch.complex64, generator=g),
            "scalar": torch.tensor(3.5, dtype=torch.float64),
            "empty": torch.zeros(0, 3),
            "flags": torch.tensor([True, False, True]),
        },
        "step": 3,
        "names": ["a", "b"],
    }


def _same_bits(a, b):
    a, b = a.contiguous(), b.contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.view(-1).view(torch.uint8) if a.numel() else a, b.view(-1).view(torch.uint8) if b.numel()
        else b)


def _convert(cli, src, dst, check=True):
    return subprocess.run([cli, "convert", src, dst], check=check, capture_output=True, text=True)


def test_convert_single_process_bit_exact(tmp_path, savepoint_cli):
    src, dst = str(tmp_path / "dcp"), str(tmp_path / "native")
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(src))
    out = _convert(savepoint_cli, src, dst)
    assert "(dcp)" in out.stdout
    subprocess.run([savepoint_cli, "verify", dst], check=True, capture_output=True)
    loaded = savepoint.load(dst, framework="pt")
    for k, v in _state()["model"].items():
        assert _same_bits(loaded["model." + k], v), k
    # The values keep DCP's bytes: dcp.load through the plug-in gets them back.
    back = _state()
    back["model"] = {k: torch.zeros_like(v) for k, v in back["model"].items()}
    back["step"], back["names"] = 0, []
    dcp.load(back, storage_reader=spt.StorageReader(dst))
    assert back["step"] == 3 and back["names"] == ["a", "b"]
    assert _same_bits(back["model"]["view"], _state()["model"]["view"])


def test_convert_sharded_gloo_checkpoint(tmp_path, savepoint_cli):
    """DTensors over a 2x2 mesh written by 4 gloo ranks (chunks in four files) import whole."""
    r = run_python("dcp_ranks.py", "fswrite", 4, tmp_path, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    dst = str(tmp_path / "native")
    _convert(savepoint_cli, str(tmp_path / "fs"), dst)
    loaded = savepoint.load(dst, framework="pt")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "helpers"))
    try:
        import dcp_ranks
    finally:
        sys.path.pop(0)
    for name, want in dcp_ranks.expected().items():
        assert _same_bits(loaded[name], want), name


class _Hostile:
    """Unpickling this runs os.system (what a malicious .metadata would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _unpickle_in_subprocess(path):
    code = "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))"
    subprocess.run([sys.executable, "-c", code, path], capture_output=True)


def test_hostile_metadata_is_refused_without_running_it(tmp_path, savepoint_cli):
    src = tmp_path / "dcp"
    dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(str(src)))
    marker = tmp_path / "pwned"
    (src / ".metadata").write_bytes(pickle.dumps(_Hostile(marker), protocol=2))
    _unpickle_in_subprocess(str(src / ".metadata"))  # the fixture is real: pickle runs it
    assert marker.exists()
    marker.unlink()
    out = _convert(savepoint_cli, str(src), str(tmp_path / "native"), check=False)
    assert out.returncode != 0
    assert "refusing global" in out.stderr and "system" in out.stderr, out.stderr
    assert "byte" in out.stderr
    assert not marker.exists() and not (tmp_path / "native").exists()
    # Protocol 4 (STACK_GLOBAL) and a callable that is not allowed: builtins.eval.
    (src / ".metadata").write_bytes(
        pickle.dumps(_EvalHostile(f"open({str(marker)!r}, 'w')"), protocol=4))
    out = _convert(savepoint_cli, str(src), str(tmp_path / "native"), check=False)
    assert out.returncode != 0 and "builtins.eval" in out.stderr, out.stderr
    assert not marker.exists()


class _EvalHostile:
    def __init__(self, expr):
        self.expr = expr

    def __reduce__(self):
        return (eval, (self.expr,))


def test_hostile_tensor_pickle_in_a_chunk_is_refused(tmp_path, savepoint_cli):
    """A .distcp chunk whose torch.save data.pkl would run os.system."""
    src = tmp_path / "dcp"
    dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(str(src)))
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps(_Hostile(marker), protocol=2))
        z.writestr("archive/byteorder", "little")
    md = dcp.FileSystemReader(str(src)).read_metadata()
    (index, info), = [(k, v) for k, v in md.storage_data.items() if k.fqn == "w"]
    (src / info.relative_path).write_bytes(buf.getvalue())
    md.storage_data[index] = dataclasses_replace(info, offset=0, length=len(buf.getvalue()))
    (src / ".metadata").write_bytes(pickle.dumps(md))
    out = _convert(savepoint_cli, str(src), str(tmp_path / "native"), check=False)
    assert out.returncode != 0 and "refusing global" in out.stderr and '"w"' in out.stderr, \
        out.stderr
    assert not marker.exists()


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)
