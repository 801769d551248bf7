"""Sparse embedding tables in Python: savepoint.SparseTable, the __savepoint_table__ protocol and
savepoint.DirtyTracker (design: docs/SPARSE.md, "Python").

A SparseTable is int64 ids (1-D, unique) plus named slots (the embedding and its optimizer
slots), each a tensor or array whose dim 0 is the number of ids: row r of every slot belongs to
ids[r]. In a delta (savepoint.save(..., base=...)) it also carries `deleted`, the ids removed
since the base. The arrays are torch tensors or numpy arrays (mixing is fine); saving borrows
their memory (contiguous CPU tensors are not copied).

Any object can stand for a table in a saved state by defining `__savepoint_table__(self)`
returning a SparseTable over its own storage (e.g. a hash-embedding module handing over its id and
row tensors): savepoint.save calls it and saves the rows without a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, _dtypes, _errors

NUM_SLICES = 65536


def _kind(x):
    """"np", "pt" or None (not a tensor or array)."""
    if isinstance(x, np.ndarray):
        return "np"
    torch = _dtypes.torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        return "pt"
    return None


def _dtype_name(x):
    if _kind(x) == "np":
        return _dtypes.from_numpy_dtype(x.dtype)
    return _dtypes.from_torch_dtype(x.dtype)


def _as_numpy(x):
    """A numpy view of a CPU tensor or array (a host copy of a device tensor; lists become
    arrays)."""
    if _kind(x) == "pt":
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _check_ids(x, what):
    if _kind(x) is None:
        raise _errors.InvalidArgumentError(
            f"{what} must be a torch tensor or numpy array, not {type(x).__name__}")
    if _dtype_name(x) != "I64" or len(x.shape) != 1:
        raise _errors.InvalidArgumentError(
            f"{what} must be int64 and 1-D, got {x.dtype} of shape {list(x.shape)} (ids are "
            "int64 hashes: convert with .astype(np.int64) / .to(torch.int64))")


class SparseTable:
    """A sparse embedding table: `ids` (int64, 1-D, unique; negative ids are fine), `slots`
    ({name: tensor or array whose dim 0 is len(ids)}, any dtype, e.g. {"embedding": e,
    "exp_avg": m, "exp_avg_sq": v}) and, for a delta, `deleted` (int64 1-D ids removed since the
    base; none of them in `ids`). torch tensors or numpy arrays.

    The constructor checks types, dtypes and row counts (InvalidArgumentError naming the slot);
    duplicate ids are found when the table is saved, as the save sorts it (InvalidArgumentError
    naming the table and the id; from the future's wait() for an asynchronous save of a large
    table in hash order, which is sorted in the background). Loaded tables are SparseTables whose rows are in storage order, ascending by
    (id mod 65536, id)."""

    __slots__ = ("ids", "slots", "deleted")

    def __init__(self, ids: Any, slots: dict[str, Any], deleted: Any = None) -> None:
        _check_ids(ids, "SparseTable: ids")
        if not isinstance(slots, dict) or not slots:
            raise _errors.InvalidArgumentError(
                "SparseTable: slots must be a non-empty dict {slot name: tensor or array}")
        rows = ids.shape[0]
        for name, s in slots.items():
            if type(name) is not str or not name:
                raise _errors.InvalidArgumentError(f"SparseTable: slot name {name!r} is not a str")
            if _kind(s) is None:
                raise _errors.InvalidArgumentError(
                    f"SparseTable: slot {name!r} must be a torch tensor or numpy array, not "
                    f"{type(s).__name__}")  # fmt: skip
            if _dtype_name(s) is None:
                raise _errors.InvalidArgumentError(
                    f"SparseTable: slot {name!r} has dtype {s.dtype}, which cannot be saved")
            if len(s.shape) < 1 or s.shape[0] != rows:
                raise _errors.InvalidArgumentError(
                    f"SparseTable: slot {name!r} has shape {list(s.shape)}: its dim 0 must be "
                    f"the {rows} rows of ids")  # fmt: skip
        if deleted is not None:
            _check_ids(deleted, "SparseTable: deleted")
        self.ids, self.slots, self.deleted = ids, dict(slots), deleted

    @property
    def num_rows(self) -> int:
        return int(self.ids.shape[0])

    def __len__(self) -> int:
        return self.num_rows

    def __savepoint_table__(self) -> SparseTable:
        return self

    def __repr__(self) -> str:
        slots = ", ".join(f"{k}: {_dtype_name(v)} {list(v.shape[1:])}"
                          for k, v in self.slots.items())  # fmt: skip
        deleted = "" if self.deleted is None else f", {self.deleted.shape[0]} deleted"
        return f"SparseTable({self.num_rows} rows{deleted}; {slots})"

    def to_dict(self, slot: str | None = None) -> dict[int, np.ndarray]:
        """{id: row} (numpy) of slot `slot` (default: the first), for tests and small tables."""
        name = slot if slot is not None else next(iter(self.slots))
        rows = _as_numpy(self.slots[name])
        return {int(i): rows[r] for r, i in enumerate(_as_numpy(self.ids))}

    def delta(self, touched: Any, deleted: Any = None) -> SparseTable:
        """The table a delta save takes: the rows of the ids `touched` (which must all be rows of
        this table: NotFoundError naming the first that is not) and `deleted` as its deleted ids.
        The rows are copied (gathered); tensors stay tensors, arrays arrays."""
        touched = np.ascontiguousarray(_as_numpy(touched), dtype=np.int64).reshape(-1)
        ids = _as_numpy(self.ids)
        order = np.argsort(ids, kind="stable")
        if len(ids):
            pos = np.minimum(np.searchsorted(ids[order], touched), len(ids) - 1)
            found, rows = ids[order][pos] == touched, order[pos]
        else:
            found, rows = np.zeros(len(touched), bool), np.zeros(0, np.int64)
        if not found.all():
            missing = int(touched[np.argmin(found)])
            raise _errors.NotFoundError(
                f"SparseTable.delta: touched id {missing} is not in the table")

        def take(x):
            if _kind(x) == "np":
                return x[rows]
            torch = _dtypes.torch_module()
            return x[torch.from_numpy(rows).to(x.device)]

        if deleted is not None:
            deleted = np.ascontiguousarray(_as_numpy(deleted), dtype=np.int64).reshape(-1)
            if _kind(self.ids) == "pt":
                deleted = _dtypes.torch_module().from_numpy(deleted)
        return SparseTable(take(self.ids), {k: take(v) for k, v in self.slots.items()}, deleted)

    def shard(self, shard_id: int, shard_num: int) -> SparseTable:
        """The rows shard `shard_id` of `shard_num` owns (ids whose slice, id mod 65536, lies in
        savepoint.gen_slice(shard_id, shard_num)): what that rank passes to a distributed save."""
        begin, end = gen_slice(shard_id, shard_num)
        ids = _as_numpy(self.ids)
        rows = np.nonzero(((ids & 0xFFFF) >= begin) & ((ids & 0xFFFF) < end))[0]
        return self.delta(ids[rows], None) if len(rows) != len(ids) else self


def gen_slice(shard_id: int, shard_num: int) -> tuple[int, int]:
    """(begin, end): the slices [begin, end) shard `shard_id` of `shard_num` owns (RecIS
    gen_slice: 65536 // shard_num each, the first 65536 % shard_num one more)."""
    return tuple(_core.gen_slice(int(shard_id), int(shard_num)))


def as_table(obj):
    """The SparseTable `obj` stands for (itself, or its __savepoint_table__()), else None."""
    if type(obj) is SparseTable:
        return obj
    hook = getattr(type(obj), "__savepoint_table__", None)
    if hook is None:
        return None
    table = obj.__savepoint_table__()
    if not isinstance(table, SparseTable):
        raise TypeError(f"{type(obj).__qualname__}.__savepoint_table__() returned "
                        f"{type(table).__name__}, not a savepoint.SparseTable")  # fmt: skip
    return table


def is_table(obj):
    """Whether `obj` is a SparseTable or stands for one (has __savepoint_table__)."""
    return type(obj) is SparseTable or hasattr(type(obj), "__savepoint_table__")


class DirtyTracker:
    """The ids touched (inserted or updated) and deleted since the last save, for delta saves
    (C++ DirtySet; thread-safe). Touching an id forgets an earlier deletion of it, deleting one
    forgets an earlier touch.

        tracker.touch(batch_ids)            # every training step, ids whose rows changed
        tracker.delete(evicted_ids)         # ids evicted from the table
        savepoint.save({"emb": tracker.delta(table)}, "ckpt/step-200", base="ckpt/step-100")
        tracker.clear()                     # after the save committed
    """

    def __init__(self) -> None:
        self._d = _core.DirtySet()

    @staticmethod
    def _ids(ids):
        a = np.ascontiguousarray(_as_numpy(ids))
        if a.dtype.kind not in "iu":
            raise _errors.InvalidArgumentError(f"DirtyTracker: ids must be integers, not {a.dtype}")
        a = np.ascontiguousarray(a.astype(np.int64, copy=False).reshape(-1))
        return a

    def touch(self, ids: Any) -> None:
        a = self._ids(ids)
        self._d.touch(a.__array_interface__["data"][0], a.shape[0])

    def delete(self, ids: Any) -> None:
        a = self._ids(ids)
        self._d.delete(a.__array_interface__["data"][0], a.shape[0])

    def touched(self) -> np.ndarray:
        """The touched ids, sorted (int64 numpy array)."""
        return np.frombuffer(self._d.touched(), np.int64).copy()

    def deleted(self) -> np.ndarray:
        """The deleted ids, sorted (int64 numpy array)."""
        return np.frombuffer(self._d.deleted(), np.int64).copy()

    def clear(self) -> None:
        self._d.clear()

    def delta(self, table: Any) -> SparseTable:
        """table.delta(touched, deleted): the table to save as the delta. Touched ids that are
        no longer rows of `table` must have been deleted (NotFoundError otherwise)."""
        return as_table(table).delta(self.touched(), self.deleted())
