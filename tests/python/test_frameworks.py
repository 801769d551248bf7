"""savepoint.load(framework=None | "pt" | "np"): checkpoints not written from torch (the CLI's
`savepoint convert` of a safetensors file, the C++ API) load as torch tensors on request, bf16 and
fp8 included, even where ml_dtypes cannot be imported; as saved by default; as numpy on request."""

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import savepoint


def _source():
    g = torch.Generator().manual_seed(7)
    f32 = torch.randn(4, 6, generator=g)
    return {
        "w.bf16": f32.to(torch.bfloat16),
        "w.fp8": f32.to(torch.float8_e4m3fn),
        "w.f32": f32,
        "n.i64": torch.arange(5),
    }


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8).tolist()


def _converted(tmp_path, cli):
    """A checkpoint made by `savepoint convert` of a safetensors file written by the safetensors
    package: flat, no Python structure."""
    src = tmp_path / "ref.safetensors"
    save_file(_source(), str(src))
    dst = tmp_path / "converted"
    cmd = [cli, "convert", str(src), str(dst)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return dst


def _cpp_flat(tmp_path):
    """A checkpoint as the C++ API writes it: the same core call as savepoint.save, without the
    Python structure in the metadata."""
    from savepoint._tree import Flattener

    flat = Flattener()
    src = _source()
    flat.flatten(src)
    path = tmp_path / "cpp"
    savepoint._core.save(str(path), [t.spec() for t in flat.tensors], flat.values, "",
                         overwrite=False, create_parents=True, direct_io=True, io_threads=2,
                         chunk_bytes=8 << 20)  # fmt: skip
    return path


# Runs in a fresh interpreter where `import ml_dtypes` fails.
_NO_ML_DTYPES = r"""
import json, sys
sys.modules["ml_dtypes"] = None
import numpy as np, torch, savepoint
path = sys.argv[1]
out = {}
pt = savepoint.load(path, framework="pt")
out["pt"] = {k: [str(v.dtype), v.contiguous().reshape(-1).view(torch.uint8).tolist()]
             for k, v in pt.items()}
default = savepoint.load(path)
out["default"] = {k: type(v).__module__.split(".")[0] + ":" + str(v.dtype)
                  for k, v in default.items()}
mapped = savepoint.load(path, framework="pt", mmap=True)
out["mmap"] = str(mapped["w.bf16"].dtype)
try:
    savepoint.load(path, framework="np")
    out["np"] = "loaded"
except TypeError as e:
    out["np"] = str(e)
print(json.dumps(out))
"""


def _check_without_ml_dtypes(path):
    r = subprocess.run([sys.executable, "-c", _NO_ML_DTYPES, str(path)], capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    src = _source()
    for name, t in src.items():
        dtype, bits = out["pt"][name]
        assert dtype == str(t.dtype) and bits == _bits(t), name
    # Default: numpy where numpy can hold it without ml_dtypes, torch for bf16 / fp8.
    assert out["default"] == {
        "w.bf16": "torch:torch.bfloat16", "w.fp8": "torch:torch.float8_e4m3fn",
        "w.f32": "numpy:float32", "n.i64": "numpy:int64"}  # fmt: skip
    assert out["mmap"] == "torch.bfloat16"
    assert "ml_dtypes" in out["np"] and "framework='pt'" in out["np"]


def test_converted_bf16_loads_as_torch_without_ml_dtypes(tmp_path, savepoint_cli):
    _check_without_ml_dtypes(_converted(tmp_path, savepoint_cli))


def test_cpp_written_bf16_loads_as_torch_without_ml_dtypes(tmp_path):
    _check_without_ml_dtypes(_cpp_flat(tmp_path))


def test_flat_checkpoint_frameworks_with_ml_dtypes(tmp_path):
    path = _cpp_flat(tmp_path)
    src = _source()
    default = savepoint.load(path)  # C++ / CLI checkpoints: numpy, bf16 and fp8 via ml_dtypes
    assert all(isinstance(v, np.ndarray) for v in default.values())
    assert default["w.bf16"].dtype == ml_dtypes.bfloat16
    assert _bits(torch.from_numpy(default["w.bf16"].view(np.uint16))) == _bits(src["w.bf16"])
    pt = savepoint.load(path, framework="torch")
    assert pt["w.fp8"].dtype == torch.float8_e4m3fn and _bits(pt["w.fp8"]) == _bits(src["w.fp8"])
    assert pt["w.bf16"].dtype == torch.bfloat16 and torch.equal(pt["w.bf16"], src["w.bf16"])
    assert torch.equal(pt["n.i64"], src["n.i64"])


def test_python_checkpoint_frameworks(tmp_path):
    obj = {"t": torch.arange(6.0).to(torch.bfloat16), "a": np.arange(3, dtype=np.int16),
           "s": np.float32(2.5), "p": torch.nn.Parameter(torch.ones(2)), "k": 3}  # fmt: skip
    savepoint.save(obj, tmp_path / "c")
    same = savepoint.load(tmp_path / "c")  # as saved
    assert isinstance(same["t"], torch.Tensor) and isinstance(same["a"], np.ndarray)
    assert isinstance(same["p"], torch.nn.Parameter) and same["s"] == np.float32(2.5)
    pt = savepoint.load(tmp_path / "c", framework="pt")
    assert pt["a"].dtype == torch.int16 and pt["a"].tolist() == [0, 1, 2]
    assert isinstance(pt["s"], torch.Tensor) and pt["s"].item() == 2.5 and pt["k"] == 3
    assert pt["t"].dtype == torch.bfloat16
    np_ = savepoint.load(tmp_path / "c", framework="np")
    assert isinstance(np_["t"], np.ndarray) and np_["t"].dtype == ml_dtypes.bfloat16
    assert np_["t"].astype(np.float32).tolist() == [0, 1, 2, 3, 4, 5]
    assert isinstance(np_["p"], np.ndarray) and np_["a"].dtype == np.int16
    like = torch.zeros(6, dtype=torch.bfloat16)  # like targets come back as they are
    assert savepoint.load(tmp_path / "c", framework="np", like={"t": like})["t"] is like
    with pytest.raises(ValueError, match="framework"):
        savepoint.load(tmp_path / "c", framework="jax")
