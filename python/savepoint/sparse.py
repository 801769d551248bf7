"""savepoint.sparse: sparse embedding tables (docs/SPARSE.md).

    from savepoint import sparse
    table = sparse.SparseTable(ids, {"embedding": e, "exp_avg": m})
    savepoint.save({"emb": table, "model": model.state_dict()}, "ckpt/step-100")
    tables = sparse.load_tables("ckpt/step-100", slots="embedding")   # {name: SparseTable}
    if sparse.should_compact("ckpt/step-900"):
        sparse.compact("ckpt/step-900", "ckpt/full-900")

SparseTable: int64 ids plus named slot tensors or arrays (the __savepoint_table__ protocol lets
any object stand for one). DirtyTracker: the ids touched and deleted since the last save, for
delta saves (savepoint.save(..., base=...)). gen_slice: the id slices a shard owns. chain: the
delta chain ending at a checkpoint. should_compact / compact: fold a chain into a full checkpoint.
load_tables: only the tables of a checkpoint. load_into: the tables into the caller's own structures
(objects with __savepoint_set_table__), batch by batch.

The same objects are also at the top level (savepoint.SparseTable, savepoint.sparse_chain for
chain, ...), as they were before this module existed.
"""

from ._sparse import DirtyTracker, SparseTable, gen_slice
from ._sparse_io import chain, compact, load_into, load_tables, should_compact

__all__ = [
    "DirtyTracker",
    "SparseTable",
    "chain",
    "compact",
    "gen_slice",
    "load_into",
    "load_tables",
    "should_compact",
]
