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
    with pytest.raises(savepoint.UnimplementedError, match="encrypted"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "e.ckpt", enc_key=b"0" * 16)
    assert not (tmp_path / "e.ckpt").exists()
    with pytest.raises(savepoint.UnimplementedError, match="format"):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "e.ckpt", format="safetensors")
    with pytest.raises(TypeError, match="'name' and 'data'"):
        spms.save_checkpoint([{"w": 1}], tmp_path / "e.ckpt")
    with pytest.raises(savepoint.NotFoundError):
        spms.save_checkpoint({"w": np.ones(2)}, tmp_path / "f.ckpt")
        spms.load_checkpoint(tmp_path / "f.ckpt", names=["nope"])
