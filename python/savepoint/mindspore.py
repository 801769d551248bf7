"""MindSpore checkpoint files (.ckpt) with MindSpore's argument names, through savepoint's C++ core:
no MindSpore installation needed, tensors written and read in parallel with the GIL released.

    from savepoint import mindspore as spms
    spms.save_checkpoint({"w": np.ones((2, 3), np.float32)}, "net.ckpt", append_dict={"epoch_num": 3})
    params = spms.load_checkpoint("net.ckpt")          # {"w": array, "epoch_num": array(3)}
    spms.save_checkpoint(params, "net.safetensors", format="safetensors", crc_check=True)

format="safetensors" is MindSpore's safetensors flavour: "format": "ms" in the header's
__metadata__ and, with crc_check, MindSpore's CRC-32 "crc_num" there (docs/INTEROP.md).

Files written here load in MindSpore's `mindspore.load_checkpoint`, and files MindSpore writes load
here, bit for bit (tests/mindspore/), encrypted ones too (enc_key / dec_key: AES-GCM with 16, 24
or 32-byte keys, AES-CBC, SM4-CBC; a key is bytes, a key file path or a callable returning bytes).
CBC files also get an HMAC sidecar "<file>.mac" that savepoint checks (MindSpore's CBC files are
unauthenticated).
"""

import os

import numpy as np

from . import _core, _dtypes, _errors, _keys, _tree

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_info", "transform_checkpoints",
           "transform_checkpoint_by_rank", "rank_list_for_transform", "merge_pipeline_strategys",
           "load_distributed", "save_checkpoint_without_redundancy", "export_distributed"]

_FRAMEWORKS = ("np", "numpy", "pt", "torch")


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


# format="safetensors": MindSpore's flavour of safetensors ("format": "ms" in __metadata__, and its
# CRC-32 "crc_num" with crc_check), written and read by savepoint's C++ safetensors code.


def _save_safetensors(entries, path, crc_check, overwrite, io_threads):
    """Every entry is a tensor in a safetensors file, as in MindSpore's: Python scalars become 0-d
    arrays (int -> int64, float -> float64, bool -> bool_); strings cannot be stored."""
    arrays = {}
    for name, v in entries.items():
        if isinstance(v, str):
            raise TypeError(f"savepoint.mindspore.save_checkpoint: {name!r} is a string, which "
                            f"format='safetensors' cannot store (nor can MindSpore)")  # fmt: skip
        if isinstance(v, bool):
            v = np.asarray(v, np.bool_)
        elif isinstance(v, int):
            v = np.asarray(v, np.int64)
        elif isinstance(v, float):
            v = np.asarray(v, np.float64)
        arrays[name] = v
    flat = _tree.Flattener()
    flat.flatten(arrays)
    specs = [t.spec() for t in flat.tensors]
    return _core.save_safetensors(os.fspath(path), specs, flat.values, "",
                                  overwrite=bool(overwrite), create_parents=True,
                                  io_threads=io_threads, mindspore_format=True,
                                  crc_check=bool(crc_check))  # fmt: skip


def _load_safetensors(path, crc_check, names, io_threads):
    """(tensors, values) of a safetensors file, its crc_num checked unless crc_check is False."""
    path = os.fspath(path)
    if crc_check is True and _core.inspect_safetensors(path)["crc_num"] is None:
        raise _errors.CorruptCheckpointError(
            f"savepoint.mindspore.load_checkpoint: {path} has no crc_num (crc_check=True)")
    if isinstance(names, str):
        names = [names]
    tensors, values, _ = _core.load_safetensors(path, list(names or []), False,
                                                crc_check=crc_check is not False,
                                                io_threads=io_threads)  # fmt: skip
    return tensors, values


def _no_cipher_for_safetensors(what, key, mode):
    """MindSpore refuses a key or a mode with format="safetensors" (ValueError): so does this."""
    if key is not None or mode != "AES-GCM":
        raise _errors.InvalidArgumentError(
            f"savepoint.mindspore.{what}: format='safetensors' files are not "
            f"encrypted: leave the key and mode at their defaults")  # fmt: skip


def _check_format(what, format):
    if format not in ("ckpt", "safetensors"):
        raise _errors.InvalidArgumentError(
            f"savepoint.mindspore.{what}: format={format!r}: use 'ckpt' or "
            f"'safetensors'")  # fmt: skip


def save_checkpoint(save_obj, ckpt_file_name, *, append_dict=None, enc_key=None,
                    enc_mode="AES-GCM", crc_check=False, format="ckpt", overwrite=True,
                    io_threads=4):  # fmt: skip
    """Writes a MindSpore .ckpt file, or with format="safetensors" a safetensors file in MindSpore's
    flavour, as mindspore.save_checkpoint does.

    save_obj: a dict name -> data, or a list of {"name": ..., "data": ...}; data is a numpy array,
        a torch tensor, a MindSpore Tensor/Parameter (via asnumpy()) or a Python scalar (int ->
        Int64, float -> Float64, bool -> Bool, str -> a string entry).
    append_dict: extra entries with MindSpore's types (int -> Int64, float -> Float32, bool, str).
    crc_check: append MindSpore's CRC-32 trailer (inside the plaintext when encrypting, so
        MindSpore loads the file with crc_check=True too).
    enc_key: encrypt with this key (bytes, a key file path, or a callable returning bytes);
        enc_mode: "AES-GCM" (default), "AES-CBC" or "SM4-CBC".
    overwrite: replace an existing file (MindSpore always does; default True).
    format: "ckpt" (default) or "safetensors": every entry is then a tensor (Python scalars 0-d
        arrays; a string is a TypeError, as MindSpore cannot store one either), crc_check stores
        MindSpore's "crc_num", and enc_key / enc_mode must stay at their defaults (ValueError).
    Writes atomically (temporary file, fsync, rename). Returns the save statistics.
    """
    _check_format("save_checkpoint", format)
    if format == "safetensors":
        _no_cipher_for_safetensors("save_checkpoint", enc_key, enc_mode)
    enc_key = _keys.normalize(enc_key, "savepoint.mindspore.save_checkpoint: enc_key")
    entries = _entries(save_obj)
    for name, v in (append_dict or {}).items():
        if name in entries:
            raise _errors.InvalidArgumentError(
                f"savepoint.mindspore.save_checkpoint: append_dict[{name!r}] repeats "
                f"an entry of save_obj")  # fmt: skip
        entries[name] = _append_value(name, v)
    if format == "safetensors":
        return _save_safetensors(entries, ckpt_file_name, crc_check, overwrite, io_threads)
    flat = _tree.Flattener()
    flat.flatten(entries)
    specs = [t.spec() for t in flat.tensors]
    return _core.save_mindspore(os.fspath(ckpt_file_name), specs, flat.values, "",
                                overwrite=bool(overwrite), crc_check=bool(crc_check),
                                enc_key=enc_key, enc_mode=str(enc_mode),
                                io_threads=io_threads)  # fmt: skip


def load_checkpoint(ckpt_file_name, *, dec_key=None, dec_mode="AES-GCM", crc_check=None,
                    format="ckpt", names=None, framework="np", io_threads=4):  # fmt: skip
    """Reads a MindSpore .ckpt file (format="safetensors": a safetensors file, MindSpore's flavour
    or any other) as a dict name -> numpy array (framework="pt": torch tensors); scalars are 0-d
    arrays and string entries str, as mindspore.load_checkpoint keeps them.

    crc_check: None (default) verifies the CRC-32 trailer (safetensors: "crc_num") when the file
        has one; True also requires one (CorruptCheckpointError without it; MindSpore only warns);
        False skips the check. A mismatch raises CorruptCheckpointError.
    names: entry names or glob patterns to load (default: all); one matching nothing raises
        NotFoundError. A hash map comes back as "<name>.keys", "<name>.values", "<name>.status";
        Int4 tensors as int8.
    dec_key: the key of an encrypted file (bytes, a key file path, or a callable returning bytes);
        dec_mode: the mode the file must use ("AES-GCM" by default, as in MindSpore). A wrong key
        or a modified file raises AuthenticationError naming the block.
    """
    _check_format("load_checkpoint", format)
    if format == "safetensors":
        _no_cipher_for_safetensors("load_checkpoint", dec_key, dec_mode)
    dec_key = _keys.normalize(dec_key, "savepoint.mindspore.load_checkpoint: dec_key")
    if framework not in _FRAMEWORKS:
        raise _errors.InvalidArgumentError(
            f"savepoint.mindspore.load_checkpoint: framework={framework!r}: use 'np' "
            f"or 'pt'")  # fmt: skip
    if format == "safetensors":
        tensors, values = _load_safetensors(ckpt_file_name, crc_check, names, io_threads)
        return _as_dict(tensors, values, framework)
    path = os.fspath(ckpt_file_name)
    if crc_check is True and callable(dec_key):
        dec_key = _keys.normalize(dec_key(), "savepoint.mindspore.load_checkpoint: dec_key()")
    if crc_check is True and not checkpoint_info(path, dec_key=dec_key)["has_crc"]:
        raise _errors.CorruptCheckpointError(
            f"savepoint.mindspore.load_checkpoint: {path} has no CRC trailer (crc_check=True)")
    if isinstance(names, str):
        names = [names]
    tensors, values, _ = _core.load_mindspore(path, list(names or []), crc_check is not False,
                                              dec_key, str(dec_mode), io_threads)  # fmt: skip
    return _as_dict(tensors, values, framework)


def _as_dict(tensors, values, framework):
    """What load_checkpoint returns, from the core's (tensors, values)."""
    to_torch = framework in ("pt", "torch")
    out = {name: _dtypes.view_bytes(raw, dtype, shape, to_torch) for name, dtype, shape, raw in tensors}
    out.update({name: v for name, _, v in values})
    return out


def checkpoint_info(ckpt_file_name, dec_key=None):
    """The entries of a .ckpt file without reading tensor bytes: a dict with file_bytes, has_crc,
    stored_crc, cipher ("" or the encryption mode), cipher_blocks, authentication and entries
    ({name: {"type", "shape", "bytes", "pieces"}}; "type" is MindSpore's name, "map" for a hash
    map). An encrypted file lists its entries only with dec_key (entries_listed says so)."""
    dec_key = _keys.normalize(dec_key, "savepoint.mindspore.checkpoint_info: dec_key")
    h = _core.inspect_mindspore(os.fspath(ckpt_file_name), dec_key)
    entries = {n: {"type": t, "shape": s, "bytes": b, "pieces": p} for n, t, s, b, p in h["entries"]}
    out = {k: h[k] for k in ("path", "file_bytes", "has_crc", "stored_crc", "cipher",
                             "cipher_blocks", "authentication", "entries_listed")}  # fmt: skip
    out["entries"] = entries
    return out


# --- Distributed checkpoints: MindSpore's mindspore.parallel functions (docs/INTEROP.md). ---

_DEFAULT_BUDGET = 1 << 30


def _opt_path(what, path):
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"savepoint.mindspore: {what} must be a path or None, not "
                        f"{type(path).__name__}")  # fmt: skip
    return os.fspath(path)


def _check_output_format(output_format):
    if output_format not in ("ckpt", "safetensors", "native"):
        raise _errors.InvalidArgumentError(
            f"savepoint.mindspore: output_format={output_format!r}: must be 'ckpt', "
            "'safetensors' or 'native'")  # fmt: skip


def _check_rank(rank_id):
    if isinstance(rank_id, bool) or not isinstance(rank_id, int):
        raise TypeError("savepoint.mindspore: rank_id must be an int")


def transform_checkpoints(src_checkpoints_dir, dst_checkpoints_dir, ckpt_prefix,
                          src_strategy_file=None, dst_strategy_file=None, process_num=1,
                          output_format="ckpt", *, ranks=None,
                          memory_budget_bytes=_DEFAULT_BUDGET, io_threads=None):  # fmt: skip
    """mindspore.parallel.transform_checkpoints: the checkpoint in src_checkpoints_dir/rank_N/
    (the lexicographically last .ckpt of each) saved under src_strategy_file, rewritten for
    dst_strategy_file as dst_checkpoints_dir/rank_N/{ckpt_prefix}N.ckpt (or
    {ckpt_prefix}N_part{stage}.ckpt when the source strategy is one pipeline stage of the
    destination's). A strategy of None means "not split". Reads only the bytes each destination
    rank needs; destination ranks run in parallel within memory_budget_bytes; every file is
    written atomically, and nothing is written when the strategies do not fit the files.
    output_format="safetensors" writes {ckpt_prefix}N.safetensors in MindSpore's flavour (as
    MindSpore's transform of safetensors sources does; MindSpore refuses .ckpt sources there).
    output_format="native" writes each rank as a savepoint checkpoint directory
    {ckpt_prefix}N (CRC32C per chunk; savepoint.load reads it).
    process_num (MindSpore's argument, in its position): how many destination ranks MindSpore
    builds at once in worker processes; savepoint builds them on threads, io_threads of them
    (default: max(4, process_num)) within memory_budget_bytes.
    ranks: the destination ranks to write (default: all).
    """
    _check_output_format(output_format)
    if isinstance(process_num, bool) or not isinstance(process_num, int) or process_num < 1:
        raise _errors.InvalidArgumentError(
            f"savepoint.mindspore.transform_checkpoints: process_num={process_num!r}: "
            "must be a positive int")  # fmt: skip
    if io_threads is None:
        io_threads = max(4, process_num)
    if not isinstance(ckpt_prefix, str):
        raise TypeError("savepoint.mindspore.transform_checkpoints: ckpt_prefix must be a str")
    _core.ms_transform(os.fspath(src_checkpoints_dir), os.fspath(dst_checkpoints_dir), ckpt_prefix,
                       _opt_path("src_strategy_file", src_strategy_file),
                       _opt_path("dst_strategy_file", dst_strategy_file),
                       [int(r) for r in (ranks or [])], int(memory_budget_bytes),
                       int(io_threads), output_format)  # fmt: skip


def transform_checkpoint_by_rank(rank_id, checkpoint_files_map, save_checkpoint_file_name,
                                 src_strategy_file=None, dst_strategy_file=None, *,
                                 memory_budget_bytes=_DEFAULT_BUDGET, io_threads=4,
                                 output_format=None):  # fmt: skip
    """mindspore.parallel.transform_checkpoint_by_rank: destination rank rank_id's checkpoint,
    written to save_checkpoint_file_name (must end in ".ckpt", or ".safetensors" for
    output_format="safetensors"; a checkpoint directory for output_format="native"), from
    checkpoint_files_map {source rank: .ckpt file} (at least the ranks rank_list_for_transform
    lists). output_format None: "safetensors" when the name ends in ".safetensors", else
    "ckpt"."""
    _check_rank(rank_id)
    if not isinstance(checkpoint_files_map, dict):
        raise TypeError("savepoint.mindspore.transform_checkpoint_by_rank: checkpoint_files_map "
                        "must be a dict")  # fmt: skip
    if not isinstance(save_checkpoint_file_name, (str, os.PathLike)):
        raise TypeError("savepoint.mindspore.transform_checkpoint_by_rank: "
                        "save_checkpoint_file_name must be a path")  # fmt: skip
    files = {int(r): os.fspath(p) for r, p in checkpoint_files_map.items()}
    dst_file = os.fspath(save_checkpoint_file_name)
    if output_format is None:
        output_format = "safetensors" if dst_file.endswith(".safetensors") else "ckpt"
    _check_output_format(output_format)
    _core.ms_transform_by_rank(rank_id, files, dst_file,
                               _opt_path("src_strategy_file", src_strategy_file),
                               _opt_path("dst_strategy_file", dst_strategy_file),
                               int(memory_budget_bytes), int(io_threads),
                               output_format)  # fmt: skip


def rank_list_for_transform(rank_id, src_strategy_file=None, dst_strategy_file=None):
    """mindspore.parallel.rank_list_for_transform: the source ranks destination rank rank_id needs,
    in descending order. Lists only the ranks holding bytes it needs (MindSpore often lists all)."""
    _check_rank(rank_id)
    return list(_core.ms_rank_list(rank_id, _opt_path("src_strategy_file", src_strategy_file),
                                   _opt_path("dst_strategy_file", dst_strategy_file)))  # fmt: skip


def merge_pipeline_strategys(src_strategy_dirs, dst_strategy_file):
    """mindspore.parallel.merge_pipeline_strategys: the per-stage strategy files of
    src_strategy_dirs (all .ckpt or all .json) merged into dst_strategy_file, parameters renamed
    "{stage}-{name}"."""
    src = os.fspath(src_strategy_dirs)
    if not os.path.isdir(src):
        raise NotADirectoryError(f"savepoint.mindspore.merge_pipeline_strategys: {src} is not a "
                                 f"directory")  # fmt: skip
    _core.ms_merge_strategies(src, os.fspath(dst_strategy_file))


def strategy_layouts(strategy_file):
    """The resolved layouts of a strategy file: {param: {"dev_matrix", "tensor_map", "stages",
    ...}} (stage prefixes of a merged file removed)."""
    return dict(_core.ms_strategy_layouts(os.fspath(strategy_file)))


# --- Distributed checkpoints without an offline step (docs/INTEROP.md). ---


def _box(name, box):
    if not isinstance(box, (tuple, list)) or len(box) != 3:
        raise TypeError(f"savepoint.mindspore.load_distributed: layout[{name!r}] must be "
                        f"(global_shape, offsets, sizes)")  # fmt: skip
    return tuple([int(d) for d in part] for part in box)


def load_distributed(src_checkpoints_dir, src_strategy_file=None, *, rank_id=None,
                     dst_strategy_file=None, layout=None, framework="np",
                     io_threads=4):  # fmt: skip
    """This rank's part of a MindSpore distributed checkpoint, with no offline transform: the
    checkpoint in src_checkpoints_dir/rank_N/ (the lexicographically last .ckpt of each) saved
    under src_strategy_file (None: not split), read straight into the boxes this rank needs,
    reading only the byte ranges of the source slices that intersect them. Give one of:

    rank_id: destination rank rank_id of dst_strategy_file (None: not split): exactly the entries
        transform_checkpoint_by_rank would write for it (as load_checkpoint returns them);
    layout: {name: (global_shape, offsets, sizes)}: those boxes (any layout, uneven splits too;
        global_shape must be the parameter's full shape); a name of the layout gets its box.

    Returns a dict name -> numpy array (framework="pt": torch tensors)."""
    if (rank_id is None) == (layout is None):
        raise _errors.InvalidArgumentError(
            "savepoint.mindspore.load_distributed: give rank_id or layout")
    if framework not in _FRAMEWORKS:
        raise _errors.InvalidArgumentError(
            f"savepoint.mindspore.load_distributed: framework={framework!r}: use "
            f"'np' or 'pt'")  # fmt: skip
    src_dir = os.fspath(src_checkpoints_dir)
    src = _opt_path("src_strategy_file", src_strategy_file)
    if layout is None:
        _check_rank(rank_id)
        tensors, values, _ = _core.ms_load_distributed_rank(
            src_dir, rank_id, src, _opt_path("dst_strategy_file", dst_strategy_file),
            int(io_threads))  # fmt: skip
    else:
        if dst_strategy_file is not None:
            raise _errors.InvalidArgumentError(
                "savepoint.mindspore.load_distributed: dst_strategy_file goes with "
                "rank_id, not with layout")  # fmt: skip
        boxes = {str(n): _box(n, b) for n, b in dict(layout).items()}
        tensors, values, _ = _core.ms_load_distributed_layout(src_dir, boxes, src, int(io_threads))
    return _as_dict(tensors, values, framework)


def save_checkpoint_without_redundancy(save_obj, ckpt_file_name, strategy_file, rank_id, *,
                                       crc_check=False, overwrite=True,
                                       io_threads=4):  # fmt: skip
    """Writes rank rank_id's .ckpt file as a MindSpore job under strategy_file writes it with
    remove_redundancy=True (CheckpointConfig): of the parameters the strategy lays out on the
    rank's stage only those MindSpore's rule assigns to it (the k-th parameter, by name, of each
    replica group goes to member k % group size), plus every entry without a layout there.

    save_obj: the rank's full local state (every parameter of its stage, as save_checkpoint takes
        it: the assignment counts each one). Returns the save statistics."""
    _check_rank(rank_id)
    flat = _tree.Flattener()
    flat.flatten(_entries(save_obj))
    return _core.ms_save_redundancy_free(
        os.fspath(ckpt_file_name), [t.spec() for t in flat.tensors], flat.values,
        os.fspath(strategy_file), rank_id, bool(overwrite), bool(crc_check),
        int(io_threads))  # fmt: skip


def export_distributed(checkpoint_dir, dst_checkpoints_dir, ckpt_prefix, dst_strategy_file=None,
                       *, ranks=None, io_threads=4):  # fmt: skip
    """Writes the savepoint checkpoint at checkpoint_dir (any sharding: a distributed save, or a
    plain one) as a MindSpore job's rank files dst_checkpoints_dir/rank_N/{ckpt_prefix}N.ckpt for
    dst_strategy_file (None: not split), the files transform_checkpoints writes from the merged
    checkpoint. Each rank reads only the chunks its slices overlap. ranks: the destination ranks
    to write (default: all)."""
    if not isinstance(ckpt_prefix, str):
        raise TypeError("savepoint.mindspore.export_distributed: ckpt_prefix must be a str")
    _core.ms_export(os.fspath(checkpoint_dir), os.fspath(dst_checkpoints_dir), ckpt_prefix,
                    _opt_path("dst_strategy_file", dst_strategy_file),
                    [int(r) for r in (ranks or [])], int(io_threads))  # fmt: skip

