"""Importing RecIS checkpoint directories as savepoint checkpoints:
savepoint.recis.import_checkpoint (docs/INTEROP.md, "RecIS checkpoints").

The C++ import (savepoint/recis.h, `savepoint convert --from recis`) reads the sparse tables and
the dense tensors of the safetensors data files; it cannot read the torch pickles. This module
adds them: model.pt (the model's dense parameters), extra.pt (the registered objects) and the IO
states (io_state_<worker>.pt, one per worker, their count in io_state_count), each read with
torch.load(weights_only=True), so that nothing in them is executed.
"""

import json
import os

from . import _core, _dtypes, _errors, _save, _sparse, _tree

_MAX_WORKERS = 65536  # io_state_count is untrusted: at most one worker per slice


def _view(entry, as_torch):
    """The tensor or array of a (name, dtype, shape, bytes) entry, without a copy."""
    _, dtype, shape, raw = entry
    return _dtypes.view_bytes(raw, dtype, shape, as_torch)


def _torch_load(path, what):
    torch = _dtypes.torch_module()
    if torch is None:
        raise _errors.UnimplementedError(f"{path}: reading {what} needs torch")
    with open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)


def import_checkpoint(src_dir, dst, *, model=True, extra=True, io_state=True, overwrite=False,
                      io_threads=4, compression=None, key=None):  # fmt: skip
    """Reads the RecIS checkpoint at `src_dir` (or, when it holds a `checkpoint` list instead of
    an `index`, the newest listed one under it) and saves it as the savepoint checkpoint `dst`:

        {"sparse": {table: SparseTable},      # every hash table, all shards' rows
         "tensors": {name: tensor},           # the dense tensors of the safetensors files
         "dense": model.pt's state dict,      # with model=True, when model.pt exists
         "extra": extra.pt's dict,            # with extra=True, when weights_only can read it
         "io_state": the IO states}           # with io_state=True, when the directory has them

    (empty parts left out), with metadata {"recis": {"source", "shard_num", "skipped"}}.
    Tables load into any number of shards (savepoint.load(dst, shard_id=, shard_num=),
    savepoint.load_tables). model.pt must be readable with torch.load(weights_only=True)
    (InvalidArgumentError naming it otherwise; pass model=False to leave it out); an extra.pt
    that is not is left out and listed in "skipped". The IO states are stored as
    savepoint.recis.Saver stores them: one worker's dict as it is, several workers' as per-rank
    parts (savepoint.PerRank of each worker), so that Saver.load on as many workers gives each its
    own; they are left out (and listed in "skipped") unless every worker's file reads with
    torch.load(weights_only=True) and their count is the tables' shard count.

    Returns {"path": the RecIS directory read, "shard_num", "tables", "rows", "tensors",
    "skipped": [lines]}."""
    (tensors, _, meta_json, tables), path, shard_num, skipped = _core.load_recis(
        os.fspath(src_dir), int(io_threads))
    as_torch = _dtypes.torch_module() is not None
    state = {}
    if tables:
        state["sparse"] = {
            name: _sparse.SparseTable(_view(ids, as_torch),
                                      {s[0]: _view(s, as_torch) for s in slots})
            for name, ids, slots in tables}  # fmt: skip
    if tensors:
        state["tensors"] = {t[0]: _view(t, as_torch) for t in tensors}
    skipped = _add_pickles(state, path, model, extra, list(skipped))
    meta = json.loads(meta_json)
    if io_state:
        skipped = _add_io_states(state, path, meta["recis"].get("shard_num"), skipped)
    options = dict(overwrite=overwrite, io_threads=io_threads, compression=compression, key=key)
    try:
        meta["recis"]["skipped"] = skipped
        _save.save(state, dst, metadata=meta, **options)
    except TypeError as e:  # extra.pt or an IO state holds what a checkpoint cannot: leave it out
        part = next((p for p in ("extra", "io_state") if p in state and f"obj['{p}" in str(e)),
                    None)  # fmt: skip
        if part is None:
            raise
        del state[part]
        what = "extra.pt" if part == "extra" else "io_state_count: an IO state"
        skipped.append(f"{what}: holds what savepoint.save cannot store ({e}): not imported")
        meta["recis"]["skipped"] = skipped
        _save.save(state, dst, metadata=meta, **options)
    return {"path": path, "shard_num": shard_num, "tables": len(tables),
            "rows": sum(ids[2][0] for _, ids, _ in tables),
            "tensors": len(tensors), "skipped": skipped}  # fmt: skip


def _add_pickles(state, path, model, extra, skipped):
    """Adds model.pt ("dense") and extra.pt ("extra") of the RecIS directory `path` to `state`
    as asked; returns `skipped` without the lines of the files read, with those left out."""
    for name, part, wanted in (("model.pt", "dense", model), ("extra.pt", "extra", extra)):
        file = os.path.join(path, name)
        if not wanted or not os.path.exists(file):
            continue
        skipped = [s for s in skipped if not s.startswith(name + ":")]
        try:
            state[part] = _torch_load(file, name)
        except Exception as e:  # noqa: BLE001 (the unpickler's errors have many types)
            if part == "dense":
                raise _errors.InvalidArgumentError(
                    f"{file}: not readable with torch.load(weights_only=True): {e} (pass "
                    "model=False to import without it)") from e  # fmt: skip
            skipped.append(f"{name}: not readable with torch.load(weights_only=True): not imported")
    return skipped


def _add_io_states(state, path, shard_num, skipped):
    """Adds the IO states of the RecIS directory `path` to `state` (see import_checkpoint);
    returns `skipped` without the IO state lines when they were read, with one line saying why
    when they were not."""
    count_file = os.path.join(path, "io_state_count")
    if not os.path.exists(count_file):
        return skipped
    rest = [s for s in skipped if not s.startswith("io_state_")]
    try:
        with open(count_file, "rb") as f:
            text = f.read(32).decode("ascii").strip()
        count = int(text) if text.isdigit() else 0
    except (OSError, UnicodeDecodeError):
        count = 0
    if not 1 <= count <= _MAX_WORKERS:
        return rest + ["io_state_count: not a worker count in [1, 65536]: IO states not imported"]
    if count != shard_num:
        return rest + [f"io_state_count: {count} workers, the tables {shard_num} shards: IO states "
                       "not imported"]  # fmt: skip
    states = []
    for r in range(count):
        name = f"io_state_{r}.pt"
        file = os.path.join(path, name)
        if not os.path.exists(file):
            return rest + [f"{name}: missing (io_state_count says {count}): IO states not imported"]
        try:
            states.append(_torch_load(file, name))
        except Exception:  # noqa: BLE001 (the unpickler's errors have many types)
            return rest + [f"{name}: not readable with torch.load(weights_only=True): IO states "
                           "not imported"]  # fmt: skip
    state["io_state"] = states[0] if count == 1 else _tree.EveryRank(states)
    return rest
