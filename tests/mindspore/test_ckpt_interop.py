"""MindSpore .ckpt interop against the real MindSpore (2.10, CPU): files MindSpore writes load
bit-exactly through savepoint, and files savepoint writes load bit-exactly in MindSpore.

Runs in its own virtual environment (scripts/msvenv: mindspore==2.10.0 needs numpy<2) and drives
the `savepoint` CLI (path in SAVEPOINT_CLI): every conversion goes through savepoint's reader into
a State and back out through its writer, so each comparison checks both directions."""
import os
import subprocess

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

ms.set_context(device_target="CPU")
CLI = os.environ["SAVEPOINT_CLI"]
DTYPES = [ms.int8, ms.uint8, ms.int16, ms.uint16, ms.int32, ms.uint32, ms.int64, ms.uint64,
          ms.float16, ms.float32, ms.float64, ms.bool_, ms.bfloat16]  # fmt: skip


def convert(src, dst, *flags, ok=True):
    r = subprocess.run([CLI, "convert", str(src), str(dst), *flags], capture_output=True, text=True)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    return r


def contents(path, **kw):
    """{name: (dtype, shape, bytes)} or {name: str} as MindSpore loads the file."""
    out = {}
    for k, v in ms.load_checkpoint(str(path), **kw).items():
        out[k] = v if isinstance(v, str) else (str(v.dtype), tuple(v.shape), v.asnumpy().tobytes())
    return out


def corpus(seed):
    rng = np.random.default_rng(seed)
    items = []
    for i, dt in enumerate(DTYPES):
        shape = (3, 7) if i % 2 else (11,)
        data = rng.integers(0, 2, shape) if dt == ms.bool_ else rng.standard_normal(shape) * 50
        items.append({"name": f"layer{i}.w", "data": Parameter(Tensor(data, dt), name=f"layer{i}.w")})
    items.append({"name": "beta1_power", "data": Parameter(Tensor(0.9, ms.float32), name="beta1_power")})
    return items


def test_every_dtype_scalars_and_append_info_both_ways(tmp_path):
    src = tmp_path / "ms.ckpt"
    ms.save_checkpoint(corpus(1), str(src),
                       append_dict={"epoch_num": 3, "step_num": 120, "lr": 0.001, "flag": True,
                                    "note": "héllo 🙂"})  # fmt: skip
    want = contents(src)
    assert want["note"] == "héllo 🙂" and want["epoch_num"][0] == "Int64"
    convert(src, tmp_path / "ours.ckpt")  # .ckpt -> State -> .ckpt
    assert contents(tmp_path / "ours.ckpt") == want
    convert(src, tmp_path / "native")  # .ckpt -> native checkpoint -> .ckpt
    convert(tmp_path / "native", tmp_path / "back.ckpt")
    assert contents(tmp_path / "back.ckpt") == want


def test_int4_round_trips(tmp_path):
    src = tmp_path / "q.ckpt"
    q = Tensor(np.array([[1, -2, 3, 7], [-8, 0, 5, -1]], np.int8), ms.qint4x2)
    ms.save_checkpoint([{"name": "q", "data": q}], str(src))
    convert(src, tmp_path / "native")
    convert(tmp_path / "native", tmp_path / "q2.ckpt")
    assert contents(tmp_path / "q2.ckpt") == contents(src)
    assert (tmp_path / "q2.ckpt").read_bytes() == src.read_bytes()  # one entry: the same bytes


def test_crc_written_and_checked(tmp_path):
    src = tmp_path / "crc.ckpt"
    ms.save_checkpoint(corpus(2), str(src), crc_check=True)
    convert(src, tmp_path / "ours.ckpt", "--crc")
    assert contents(tmp_path / "ours.ckpt", crc_check=True) == contents(src, crc_check=True)
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the tensors: only the CRC can tell
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(bytes(data))
    r = convert(bad, tmp_path / "x.ckpt", ok=False)
    assert "CRC-32 mismatch" in r.stderr and "bad.ckpt" in r.stderr, r.stderr


def test_tensor_over_512_mib_is_split_as_mindspore_splits_it(tmp_path):
    src = tmp_path / "big.ckpt"
    big = np.arange(513 * 1024 * 1024 // 4, dtype=np.int32).reshape(-1, 1024)
    ms.save_checkpoint([{"name": "big", "data": Parameter(Tensor(big), name="big")}], str(src))
    convert(src, tmp_path / "ours.ckpt")
    # One entry: our writer lays the pieces out byte for byte as MindSpore does.
    assert (tmp_path / "ours.ckpt").read_bytes() == src.read_bytes()
    back = ms.load_checkpoint(str(tmp_path / "ours.ckpt"))["big"].asnumpy()
    assert np.array_equal(back, big)


# The Python API (savepoint.mindspore, MindSpore's argument names) against MindSpore itself.
def test_python_api_reads_what_mindspore_writes(tmp_path):
    from savepoint import mindspore as spms

    src = tmp_path / "ms.ckpt"
    ms.save_checkpoint(corpus(3), str(src), crc_check=True,
                       append_dict={"epoch_num": 2, "lr": 0.5, "note": "abc"})  # fmt: skip
    ours = spms.load_checkpoint(src)
    theirs = ms.load_checkpoint(str(src))
    assert set(ours) == set(theirs)
    for name, v in theirs.items():
        if isinstance(v, str):
            assert ours[name] == v
        else:
            assert ours[name].shape == tuple(v.shape), name
            assert ours[name].tobytes() == v.asnumpy().tobytes(), name
    assert spms.checkpoint_info(src)["has_crc"]


def test_mindspore_reads_what_the_python_api_writes(tmp_path):
    from savepoint import mindspore as spms

    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.arange(5, dtype=np.int64),
              "mask": np.array([True, False]), "h": np.ones(3, np.float16)}  # fmt: skip
    out = tmp_path / "ours.ckpt"
    spms.save_checkpoint([{"name": k, "data": v} for k, v in arrays.items()], out, crc_check=True,
                         append_dict={"epoch_num": 4, "lr": 0.25, "flag": True, "tag": "x"})  # fmt: skip
    back = ms.load_checkpoint(str(out), crc_check=True)
    for k, v in arrays.items():
        assert np.array_equal(back[k].asnumpy(), v), k
        assert back[k].asnumpy().dtype == v.dtype, k
    # append_dict with MindSpore's own types: int -> Int64, float -> Float32, bool -> Bool.
    assert str(back["epoch_num"].dtype) == "Int64" and int(back["epoch_num"].asnumpy()) == 4
    assert str(back["lr"].dtype) == "Float32" and float(back["lr"].asnumpy()) == 0.25
    assert str(back["flag"].dtype) == "Bool" and bool(back["flag"].asnumpy())
    assert back["tag"] == "x"
