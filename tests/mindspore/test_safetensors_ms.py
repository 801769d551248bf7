"""MindSpore's safetensors flavour against the real MindSpore (2.10, CPU): `"format": "ms"` and
the CRC-32 `crc_num` of save_checkpoint / load_checkpoint(format="safetensors", crc_check=True).

Files MindSpore writes load bit-exactly through savepoint (Python API and CLI) with their CRC
verified; files savepoint writes load bit-exactly in MindSpore with crc_check=True; one flipped data
byte makes both report a CRC error. A Python transcription of the algorithm (reference_crc) pins
the value where MindSpore itself cannot compute it (bfloat16, negative integer scalars)."""
import binascii
import json
import os
import subprocess

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

import savepoint
from savepoint import mindspore as spms

ms.set_context(device_target="CPU")
CLI = os.environ["SAVEPOINT_CLI"]
# Every dtype MindSpore's safetensors path handles; bfloat16 only without crc_check (MindSpore's
# CRC code calls bytes() on the array, which numpy refuses for bfloat16).
DTYPES = [ms.int8, ms.uint8, ms.int16, ms.uint16, ms.int32, ms.uint32, ms.int64, ms.uint64,
          ms.float16, ms.float32, ms.float64, ms.bool_]  # fmt: skip
INTS = {"I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64"}


def header(path):
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def reference_crc(path):
    """MindSpore's crc_num, from the file alone: names in order, each followed by its bytes, where
    a 0-d integer tensor holding v (0 <= v < 2**63) counts as bytes(v), v zero bytes."""
    h, body = header(path)
    h.pop("__metadata__", None)
    crc = 0
    for name in sorted(h):
        begin, end = h[name]["data_offsets"]
        raw = body[begin:end]
        if h[name]["shape"] == [] and h[name]["dtype"] in INTS:
            v = int.from_bytes(raw, "little", signed=h[name]["dtype"].startswith("I"))
            raw = bytes(v) if 0 <= v < 2**63 else raw
        crc = binascii.crc32(raw, binascii.crc32(name.encode(), crc))
    return crc


def corpus(seed, bf16=False):
    rng = np.random.default_rng(seed)
    items = []
    for i, dt in enumerate(DTYPES + ([ms.bfloat16] if bf16 else [])):
        shape = (3, 7) if i % 2 else (11,)
        data = rng.integers(0, 2, shape) if dt == ms.bool_ else rng.standard_normal(shape) * 50
        name = f"layer{i}.w"
        items.append({"name": name, "data": Parameter(Tensor(data, dt), name=name)})
    scalars = {"beta1_power": Tensor(0.9, ms.float32), "step": Tensor(123456, ms.int64),
               "zero": Tensor(0, ms.int32), "flag": Tensor(True, ms.bool_),
               "small": Tensor(7, ms.uint8), "empty": Tensor(np.zeros((0, 3), np.float32))}
    items += [{"name": k, "data": Parameter(v, name=k)} for k, v in scalars.items()]  # fmt: skip
    return items


def theirs(path, **kw):
    """{name: (numpy dtype name, shape, bytes)} as MindSpore loads the file."""
    out = {}
    for k, v in ms.load_checkpoint(str(path), format="safetensors", **kw).items():
        a = v.asnumpy()
        out[k] = (a.dtype.name, a.shape, a.tobytes())
    return out


def ours(path, **kw):
    return {k: (a.dtype.name, a.shape, a.tobytes())
            for k, a in spms.load_checkpoint(path, format="safetensors", **kw).items()}  # fmt: skip


def cli(*args, ok=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    return r


def flip_data_byte(src, dst):
    h, _ = header(src)
    data = bytearray(open(src, "rb").read())
    n = int.from_bytes(data[:8], "little")
    begin, _ = h["layer2.w"]["data_offsets"]
    data[8 + n + begin + 3] ^= 0x04
    with open(dst, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("crc", [True, False])
def test_mindspore_files_load_bit_exactly_and_their_crc_verifies(tmp_path, crc):
    src = tmp_path / "ms.safetensors"
    ms.save_checkpoint(corpus(1, bf16=not crc), str(src), format="safetensors", crc_check=crc,
                       append_dict={"epoch_num": 3, "lr": 0.001})  # fmt: skip
    h, _ = header(src)
    assert h["__metadata__"]["format"] == "ms"
    assert ("crc_num" in h["__metadata__"]) == crc
    if crc:
        assert int(h["__metadata__"]["crc_num"]) == reference_crc(src)
    want = theirs(src, crc_check=crc)
    assert ours(src, crc_check=True if crc else None) == want
    assert set(want) >= {"epoch_num", "empty", "step"} and want["step"][1] == ()
    info = json.loads(cli("inspect", "--json", src).stdout)
    assert info["mindspore_format"] is True
    assert info["crc_num"] == (h["__metadata__"]["crc_num"] if crc else None)
    verify = json.loads(cli("verify", "--json", src).stdout)
    assert verify["ok"] and verify["checksums"] == crc and verify["chunks"] == (1 if crc else 0)


def test_mindspore_loads_our_files_with_crc_check(tmp_path):
    rng = np.random.default_rng(2)
    dtypes = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
              np.float16, np.float32, np.float64]  # fmt: skip
    arrays = {f"t{i}": (rng.standard_normal((4, 5)) * 100).astype(t) for i, t in enumerate(dtypes)}
    arrays["mask"] = rng.integers(0, 2, (3, 3)).astype(np.bool_)
    arrays["big"] = rng.standard_normal(3 << 20).astype(np.float32)  # several 8 MiB pieces
    arrays["step"] = np.int64(99)  # a 0-d integer: hashed as 99 zero bytes
    arrays["zero"] = np.array(0, np.uint16)
    arrays["empty"] = np.zeros((0, 2), np.float64)
    out = tmp_path / "ours.safetensors"
    spms.save_checkpoint(arrays, out, format="safetensors", crc_check=True,
                         append_dict={"epoch_num": 5, "lr": 0.25, "flag": True})  # fmt: skip
    h, _ = header(out)
    assert h["__metadata__"]["format"] == "ms"
    assert int(h["__metadata__"]["crc_num"]) == reference_crc(out)
    back = theirs(out, crc_check=True)
    for k, v in arrays.items():
        v = np.asarray(v)
        assert back[k] == (v.dtype.name, v.shape, v.tobytes()), k
    # append_dict with MindSpore's own types: int -> int64, float -> float32, bool.
    assert back["epoch_num"][:2] == ("int64", ()) and back["lr"][:2] == ("float32", ())
    assert back["flag"] == ("bool", (), b"\x01")
    assert ours(out, crc_check=True) == back
    assert ours(out, names=["t1", "step"]).keys() == {"t1", "step"}


def test_cli_converts_a_mindspore_ckpt_to_its_safetensors_flavour(tmp_path):
    src = tmp_path / "ms.ckpt"
    ms.save_checkpoint(corpus(3, bf16=False), str(src))
    want = {k: (str(v.dtype), tuple(v.shape), v.asnumpy().tobytes())
            for k, v in ms.load_checkpoint(str(src)).items()}  # fmt: skip
    for flags, crc in ((["--crc"], True), (["--mindspore"], False)):
        dst = tmp_path / f"out_{crc}.safetensors"
        cli("convert", src, dst, *flags)
        h, _ = header(dst)
        assert h["__metadata__"]["format"] == "ms" and ("crc_num" in h["__metadata__"]) == crc
        got = {k: (str(v.dtype), tuple(v.shape), v.asnumpy().tobytes())
               for k, v in ms.load_checkpoint(str(dst), format="safetensors",
                                              crc_check=crc).items()}  # fmt: skip
        assert got == want


def test_bfloat16_and_negative_scalars_mindspore_cannot_check(tmp_path):
    """MindSpore 2.10 cannot compute its own CRC over a bfloat16 tensor or a negative integer
    scalar; savepoint writes and checks the natural value (their bytes), and MindSpore loads such
    files with crc_check=False."""
    bf16 = Tensor(np.linspace(-3, 3, 12).reshape(3, 4), ms.bfloat16).asnumpy()
    out = tmp_path / "bf16.safetensors"
    spms.save_checkpoint({"w": bf16, "neg": np.int32(-4)}, out, format="safetensors",
                         crc_check=True)  # fmt: skip
    assert int(header(out)[0]["__metadata__"]["crc_num"]) == reference_crc(out)
    assert theirs(out)["w"] == ("bfloat16", (3, 4), bf16.tobytes())
    with pytest.raises(ValueError, match="cannot include dtype 'E'|negative count"):
        ms.load_checkpoint(str(out), format="safetensors", crc_check=True)
    assert ours(out, crc_check=True)["w"][2] == bf16.tobytes()
    cli("verify", out)


@pytest.mark.parametrize("writer", ["mindspore", "savepoint"])
def test_a_flipped_data_byte_is_a_crc_error_in_both(tmp_path, writer):
    good = tmp_path / "good.safetensors"
    if writer == "mindspore":
        ms.save_checkpoint(corpus(3), str(good), format="safetensors", crc_check=True)
    else:
        params = ms.load_checkpoint(str(_ms_file(tmp_path)), format="safetensors")
        spms.save_checkpoint({k: v.asnumpy() for k, v in params.items()}, good,
                             format="safetensors", crc_check=True)  # fmt: skip
    bad = tmp_path / "bad.safetensors"
    flip_data_byte(good, bad)
    with pytest.raises(ValueError, match="crc check has failed"):
        ms.load_checkpoint(str(bad), format="safetensors", crc_check=True)
    with pytest.raises(savepoint.CorruptCheckpointError, match="CRC-32 mismatch") as e:
        spms.load_checkpoint(bad, format="safetensors")
    assert str(bad) in str(e.value) and header(bad)[0]["__metadata__"]["crc_num"] in str(e.value)
    with pytest.raises(savepoint.CorruptCheckpointError, match="CRC-32 mismatch"):
        spms.load_checkpoint(bad, format="safetensors", names=["layer0.w"])  # the CRC covers all
    r = cli("verify", bad, ok=False)
    assert r.returncode == 2 and "CRC-32 mismatch" in r.stderr and "bad.safetensors" in r.stderr
    # Unchecked, both load it (and agree on every byte).
    assert ours(bad, crc_check=False) == theirs(bad, crc_check=False)


def _ms_file(tmp_path):
    p = tmp_path / "src.safetensors"
    ms.save_checkpoint(corpus(4), str(p), format="safetensors")
    return p


def test_crc_check_true_needs_a_crc_num_and_keys_are_refused(tmp_path):
    p = _ms_file(tmp_path)
    with pytest.raises(savepoint.CorruptCheckpointError, match="no crc_num"):
        spms.load_checkpoint(p, format="safetensors", crc_check=True)
    assert set(ours(p)) == set(theirs(p))
    with pytest.raises(ValueError, match="not encrypted"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "e.safetensors", format="safetensors",
                             enc_key=b"0" * 16)  # fmt: skip
    with pytest.raises(TypeError, match="string"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "s.safetensors", format="safetensors",
                             append_dict={"note": "x"})  # fmt: skip
