"""The public surface of the package (issue 30): savepoint.sparse and the top-level names it keeps,
type hints on the public functions (resolvable, never evaluated at import), InvalidArgumentError
for bad arguments."""

import inspect
import subprocess
import sys
import typing

import numpy as np
import pytest

import savepoint
import savepoint.sparse

SPARSE_NAMES = ["DirtyTracker", "SparseTable", "chain", "compact", "gen_slice", "load_into",
                "load_tables", "should_compact"]  # fmt: skip
OLD_TOP_LEVEL = {"chain": "sparse_chain"}  # savepoint.sparse name -> its top-level name
SUBMODULE_ONLY = {"load_into"}  # added after the submodule: not repeated at the top level


def test_sparse_submodule_names_are_the_top_level_objects():
    assert sorted(savepoint.sparse.__all__) == SPARSE_NAMES
    for name in SPARSE_NAMES:
        if name in SUBMODULE_ONLY:
            assert callable(getattr(savepoint.sparse, name)) and not hasattr(savepoint, name), name
            continue
        top = OLD_TOP_LEVEL.get(name, name)
        assert getattr(savepoint.sparse, name) is getattr(savepoint, top), name
        assert top in savepoint.__all__, top
    from savepoint.sparse import SparseTable, chain  # the submodule's names import as well

    assert SparseTable is savepoint.SparseTable and chain is savepoint.sparse_chain
    assert savepoint.sparse is sys.modules["savepoint.sparse"]


def test_every_top_level_name_resolves():
    missing = [n for n in savepoint.__all__ if not hasattr(savepoint, n)]
    assert not missing
    assert len(savepoint.__all__) == len(set(savepoint.__all__))


def _public_callables():
    fns = [savepoint.save, savepoint.load, savepoint.verify, savepoint.info,
           savepoint.list_checkpoints, savepoint.delete, savepoint.gc,
           savepoint.save_safetensors, savepoint.load_safetensors,
           savepoint.safetensors_info, savepoint.default_checkpointer, savepoint.set_log_level]
    fns += [getattr(savepoint.sparse, n) for n in SPARSE_NAMES if n[0].islower()]
    for cls in (savepoint.CheckpointManager, savepoint.AsyncCheckpointer, savepoint.SaveFuture,
                savepoint.SparseTable, savepoint.DirtyTracker):
        for name, member in vars(cls).items():
            if name.startswith("_") and name not in ("__init__", "__enter__", "__exit__"):
                continue
            f = member.fget if isinstance(member, property) else member
            if callable(f):
                fns.append(f)
    return fns


@pytest.mark.parametrize("fn", _public_callables(), ids=lambda f: f.__qualname__)
def test_public_functions_are_annotated(fn):
    """Every parameter and the return value carry a hint; the hints stay strings until asked
    for (from __future__ import annotations) and then resolve (Python 3.10+: `X | None`)."""
    hints = fn.__annotations__
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    assert "return" in hints and not [p for p in params if p not in hints], hints
    if fn.__module__ != "savepoint":  # (savepoint/__init__.py has no __future__ import)
        assert all(isinstance(h, str) for h in hints.values())
    if sys.version_info >= (3, 10):
        typing.get_type_hints(fn)


def test_bad_arguments_raise_invalid_argument_error(tmp_path):
    savepoint.save({"w": np.ones(2, np.float32)}, tmp_path / "c")
    cases = [
        lambda: savepoint.load(tmp_path / "c", framework="jax"),
        lambda: savepoint.save({}, tmp_path / "d", compression="gzip"),
        lambda: savepoint.save({}, tmp_path / "e", metadata={"savepoint.python": 1}),
        lambda: savepoint.load_safetensors(tmp_path / "x.safetensors", framework="jax"),
        lambda: savepoint.load_tables(tmp_path / "c", framework="jax"),
        lambda: savepoint.load(tmp_path / "c", like={"w": np.ones(3, np.float32)}),
    ]
    for case in cases:
        with pytest.raises(savepoint.InvalidArgumentError) as e:
            case()
        assert isinstance(e.value, ValueError)  # (callers catching ValueError still do)


def test_delete_removes_only_a_checkpoints_own_files(tmp_path):
    path = tmp_path / "ck"
    savepoint.save({"w": np.arange(10)}, path)
    (path / "notes.txt").write_text("mine")
    savepoint.delete(path)
    assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]
    with pytest.raises(savepoint.NotFoundError):  # no MANIFEST: not a checkpoint, nothing deleted
        savepoint.delete(path)
    assert (path / "notes.txt").exists()
    savepoint.save({"w": np.arange(3)}, tmp_path / "whole")
    savepoint.delete(tmp_path / "whole")
    assert not (tmp_path / "whole").exists()
    for name in ("notes.txt", "notes.ckpt"):  # a user's files, whatever their names say
        (tmp_path / name).write_text("not a checkpoint")
        with pytest.raises(savepoint.FailedPreconditionError, match=name):
            savepoint.delete(tmp_path / name)
        assert (tmp_path / name).read_text() == "not a checkpoint"
    savepoint.save_safetensors({"w": np.arange(3)}, tmp_path / "w.safetensors")
    savepoint.delete(tmp_path / "w.safetensors")
    assert not (tmp_path / "w.safetensors").exists()


def test_gc_removes_debris_of_dead_processes_and_keeps_checkpoints(tmp_path):
    savepoint.save({"w": np.arange(4)}, tmp_path / "kept")
    dead = tmp_path / ".lost.savepoint-tmp.999999.0123456789abcdef"  # no such process
    dead.mkdir()
    (dead / "data-00000-00000.spd").write_bytes(b"partial")
    (tmp_path / "user.txt").write_text("not savepoint's")
    assert savepoint.gc(tmp_path, dry_run=True) == [str(dead)]
    assert dead.exists()
    assert savepoint.gc(tmp_path) == [str(dead)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "user.txt"]
    assert savepoint.load(tmp_path / "kept")["w"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("module, missing", [("savepoint.lightning", "lightning"),
                                             ("savepoint.hf", "transformers"),
                                             ("savepoint.accelerate", "accelerate"),
                                             ("savepoint.torchtitan", "torchtitan")])
def test_a_plugin_without_its_framework_says_what_to_install(module, missing):
    blocked = "lightning_fabric" if missing == "lightning" else missing
    code = (f"import sys; sys.modules[{missing!r}] = None; sys.modules[{blocked!r}] = None\n"
            f"import {module}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "ImportError" in r.stderr, r.stderr[-2000:]
    assert f"pip install {missing}" in r.stderr, r.stderr[-2000:]
