"""Encrypted checkpoints from Python (docs/FORMAT.md §10): key= as bytes, a key file path
(str / os.PathLike) or a provider callable on save / load / verify / info, AsyncCheckpointer and
CheckpointManager; missing, wrong and superfluous keys; mmap refused; tampering; and the format
checked independently of the C++ code (key derivation and manifest MAC with the standard library,
chunk decryption with `cryptography` when it is installed)."""

import hashlib
import hmac
import json
import os
import pathlib
import struct

import numpy as np
import pytest
import torch

import savepoint
from conftest import assert_same

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


def state(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "model": {"w": torch.from_numpy(rng.standard_normal((300, 200)).astype(np.float32)),
                  "b": torch.arange(16, dtype=torch.bfloat16)},
        "zeros": np.zeros(100_000, np.float64),
        "step": 7,
        "rng": b"\x00\x01\xff",
    }  # fmt: skip


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_round_trip_and_keys(tmp_path, compression):
    path = tmp_path / "ck"
    s = state()
    savepoint.save(s, path, key=KEY, compression=compression, chunk_bytes=64 << 10)
    assert_same(savepoint.load(path, key=KEY), s)
    assert_same(savepoint.load(path, key=bytearray(KEY), verify=False), s)
    like = {"model": {"w": torch.zeros(300, 200), "b": torch.zeros(16, dtype=torch.bfloat16)}}
    out = savepoint.load(path, key=KEY, like=like)
    assert out["model"]["w"] is like["model"]["w"] and torch.equal(like["model"]["w"], s["model"]["w"])
    assert savepoint.verify(path, key=KEY)["bytes"] > 0
    # Without the key: listed, not read.
    info = savepoint.info(path)
    assert info["encrypted"] and info["values"]["step"] == 7
    assert savepoint.info(path, key=KEY)["encrypted"]
    with pytest.raises(savepoint.InvalidArgumentError, match="is encrypted: pass LoadOptions::key"):
        savepoint.load(path)
    with pytest.raises(savepoint.InvalidArgumentError, match="is encrypted"):
        savepoint.verify(path)
    with pytest.raises(savepoint.AuthenticationError, match="wrong key"):
        savepoint.load(path, key=OTHER)
    with pytest.raises(savepoint.AuthenticationError, match="wrong key"):
        savepoint.info(path, key=OTHER)
    with pytest.raises(savepoint.InvalidArgumentError, match="cannot be mapped"):
        savepoint.load(path, key=KEY, mmap=True)
    # A key for a checkpoint that is not encrypted.
    savepoint.save(s, tmp_path / "plain")
    assert not savepoint.info(tmp_path / "plain")["encrypted"]
    with pytest.raises(savepoint.InvalidArgumentError, match="is not encrypted"):
        savepoint.load(tmp_path / "plain", key=KEY)


def test_key_file_and_provider(tmp_path):
    key_file = tmp_path / "ckpt.key"
    key_file.write_bytes(KEY)
    s = state(1)
    savepoint.save(s, tmp_path / "a", key=str(key_file))
    assert_same(savepoint.load(tmp_path / "a", key=KEY), s)  # the same key as bytes
    savepoint.save(s, tmp_path / "b", key=pathlib.Path(key_file))
    assert_same(savepoint.load(tmp_path / "b", key=key_file), s)
    with pytest.raises(savepoint.NotFoundError, match="key file"):
        savepoint.load(tmp_path / "b", key=str(tmp_path / "missing.key"))

    calls = []

    def provider():
        calls.append(1)
        return KEY

    savepoint.save(s, tmp_path / "c", key=provider)
    assert len(calls) == 1
    assert_same(savepoint.load(tmp_path / "c", key=provider), s)
    assert len(calls) == 2, "asked once per load"
    savepoint.verify(tmp_path / "c", key=provider)
    assert len(calls) == 3


def test_key_errors(tmp_path):
    s = state(2)

    def failing():
        raise RuntimeError("kms down")

    with pytest.raises(savepoint.InvalidArgumentError, match="kms down"):
        savepoint.save(s, tmp_path / "a", key=failing)
    with pytest.raises(savepoint.InvalidArgumentError, match="other than bytes"):
        savepoint.save(s, tmp_path / "a", key=lambda: "not bytes")
    with pytest.raises(savepoint.InvalidArgumentError, match="16 to 64 bytes") as e:
        savepoint.save(s, tmp_path / "a", key=b"SECRET-short")
    assert "SECRET" not in str(e.value), "the key must not appear in errors"
    with pytest.raises(TypeError, match="key"):
        savepoint.save(s, tmp_path / "a", key=12345)
    assert not (tmp_path / "a").exists()


def test_async(tmp_path):
    s = state(3)
    savepoint.save(s, tmp_path / "a", async_=True, key=KEY).wait()
    assert_same(savepoint.load(tmp_path / "a", key=KEY), s)
    with savepoint.AsyncCheckpointer(slab_bytes=64 << 10, key=KEY) as c:
        c.save(s, tmp_path / "b").result()
        c.save(s, tmp_path / "c", key=OTHER, compression="lz4").result()  # per-save key
    assert_same(savepoint.load(tmp_path / "b", key=KEY), s)
    assert_same(savepoint.load(tmp_path / "c", key=OTHER), s)


def test_manager(tmp_path):
    s = state(4)
    with savepoint.CheckpointManager(tmp_path / "run", key=KEY, async_=True) as m:
        m.save(1, s, force=True)
        m.save(2, s, force=True)
        assert_same(m.restore(), s)
        model = torch.nn.Linear(4, 3)
        m.register("model", model)
        m.save_registered(3, force=True)
        weight = model.weight.detach().clone()
        with torch.no_grad():
            model.weight.zero_()
        m.restore_registered()
        assert torch.equal(model.weight, weight)
    with savepoint.CheckpointManager(tmp_path / "run") as plain:
        with pytest.raises(savepoint.InvalidArgumentError, match="is encrypted"):
            plain.restore()


def test_tampering_is_detected(tmp_path):
    path = tmp_path / "ck"
    savepoint.save(state(5), path, key=KEY, chunk_bytes=64 << 10)
    data = path / "data-00000-00000.spd"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(savepoint.CorruptCheckpointError, match="CRC32C mismatch"):
        savepoint.load(path, key=KEY)
    with pytest.raises(savepoint.AuthenticationError, match=r'tensor "[^"]+" chunk \d+'):
        savepoint.load(path, key=KEY, verify=False)


# --- The format, independently of the C++ code (docs/FORMAT.md §10). ---


def hkdf(ikm, salt, info, n):
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < n:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:n]


def saved(tmp_path):
    path = tmp_path / "ck"
    s = state(6)
    savepoint.save(s, path, key=KEY)
    return path, s


def test_key_check_and_manifest_mac_match_the_specification(tmp_path):
    path, _ = saved(tmp_path)
    blob = (path / "MANIFEST").read_bytes()
    header, body = blob[:64], blob[64:]
    flags = struct.unpack_from("<I", header, 36)[0]
    assert flags == 1
    manifest = json.loads(body)
    enc = manifest["encryption"]
    assert "encryption" in manifest["required_features"]
    assert enc["cipher"] == "AES-256-GCM" and enc["kdf"] == "HKDF-SHA256"
    salt = bytes.fromhex(enc["salt"])
    assert hkdf(KEY, salt, b"savepoint/1 key check", 16).hex() == enc["key_check"]
    mac_key = hkdf(KEY, salt, b"savepoint/1 manifest mac key", 32)
    assert hmac.new(mac_key, header[:40] + body, hashlib.sha256).digest()[:20] == header[40:60]


def test_chunks_decrypt_as_specified(tmp_path):
    aead = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead")
    path, s = saved(tmp_path)
    manifest = json.loads((path / "MANIFEST").read_bytes()[64:])
    salt = bytes.fromhex(manifest["encryption"]["salt"])
    chunk_key = hkdf(KEY, salt, b"savepoint/1 chunk key", 32)
    tensor = next(t for t in manifest["tensors"] if t["name"] == "model.w")
    shard = tensor["shards"][0]
    chunk = 0
    raw = min(manifest["chunk_bytes"], shard["bytes"])
    offset = shard["offset"]
    ciphertext = (path / manifest["files"][shard["file"]]["name"]).read_bytes()[offset : offset + raw]
    cid = int(manifest["checkpoint_id"], 16)
    name = tensor["name"].encode()
    aad = (b"SVPTCHNK" + struct.pack("<QIQQQQB", cid, shard["file"], offset, chunk, raw, raw, 0)
           + struct.pack("<I", len(shard["offsets"]))
           + b"".join(struct.pack("<Q", o) for o in shard["offsets"])
           + struct.pack("<I", len(name)) + name)  # fmt: skip
    nonce = struct.pack("<IQ", shard["file"], offset)
    tag = bytes.fromhex(shard["tags"][chunk])
    plain = aead.AESGCM(chunk_key).decrypt(nonce, ciphertext + tag, aad)
    assert plain == s["model"]["w"].numpy().tobytes()[:raw]
