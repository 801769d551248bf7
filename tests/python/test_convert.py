"""savepoint.convert and savepoint.verify over every format, against the reference libraries:
a safetensors file written by the safetensors package converts to a savepoint checkpoint and
back to a file the package reads bit-exact; a native checkpoint converts to a .ckpt and a
safetensors file and back; verify reads a safetensors file through and finds a truncation; every
refusal happens before anything is written."""

import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import savepoint

SEED = 4321


def _tensors():
    print(f"seed {SEED}")
    g = torch.Generator().manual_seed(SEED)
    return {
        "w": torch.randn(64, 32, generator=g),
        "b16": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "i64": torch.randint(-(2**40), 2**40, (5,), generator=g, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
    }


def test_reference_safetensors_to_native_and_back(tmp_path):
    src = tmp_path / "ref.safetensors"
    save_file(_tensors(), str(src), metadata={"origin": "reference"})
    report = savepoint.convert(src, tmp_path / "native")
    assert report["from"] == "safetensors" and report["to"] == "native"
    assert report["tensors"] == 4
    loaded = savepoint.load(tmp_path / "native", framework="pt")
    for k, v in _tensors().items():
        assert torch.equal(loaded[k].view(torch.uint8), v.view(torch.uint8)), k
    savepoint.verify(tmp_path / "native")
    back = savepoint.convert(tmp_path / "native", tmp_path / "back.safetensors")
    assert back["to"] == "safetensors"
    got = load_file(str(tmp_path / "back.safetensors"))
    for k, v in _tensors().items():
        assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k


def test_native_to_ckpt_and_safetensors_round_trip(tmp_path):
    state = {k: v.numpy() if v.dtype != torch.bfloat16 else v for k, v in _tensors().items()}
    savepoint.save(state, tmp_path / "n")
    savepoint.convert(tmp_path / "n", tmp_path / "m.ckpt", file_checksum=True)
    savepoint.verify(tmp_path / "m.ckpt")
    savepoint.convert(tmp_path / "m.ckpt", tmp_path / "m.safetensors")
    savepoint.convert(tmp_path / "m.safetensors", tmp_path / "n2")
    a = savepoint.load(tmp_path / "n", framework="pt")
    b = savepoint.load(tmp_path / "n2", framework="pt")
    for k in _tensors():
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k


def test_verify_reads_a_safetensors_file_through(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file(_tensors(), str(path))
    stats = savepoint.verify(path)
    assert stats["bytes"] == sum(v.numel() * v.element_size() for v in _tensors().values())
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 16)
    with pytest.raises(savepoint.CorruptCheckpointError):
        savepoint.verify(path)


def test_refusals_come_before_any_write(tmp_path):
    save_file(_tensors(), str(tmp_path / "a.safetensors"))
    savepoint.convert(tmp_path / "a.safetensors", tmp_path / "n")
    with pytest.raises(savepoint.AlreadyExistsError):
        savepoint.convert(tmp_path / "missing", tmp_path / "n")
    with pytest.raises(savepoint.InvalidArgumentError, match="read only"):
        savepoint.convert(tmp_path / "n", tmp_path / "x", to="dcp")
    with pytest.raises(savepoint.InvalidArgumentError, match="to='onnx'"):
        savepoint.convert(tmp_path / "n", tmp_path / "x", to="onnx")
    with pytest.raises(savepoint.InvalidArgumentError, match="not encrypted"):
        savepoint.convert(tmp_path / "n", tmp_path / "x.safetensors", key=b"k" * 32)
    with pytest.raises(savepoint.InvalidArgumentError, match="file_checksum"):
        savepoint.convert(tmp_path / "n", tmp_path / "x", file_checksum=True)
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.safetensors").exists()
    savepoint.convert(tmp_path / "n", tmp_path / "n", overwrite=True)
    assert savepoint.load(tmp_path / "n")["w"].shape == (64, 32)
