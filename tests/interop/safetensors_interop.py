"""Interop of savepoint's safetensors reader and writer with the reference `safetensors` package.

Files written by `safetensors.torch.save_file` convert to native checkpoints and back with the
`savepoint convert` CLI, and the result loads in `safetensors.torch.load_file` bit-exactly with its
metadata; files our writer makes from a native checkpoint load in the reference package with their
metadata; hostile files are rejected by both.

Run by ctest (test `safetensors_interop`, label `python`) when CMake was given -DSAVEPOINT_PYTHON;
by hand:
    SAVEPOINT_CLI=build/tools/savepoint SAVEPOINT_MAKE_CHECKPOINT=build/tests/make_checkpoint \
        $(scripts/venv) -m pytest -q tests/interop/safetensors_interop.py
"""

import json
import os
import struct
import subprocess

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

SP = os.environ.get("SAVEPOINT_CLI", "build/tools/savepoint")
MAKE_CHECKPOINT = os.environ.get("SAVEPOINT_MAKE_CHECKPOINT", "build/tests/make_checkpoint")

# Every dtype both savepoint and the reference package support, by safetensors code.
DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "U16": torch.uint16,
    "I16": torch.int16,
    "U32": torch.uint32,
    "I32": torch.int32,
    "U64": torch.uint64,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}

METADATA = {"format": "pt", "note": "h\u00e9llo, \u4e16\u754c", "empty": ""}


def random_tensor(dtype, shape, gen):
    """Random bits of `dtype` (every bit pattern for integer-like types, incl. NaNs for floats)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype == torch.complex64:
        return torch.randn(shape, generator=gen, dtype=torch.complex64)
    nbytes = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, nbytes), generator=gen, dtype=torch.uint8)
    if len(shape) == 0:
        return raw.view(dtype).reshape(())
    return raw.view(dtype).reshape(shape)


def make_tensors(seed=1234):
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for code, dtype in DTYPES.items():
        tensors[f"t.{code}"] = random_tensor(dtype, (3, 5), gen)
    tensors["scalar"] = random_tensor(torch.float32, (), gen)
    tensors["empty"] = torch.zeros((0, 4), dtype=torch.float16)
    tensors["model.layers.0.weight"] = random_tensor(torch.bfloat16, (64, 33), gen)
    return tensors


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).tolist() if t.numel() else []


def assert_same_tensors(expected, actual):
    assert sorted(expected) == sorted(actual)
    for name, e in expected.items():
        a = actual[name]
        assert a.dtype == e.dtype, name
        assert a.shape == e.shape, name
        assert raw_bytes(a) == raw_bytes(e), name
        if e.dtype in (torch.float32, torch.int64, torch.bool):
            assert torch.equal(a, e) or torch.isnan(e).any(), name


def sp(*args):
    return subprocess.run([SP, *map(str, args)], capture_output=True, text=True, check=False)


def sp_ok(*args):
    r = sp(*args)
    assert r.returncode == 0, f"savepoint {args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def file_metadata(path):
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def test_reference_file_round_trips_through_native(tmp_path):
    tensors = make_tensors()
    src = tmp_path / "ref.safetensors"
    save_file(tensors, str(src), metadata=METADATA)

    sp_ok("convert", src, tmp_path / "ckpt")
    sp_ok("verify", tmp_path / "ckpt")
    info = json.loads(sp_ok("inspect", "--json", tmp_path / "ckpt").stdout)
    assert info["metadata"] == METADATA
    shown = {t["name"]: (t["dtype"], t["shape"]) for t in info["tensors"]}
    assert shown["t.BF16"] == ("BF16", [3, 5])
    assert shown["t.F8_E5M2"] == ("F8_E5M2", [3, 5])
    assert shown["scalar"] == ("F32", [])
    assert shown["empty"] == ("F16", [0, 4])

    back = tmp_path / "back.safetensors"
    sp_ok("convert", tmp_path / "ckpt", back)
    assert_same_tensors(tensors, load_file(str(back)))
    assert file_metadata(back) == METADATA


def test_safetensors_to_safetensors_is_lossless(tmp_path):
    tensors = make_tensors(seed=7)
    src = tmp_path / "ref.safetensors"
    save_file(tensors, str(src), metadata=METADATA)
    out = tmp_path / "copy.safetensors"
    sp_ok("convert", src, out)
    assert_same_tensors(tensors, load_file(str(out)))
    assert file_metadata(out) == METADATA
    r = sp("convert", src, out)
    assert r.returncode == 1 and "exists" in r.stderr
    sp_ok("convert", "--overwrite", src, out)
    assert sorted(os.listdir(tmp_path)) == ["copy.safetensors", "ref.safetensors"]


def test_native_checkpoint_loads_in_the_reference_package(tmp_path):
    ckpt = tmp_path / "native"
    subprocess.run([MAKE_CHECKPOINT, str(ckpt)], check=True)
    out = tmp_path / "ours.safetensors"
    sp_ok("convert", ckpt, out)

    loaded = load_file(str(out))
    assert loaded["a"].dtype == torch.float32 and loaded["a"].shape == (2, 3)
    assert loaded["model.w"].dtype == torch.bfloat16 and loaded["model.w"].shape == (1024, 1024)
    meta = file_metadata(out)
    assert meta["purpose"] == "cli test"  # user string metadata, 1:1
    values = {v["name"]: v for v in json.loads(meta["savepoint.values"])}
    assert values["step"] == {"name": "step", "kind": "int", "value": 7}
    assert values["config"]["value"] == {"layers": 2}
    with open(out, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    assert n % 8 == 0

    # Re-saved by the reference writer, it converts back to a native checkpoint holding the same
    # tensors, values and metadata as the original.
    resaved = tmp_path / "resaved.safetensors"
    save_file(loaded, str(resaved), metadata=meta)
    sp_ok("convert", resaved, tmp_path / "native2")
    a = json.loads(sp_ok("inspect", "--json", ckpt).stdout)
    b = json.loads(sp_ok("inspect", "--json", tmp_path / "native2").stdout)
    for key in ("values", "metadata", "totals"):
        assert a[key] == b[key], key
    assert [(t["name"], t["dtype"], t["shape"]) for t in a["tensors"]] == [
        (t["name"], t["dtype"], t["shape"]) for t in b["tensors"]
    ]
    sp_ok("convert", tmp_path / "native2", tmp_path / "again.safetensors")
    assert_same_tensors(loaded, load_file(str(tmp_path / "again.safetensors")))


def test_inspect_shows_a_safetensors_file(tmp_path):
    src = tmp_path / "ref.safetensors"
    save_file(make_tensors(), str(src), metadata=METADATA)
    info = json.loads(sp_ok("inspect", "--json", src).stdout)
    assert info["format"] == "safetensors"
    assert info["__metadata__"] == METADATA
    assert len(info["tensors"]) == len(make_tensors())
    human = sp_ok("inspect", src).stdout
    assert "t.F8_E4M3" in human and "BF16" in human


def test_verify_reads_a_reference_file(tmp_path):
    src = tmp_path / "ref.safetensors"
    save_file(make_tensors(), str(src), metadata=METADATA)
    info = json.loads(sp_ok("inspect", "--json", src).stdout)
    r = sp_ok("verify", "--json", src)
    assert r.stderr == ""
    v = json.loads(r.stdout)
    assert v["ok"] and v["format"] == "safetensors" and v["checksums"] is False
    assert v["tensors"] == len(info["tensors"])
    assert v["bytes"] == info["totals"]["tensor_bytes"]
    assert "no checksums" in sp_ok("verify", src).stdout


def write_raw(path, header, data=b""):
    body = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body + data)


HOSTILE = {
    "overlap": (
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        b"x" * 12,
        "overlap",
    ),
    "hole": (
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        },
        b"x" * 12,
        "hole",
    ),
    "bad_dtype": ({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"x" * 4, "dtype"),
    "mismatch": ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"x" * 8, "needs"),
    "truncated": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"x" * 8, "truncated"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_are_rejected_by_both(tmp_path, case):
    header, data, words = HOSTILE[case]
    path = tmp_path / f"{case}.safetensors"
    write_raw(path, header, data)
    r = sp("convert", path, tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "corruption" in r.stderr and words in r.stderr
    assert not (tmp_path / "out").exists()
    r = sp("verify", path)
    assert r.returncode == 2, r.stderr
    assert "savepoint: verify: corruption: " in r.stderr and words in r.stderr
    with pytest.raises(Exception):
        load_file(str(path))


def test_huge_header_length_is_rejected(tmp_path):
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 200_000_000) + b"{}")
    r = sp("inspect", path)
    assert r.returncode == 2 and "exceeds the limit" in r.stderr
    with pytest.raises(Exception):
        load_file(str(path))


def test_dtype_savepoint_lacks_is_unimplemented(tmp_path):
    path = tmp_path / "fnuz.safetensors"
    save_file({"x": torch.zeros(4, dtype=torch.float8_e4m3fnuz)}, str(path))
    r = sp("convert", path, tmp_path / "out")
    assert r.returncode == 4 and "F8_E4M3FNUZ" in r.stderr
