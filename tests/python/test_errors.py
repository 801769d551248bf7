"""Bad input and faults from Python: unsupported objects raise TypeError naming the key path (and
write nothing); C++ errors arrive as typed exceptions with the C++ message; corrupt or truncated
checkpoints raise CorruptCheckpointError naming tensor and chunk."""

import collections
import os
import warnings

import numpy as np
import pytest
import torch

import savepoint


class Opaque:
    pass


def _complex32():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
        return torch.zeros(2, dtype=torch.complex32)


UNSUPPORTED = [
    ({"a": {"b": Opaque()}}, r"object of type .*Opaque at obj\['a'\]\['b'\]"),
    ({"x": [1, np.array([object()], dtype=object)]}, r"dtype=object\) at obj\['x'\]\[1\]"),
    ({"be": np.arange(3, dtype=">f4")}, r"dtype >f4 at obj\['be'\]: convert to native byte order"),
    ({"s": np.array(["abc"])}, r"numpy array of dtype <U3 at obj\['s'\]"),
    ({"m": torch.empty(3, device="meta")}, r"meta device at obj\['m'\]"),
    ({"sp": torch.eye(3).to_sparse()}, r"sparse_coo / quantized tensor at obj\['sp'\]"),
    ({"c32": _complex32()}, r"dtype torch.complex32 at obj\['c32'\]"),
    ({"nt": collections.namedtuple("P", "x y")(1, 2)}, r"object of type .*P at obj\['nt'\]"),
    ({"dd": collections.defaultdict(int)}, r"defaultdict at obj\['dd'\]"),
    ({"set": {1, 2}}, r"object of type builtins.set at obj\['set'\]"),
    ({"k": {(1, 2): 3}}, r"dict key of type tuple \(\(1, 2\)\) at obj\['k'\]"),
    ({"k": {1.5: 3}}, r"dict key of type float"),
    ({"u": "\ud800"}, r"str that is not valid Unicode at obj\['u'\]"),
    ({"c": 1 + 2j}, r"object of type builtins.complex at obj\['c'\]"),
    ({"f": lambda: 0}, r"object of type builtins.function at obj\['f'\]"),
    ({"ba": bytearray(b"x")}, r"object of type builtins.bytearray"),
    ({"sub": torch.Tensor._make_subclass(type("Sub", (torch.Tensor,), {}), torch.ones(1))},
     r"tensor subclass Sub at obj\['sub'\]"),
]  # fmt: skip


@pytest.mark.parametrize("obj,match", UNSUPPORTED, ids=lambda v: "" if isinstance(v, str) else None)
def test_unsupported_objects_raise_type_error_and_write_nothing(tmp_path, obj, match):
    for async_ in (False, True):
        with pytest.raises(TypeError, match=match):
            savepoint.save(obj, tmp_path / "c", async_=async_)
        assert not os.path.exists(tmp_path / "c") and os.listdir(tmp_path) == []


def test_exception_hierarchy_and_codes():
    pairs = [
        (savepoint.InvalidArgumentError, ValueError), (savepoint.NotFoundError, FileNotFoundError),
        (savepoint.AlreadyExistsError, FileExistsError), (savepoint.SavepointIOError, OSError),
        (savepoint.NoSpaceError, savepoint.SavepointIOError),
        (savepoint.UnimplementedError, NotImplementedError),
        (savepoint.PermissionDeniedError, PermissionError),
    ]  # fmt: skip
    for cls, base in pairs:
        assert issubclass(cls, savepoint.SavepointError) and issubclass(cls, base)
    assert savepoint.InvalidConfigError is savepoint.InvalidArgumentError
    assert issubclass(savepoint.CorruptCheckpointError, savepoint.SavepointError)
    assert savepoint.CorruptCheckpointError.code == "corruption"
    assert set(savepoint._core.STATUS_CODES) >= {"corruption", "not found", "invalid argument"}


def test_cpp_errors_keep_their_messages(tmp_path):
    with pytest.raises(savepoint.NotFoundError, match=r"/nope: not a committed checkpoint \(no MANIFEST\)"):
        savepoint.load(tmp_path / "nope")
    with pytest.raises(savepoint.InvalidArgumentError, match=r"IoOptions.io_threads = 0: must be in \[1, 64\]"):
        savepoint.load(tmp_path / "nope", io_threads=0)
    with pytest.raises(savepoint.InvalidArgumentError, match="chunk_bytes"):
        savepoint.save({"t": torch.ones(1)}, tmp_path / "c", chunk_bytes=1000)
    for bad in ("gzip", {"codec": "zstd", "shuffle": "sideways"}, {"level": 3, "speed": 1}, 3):
        with pytest.raises(ValueError, match="compression="):
            savepoint.save({"t": torch.ones(1)}, tmp_path / "c", compression=bad)
    with pytest.raises(savepoint.InvalidArgumentError, match="level"):
        savepoint.save({"t": torch.ones(1)}, tmp_path / "c", compression={"codec": "zstd", "level": 99})
    (tmp_path / "file").write_text("x")
    with pytest.raises(savepoint.SavepointError):
        savepoint.save({"t": torch.ones(1)}, tmp_path / "file" / "c")
    assert not os.path.exists(tmp_path / "c")


def _single_tensor_checkpoint(path, n=3 << 20):
    """A checkpoint with one F32 tensor "w" of n bytes (several 1 MiB chunks); returns its data file."""
    savepoint.save({"w": torch.arange(n // 4, dtype=torch.float32)}, path, chunk_bytes=1 << 20)
    (data,) = [f for f in os.listdir(path) if f.endswith(".spd")]
    return os.path.join(path, data)


@pytest.mark.parametrize("mmap", [False, True])
def test_bit_flip_names_tensor_and_chunk(tmp_path, mmap):
    data = _single_tensor_checkpoint(tmp_path / "c")
    with open(data, "r+b") as f:  # data starts at 4096; chunk 2 covers [2 MiB, 3 MiB) of it
        f.seek(4096 + (2 << 20) + 123)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(savepoint.CorruptCheckpointError, match=r'tensor "w" chunk 2 .*CRC32C mismatch'):
        savepoint.load(tmp_path / "c", mmap=mmap)
    with pytest.raises(savepoint.CorruptCheckpointError, match=r'tensor "w" chunk 2'):
        savepoint.verify(tmp_path / "c")
    # Without verification the bytes load (the caller asked for it).
    back = savepoint.load(tmp_path / "c", verify=False, mmap=mmap)
    assert back["w"].shape == ((3 << 20) // 4,)


@pytest.mark.parametrize("mmap", [False, True])
def test_truncated_data_file_names_tensor_and_chunk(tmp_path, mmap):
    data = _single_tensor_checkpoint(tmp_path / "c")
    os.truncate(data, 4096 + (1 << 20) + 5)  # chunk 1 is cut short
    with pytest.raises(savepoint.CorruptCheckpointError, match=r'truncated.*tensor "w" chunk 1'):
        savepoint.load(tmp_path / "c", mmap=mmap)


def test_corrupt_manifest(tmp_path):
    _single_tensor_checkpoint(tmp_path / "c", n=4096)
    manifest = tmp_path / "c" / "MANIFEST"
    raw = bytearray(manifest.read_bytes())
    raw[80] ^= 0x01
    manifest.write_bytes(bytes(raw))
    with pytest.raises(savepoint.CorruptCheckpointError, match="MANIFEST"):
        savepoint.load(tmp_path / "c")
    with pytest.raises(savepoint.CorruptCheckpointError):
        savepoint.info(tmp_path / "c")


def test_structure_naming_missing_tensor_is_corruption(tmp_path):
    import json

    tree = {"version": 1, "root": {"dict": [["w", {"torch": "w"}]]}}
    savepoint._core.save(str(tmp_path / "c"), [], [], json.dumps({"savepoint.python": tree}),
                         overwrite=False, create_parents=True, direct_io=True, io_threads=1,
                         chunk_bytes=1 << 20)  # fmt: skip
    with pytest.raises(savepoint.CorruptCheckpointError, match="names tensor 'w', which is missing"):
        savepoint.load(tmp_path / "c")
    tree["version"] = 99
    savepoint._core.save(str(tmp_path / "d"), [], [], json.dumps({"savepoint.python": tree}),
                         overwrite=False, create_parents=True, direct_io=True, io_threads=1,
                         chunk_bytes=1 << 20)  # fmt: skip
    with pytest.raises(savepoint.UnimplementedError, match="structure version 99"):
        savepoint.load(tmp_path / "d")


def test_cpp_written_checkpoint_loads_flat(tmp_path):
    """A checkpoint without the Python structure (C++ API, CLI) loads as {name: array or value}."""
    a = np.arange(6, dtype=np.int32)
    savepoint._core.save(str(tmp_path / "c"), [("layer.w", a.__array_interface__["data"][0], "I32", [2, 3])],
                         [("step", "int", 5), ("cfg", "json", '{"k": [1]}')], "", overwrite=False,
                         create_parents=True, direct_io=True, io_threads=1, chunk_bytes=1 << 20)  # fmt: skip
    back = savepoint.load(tmp_path / "c")
    assert list(back) == ["cfg", "layer.w", "step"]
    assert (back["layer.w"] == a.reshape(2, 3)).all() and back["step"] == 5 and back["cfg"] == {"k": [1]}
