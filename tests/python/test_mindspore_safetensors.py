"""savepoint.mindspore with format="safetensors" without MindSpore: MindSpore's flavour ("format":
"ms", crc_num) written, read, checked and refused where MindSpore refuses. (Against the real
MindSpore: tests/mindspore/test_safetensors_ms.py.)"""
import binascii
import json

import numpy as np
import pytest

import savepoint
from savepoint import mindspore as spms


def metadata(path):
    data = path.read_bytes()
    return json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]


def test_round_trip_writes_the_flavour_and_a_known_crc(tmp_path):
    p = tmp_path / "m.safetensors"
    obj = {"b": np.array([1, 2], np.float32), "a": 3, "c": np.arange(1, 4, dtype=np.uint8)}
    spms.save_checkpoint(obj, p, format="safetensors", crc_check=True)
    # MindSpore's algorithm: names in order, each followed by its bytes; the 0-d int64 "a" = 3
    # counts as bytes(3), three zero bytes (Python's bytes() of an integer array scalar).
    want = binascii.crc32(b"a" + b"\0" * 3 + b"b" + np.array([1, 2], np.float32).tobytes()
                          + b"c" + bytes([1, 2, 3]))  # fmt: skip
    assert metadata(p) == {"format": "ms", "crc_num": str(want)}
    back = spms.load_checkpoint(p, format="safetensors", crc_check=True)
    assert back["a"].dtype == np.int64 and back["a"].shape == () and back["a"] == 3
    assert np.array_equal(back["b"], [1, 2]) and back["c"].dtype == np.uint8
    assert savepoint.safetensors_info(p)["metadata"]["format"] == "ms"


def test_crc_mismatch_and_modes(tmp_path):
    p = tmp_path / "m.safetensors"
    spms.save_checkpoint({"w": np.ones(1000, np.float32)}, p, format="safetensors")
    assert "crc_num" not in metadata(p)
    with pytest.raises(savepoint.CorruptCheckpointError, match="no crc_num"):
        spms.load_checkpoint(p, format="safetensors", crc_check=True)
    spms.save_checkpoint({"w": np.ones(1000, np.float32)}, p, format="safetensors", crc_check=True)
    data = bytearray(p.read_bytes())
    data[-10] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(savepoint.CorruptCheckpointError, match="CRC-32 mismatch"):
        spms.load_checkpoint(p, format="safetensors")
    with pytest.raises(savepoint.CorruptCheckpointError, match="CRC-32 mismatch"):
        savepoint.load_safetensors(p, framework="numpy")  # any load checks a crc_num it finds
    assert spms.load_checkpoint(p, format="safetensors", crc_check=False)["w"].shape == (1000,)


def test_what_mindspore_refuses_is_refused(tmp_path):
    p = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match="not encrypted"):
        spms.save_checkpoint({"w": np.ones(2)}, p, format="safetensors", enc_key=b"0" * 16)
    with pytest.raises(ValueError, match="not encrypted"):
        spms.load_checkpoint(p, format="safetensors", dec_mode="AES-CBC")
    with pytest.raises(TypeError, match="string"):
        spms.save_checkpoint({"w": np.ones(2), "note": "x"}, p, format="safetensors")
    with pytest.raises(savepoint.InvalidArgumentError, match="MindSpore cannot load"):
        spms.save_checkpoint({"z": np.ones(2, np.complex64)}, p, format="safetensors")
    assert not p.exists()
