"""savepoint.convert: one checkpoint format into another (the C++ Convert, GIL released)."""

from __future__ import annotations

import os

from . import _core, _keys
from ._errors import InvalidArgumentError
from ._types import Key, Stats, StrPath

_FORMATS = ("native", "safetensors", "ckpt", "dcp", "recis")


def convert(src: StrPath, dst: StrPath, *, from_: str | None = None, to: str | None = None,
            overwrite: bool = False, source_key: Key | None = None,
            source_cipher: str | None = None, key: Key | None = None, cipher: str = "AES-GCM",
            file_checksum: bool = False, mindspore_flavour: bool = False,
            io_threads: int = 4) -> Stats:  # fmt: skip
    """Converts the checkpoint at `src` into `dst`: a savepoint checkpoint directory, a
    safetensors file or a MindSpore .ckpt file, any way; PyTorch DCP and RecIS directories as
    sources. Formats come from the paths (".safetensors", ".ckpt", else a directory; a source
    directory holding DCP's `.metadata` or RecIS's `index` is one of those) unless named by
    `from_` / `to` ("native", "safetensors", "ckpt", "dcp", "recis"). The target is committed
    atomically; without `overwrite` an existing one fails (AlreadyExistsError) before the source
    is read. `source_key` / `source_cipher` read an encrypted source (native or .ckpt), `key` /
    `cipher` encrypt the target (native: AES-256-GCM; .ckpt: "AES-GCM", "AES-CBC" or
    "SM4-CBC"); `file_checksum` writes MindSpore's CRC (a .ckpt trailer or a safetensors
    crc_num) and `mindspore_flavour` MindSpore's safetensors flavour. Returns {"from", "to",
    "tensors", "values", "tables", "table_rows", "tensor_bytes", "notes"}."""
    for name, value in (("from_", from_), ("to", to)):
        if value is not None and value not in _FORMATS:
            raise InvalidArgumentError(
                f"savepoint.convert: {name}={value!r}: one of {', '.join(_FORMATS)}")
    return _core.convert(os.fspath(src), os.fspath(dst), from_=from_, to=to, overwrite=overwrite,
                         source_key=_keys.normalize(source_key, "savepoint.convert: source_key"),
                         source_cipher=source_cipher,
                         key=_keys.normalize(key, "savepoint.convert: key"), cipher=cipher,
                         file_checksum=file_checksum, mindspore_flavour=mindspore_flavour,
                         io_threads=io_threads)  # fmt: skip
