"""savepoint.save_safetensors / load_safetensors against the reference safetensors package:
our files load bit-exact with safetensors.torch.load_file (metadata kept), theirs load with ours,
and a hostile header raises CorruptCheckpointError."""

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import savepoint

SEED = 1234


def _tensors():
    g = torch.Generator().manual_seed(SEED)
    print(f"seed {SEED}")
    f32 = torch.randn(3, 5, generator=g)
    return {
        "f32": f32,
        "f64": torch.randn(4, generator=g, dtype=torch.float64),
        "f16": f32.to(torch.float16),
        "bf16": f32.to(torch.bfloat16),
        "fp8_e4m3": f32.to(torch.float8_e4m3fn),
        "fp8_e5m2": f32.to(torch.float8_e5m2),
        "bool": torch.rand(7, generator=g) > 0.5,
        "u8": torch.randint(0, 256, (2, 3), generator=g, dtype=torch.uint8),
        "i8": torch.randint(-128, 128, (9,), generator=g, dtype=torch.int8),
        "i16": torch.randint(-(2**15), 2**15, (3,), generator=g, dtype=torch.int16),
        "i32": torch.randint(-(2**31), 2**31, (2, 2), generator=g, dtype=torch.int32),
        "i64": torch.randint(-(2**62), 2**62, (5,), generator=g, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


def _bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.contiguous().reshape(-1).view(torch.uint8).tolist() == (
        b.contiguous().reshape(-1).view(torch.uint8).tolist())


def test_ours_load_with_reference_bit_exact(tmp_path):
    tensors = _tensors()
    path = tmp_path / "m.safetensors"
    savepoint.save_safetensors(tensors, path, metadata={"format": "pt", "step": "7"})
    theirs = load_file(str(path))
    assert set(theirs) == set(tensors)
    for name, t in tensors.items():
        _bits_equal(theirs[name], t)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert header["__metadata__"] == {"format": "pt", "step": "7"}


@pytest.mark.parametrize("mmap", [False, True])
def test_reference_files_load_with_ours(tmp_path, mmap):
    tensors = _tensors()
    path = tmp_path / "ref.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    ours = savepoint.load_safetensors(path, mmap=mmap)
    assert set(ours) == set(tensors)
    for name, t in tensors.items():
        _bits_equal(ours[name], t)
    assert ours.metadata == {"format": "pt"}
    ours["f32"].add_(1)  # writable (copy-on-write with mmap: the file is unchanged)
    _bits_equal(load_file(str(path))["f32"], tensors["f32"])


def test_nested_names_values_and_metadata_round_trip(tmp_path):
    obj = {"model": {"layer": {"w": torch.arange(6.0).reshape(2, 3)}, "b": np.ones(3, np.int32)},
           "step": 42}  # fmt: skip
    path = tmp_path / "n.safetensors"
    savepoint.save_safetensors(obj, path, metadata={"note": "hi", "cfg": {"lr": 0.1}})
    assert set(load_file(str(path))) == {"model.layer.w", "model.b"}
    got = savepoint.load_safetensors(path)
    assert torch.equal(got["model.layer.w"], obj["model"]["layer"]["w"])
    assert got["model.b"].dtype == torch.int32
    assert got.scalars == {"step": 42}
    assert got.metadata == {"note": "hi", "cfg": {"lr": 0.1}}
    arrays = savepoint.load_safetensors(path, names=["model.*"], framework="numpy")
    assert set(arrays) == {"model.layer.w", "model.b"}
    np.testing.assert_array_equal(arrays["model.b"], obj["model"]["b"])
    info = savepoint.safetensors_info(path)
    assert info["tensors"]["model.layer.w"]["dtype"] == "F32"
    assert info["tensors"]["model.layer.w"]["shape"] == (2, 3)
    assert info["metadata"]["note"] == "hi"
    with pytest.raises(savepoint.NotFoundError):
        savepoint.load_safetensors(path, names=["nope"])
    with pytest.raises(savepoint.AlreadyExistsError):
        savepoint.save_safetensors(obj, path)
    savepoint.save_safetensors({"x": torch.ones(1)}, path, overwrite=True)
    assert set(savepoint.load_safetensors(path)) == {"x"}


def test_result_is_a_whole_mapping(tmp_path):
    """The metadata and scalars are attributes that shadow no dict method: .values(), .items(),
    .keys(), copy() and pickling all work as for a dict, and keep the attributes."""
    import copy
    import pickle

    path = tmp_path / "m.safetensors"
    savepoint.save_safetensors({"a": torch.ones(2), "b": torch.zeros(3), "n": 7}, path,
                               metadata={"note": "x"})  # fmt: skip
    got = savepoint.load_safetensors(path)
    assert isinstance(got, dict)
    assert sorted(t.numel() for t in got.values()) == [2, 3]
    assert sorted(got.keys()) == ["a", "b"] and len(list(got.items())) == 2
    assert got.scalars == {"n": 7} and got.metadata == {"note": "x"}
    for other in (got.copy(), copy.copy(got), pickle.loads(pickle.dumps(got))):
        assert type(other) is savepoint.SafetensorsDict and set(other) == {"a", "b"}
        assert other.scalars == {"n": 7} and other.metadata == {"note": "x"}
    plain = savepoint.load_safetensors(tmp_path / "m.safetensors", names=["a"])
    assert list(plain.values())[0].tolist() == [1.0, 1.0]
    torch.nn.Linear(2, 2).load_state_dict(
        savepoint.load_safetensors(_linear_file(tmp_path)))  # a state_dict as it is


def _linear_file(tmp_path):
    path = tmp_path / "linear.safetensors"
    save_file(torch.nn.Linear(2, 2).state_dict(), str(path))
    return path


def _write_raw(path, header, data=b""):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


HOSTILE = [
    ("overlap", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
    ("size mismatch", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
    ("past end", {"a": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}, b""),
    ("bad dtype", {"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
    ("not json", b"{\"a\": [", b""),
]  # fmt: skip


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_header_raises_corrupt(tmp_path, case, mmap):
    _, header, data = case
    path = tmp_path / "bad.safetensors"
    _write_raw(path, header, data)
    with pytest.raises(savepoint.CorruptCheckpointError):
        savepoint.load_safetensors(path, mmap=mmap)


def test_huge_header_length_raises_corrupt(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with pytest.raises(savepoint.CorruptCheckpointError):
        savepoint.load_safetensors(path)
    with pytest.raises(savepoint.CorruptCheckpointError):
        savepoint.safetensors_info(path)
