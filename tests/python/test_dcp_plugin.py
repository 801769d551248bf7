"""The torch.distributed.checkpoint storage plug-in (savepoint.torch): DCP's own dcp.save /
dcp.async_save / dcp.load flows on savepoint storage, in one process and on gloo ranks
(helpers/dcp_ranks.py), resharded loads, checksums that DCP's own FileSystemReader lacks."""

import json
import os
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import savepoint  # noqa: E402
import savepoint.torch as spt  # noqa: E402
from conftest import run_python  # noqa: E402


def _state(fill=True):
    g = torch.Generator().manual_seed(7)

    def t(x):
        return x if fill else torch.zeros_like(x)

    return {
        "model": {
            "w": t(torch.randn(300, 70, generator=g)),  # 84000 B: several 16 KiB chunks below
            "b": t(torch.randn(70, generator=g).to(torch.bfloat16)),
            "ids": t(torch.randint(0, 1 << 40, (33,), generator=g)),
        },
        "scalar": t(torch.tensor(2.5)),
        "step": 100 if fill else 0,
        "sched": {"lr": [0.1, 0.01]} if fill else {"lr": []},
    }


def _assert_equal(a, b):
    for k in ("w", "b", "ids"):
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert torch.equal(a["scalar"], b["scalar"])
    assert a["step"] == b["step"] and a["sched"] == b["sched"]


@pytest.fixture(autouse=True)
def _quiet_single_process_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _save(path, **kw):
    dcp.save(_state(), storage_writer=spt.StorageWriter(path, chunk_bytes=16 << 10, **kw))


def test_save_load_roundtrip_single_process(tmp_path, savepoint_cli):
    path = str(tmp_path / "ckpt")
    _save(path)
    out = _state(fill=False)
    dcp.load(out, storage_reader=spt.StorageReader(path))
    _assert_equal(out, _state())
    # A native checkpoint: savepoint.load, the CLI's verify and inspect read it.
    flat = savepoint.load(path)
    assert torch.equal(torch.as_tensor(flat["model.w"]), _state()["model"]["w"])
    assert sorted(k for k in flat) == ["model.b", "model.ids", "model.w", "scalar", "sched.lr",
                                       "step"]
    subprocess.run([savepoint_cli, "verify", path], check=True, capture_output=True)
    shown = subprocess.run([savepoint_cli, "inspect", "--json", path], check=True,
                           capture_output=True, text=True).stdout
    assert "model.w" in shown
    # Committed atomically: nothing hidden is left beside it.
    assert os.listdir(tmp_path) == ["ckpt"]


def test_async_save(tmp_path):
    path = str(tmp_path / "ckpt")
    fut = dcp.async_save(_state(), storage_writer=spt.StorageWriter(path))
    fut.result()
    out = _state(fill=False)
    dcp.load(out, storage_reader=spt.StorageReader(path))
    _assert_equal(out, _state())


def test_existing_checkpoint_is_replaced_by_default_refused_without_overwrite(tmp_path):
    path = str(tmp_path / "ckpt")
    _save(path)
    _save(path)  # DCP's default: overwrite=True
    with pytest.raises(CheckpointException, match="Checkpoint already exists and"):
        _save(path, overwrite=False)  # (DCP's words)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    out = _state(fill=False)
    dcp.load(out, storage_reader=spt.StorageReader(path))
    _assert_equal(out, _state())


def test_file_system_writer_and_reader_arguments_are_taken(tmp_path):
    # FileSystemWriter's arguments, positionally and by name, with their meaning.
    w = spt.StorageWriter(tmp_path / "a", True, True, 3, 1 << 20, False, False)
    assert w.io_threads == 3 and w.overwrite is False
    assert spt.StorageWriter(tmp_path / "a").overwrite is True  # DCP's default
    w = spt.StorageWriter(tmp_path / "a", single_file_per_rank=False, sync_files=False,
                          thread_count=2, per_thread_copy_ahead=0)  # fmt: skip
    assert w.io_threads == 2 and w.thread_count == 2
    dcp.save(_state(), storage_writer=w)
    out = _state(fill=False)
    dcp.load(out, storage_reader=spt.StorageReader(tmp_path / "a", None))
    _assert_equal(out, _state())
    assert savepoint.verify(str(tmp_path / "a"))["chunks"] > 0  # checksummed, as always
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    spt.StorageWriter(tmp_path / "b", serialization_format=SerializationFormat.TORCH_SAVE)
    # What savepoint cannot honour is refused naming it (never a TypeError).
    for kwargs, match in [
        ({"thread_count": 2, "io_threads": 3}, "thread_count=2 and io_threads=3"),
        ({"thread_count": 0}, "thread_count must be an int >= 1"),
        ({"per_thread_copy_ahead": -1}, "per_thread_copy_ahead"),
        ({"_extensions": [object()]}, "_extensions"),
        ({"serialization_format": SerializationFormat.SAFETENSORS}, "serialization_format"),
    ]:
        with pytest.raises(savepoint.InvalidArgumentError, match=match):
            spt.StorageWriter(tmp_path / "b", **kwargs)
    with pytest.raises(savepoint.InvalidArgumentError, match="_extension_registry"):
        spt.StorageReader(tmp_path / "a", _extension_registry=object())
    from torch.distributed.checkpoint._extension import ExtensionRegistry

    spt.StorageReader(tmp_path / "a", _extension_registry=ExtensionRegistry())  # (nothing to do)
    assert not (tmp_path / "b").exists()


def test_async_save_with_a_cached_pinned_stage(tmp_path):
    writer = spt.StorageWriter(tmp_path / "a", cache_staged_state_dict=True, overwrite=True)
    for step in (1, 2):
        state = _state()
        state["step"] = step
        state["model"]["w"] += step
        dcp.async_save(state, storage_writer=writer).result()
        out = _state(fill=False)
        dcp.load(out, storage_reader=spt.StorageReader(tmp_path / "a"))
        _assert_equal(out, state)
    assert writer.state_dict_cache is not None  # one staged copy, reused


def test_empty_directory_is_a_target_and_overwrite_removes_nothing_else(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()  # as DCP's own tests save into tempfile.mkdtemp()
    _save(str(empty))
    out = _state(fill=False)
    dcp.load(out, storage_reader=spt.StorageReader(empty))
    _assert_equal(out, _state())
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointException, match="notes.txt"):
        _save(str(proj), overwrite=True)
    (empty / "keep.txt").write_text("mine too")  # beside a checkpoint's own files
    with pytest.raises(CheckpointException, match="keep.txt"):
        _save(str(empty), overwrite=True)
    with pytest.raises(savepoint.FailedPreconditionError, match="notes.txt"):
        savepoint.save({"w": torch.ones(2)}, proj, overwrite=True)
    assert (proj / "notes.txt").read_text() == "mine"
    assert (empty / "keep.txt").read_text() == "mine too"
    assert sorted(os.listdir(tmp_path)) == ["empty", "proj"]  # no debris


class _LosesItsTempDir(spt.StorageWriter):
    """A writer whose temporary directory vanishes before the ranks write (a failing rank)."""

    def write_data(self, plan, planner):
        parent = os.path.dirname(self.path)
        for name in os.listdir(parent):
            if name.startswith("."):
                shutil.rmtree(os.path.join(parent, name))
        return super().write_data(plan, planner)


def test_failed_write_commits_nothing(tmp_path):
    path = str(tmp_path / "ckpt")
    with pytest.raises(CheckpointException, match="rank 0"):
        dcp.save(_state(), storage_writer=_LosesItsTempDir(path))
    assert os.listdir(tmp_path) == []


def test_native_checkpoint_loads_through_dcp(tmp_path):
    """A checkpoint written by savepoint.save (values not from DCP) loads with dcp.load."""
    path = str(tmp_path / "native")
    w = torch.arange(12.0).reshape(3, 4)
    savepoint.save({"w": w, "step": 5, "name": "run"}, path)
    out = {"w": torch.zeros(3, 4), "step": 0, "name": ""}
    dcp.load(out, storage_reader=spt.StorageReader(path))
    assert torch.equal(out["w"], w) and out["step"] == 5 and out["name"] == "run"


def _flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def test_corrupt_chunk_fails_naming_it_where_dcp_alone_loads_garbage(tmp_path):
    ours = str(tmp_path / "ours")
    _save(ours)
    manifest = json.loads(savepoint._core.Reader.open(ours, 1, False).manifest_json())
    w = next(t for t in manifest["tensors"] if t["name"] == "model.w")
    shard = w["shards"][0]
    chunk = 2  # a byte inside the third 16 KiB chunk of model.w
    data = os.path.join(ours, manifest["files"][shard["file"]]["name"])
    _flip_byte(data, shard["offset"] + chunk * (16 << 10) + 100)
    with pytest.raises(CheckpointException) as e:
        dcp.load(_state(fill=False), storage_reader=spt.StorageReader(ours))
    msg = str(e.value)
    assert "model.w" in msg and "chunk 2" in msg and "CRC" in msg.upper(), msg

    # The contrast: DCP's own FileSystemWriter/Reader keep no checksum of tensor bytes, so the
    # same flipped byte loads silently as a wrong value.
    theirs = str(tmp_path / "theirs")
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(theirs))
    md = dcp.FileSystemReader(theirs).read_metadata()
    info = next(v for k, v in md.storage_data.items() if k.fqn == "model.w")
    _flip_byte(os.path.join(theirs, info.relative_path), info.offset + info.length // 2)
    out = _state(fill=False)
    dcp.load(out, storage_reader=dcp.FileSystemReader(theirs))
    assert not torch.equal(out["model"]["w"], _state()["model"]["w"])


def test_resharded_load_in_one_process(tmp_path):
    """Saved whole, loaded into boxes that cross the stored chunks (DCP's narrowing)."""
    path = str(tmp_path / "ckpt")
    _save(path)
    full = _state()["model"]["w"]
    out = {"model": {"w": torch.zeros(300, 70)}}
    dcp.load(out, storage_reader=spt.StorageReader(path))
    assert torch.equal(out["model"]["w"], full)


@pytest.mark.parametrize("save_world,load_worlds", [(4, (2, 3)), (2, (4,))])
def test_gloo_ranks_save_and_reshard(tmp_path, savepoint_cli, save_world, load_worlds):
    """DTensors over a 2-D (4 ranks) or 1-D mesh, a replicated plain tensor and values: dcp.save
    and dcp.async_save (DCP's thread and process executors) on `save_world` gloo ranks, dcp.load
    on other worlds and meshes."""
    root = str(tmp_path)
    r = run_python("dcp_ranks.py", "save", save_world, root, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    for name in ("sync", "async", "process"):
        subprocess.run([savepoint_cli, "verify", os.path.join(root, name)], check=True,
                       capture_output=True)
        files = sorted(f for f in os.listdir(os.path.join(root, name)) if f.endswith(".spd"))
        assert len(files) >= 2, files  # every rank with shards wrote its own file
    flat = savepoint.load(os.path.join(root, "sync"))
    g = torch.Generator().manual_seed(1234)
    assert torch.equal(torch.as_tensor(flat["model.weight"]), torch.randn(8, 6, generator=g))
    # Two row chunks of model.chunks per rank, interleaved: one tensor of 24 rows on disk.
    inspect = [savepoint_cli, "inspect", "--json", os.path.join(root, "sync")]
    shown = json.loads(subprocess.run(inspect, check=True, capture_output=True, text=True).stdout)
    chunks = [t for t in shown["tensors"] if t["name"] == "model.chunks"]
    assert [(c["shape"], c["shards"]) for c in chunks] == [([24, 3], 2 * save_world)]
    for world in load_worlds:
        r = run_python("dcp_ranks.py", "load", world, root, check=False)
        assert r.returncode == 0, r.stderr[-4000:]


def test_save_without_collectives_commits_one_checkpoint_per_rank(tmp_path, savepoint_cli):
    """dcp.save(..., use_collectives=False) on 2 gloo ranks: each rank commits its own
    checkpoint (rank-<r>, its boxes and where they lie), dcp.load reads each rank's back."""
    r = run_python("dcp_ranks.py", "solo", 2, tmp_path, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    root = tmp_path / "solo"
    assert sorted(os.listdir(root)) == ["rank-0", "rank-1"]
    for rank in range(2):
        subprocess.run([savepoint_cli, "verify", str(root / f"rank-{rank}")], check=True,
                       capture_output=True)
    flat = savepoint.load(root / "rank-1")
    # Rank 1 of 2 holds chunks 1 and 3 of model.chunks' four row chunks: rows 6-12 and 18-24.
    assert list(flat["model.chunks"].shape) == [6, 3]
    assert list(flat["model.chunks#box2"].shape) == [6, 3]


@pytest.mark.parametrize("boxes", [
    [1, 2],                                  # not a mapping
    {"w": "x"},                              # not a triple
    {"w": ["w", [4], [0, 0]]},               # global shape of another rank than the tensor
    {"w": ["w", [4, 3], [0, -1]]},           # a negative offset
    {"w": [3, [4, 3], [0, 0]]},              # the fqn is no string
    {"w": ["w", [4, 3], [0, True]]},         # a bool for an offset
    {"gone": ["w", [4, 3], [0, 0]]},         # names no stored tensor
])
def test_rank_checkpoint_whose_boxes_do_not_fit_is_corrupt(tmp_path, boxes):
    """A rank's own checkpoint (a save without collectives) whose DCP boxes do not fit its
    stored tensors: CorruptCheckpointError naming the checkpoint, nothing handed to DCP."""
    meta = {"torch.distributed.checkpoint": {"byte_io": [], "boxes": boxes}}
    savepoint.save({"w": torch.ones(2, 3)}, tmp_path / "ckpt" / "rank-0", metadata=meta)
    with pytest.raises(savepoint.CorruptCheckpointError, match="rank-0"):
        spt.StorageReader(tmp_path / "ckpt").read_metadata(rank=0)


def test_checkpoint_id_alone_uses_savepoint_after_install(tmp_path):
    spt.install()
    try:
        spt.install()  # (idempotent)
        dcp.save(_state(), checkpoint_id=str(tmp_path / "ours"))
        assert (tmp_path / "ours" / "MANIFEST").is_file()
        savepoint.verify(tmp_path / "ours")
        out = _state(fill=False)
        dcp.load(out, checkpoint_id=str(tmp_path / "ours"))
        _assert_equal(out, _state())
        fut = dcp.async_save(_state(), checkpoint_id=str(tmp_path / "async"))
        fut.result()
        assert (tmp_path / "async" / "MANIFEST").is_file()
        # A directory of DCP's own writer still loads by checkpoint_id alone.
        dcp.save(_state(), storage_writer=dcp.FileSystemWriter(str(tmp_path / "theirs")))
        out = _state(fill=False)
        dcp.load(out, checkpoint_id=str(tmp_path / "theirs"))
        _assert_equal(out, _state())
    finally:
        spt.uninstall()
    dcp.save(_state(), checkpoint_id=str(tmp_path / "after"))  # DCP's own writer again
    assert (tmp_path / "after" / ".metadata").is_file()
    assert not (tmp_path / "after" / "MANIFEST").exists()


@pytest.mark.parametrize("pinned_async", [False, True], ids=["plain", "pinned-async-staging"])
def test_async_save_with_dcps_default_stager(tmp_path, pinned_async):
    staging = pytest.importorskip("torch.distributed.checkpoint.staging")
    options = staging.StagingOptions(use_pinned_memory=pinned_async, use_shared_memory=False,
                                     use_async_staging=pinned_async,
                                     use_non_blocking_copy=False)  # fmt: skip
    stager = staging.DefaultStager(options)
    try:
        path = tmp_path / "staged"
        response = dcp.async_save(_state(), storage_writer=spt.StorageWriter(path),
                                  async_stager=stager)  # fmt: skip
        getattr(response, "upload_completion", response).result()
    finally:
        stager.close()
    savepoint.verify(path)
    out = _state(fill=False)
    dcp.load(out, storage_reader=spt.StorageReader(path))
    _assert_equal(out, _state())
