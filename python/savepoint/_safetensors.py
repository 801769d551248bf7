"""safetensors files (the Hugging Face weight format) through the C++ reader and writer.

A safetensors file holds flat named tensors plus a string -> string `__metadata__` map, so a nested
object is flattened with the same dotted names as savepoint.save ("model.layer1.weight") and
loads back as a flat dict. Files interoperate with `safetensors.torch.save_file` / `load_file`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import _core, _dtypes, _errors, _tree
from ._types import Names, Stats, StrPath


_FRAMEWORKS = ("pt", "torch", "numpy", "np")


def save_safetensors(obj: Any, path: StrPath, *, metadata: dict[str, Any] | None = None,
                     overwrite: bool = False, create_parents: bool = True,
                     io_threads: int = 4) -> Stats:  # fmt: skip
    """Writes `obj` as one safetensors file at `path` (atomically: temporary file, fsync, rename).

    obj: a flat or nested dict (lists, tuples) of torch tensors / numpy arrays, as savepoint.save;
        nested keys are joined with ".". Scalars (int, float, str, ...) are kept in the
        `__metadata__` entry "savepoint.values" (other readers ignore it). complex128 cannot be
        stored (InvalidArgumentError).
    metadata: optional dict with str keys; str values are stored 1:1 in `__metadata__` (visible to
        every safetensors reader), other JSON-able values under the key "savepoint.metadata".
    overwrite: replace an existing file. Default False: AlreadyExistsError.

    Returns a dict of statistics (bytes, seconds, ...).
    """
    flat = _tree.Flattener()
    flat.flatten(obj)
    meta_json = ""
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(type(k) is str for k in metadata):
            raise TypeError("savepoint.save_safetensors: metadata must be a dict with str keys")
        try:
            meta_json = json.dumps(metadata, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            msg = f"savepoint.save_safetensors: metadata is not JSON-serialisable: {e}"
            raise TypeError(msg) from None
    specs = [t.spec() for t in flat.tensors]
    return _core.save_safetensors(os.fspath(path), specs, flat.values, meta_json,
                                  overwrite=overwrite, create_parents=create_parents,
                                  io_threads=io_threads)  # fmt: skip


class SafetensorsDict(dict):
    """The tensors of a safetensors file: a dict name -> tensor, with every dict method intact
    (`.values()`, `.items()`, ...), plus two attributes that shadow none of them:

    metadata: the file's `__metadata__` decoded (a dict), or None when it is empty;
    scalars: the scalars saved by save_safetensors (name -> value); {} when there are none.

    (Earlier versions kept the scalars in an attribute `values`, which hid dict.values(); they
    are in `scalars` now.)"""

    __slots__ = ("metadata", "scalars")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.metadata = None
        self.scalars = {}

    def __reduce__(self):  # pickles and copies keep the attributes
        return (_rebuild_safetensors_dict, (dict(self), self.metadata, self.scalars))

    def copy(self):
        return _rebuild_safetensors_dict(dict(self), self.metadata, dict(self.scalars))


def _rebuild_safetensors_dict(items, metadata, scalars):
    out = SafetensorsDict(items)
    out.metadata, out.scalars = metadata, scalars
    return out


def load_safetensors(path: StrPath, *, names: Names | None = None, mmap: bool = False,
                     framework: str = "pt") -> SafetensorsDict:
    """Loads a safetensors file as a flat dict name -> torch tensor (framework="numpy": arrays).

    names: optional list of tensor names or glob patterns to load; one that matches nothing raises
        NotFoundError. Default: every tensor.
    mmap: map the file copy-on-write instead of reading it (tensors are writable; writes stay
        private). The header is validated either way; a hostile or truncated file raises
        CorruptCheckpointError. A file with MindSpore's CRC-32 ("crc_num" in its metadata,
        docs/INTEROP.md) has it verified (every tensor is then read; CorruptCheckpointError on a
        mismatch); savepoint.mindspore.load_checkpoint(..., crc_check=False) skips that.

    Returns a SafetensorsDict: a dict name -> tensor, with the file's metadata in `.metadata` and
    scalars saved by save_safetensors in `.scalars`.
    """
    if framework not in _FRAMEWORKS:
        msg = f"savepoint.load_safetensors: framework={framework!r}: use 'pt' or 'numpy'"
        raise _errors.InvalidArgumentError(msg)
    to_torch = framework in ("pt", "torch")
    if to_torch and _dtypes.torch_module() is None:
        raise ImportError("savepoint.load_safetensors: framework='pt' needs torch; pass 'numpy'")
    path = os.fspath(path)
    if isinstance(names, str):
        names = [names]
    tensors, values, meta_json = _core.load_safetensors(path, list(names or []), bool(mmap))
    out = SafetensorsDict()
    for name, dtype, shape, raw in tensors:
        out[name] = _dtypes.view_bytes(raw, dtype, shape, to_torch)
    out.scalars = {name: v for name, _, v in values}
    meta = json.loads(meta_json)
    out.metadata = meta if meta else None
    return out


def safetensors_info(path: StrPath) -> dict[str, Any]:
    """The validated header, without reading tensor data: a dict with file_bytes, header_bytes,
    data_offset, tensors ({name: {"dtype", "shape", "data_offsets"}}), metadata (the raw
    `__metadata__` strings, reserved keys included)."""
    h = _core.inspect_safetensors(os.fspath(path))
    return {
        "path": h["path"],
        "file_bytes": h["file_bytes"],
        "header_bytes": h["header_bytes"],
        "data_offset": h["data_offset"],
        "tensors": {
            n: {"dtype": d, "shape": s, "data_offsets": (b, e)} for n, d, s, b, e in h["tensors"]
        },
        "metadata": dict(h["raw_metadata"]),
    }
