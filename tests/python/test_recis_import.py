"""Import of RecIS checkpoint directories (`savepoint convert --from recis`,
savepoint.recis.import_checkpoint): directories built at test time in the layout RecIS's Saver
writes (csrc/serialize: name.cc, save_bundle.cc, write_block.cc, table_writer.cc, index_info.cc,
embedding/slice_info.cc; recis/framework/checkpoint_manager.py), with 2 and 3 writer shards,
tables of F32 and BF16 slots, dense tensors, model.pt and extra.pt; every row compared with the
source, loaded whole and into another number of shards; hostile directories refused naming the
file and block."""

import collections
import json
import os
import struct
import subprocess

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import savepoint  # noqa: E402
from savepoint import recis  # noqa: E402

_CODES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.float16: "F16"}
_SLICES = 65536


# ------------------------------------------------------------------ writing RecIS's layout


def _raw(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _write_like_recis(path, blocks):
    """A safetensors file as RecIS's TableWriter writes it: the header is the blocks in write
    order (compact JSON, no __metadata__) padded with 1-8 spaces to a multiple of 8."""
    header, offset = {}, 0
    for name, t in blocks:
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}  # fmt: skip
        offset += n
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (8 - len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, t in blocks:
            f.write(_raw(t))


def _slice_string(begin, end):
    """RecIS SliceInfo::ToString: begin@end@size, begin and end zero-padded to size's width."""
    w = len(str(_SLICES))
    return f"{begin:0{w}d}@{end:0{w}d}@{_SLICES}"


def write_recis_checkpoint(path, tables, dense, shard_num, parallel, writer="recis"):
    """A RecIS checkpoint directory: tables {name: (ids, {slot: rows})} split over shard_num
    shards by RecIS's slice partition, dense {name: tensor} (written by shard 0), blocks dealt
    round-robin over `parallel` writers per shard (SaveBundle::AddBlock), data files
    model-%06d-of-%06d.safetensors, the merged `index`, tensorkey.json, model.pt and extra.pt."""
    os.makedirs(path, exist_ok=True)
    file_index, block_index, tensorkey = {}, {}, {}
    for s in range(shard_num):
        begin, end = savepoint.gen_slice(s, shard_num)
        blocks = []
        for name, (ids, slots) in tables.items():
            mask = ((ids % _SLICES) >= begin) & ((ids % _SLICES) < end)
            for slot, rows in [("id", ids)] + list(slots.items()):
                part = f"{name}.{slot}/part_{s}_{shard_num}"  # '@' -> '.', + "/part_<i>_<n>"
                tensorkey[part] = f"{name}@{slot}^{_slice_string(begin, end)}"
                blocks.append((part, rows[mask].contiguous()))
        if s == 0:
            blocks += [(f"{name}^ ", t) for name, t in dense.items()]
        writers = [[] for _ in range(parallel)]
        for i, b in enumerate(blocks):
            writers[i % parallel].append(b)
        shard_files = {}
        for w, wblocks in enumerate(writers):
            if not wblocks:
                continue  # an empty writer writes no file
            fname = f"model-{s * parallel + w:06d}-of-{parallel * shard_num:06d}.safetensors"
            if writer == "recis":
                _write_like_recis(os.path.join(path, fname), wblocks)
            else:
                safetensors_torch.save_file(dict(wblocks), os.path.join(path, fname))
            shard_files[fname] = len(file_index) + len(shard_files)  # IndexInfo::MergeFrom
            for name, _ in wblocks:
                block_index[name] = shard_files[fname]
        file_index.update(shard_files)
    with open(os.path.join(path, "index"), "w") as f:
        json.dump({"file_index": file_index, "block_index": block_index}, f, sort_keys=True)
    with open(os.path.join(path, "tensorkey.json"), "w") as f:
        json.dump(tensorkey, f, indent=4)
    with open(os.path.join(path, "torch_rank_weights_embs_table_multi_shard.json"), "w") as f:
        f.write("{}")


def _source(seed, rows=300):
    g = torch.Generator().manual_seed(seed)

    def unique_ids(low, high, n):  # shuffled, negative ones too
        ids = torch.unique(torch.randint(low, high, (2 * n,), generator=g))[:n]
        return ids[torch.randperm(n, generator=g)]

    ids, ids2 = unique_ids(-(1 << 62), 1 << 62, rows), unique_ids(0, 1 << 20, rows // 2)
    tables = {
        "user_emb": (ids, {"embedding": torch.randn(rows, 8, generator=g),
                           "exp_avg": torch.randn(rows, 8, generator=g),
                           "exp_avg_sq": torch.rand(rows, 8, generator=g)}),
        "item.emb": (ids2, {"embedding": torch.randn(rows // 2, 4, generator=g).bfloat16(),
                            "accum": torch.randn(rows // 2, 4, generator=g).bfloat16()}),
    }  # fmt: skip
    dense = {"sparse_optim.step": torch.tensor(17.0), "bias": torch.randn(3, generator=g)}
    model = collections.OrderedDict(
        [("mlp.0.weight", torch.randn(4, 8, generator=g)), ("mlp.0.bias", torch.zeros(4))])
    return tables, dense, model


def _make(path, seed, shard_num, parallel, writer="recis"):
    tables, dense, model = _source(seed)
    write_recis_checkpoint(path, tables, dense, shard_num, parallel, writer)
    torch.save(model, os.path.join(path, "model.pt"))
    torch.save({"global_step": 40, "sched": {"lr": torch.tensor(0.5)}},
               os.path.join(path, "extra.pt"))  # fmt: skip
    for r in range(shard_num):  # the Saver's IO states: one file per worker, and their count
        torch.save({"train": {"pos": 100 + r}}, os.path.join(path, f"io_state_{r}.pt"))
    with open(os.path.join(path, "io_state_count"), "w") as f:
        f.write(str(shard_num))
    return tables, dense, model


# ------------------------------------------------------------------ checking


def _bits(t):
    return t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t


def _rows(table):
    """{slot: {id: row}} of a loaded SparseTable."""
    ids = [int(i) for i in table.ids]
    return {s: {i: _bits(r[k]).tolist() for k, i in enumerate(ids)} for s, r in table.slots.items()}


def _check_tables(loaded, tables):
    assert sorted(loaded) == sorted(tables)
    for name, (ids, slots) in tables.items():
        got = _rows(loaded[name])
        assert sorted(got) == sorted(slots)
        for slot, rows in slots.items():
            assert loaded[name].slots[slot].dtype == rows.dtype
            want = {int(i): _bits(rows[k]).tolist() for k, i in enumerate(ids)}
            assert got[slot] == want, (name, slot)


def _check_reshard(dst, tables, shard_num):
    seen = {name: set() for name in tables}
    for s in range(shard_num):
        part = savepoint.load_tables(dst, shard_id=s, shard_num=shard_num, framework="pt")
        begin, end = savepoint.gen_slice(s, shard_num)
        for name, t in part.items():
            ids = [int(i) for i in t.ids]
            assert all(begin <= i % _SLICES < end for i in ids)
            want = dict(zip([int(i) for i in tables[name][0]], range(len(tables[name][0]))))
            for slot, rows in t.slots.items():
                for k, i in enumerate(ids):
                    assert _bits(rows[k]).tolist() == _bits(tables[name][1][slot][want[i]]).tolist()
            seen[name] |= set(ids)
    for name, (ids, _) in tables.items():
        assert seen[name] == {int(i) for i in ids}


def _convert(cli, *args, check=True):
    return subprocess.run([cli, "convert", *map(str, args)], check=check, capture_output=True,
                          text=True)  # fmt: skip


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("shard_num,parallel,writer,explicit", [
    (2, 2, "recis", False), (3, 1, "safetensors", True), (3, 2, "recis", True)])  # fmt: skip
def test_convert_every_row(tmp_path, savepoint_cli, shard_num, parallel, writer, explicit):
    src, dst = tmp_path / "ckpt_100", tmp_path / "out"
    tables, dense, _ = _make(src, 7 + shard_num, shard_num, parallel, writer)
    out = _convert(savepoint_cli, src, dst, *(["--from", "recis"] if explicit else []))
    assert "(recis)" in out.stdout and "2 sparse tables" in out.stdout, out.stdout
    assert "skipped model.pt: torch pickle" in out.stdout
    assert "skipped io_state_0.pt" in out.stdout
    subprocess.run([savepoint_cli, "verify", dst], check=True, capture_output=True)
    _check_tables(savepoint.load_tables(dst, framework="pt"), tables)
    _check_reshard(dst, tables, 1)
    _check_reshard(dst, tables, 5 - shard_num)  # another shard count (3 or 2)
    loaded = savepoint.load(dst)
    for name, t in dense.items():
        assert loaded[name].tolist() == t.tolist()
    meta = savepoint.info(dst)["metadata"]["recis"]
    assert meta["shard_num"] == shard_num and any(s.startswith("extra.pt") for s in meta["skipped"])


def test_fixture_files_are_safetensors(tmp_path):
    """The RecIS-style writer's files read back with the real safetensors package."""
    src = tmp_path / "src"
    tables, dense, _ = _make(src, 9, 2, 2)
    names = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            names.update(_load_file(src / f))
    assert sorted(names) == sorted(_index(src)["block_index"])
    assert torch.equal(names["bias^ "], dense["bias"])
    assert names["item.emb.embedding/part_1_2"].dtype == torch.bfloat16


def test_convert_follows_checkpoint_list(tmp_path, savepoint_cli):
    root = tmp_path / "out_dir"
    _make(root / "ckpt_10", 1, 2, 1)
    tables, _, _ = _make(root / "ckpt_20", 2, 2, 1)
    (root / "checkpoint").write_text("ckpt_10\nckpt_20\n")
    out = _convert(savepoint_cli, root, tmp_path / "dst", "--from", "recis")
    assert "ckpt_20 (the newest listed)" in out.stdout
    _check_tables(savepoint.load_tables(tmp_path / "dst", framework="pt"), tables)


def test_python_import_adds_model_and_extra(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tables, dense, model = _make(src, 3, 3, 2)
    report = recis.import_checkpoint(src, dst)
    assert report["tables"] == 2 and report["shard_num"] == 3
    assert report["rows"] == sum(len(ids) for ids, _ in tables.values())
    assert not any(s.startswith(("model.pt", "extra.pt", "io_state")) for s in report["skipped"])
    got = savepoint.load(dst)
    _check_tables(got["sparse"], tables)
    assert list(got["dense"]) == list(model)
    for k, v in model.items():
        assert torch.equal(got["dense"][k], v)
    for k, v in dense.items():
        assert got["tensors"][k].tolist() == v.tolist()
    assert got["extra"]["global_step"] == 40
    assert float(got["extra"]["sched"]["lr"]) == 0.5
    part = savepoint.load(dst, shard_id=1, shard_num=2)
    b, e = savepoint.gen_slice(1, 2)
    assert all(b <= int(i) % _SLICES < e for i in part["sparse"]["user_emb"].ids)


def _load_io_state(rank, n, dst):
    from test_recis import Model, Reader

    saver = recis.Saver(Model(9), output_dir=os.path.dirname(dst))
    reader = Reader()
    saver.register_io_state("train", reader)
    saver.load(dst, load_conf={"load": ["io_state"]}, shard_id=rank, direct_path=True)
    return reader.pos


def test_python_import_gives_each_worker_its_io_state(tmp_path):
    """Imported IO states load as the Saver's own: each of the 3 workers gets its file's."""
    from test_torch_distributed import run_ranks, values

    src, dst = tmp_path / "src", tmp_path / "out" / "dst"
    _make(src, 5, 3, 1)
    report = recis.import_checkpoint(src, dst)
    assert not any(s.startswith("io_state") for s in report["skipped"]), report
    assert sorted(values(run_ranks(tmp_path, 3, _load_io_state, str(dst)))) == [100, 101, 102]
    one = tmp_path / "one"  # one worker: its dict as the Saver of one worker stores it
    _make(one, 6, 1, 1)
    recis.import_checkpoint(one, tmp_path / "one-dst")
    assert savepoint.load(tmp_path / "one-dst")["io_state"] == {"train": {"pos": 100}}


@pytest.mark.parametrize("damage,line", [
    ("missing", "io_state_2.pt: missing"), ("count", "io_state_count: not a worker count"),
    ("unsafe", "io_state_1.pt: not readable"), ("mismatch", "io_state_count: 2 workers"),
    ("unsavable", "io_state_count: an IO state: holds what")])  # fmt: skip
def test_python_import_leaves_out_io_states_it_cannot_use(tmp_path, damage, line):
    src = tmp_path / "src"
    _make(src, 8, 3, 1)
    if damage == "missing":
        os.remove(src / "io_state_2.pt")
    elif damage == "count":
        (src / "io_state_count").write_text("99999999999")
    elif damage == "unsafe":
        torch.save({"train": _Opaque()}, src / "io_state_1.pt")
    elif damage == "unsavable":  # loadable, but a set is not a checkpoint leaf
        torch.save({"train": {1, 2}}, src / "io_state_1.pt")
    else:
        (src / "io_state_count").write_text("2")
    report = recis.import_checkpoint(src, tmp_path / "dst")
    assert [s for s in report["skipped"] if s.startswith("io_state")][0].startswith(line), report
    assert "io_state" not in savepoint.load(tmp_path / "dst")
    report = recis.import_checkpoint(src, tmp_path / "dst2", io_state=False)
    assert "io_state" not in savepoint.load(tmp_path / "dst2")


class _Opaque:
    """A class torch.load(weights_only=True) refuses to build."""


def test_python_import_refuses_unsafe_model_pt(tmp_path):
    src = tmp_path / "src"
    _make(src, 4, 2, 1)
    torch.save({"f": _Opaque()}, src / "model.pt")
    with pytest.raises(savepoint.InvalidArgumentError, match="model.pt"):
        recis.import_checkpoint(src, tmp_path / "dst")
    report = recis.import_checkpoint(src, tmp_path / "dst2", model=False)
    assert any(s.startswith("model.pt") for s in report["skipped"])
    torch.save({"odd": {1, 2}}, src / "extra.pt")  # loadable, but a set is not a checkpoint leaf
    report = recis.import_checkpoint(src, tmp_path / "dst3", model=False)
    assert any(s.startswith("extra.pt: holds what") for s in report["skipped"]), report
    assert "extra" not in savepoint.load(tmp_path / "dst3")


def test_non_native_target_refused(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 5, 2, 1)
    out = _convert(savepoint_cli, src, tmp_path / "x.safetensors", check=False)
    assert out.returncode != 0 and "sparse tables" in out.stderr, out.stderr


# ------------------------------------------------------------------ hostile directories


def _load_file(path):
    """The tensors of a safetensors file, copied (it is about to be rewritten: no mapping)."""
    return {n: t.clone() for n, t in safetensors_torch.load_file(str(path)).items()}


def _index(src):
    with open(src / "index") as f:
        return json.load(f)


def _write_index(src, index):
    with open(src / "index", "w") as f:
        json.dump(index, f)


def _first_file(src):
    return sorted(_index(src)["file_index"])[0]


def _refused(cli, src, tmp_path, *needles):
    out = _convert(cli, src, tmp_path / "dst", "--from", "recis", check=False)
    assert out.returncode != 0, out.stdout
    for n in needles:
        assert n in out.stderr, (n, out.stderr)
    assert not (tmp_path / "dst").exists()
    return out.stderr


def test_truncated_data_file(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 6, 2, 1)
    f = src / _first_file(src)
    f.write_bytes(f.read_bytes()[:-100])
    _refused(savepoint_cli, src, tmp_path, f.name)


def test_index_names_missing_file(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 6, 2, 2)
    os.remove(src / _first_file(src))
    _refused(savepoint_cli, src, tmp_path, _first_file(src), "named by block")


@pytest.mark.parametrize("name", ["../evil.safetensors", "/etc/passwd", "..", "a/b.safetensors"])
def test_path_traversal_in_index(tmp_path, savepoint_cli, name):
    src = tmp_path / "src"
    _make(src, 6, 2, 1)
    index = _index(src)
    first = _first_file(src)
    index["file_index"][name] = index["file_index"].pop(first)
    _write_index(src, index)
    _refused(savepoint_cli, src, tmp_path, json.dumps(name), "not a file name")


def test_path_traversal_in_checkpoint_list(tmp_path, savepoint_cli):
    root = tmp_path / "root"
    _make(tmp_path / "elsewhere", 6, 2, 1)
    root.mkdir()
    (root / "checkpoint").write_text("../elsewhere\n")
    _refused(savepoint_cli, root, tmp_path, '"../elsewhere"', "not a checkpoint name")


def test_block_missing_from_its_file(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 6, 2, 1)
    index = _index(src)
    index["block_index"]["ghost^ "] = 0
    _write_index(src, index)
    _refused(savepoint_cli, src, tmp_path, '"ghost^ "', "missing")


def test_rows_disagree_with_id_block(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    src.mkdir()
    blocks = [("user_emb.id/part_0_1", torch.tensor([1, 2, 3])),
              ("user_emb.embedding/part_0_1", torch.zeros(3, 4)),
              ("user_emb.exp_avg/part_0_1", torch.zeros(2, 4))]  # one row short  # fmt: skip
    fname = "model-000000-of-000001.safetensors"
    _write_like_recis(src / fname, blocks)
    _write_index(src, {"file_index": {fname: 0}, "block_index": {n: 0 for n, _ in blocks}})
    _refused(savepoint_cli, src, tmp_path, '"user_emb.exp_avg/part_0_1"', "has 3 rows")


def test_dtype_differs_between_shards(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 6, 2, 1)
    # Rewrite shard 1's file with an F16 embedding.
    index = _index(src)
    fname = [f for f, n in index["file_index"].items() if n == 1][0]
    blocks = list(_load_file(src / fname).items())
    blocks = [(n, t.half() if n == "user_emb.embedding/part_1_2" else t) for n, t in blocks]
    _write_like_recis(src / fname, blocks)
    _refused(savepoint_cli, src, tmp_path, '"user_emb.embedding/part_1_2"', "F16", "F32")


def test_duplicate_id_across_shards(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    g = torch.Generator().manual_seed(1)
    ids = torch.tensor([5, 9, 5 + _SLICES // 2 + 1, 70000])
    write_recis_checkpoint(src, {"t": (ids, {"embedding": torch.randn(4, 2, generator=g)})}, {},
                           2, 1)  # fmt: skip
    # Shard 1's id block gets shard 0's id 5.
    index = _index(src)
    fname = [f for f, n in index["file_index"].items() if n == 1][0]
    blocks = _load_file(src / fname)
    blocks["t.id/part_1_2"] = blocks["t.id/part_1_2"].clone()
    blocks["t.id/part_1_2"][0] = 5
    _write_like_recis(src / fname, list(blocks.items()))
    _refused(savepoint_cli, src, tmp_path, "id 5 is in block", '"t.id/part_0_2"', '"t.id/part_1_2"')


def test_bad_slice_string(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 6, 2, 1)
    with open(src / "tensorkey.json") as f:
        keys = json.load(f)
    keys["user_emb.id/part_0_2"] = "user_emb@id^32768@00000@65536"
    with open(src / "tensorkey.json", "w") as f:
        json.dump(keys, f)
    _refused(savepoint_cli, src, tmp_path, '"user_emb.id/part_0_2"', "bad slice")


def test_missing_shard(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 6, 3, 1)
    index = _index(src)
    index["block_index"] = {b: n for b, n in index["block_index"].items() if "part_2_3" not in b}
    _write_index(src, index)
    _refused(savepoint_cli, src, tmp_path, "shard 2 of 3 has no id block")


def test_malformed_index(tmp_path, savepoint_cli):
    src = tmp_path / "src"
    _make(src, 6, 2, 1)
    (src / "index").write_text('{"file_index": {"x": 0}, "block_index": [')
    _refused(savepoint_cli, src, tmp_path, "index", "not valid JSON")
