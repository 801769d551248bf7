"""Encrypted MindSpore .ckpt files against the real MindSpore (2.10, CPU), both directions: AES-GCM
with 16/24/32-byte keys, AES-CBC, SM4-CBC, files of several 64 MiB blocks, CRC with encryption,
and tampering (which MindSpore's CBC modes cannot see and savepoint's MAC sidecar can)."""
import os
import subprocess

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from savepoint import AuthenticationError
from savepoint import mindspore as spms

ms.set_context(device_target="CPU")
CLI = os.environ["SAVEPOINT_CLI"]
MODES = [("AES-GCM", 16), ("AES-GCM", 24), ("AES-GCM", 32), ("AES-CBC", 16), ("AES-CBC", 32),
         ("SM4-CBC", 16)]  # fmt: skip


def key(n, seed=1):
    return bytes((seed * 31 + 7 * i) % 256 for i in range(n))


def corpus(seed):
    rng = np.random.default_rng(seed)
    arrays = {"w": rng.standard_normal((64, 33)).astype(np.float32),
              "h": rng.standard_normal(17).astype(np.float16),
              "b": (rng.standard_normal((3, 5)) * 9).astype(np.float32).astype(ms.dtype_to_nptype(ms.bfloat16)),
              "ids": np.arange(11, dtype=np.int64), "beta": np.float32(0.9)}  # fmt: skip
    return arrays


def ms_items(arrays):
    out = []
    for k, v in arrays.items():
        t = Tensor(v, ms.bfloat16) if k == "b" else Tensor(v)
        out.append({"name": k, "data": Parameter(t, name=k)})
    return out


def same(ours, theirs):
    assert set(ours) == set(theirs)
    for name, v in theirs.items():
        if isinstance(v, str):
            assert ours[name] == v, name
        else:
            assert ours[name].shape == tuple(v.shape), name
            assert ours[name].tobytes() == v.asnumpy().tobytes(), name


@pytest.mark.parametrize("mode,size", MODES)
def test_mindspore_writes_we_read(tmp_path, mode, size):
    src = tmp_path / "ms.ckpt"
    ms.save_checkpoint(ms_items(corpus(1)), str(src), enc_key=key(size), enc_mode=mode,
                       append_dict={"epoch_num": 3, "note": "héllo"})  # fmt: skip
    theirs = ms.load_checkpoint(str(src), dec_key=key(size), dec_mode=mode)
    same(spms.load_checkpoint(src, dec_key=key(size), dec_mode=mode), theirs)
    info = spms.checkpoint_info(src, dec_key=key(size))
    assert info["cipher"] == mode and info["cipher_blocks"] == 1 and "w" in info["entries"]
    with pytest.raises(AuthenticationError):
        spms.load_checkpoint(src, dec_key=key(size, seed=2), dec_mode=mode)


@pytest.mark.parametrize("mode,size", MODES)
@pytest.mark.parametrize("crc", [False, True])
def test_we_write_mindspore_reads(tmp_path, mode, size, crc):
    arrays = corpus(2)
    out = tmp_path / "ours.ckpt"
    spms.save_checkpoint(arrays, out, enc_key=key(size), enc_mode=mode, crc_check=crc,
                         append_dict={"step_num": 9, "tag": "x"})  # fmt: skip
    back = ms.load_checkpoint(str(out), dec_key=key(size), dec_mode=mode, crc_check=crc)
    for k, v in arrays.items():
        assert back[k].asnumpy().tobytes() == np.asarray(v).tobytes(), k
    assert int(back["step_num"].asnumpy()) == 9 and back["tag"] == "x"
    assert (tmp_path / "ours.ckpt.mac").exists() == (mode != "AES-GCM")


def test_several_blocks_both_ways_through_the_cli(tmp_path):
    big = np.arange(70 * 1024 * 1024 // 4, dtype=np.int32).reshape(-1, 1024)  # two 64 MiB blocks
    src = tmp_path / "ms.ckpt"
    ms.save_checkpoint([{"name": "big", "data": Parameter(Tensor(big), name="big")}], str(src),
                       enc_key=key(32), enc_mode="AES-GCM")  # fmt: skip
    (tmp_path / "k").write_bytes(key(32))
    plain, again = tmp_path / "plain.ckpt", tmp_path / "again.ckpt"
    r = subprocess.run([CLI, "convert", str(src), str(plain), "--dec-key-file", str(tmp_path / "k")],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert np.array_equal(ms.load_checkpoint(str(plain))["big"].asnumpy(), big)
    r = subprocess.run([CLI, "convert", str(plain), str(again), "--enc-key-file", str(tmp_path / "k"),
                        "--enc-mode", "AES-CBC", "--crc"], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    back = ms.load_checkpoint(str(again), dec_key=key(32), dec_mode="AES-CBC", crc_check=True)
    assert np.array_equal(back["big"].asnumpy(), big)
    r = subprocess.run([CLI, "inspect", str(again), "--json", "--dec-key-file", str(tmp_path / "k")],
                       capture_output=True, text=True)  # fmt: skip
    assert '"blocks":2' in r.stdout and "HMAC-SHA256 sidecar" in r.stdout, r.stdout


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def test_cbc_tampering_mindspore_misses_and_savepoint_catches(tmp_path):
    arrays = {"w": np.arange(4096, dtype=np.float32)}
    out = tmp_path / "ours.ckpt"
    spms.save_checkpoint(arrays, out, enc_key=key(16), enc_mode="AES-CBC")
    flip(out, 32 + 8000)  # a ciphertext byte inside the tensor
    changed = ms.load_checkpoint(str(out), dec_key=key(16), dec_mode="AES-CBC")["w"].asnumpy()
    assert not np.array_equal(changed, arrays["w"])  # MindSpore: wrong values, no error
    with pytest.raises(AuthenticationError, match="HMAC-SHA256 does not match"):
        spms.load_checkpoint(out, dec_key=key(16), dec_mode="AES-CBC")


def test_gcm_tampering_is_caught_in_mindspores_files(tmp_path):
    src = tmp_path / "ms.ckpt"
    ms.save_checkpoint(ms_items(corpus(4)), str(src), enc_key=key(16))
    flip(src, 48 + 4000)
    with pytest.raises(AuthenticationError, match="encrypted block 0 of 1"):
        spms.load_checkpoint(src, dec_key=key(16))


def test_mindspores_encrypted_crc_file_loads_here(tmp_path):
    # MindSpore 2.10 writes crc 0 after the blocks when asked for both (and cannot load the file).
    src = tmp_path / "ms.ckpt"
    ms.save_checkpoint(ms_items(corpus(5)), str(src), enc_key=key(32), crc_check=True)
    info = spms.checkpoint_info(src, dec_key=key(32))
    assert info["cipher"] == "AES-GCM"
    ours = spms.load_checkpoint(src, dec_key=key(32))
    assert ours["w"].tobytes() == corpus(5)["w"].tobytes()
