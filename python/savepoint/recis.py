"""RecIS-style training integration: savepoint.recis.Saver and CheckpointManager.

The interface of RecIS's Saver / CheckpointManager (docs/SPARSE.md, "RecIS integration"), built
on savepoint's checkpoints: each checkpoint id is one savepoint checkpoint directory
`<output_dir>/<ckpt_id>` (checksummed, committed atomically, loadable with savepoint.load and the
CLI), holding the model's sparse tables (each rank its own rows; loadable into any number of
ranks), its dense parameters (written once), the registered extra objects and each rank's IO
state. `<output_dir>/checkpoint` lists the ids, newest last, as RecIS writes it.

Sparse tables are the modules of the model that implement the table protocol:
    __savepoint_table__(self) -> savepoint.SparseTable over the module's own storage (the rows
        this rank owns; slot "embedding" and optimizer slots such as "exp_avg");
    __savepoint_set_table__(self, table) -> None: take the loaded rows (a SparseTable with the
        slots that were loaded: all, or only some with load_conf / warm starts).
Their state_dict entries are left out of the dense part. With shard_num > 1 every rank calls
save() and load() (torch.distributed initialised, world size = shard_num).

Incremental saves (Saver(..., incremental=True)): a table module may also implement
    __savepoint_dirty__(self) -> a savepoint.DirtyTracker (or any object with touched(),
        deleted() and clear()) recording the ids whose rows it inserted or updated (touch) and
        the ids it evicted (delete) since the last save;
the Saver then saves a delta holding only those rows and deletions, and clears the tracker once
the save has committed (after every committed save, full or delta). A table module without it is
saved whole in every delta, its deletions found against the ids it held at the previous save.
The first save of a Saver (and the first after a load) is full, and so is a save whose chain
would grow past max_chain deltas or past max_delta_ratio x the full checkpoint's table bytes.
Retention keeps every checkpoint a listed one's chain needs (docs/SPARSE.md, "RecIS
integration").
"""

import os
import shutil
import sys

import numpy as np

from . import _core, _distributed, _errors, _load, _read, _save, _sparse, _sparse_io
from ._recis_import import import_checkpoint  # noqa: F401 (RecIS directories)

CHECKPOINT_FILE = "checkpoint"
_CATEGORIES = ("sparse", "dense", "extra", "sparse_opt", "io_state")


def load_map(load_conf):
    """{category: bool} from a load_conf's "load" (default ["*"]) and "exclude" lists."""
    conf = load_conf or {}
    want = dict.fromkeys(_CATEGORIES, False)
    for key, value in (("load", True), ("exclude", False)):
        names = conf.get(key, ["*"] if key == "load" else [])
        for name in [names] if isinstance(names, str) else names:
            if name != "*" and name not in want:
                raise _errors.InvalidArgumentError(
                    f"savepoint.recis: load_conf[{key!r}] names {name!r}; categories are "
                    f"{list(_CATEGORIES)} or '*'")  # fmt: skip
            for c in _CATEGORIES if name == "*" else [name]:
                want[c] = value
    return want


def read_checkpoint_ids(output_dir):
    """The ids listed in `<output_dir>/checkpoint`, oldest first ([] when there is none)."""
    try:
        with open(os.path.join(output_dir, CHECKPOINT_FILE)) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _write_checkpoint_ids(output_dir, ids):
    data = "".join(i + "\n" for i in ids).encode()
    _core.write_file_durably(os.path.join(output_dir, CHECKPOINT_FILE), data, True)


class Saver:
    """Saves and loads a model's sparse tables, dense parameters, registered objects and IO
    states as RecIS's Saver does.

    model: a torch.nn.Module; its table modules (see the module docstring) are the sparse part.
    sparse_optim: optional; its state_dict() (step counters, hyper-parameters) is saved with the
        extra objects and loaded with the "sparse_opt" category.
    output_dir: where checkpoint directories and the `checkpoint` list go.
    max_keep: checkpoints listed (default 1); saving more unlists the oldest (rank 0, after the
        new one is committed and listed) and removes every directory no listed checkpoint's
        delta chain needs (a base still needed is removed by a later save, once it is not).
        concurrency: threads sorting each table's rows (default 4).
    param_slots: the slots that are parameters; a table's other slots are optimizer state
        (category "sparse_opt"). Default ("embedding",).
    incremental: save deltas (default False: every save is full). The first save (and the first
        after a load) is full; each later one is a delta on the previous save holding, per table,
        the rows touched and the ids deleted since (the module's __savepoint_dirty__(); a module
        without it is saved whole); dense parameters, extra objects and IO states are saved
        whole every time. Loading a delta's id applies its chain (any worker count).
    max_chain: with incremental, a save is full when the previous checkpoint already ends a chain
        of max_chain deltas (default 8; 0: every save full).
    max_delta_ratio: with incremental, a save is full when the previous checkpoint's chain of
        deltas holds more table bytes than max_delta_ratio x its full checkpoint's (default 0.5).
        (The policy of savepoint.should_compact; a full save is the compaction.)
    """

    def __init__(self, model, sparse_optim=None, output_dir="./", max_keep=1, concurrency=4,
                 param_slots=("embedding",), incremental=False, max_chain=8,
                 max_delta_ratio=0.5):  # fmt: skip
        if int(max_keep) < 1:
            raise _errors.InvalidArgumentError(f"savepoint.recis.Saver: max_keep={max_keep}: >= 1")
        if int(max_chain) < 0 or not float(max_delta_ratio) >= 0:
            raise _errors.InvalidArgumentError(
                f"savepoint.recis.Saver: max_chain={max_chain}, max_delta_ratio="
                f"{max_delta_ratio}: both must be >= 0")  # fmt: skip
        self._model, self._sparse_optim = model, sparse_optim
        self._output_dir, self._max_keep = os.fspath(output_dir), int(max_keep)
        self._concurrency, self._param_slots = int(concurrency), tuple(param_slots)
        self._tables = self._find_tables(model)
        self._extra, self._io_state = {}, {}
        self._incremental, self._max_chain = bool(incremental), int(max_chain)
        self._max_delta_ratio = float(max_delta_ratio)
        self._last = None  # path of this Saver's last committed save (a delta's base)
        self._saved_ids = {}  # table -> its ids at that save (tables without __savepoint_dirty__)

    @staticmethod
    def _find_tables(model):
        tables = {}
        for name, m in model.named_modules():
            if not hasattr(type(m), "__savepoint_table__"):
                continue
            if any(name.startswith(t + ".") for t in tables):
                continue  # (inside a table module)
            if not hasattr(type(m), "__savepoint_set_table__"):
                raise TypeError(f"savepoint.recis.Saver: module {name!r} ({type(m).__name__}) "
                                "has __savepoint_table__ but no __savepoint_set_table__")
            tables[name or "_"] = m
        return tables

    def register_io_state(self, name, obj):
        """obj.dump_io_state() is saved per rank; obj.load_io_state(state) restores it."""
        if name in self._io_state:
            raise _errors.InvalidArgumentError(f"name {name} already registered in io state")
        self._io_state[name] = obj

    def register_for_checkpointing(self, name, obj):
        """Saves obj.state_dict() (or obj itself: tensors, numbers, dicts) with rank 0's extra
        part; loading calls obj.load_state_dict or replaces the value (get_extra_data)."""
        if name in self._extra:
            raise _errors.InvalidArgumentError(f"name {name} already registered")
        self._extra[name] = obj

    def get_extra_data(self, name):
        return self._extra.get(name)

    def _dense(self):
        prefixes = tuple(t + "." for t in self._tables)
        return {k: v for k, v in self._model.state_dict().items() if not k.startswith(prefixes)}

    def _state(self, shard_num, delta):
        extra = {k: v.state_dict() if hasattr(v, "state_dict") else v
                 for k, v in self._extra.items()}  # fmt: skip
        if self._sparse_optim is not None and hasattr(self._sparse_optim, "state_dict"):
            extra["__sparse_optim__"] = self._sparse_optim.state_dict()
        io = {k: v.dump_io_state() for k, v in self._io_state.items()}
        sparse = {n: _Delta(self, n, m) for n, m in self._tables.items()} if delta else self._tables
        return {"sparse": dict(sparse), "dense": self._dense(), "extra": extra,
                "io_state": _distributed.PerRank(io) if shard_num > 1 else io}  # fmt: skip

    def _delta(self, name, module):
        """The delta of table `name` since this Saver's last save: its dirty rows and deletions,
        or (a module without __savepoint_dirty__) every row and the ids gone since."""
        table = _sparse.as_table(module)
        dirty = _dirty(module)
        if dirty is not None:
            try:
                return table.delta(dirty.touched(), dirty.deleted())
            except _errors.NotFoundError as e:
                raise _errors.NotFoundError(
                    f"savepoint.recis: table {name!r}: its __savepoint_dirty__() tracker touched "
                    f"an id the table no longer holds ({e}): record evictions with delete()"
                ) from None  # fmt: skip
        gone = np.setdiff1d(self._saved_ids.get(name, _NO_IDS), _sparse._as_numpy(table.ids))
        if _sparse._kind(table.ids) == "pt":
            gone = _torch().from_numpy(gone)
        return _sparse.SparseTable(table.ids, table.slots, gone)

    def save(self, ckpt_id, shard_id=0, shard_num=1):
        """Saves checkpoint `ckpt_id` (every rank calls it when shard_num > 1), a delta on the
        previous save when incremental and due (see the class docstring); rank 0 then lists it
        in `checkpoint` and removes what the listed checkpoints no longer need. Returns its
        path."""
        group = _group(shard_id, shard_num, "save")
        path = os.path.join(self._output_dir, ckpt_id)
        base = self._agreed_base(self._choose_base(path, shard_id), group)
        _save.save(self._state(shard_num, base is not None), path, overwrite=True,
                   process_group=group, base=base, concurrency=self._concurrency,
                   metadata={"recis": {"shard_num": shard_num}})  # fmt: skip
        self._committed(path)
        if shard_id == 0:
            self._list(ckpt_id)
        return path

    def _choose_base(self, path, shard_id):
        """The base of this save (rank 0 decides): the previous save, unless the save is not
        incremental, is the first, goes to the same path, or its chain is due for compaction
        (or unreadable): None, a full save."""
        if not self._incremental or self._last is None or shard_id != 0:
            return None
        try:
            links = _sparse_io.chain(self._last)
        except _errors.SavepointError:
            return None  # (the previous checkpoint is gone or broken: start a new chain)
        if os.path.realpath(path) in {os.path.realpath(link["path"]) for link in links}:
            return None  # (re-saving a link of the chain: a delta on itself cannot be)
        due = _sparse_io.chain_is_due(links, self._max_chain, self._max_delta_ratio,
                                      depth=links[0]["depth"] + 1)  # fmt: skip
        return None if due else self._last

    @staticmethod
    def _agreed_base(base, group):
        """Rank 0's choice of base, on every rank of `group` (one all-gather)."""
        if group is None:
            return base
        comm = _distributed._Group(group).comm()
        chosen = comm.all_gather((base or "").encode(), 600.0)[0].decode()
        return chosen or None

    def _committed(self, path):
        """After a committed save: the next delta's base is `path`; dirty trackers are cleared
        and the ids of tables without one remembered."""
        self._last = path
        self._saved_ids = {}
        for name, module in self._tables.items():
            dirty = _dirty(module)
            if dirty is not None:
                dirty.clear()
            elif self._incremental:
                ids = _sparse._as_numpy(_sparse.as_table(module).ids)
                self._saved_ids[name] = np.array(ids, dtype=np.int64)

    def _list(self, ckpt_id):
        """Lists `ckpt_id` newest (durably; max_keep ids), then removes the directories of
        checkpoints that were listed, or needed by a listed one's chain, and no longer are."""
        listed = read_checkpoint_ids(self._output_dir)
        ids = [i for i in listed if i != ckpt_id] + [ckpt_id]
        keep = ids[-self._max_keep :]
        _write_checkpoint_ids(self._output_dir, keep)  # listed first, removed after
        needed = set()
        for i in keep:
            chain = self._chain_names(i)
            if chain is None:
                return  # (a listed chain cannot be read: remove nothing rather than a base)
            needed |= chain
        before = set()
        for i in listed:
            before |= self._chain_names(i) or {i}
        for old in sorted(before - needed):
            shutil.rmtree(os.path.join(self._output_dir, old), ignore_errors=True)

    def _chain_names(self, ckpt_id):
        """The names in output_dir of checkpoint `ckpt_id` and the links of its delta chain
        (links elsewhere are not this Saver's); None when they cannot be read."""
        path = os.path.join(self._output_dir, ckpt_id)
        try:
            if not _sparse_io.has_tables(_read.Info(path, 1, True)):
                return {ckpt_id}
            links = [p for p, _, _ in _core.sparse_chain(path)]
        except _errors.SavepointError:
            return None
        root = os.path.realpath(self._output_dir)
        return {os.path.basename(p) for p in map(os.path.realpath, links)
                if os.path.dirname(p) == root}  # fmt: skip

    def load(self, ckpt_path=None, ckpt_id=None, load_conf=None, shard_id=0, direct_path=False):
        """Loads a checkpoint: `ckpt_path` itself with direct_path=True, else `ckpt_id` (default:
        the newest listed) under ckpt_path (default output_dir). load_conf: {"load": [...],
        "exclude": [...], "strict": bool} over the categories sparse, dense, extra, sparse_opt,
        io_state (default everything). Returns the path loaded, or None when there is none."""
        if direct_path:
            path = ckpt_path
        else:
            root = os.fspath(ckpt_path) if ckpt_path else self._output_dir
            ckpt_id = ckpt_id or (read_checkpoint_ids(root) or [None])[-1]
            path = os.path.join(root, ckpt_id) if ckpt_id else None
        if not path:
            return None
        self.load_by_config(path, load_conf, shard_id)
        return path

    def load_by_config(self, path, load_conf=None, shard_id=0):
        want, strict = load_map(load_conf), (load_conf or {}).get("strict", True)
        self._last = None  # the tables change: the next save is full
        shard_num = _world_size()
        group = _group(shard_id, shard_num, "load")
        if want["io_state"] and self._io_state:
            saved = (_load.info(path)["metadata"].get("recis") or {}).get("shard_num", shard_num)
            if saved != shard_num:
                raise _errors.FailedPreconditionError(
                    f"checkpoint {path}: IO states of {saved} workers, this job has {shard_num}: "
                    "load with load_conf={'exclude': ['io_state']} to resume on another worker "
                    "count")  # fmt: skip
        slots = None
        if want["sparse"] != want["sparse_opt"]:
            slots = self._slot_filter(want["sparse"])
        loaded = _load.load(path, process_group=group, slots=slots or None, framework="pt",
                            per_rank="strict" if want["io_state"] else "all")  # fmt: skip
        if want["sparse"] or want["sparse_opt"]:
            self._set_tables(loaded.get("sparse", {}), strict, path)
        if want["dense"]:
            self._load_dense(loaded.get("dense", {}), strict)
        extra = loaded.get("extra", {})
        if want["extra"]:
            for k, obj in self._extra.items():
                if k in extra:
                    self._set_extra(k, obj, extra[k])
        if want["sparse_opt"] and "__sparse_optim__" in extra and self._sparse_optim is not None:
            self._sparse_optim.load_state_dict(extra["__sparse_optim__"])
        if want["io_state"]:
            io = loaded.get("io_state", {})  # (this worker's: the counts agree, checked above)
            for k, obj in self._io_state.items():
                if k in io:
                    obj.load_io_state(io[k])

    def _slot_filter(self, params):
        """The slots to load when only the parameters (params) or only the optimizer slots are:
        the model's tables' slots of that kind ([] when they have none)."""
        if params:
            return list(self._param_slots)
        every = set()
        for module in self._tables.values():
            every |= set(_sparse.as_table(module).slots)
        return sorted(every - set(self._param_slots))

    def _set_tables(self, tables, strict, path):
        for name, module in self._tables.items():
            table = tables.get(name)
            if table is None:
                if strict:
                    raise _errors.NotFoundError(f"checkpoint {path}: no sparse table {name!r}")
                continue
            module.__savepoint_set_table__(table)

    def _load_dense(self, dense, strict):
        result = self._model.load_state_dict(dense, strict=False)
        prefixes = tuple(t + "." for t in self._tables)
        missing = [k for k in result.missing_keys if not k.startswith(prefixes)]
        if strict and (missing or result.unexpected_keys):
            raise _errors.NotFoundError(
                f"savepoint.recis: dense parameters: missing {missing[:5]}, unexpected "
                f"{result.unexpected_keys[:5]} (pass load_conf={{'strict': False}})")

    def _set_extra(self, name, obj, value):
        if hasattr(obj, "load_state_dict"):
            obj.load_state_dict(value)
        elif hasattr(obj, "copy_") and hasattr(value, "shape"):
            obj.copy_(value)  # (a tensor registered as is, e.g. the global step)
        else:
            self._extra[name] = value


class CheckpointManager:
    """Saves every `save_interval` steps (step()), on demand (save()), restores the newest or a
    given step (restore()) and loads model banks, as RecIS's CheckpointManager; checkpoint ids are
    "ckpt_<global step>". Rank and shard count come from torch.distributed when it is
    initialised, else from RANK / WORLD_SIZE."""

    def __init__(self, saver, save_interval):
        torch = _torch()
        self._saver, self._save_interval = saver, int(save_interval)
        self._global_step = torch.scalar_tensor(0, dtype=torch.int64)
        self._rank, self._shard_num = _rank(), _world_size()
        if saver.get_extra_data("global_step") is None:
            saver.register_for_checkpointing("global_step", self._global_step)

    @property
    def save_interval(self):
        return self._save_interval

    @property
    def global_step(self):
        return int(self._global_step)

    def register_for_checkpointing(self, name, obj):
        self._saver.register_for_checkpointing(name, obj)

    def step(self):
        """Counts a training step; saves when the count reaches a multiple of save_interval."""
        self._global_step += 1
        if int(self._global_step) % self._save_interval == 0:
            self.save()

    def save(self):
        return self._saver.save(f"ckpt_{int(self._global_step)}", self._rank, self._shard_num)

    def load_model_bank(self, model_bank_conf):
        """Loads each entry of `model_bank_conf` ([{"path": checkpoint dir, "load": [...],
        "exclude": [...], "strict": bool}]) into the model, in order."""
        for conf in model_bank_conf or []:
            if conf.get("path"):
                self._saver.load(ckpt_path=conf["path"], load_conf=conf, shard_id=self._rank,
                                 direct_path=True)  # fmt: skip

    def restore(self, global_step=None):
        """Loads the newest checkpoint (or ckpt_<global_step>); returns the global step (0 when
        there is none)."""
        ckpt_id = None if global_step is None else f"ckpt_{global_step}"
        self._saver.load(ckpt_id=ckpt_id, shard_id=self._rank)
        step = self._saver.get_extra_data("global_step")
        if step is not None and step is not self._global_step:
            self._global_step.copy_(step)
        return int(self._global_step)


_NO_IDS = np.zeros(0, np.int64)


class _Delta:
    """Stands for a table's delta in a saved state; built (Saver._delta) when the save flattens
    the state, so that a failure is told to every rank of a distributed save."""

    def __init__(self, saver, name, module):
        self._saver, self._name, self._module = saver, name, module

    def __savepoint_table__(self):
        return self._saver._delta(self._name, self._module)


def _dirty(module):
    """The module's dirty tracker (__savepoint_dirty__()), or None when it has none."""
    hook = getattr(type(module), "__savepoint_dirty__", None)
    return None if hook is None else module.__savepoint_dirty__()


def _torch():
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: PLC0415 (savepoint.recis is torch-only)
    return torch


def _dist():
    dist = _torch().distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def _rank():
    dist = _dist()
    return dist.get_rank() if dist is not None else int(os.environ.get("RANK", 0))


def _world_size():
    dist = _dist()
    return dist.get_world_size() if dist is not None else int(os.environ.get("WORLD_SIZE", 1))


def _group(shard_id, shard_num, what):
    """torch.distributed's world group for shard_num > 1 (checked against it), else None."""
    if shard_num <= 1:
        return None
    dist = _dist()
    if dist is None or dist.get_world_size() != shard_num or dist.get_rank() != shard_id:
        raise _errors.FailedPreconditionError(
            f"savepoint.recis: {what} as shard {shard_id} of {shard_num} needs torch.distributed "
            f"initialised with that rank and world size")  # fmt: skip
    return dist.group.WORLD

