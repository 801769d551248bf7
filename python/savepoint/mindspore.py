"""MindSpore checkpoint files (.ckpt) with MindSpore's argument names, through savepoint's C++ core:
no MindSpore installation needed, tensors written and read in parallel with the GIL released.

    from savepoint import mindspore as spms
    spms.save_checkpoint({"w": np.ones((2, 3), np.float32)}, "net.ckpt", append_dict={"epoch_num": 3})
    params = spms.load_checkpoint("net.ckpt")          # {"w": array, "epoch_num": array(3)}

Files written here load in MindSpore's `mindspore.load_checkpoint`, and files MindSpore writes load
here, bit for bit (tests/mindspore/). Encryption (enc_key / dec_key) is not supported yet and
raises UnimplementedError rather than writing or reading plaintext.
"""

import os

import numpy as np

from . import _core, _dtypes, _errors, _tree

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_info"]

_FRAMEWORKS = ("np", "numpy", "pt", "torch")


def _no_encryption(what, key):
    if key is not None:
        raise _errors.UnimplementedError(
            f"savepoint.mindspore.{what}: encrypted checkpoints are not supported yet")


def _as_array(name, data):
    if hasattr(data, "asnumpy"):  # a MindSpore Tensor or Parameter
        return data.asnumpy()
    if isinstance(data, (bool, int, float, str, np.ndarray, np.generic)):
        return data
    torch = _dtypes.torch_module()
    if torch is not None and isinstance(data, torch.Tensor):
        return data
    raise TypeError(f"savepoint.mindspore.save_checkpoint: {name!r}: unsupported data of type "
                    f"{type(data).__name__}")  # fmt: skip


def _entries(save_obj):
    if isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, (list, tuple)):
        items = []
        for i, item in enumerate(save_obj):
            if not isinstance(item, dict) or set(item) != {"name", "data"}:
                raise TypeError(f"savepoint.mindspore.save_checkpoint: save_obj[{i}] is not a dict "
                                f"with keys 'name' and 'data'")  # fmt: skip
            items.append((item["name"], item["data"]))
    else:
        raise TypeError("savepoint.mindspore.save_checkpoint: save_obj must be a dict or a list of "
                        "{'name': ..., 'data': ...}")  # fmt: skip
    out = {}
    for name, data in items:
        if not isinstance(name, str) or not name:
            raise TypeError(f"savepoint.mindspore.save_checkpoint: name {name!r} is not a string")
        out[name] = _as_array(name, data)
    return out


def _append_value(name, v):
    """MindSpore's append_info types: int -> Int64, float -> Float32, bool -> Bool, str -> str."""
    if isinstance(v, bool):
        return np.asarray(v, np.bool_)
    if isinstance(v, int):
        return np.asarray(v, np.int64)
    if isinstance(v, float):
        return np.asarray(v, np.float32)
    if isinstance(v, str):
        return v
    raise TypeError(f"savepoint.mindspore.save_checkpoint: append_dict[{name!r}] must be an int, "
                    f"float, bool or str, not {type(v).__name__}")  # fmt: skip


def save_checkpoint(save_obj, ckpt_file_name, *, append_dict=None, enc_key=None,
                    enc_mode="AES-GCM", crc_check=False, format="ckpt", overwrite=True,
                    io_threads=4):  # fmt: skip
    """Writes a MindSpore .ckpt file, as mindspore.save_checkpoint does.

    save_obj: a dict name -> data, or a list of {"name": ..., "data": ...}; data is a numpy array,
        a torch tensor, a MindSpore Tensor/Parameter (via asnumpy()) or a Python scalar (int ->
        Int64, float -> Float64, bool -> Bool, str -> a string entry).
    append_dict: extra entries with MindSpore's types (int -> Int64, float -> Float32, bool, str).
    crc_check: append MindSpore's CRC-32 trailer.
    overwrite: replace an existing file (MindSpore always does; default True).
    Writes atomically (temporary file, fsync, rename). Returns the save statistics.
    """
    _no_encryption("save_checkpoint", enc_key)
    del enc_mode
    if format != "ckpt":
        raise _errors.UnimplementedError(
            f"savepoint.mindspore.save_checkpoint: format={format!r}: only 'ckpt' is supported yet")
    entries = _entries(save_obj)
    for name, v in (append_dict or {}).items():
        if name in entries:
            raise ValueError(f"savepoint.mindspore.save_checkpoint: append_dict[{name!r}] repeats "
                             f"an entry of save_obj")  # fmt: skip
        entries[name] = _append_value(name, v)
    flat = _tree.Flattener()
    flat.flatten(entries)
    specs = [t.spec() for t in flat.tensors]
    return _core.save_mindspore(os.fspath(ckpt_file_name), specs, flat.values, "",
                                overwrite=bool(overwrite), crc_check=bool(crc_check),
                                io_threads=io_threads)  # fmt: skip


def load_checkpoint(ckpt_file_name, *, dec_key=None, dec_mode="AES-GCM", crc_check=None,
                    format="ckpt", names=None, framework="np", io_threads=4):  # fmt: skip
    """Reads a MindSpore .ckpt file as a dict name -> numpy array (framework="pt": torch tensors);
    scalars are 0-d arrays and string entries str, as mindspore.load_checkpoint keeps them.

    crc_check: None (default) verifies the CRC-32 trailer when the file has one; True also
        requires one (CorruptCheckpointError without it); False skips the check.
    names: entry names or glob patterns to load (default: all); one matching nothing raises
        NotFoundError. A hash map comes back as "<name>.keys", "<name>.values", "<name>.status";
        Int4 tensors as int8.
    """
    _no_encryption("load_checkpoint", dec_key)
    del dec_mode
    if format != "ckpt":
        raise _errors.UnimplementedError(
            f"savepoint.mindspore.load_checkpoint: format={format!r}: only 'ckpt' is supported yet")
    if framework not in _FRAMEWORKS:
        raise ValueError(f"savepoint.mindspore.load_checkpoint: framework={framework!r}: use 'np' "
                         f"or 'pt'")  # fmt: skip
    path = os.fspath(ckpt_file_name)
    if crc_check is True and not checkpoint_info(path)["has_crc"]:
        raise _errors.CorruptCheckpointError(
            f"savepoint.mindspore.load_checkpoint: {path} has no CRC trailer (crc_check=True)")
    if isinstance(names, str):
        names = [names]
    tensors, values, _ = _core.load_mindspore(path, list(names or []), crc_check is not False,
                                              io_threads)  # fmt: skip
    to_torch = framework in ("pt", "torch")
    out = {name: _dtypes.view_bytes(raw, dtype, shape, to_torch) for name, dtype, shape, raw in tensors}
    out.update({name: v for name, _, v in values})
    return out


def checkpoint_info(ckpt_file_name):
    """The entries of a .ckpt file without reading tensor bytes: a dict with file_bytes, has_crc,
    stored_crc and entries ({name: {"type", "shape", "bytes", "pieces"}}; "type" is MindSpore's
    name, "map" for a hash map)."""
    h = _core.inspect_mindspore(os.fspath(ckpt_file_name))
    entries = {n: {"type": t, "shape": s, "bytes": b, "pieces": p} for n, t, s, b, p in h["entries"]}
    return {"path": h["path"], "file_bytes": h["file_bytes"], "has_crc": h["has_crc"],
            "stored_crc": h["stored_crc"], "entries": entries}  # fmt: skip
