"""savepoint.CheckpointManager with file formats (format="ckpt" / "safetensors"): names, restore,
retention, encryption, and clear errors for what the formats do not offer."""

import numpy as np
import pytest

import savepoint
import savepoint.mindspore


def _state(step):
    return {"w": np.full((8, 4), step, np.float32), "n": np.arange(3, dtype=np.int64) * step}


@pytest.mark.parametrize("fmt,suffix", [("ckpt", ".ckpt"), ("safetensors", ".safetensors")])
def test_file_formats_name_keep_and_restore(tmp_path, fmt, suffix):
    with savepoint.CheckpointManager(tmp_path, format=fmt, crc_check=True, keep_last_n=2,
                                     steps_per_epoch=2) as mgr:  # fmt: skip
        for step in range(1, 5):
            assert mgr.save(step, _state(step))
        assert [c["name"] for c in mgr.checkpoints()] == [f"ckpt-2_1{suffix}", f"ckpt-2_2{suffix}"]
        assert sorted(p.name for p in tmp_path.glob(f"*{suffix}")) == [f"ckpt-2_1{suffix}",
                                                                     f"ckpt-2_2{suffix}"]
        back = mgr.restore(name="ckpt-2_1")
        assert (back["w"] == 3).all() and back["n"].tolist() == [0, 3, 6]
        assert mgr.restore(framework="pt")["w"].dtype.is_floating_point
        with pytest.raises(savepoint.UnimplementedError, match=f"format='{fmt}'"):
            mgr.restore_registered()
    reader = savepoint.mindspore.load_checkpoint(tmp_path / f"ckpt-2_2{suffix}", crc_check=True,
                                                 format=fmt)  # fmt: skip
    assert (reader["w"] == 4).all()


def test_encrypted_ckpt_files_need_the_key(tmp_path):
    key = bytes(range(16))  # SM4 keys are 16 bytes
    with savepoint.CheckpointManager(tmp_path, format="ckpt", key=key, enc_mode="SM4-CBC") as mgr:
        mgr.save(1, _state(1))
        assert (mgr.restore()["w"] == 1).all()
    assert (tmp_path / "ckpt-1_1.ckpt.mac").exists()
    info = savepoint.mindspore.checkpoint_info(tmp_path / "ckpt-1_1.ckpt")
    assert info["cipher"] == "SM4-CBC" and info["authentication"].startswith("HMAC-SHA256")
    with savepoint.CheckpointManager(tmp_path, format="ckpt", key=bytes(16),
                                     enc_mode="SM4-CBC") as other:
        assert other.all_steps() == [1]
        with pytest.raises(savepoint.AuthenticationError):
            other.restore()


@pytest.mark.parametrize("kwargs,match", [
    ({"format": "native", "crc_check": True}, "crc_check: only with a file format"),
    ({"format": "safetensors", "key": b"k" * 32}, "safetensors files cannot be encrypted"),
    ({"format": "ckpt", "enc_mode": "AES-CBC"}, "enc_mode = AES-CBC"),
    ({"format": "ckpt", "key": b"k" * 16, "enc_mode": "DES"}, "DES"),
    ({"format": "zip"}, "format='zip': use 'native', 'ckpt', 'safetensors'"),
])
def test_bad_format_options(tmp_path, kwargs, match):
    with pytest.raises(savepoint.InvalidArgumentError, match=match):
        savepoint.CheckpointManager(tmp_path, **kwargs)
