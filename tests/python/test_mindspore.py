"""savepoint.mindspore without MindSpore: round trips, append_dict types, CRC, selection, and the
errors of options not supported yet. (Against the real MindSpore: tests/mindspore/.)"""
import numpy as np
import pytest

import savepoint
from savepoint import mindspore as spms


def test_round_trip_with_append_dict_and_crc(tmp_path):
    p = tmp_path / "net.ckpt"
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    stats = spms.save_checkpoint({"w": w, "b": np.zeros(4, np.float64), "step": 7}, p,
                                 append_dict={"epoch_num": 3, "lr": 0.5, "note": "hi"},
                                 crc_check=True)  # fmt: skip
    assert stats["bytes"] == w.nbytes + 32 + 8 + 4  # tensors: w, b, epoch_num, lr (step is a value)
    back = spms.load_checkpoint(p)
    assert np.array_equal(back["w"], w) and back["w"].dtype == np.float32
    assert back["epoch_num"].dtype == np.int64 and back["epoch_num"] == 3 and back["epoch_num"].shape == ()
    assert back["lr"].dtype == np.float32 and back["lr"] == 0.5  # MindSpore's append_info type
    assert back["step"].dtype == np.int64 and back["step"] == 7
    assert back["note"] == "hi"
    info = spms.checkpoint_info(p)
    assert info["has_crc"] and info["entries"]["w"]["type"] == "Float32"
    assert set(spms.load_checkpoint(p, names=["w", "no*"])) == {"w", "note"}


def test_crc_modes_and_corruption(tmp_path):
    p = tmp_path / "a.ckpt"
    spms.save_checkpoint({"w": np.ones(1000, np.float32)}, p)
    with pytest.raises(savepoint.CorruptCheckpointError, match="no CRC trailer"):
        spms.load_checkpoint(p, crc_check=True)
    spms.save_checkpoint({"w": np.ones(1000, np.float32)}, p, crc_check=True)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(savepoint.CorruptCheckpointError, match="CRC-32 mismatch"):
        spms.load_checkpoint(p)
    assert spms.load_checkpoint(p, crc_check=False)["w"].shape == (1000,)


def test_unsupported_options_raise(tmp_path):
    with pytest.raises(savepoint.InvalidArgumentError, match="AES-GCM needs a key of 16, 24 or 32"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "e.ckpt", enc_key=b"0" * 20)
    assert not (tmp_path / "e.ckpt").exists()
    with pytest.raises(TypeError, match="enc_key"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "e.ckpt", enc_key=1234)
    with pytest.raises(savepoint.InvalidArgumentError, match="unknown MindSpore cipher"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "e.ckpt", enc_key=b"0" * 16,
                             enc_mode="DES")  # fmt: skip
    with pytest.raises(ValueError, match="format"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "e.ckpt", format="pb")
    with pytest.raises(TypeError, match="'name' and 'data'"):
        spms.save_checkpoint([{"w": 1}], tmp_path / "e.ckpt")
    with pytest.raises(savepoint.NotFoundError):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "f.ckpt")
        spms.load_checkpoint(tmp_path / "f.ckpt", names=["nope"])


@pytest.mark.parametrize("mode", ["AES-GCM", "AES-CBC", "SM4-CBC"])
def test_encrypted_round_trip_with_every_kind_of_key(tmp_path, mode):
    arrays = {"w": np.arange(24, dtype=np.float32).reshape(4, 6), "b": np.ones(3, np.float16)}
    key = bytes(range(16))
    (tmp_path / "key.bin").write_bytes(key)
    calls = []

    def provider():
        calls.append(1)
        return key

    p = tmp_path / "e.ckpt"
    spms.save_checkpoint(arrays, p, enc_key=key, enc_mode=mode, crc_check=True,
                         append_dict={"epoch_num": 2})  # fmt: skip
    for k in (key, bytearray(key), tmp_path / "key.bin", str(tmp_path / "key.bin"), provider):
        got = spms.load_checkpoint(p, dec_key=k, dec_mode=mode, crc_check=True)
        for name, v in arrays.items():
            assert got[name].tobytes() == v.tobytes(), (name, k)
        assert int(got["epoch_num"]) == 2
    assert len(calls) == 1
    info = spms.checkpoint_info(p)
    assert info["cipher"] == mode and not info["entries_listed"] and info["entries"] == {}
    assert spms.checkpoint_info(p, dec_key=key)["has_crc"]
    with pytest.raises(savepoint.InvalidArgumentError, match="pass its key"):
        spms.load_checkpoint(p)
    with pytest.raises(savepoint.AuthenticationError):
        spms.load_checkpoint(p, dec_key=bytes(range(1, 17)), dec_mode=mode)

    def failing():
        raise RuntimeError("vault sealed")

    with pytest.raises(savepoint.InvalidArgumentError, match="vault sealed"):
        spms.load_checkpoint(p, dec_key=failing, dec_mode=mode)
