"""transform_checkpoints(..., output_format="safetensors") against the real MindSpore (2.10, CPU).

MindSpore writes safetensors only from safetensors sources (with .ckpt sources it raises
ValueError); savepoint reads .ckpt sources and writes what MindSpore's safetensors transform
writes from the same data: rank_N/{prefix}N.safetensors, `__metadata__` {"format": "ms"}, the
reference writer's tensor order, equal headers and tensor bytes. Except: MindSpore 2.10's
safetensors transform mis-slices a bfloat16 tensor split along a dim other than the first (it
copies the slice's element count from the start of the row-major buffer: a MindSpore bug), so the
bfloat16 tensors are compared with savepoint's .ckpt output, which equals MindSpore's .ckpt
transform (test_transform.py). Fixtures are test_transform.py's: the same whole model is cut by
MindSpore into .ckpt and into safetensors sources."""
import json
import os

import mindspore as ms
import pytest
from mindspore.parallel import transform_checkpoints as ms_transform
from test_transform import DP2MP4, MP4, MP8, contents, source, whole_model, write_strategy

from savepoint import mindspore as spms


def st_source(tmp_path, layouts, strategy):
    """The whole model of test_transform.whole_model, saved by MindSpore as safetensors and cut
    into `layouts` (whose strategy file is `strategy`) by MindSpore's safetensors transform."""
    whole = whole_model(tmp_path / "st_whole_ckpt")
    params = ms.load_checkpoint(os.path.join(whole, "rank_0", "whole.ckpt"))
    (tmp_path / "st_whole" / "rank_0").mkdir(parents=True)
    ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()],
                       str(tmp_path / "st_whole" / "rank_0" / "whole.safetensors"),
                       format="safetensors")  # fmt: skip
    ms_transform(str(tmp_path / "st_whole"), str(tmp_path / "st_src"), "src", None, strategy,
                 output_format="safetensors")  # fmt: skip
    return str(tmp_path / "st_src")


# (source layout, destination layout or None for a merge, tag)
CASES = [(DP2MP4, MP4, "optshard_to_4"), (MP8, DP2MP4, "flat_to_optshard"), (MP8, None, "merge")]


def ms_reference(tmp_path, src_l, dst_l):
    """What the tests share: the source layout's .ckpt rank files and strategy file (source), the
    destination strategy file, the same model cut by MindSpore into safetensors rank files
    (st_source), and MindSpore's safetensors transform of those into tmp_path/ms. Returns
    (.ckpt source dir, source strategy, destination strategy, safetensors source dir)."""
    src_dir, src = source(tmp_path, src_l)
    dst = write_strategy(tmp_path / "dst.ckpt", dst_l) if dst_l else None
    st_dir = st_source(tmp_path, src_l, src)
    ms_transform(st_dir, str(tmp_path / "ms"), "dst", src, dst, output_format="safetensors")
    return src_dir, src, dst, st_dir


def st_file(path):
    """(header as ordered pairs, {tensor: bytes}) of a safetensors file; header padding aside."""
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    header = json.loads(b[8:8 + n], object_pairs_hook=list)
    data = {}
    for name, info in header:
        if name != "__metadata__":
            begin, end = dict(info)["data_offsets"]
            data[name] = b[8 + n + begin:8 + n + end]
    return header, data


def st_tree(root):
    return {os.path.relpath(os.path.join(d, f), root): st_file(os.path.join(d, f))
            for d, _, fs in os.walk(root) for f in fs if f.endswith(".safetensors")}  # fmt: skip


@pytest.mark.parametrize("src_l,dst_l,tag", CASES)
def test_safetensors_output_matches_mindspore(tmp_path, src_l, dst_l, tag):
    src_dir, src, dst, _ = ms_reference(tmp_path, src_l, dst_l)
    spms.transform_checkpoints(src_dir, str(tmp_path / "sp"), "dst", src, dst,
                               output_format="safetensors")  # fmt: skip
    spms.transform_checkpoints(src_dir, str(tmp_path / "ck"), "dst", src, dst)
    want, got = st_tree(tmp_path / "ms"), st_tree(tmp_path / "sp")
    assert sorted(got) == sorted(want) and want
    for k in want:
        assert got[k][0] == want[k][0], k
        ckpt = contents(tmp_path / "ck" / k.replace(".safetensors", ".ckpt"))
        for name, data in got[k][1].items():
            if ckpt[name][0] == "BFloat16":
                assert data == ckpt[name][2], (k, name)
            else:
                assert data == want[k][1][name], (k, name)
    # By rank: the same file; the format follows the name's extension.
    files = {r: os.path.join(src_dir, f"rank_{r}", f"src{r}.ckpt") for r in range(8)}
    out = tmp_path / "one.safetensors"
    spms.transform_checkpoint_by_rank(0, files, str(out), src, dst)
    assert st_file(out) == got[os.path.join("rank_0", "dst0.safetensors")]


def test_safetensors_output_loads_in_mindspore_and_refuses_bad_formats(tmp_path):
    src_dir, src = source(tmp_path, MP8)
    dst = write_strategy(tmp_path / "dst.ckpt", MP4)
    # MindSpore's positional order: process_num, then output_format.
    spms.transform_checkpoints(src_dir, str(tmp_path / "sp"), "d", src, dst, 2, "safetensors")
    spms.transform_checkpoints(src_dir, str(tmp_path / "ck"), "d", src, dst)
    for r in range(4):
        a = ms.load_checkpoint(str(tmp_path / "sp" / f"rank_{r}" / f"d{r}.safetensors"),
                               format="safetensors")  # fmt: skip
        b = ms.load_checkpoint(str(tmp_path / "ck" / f"rank_{r}" / f"d{r}.ckpt"))
        assert sorted(a) == sorted(b)
        for k in a:
            assert a[k].asnumpy().tobytes() == b[k].asnumpy().tobytes(), k
    with pytest.raises(ValueError):
        spms.transform_checkpoints(src_dir, str(tmp_path / "x"), "d", src, dst,
                                   output_format="pickle")  # fmt: skip
    with pytest.raises(ValueError, match="process_num"):
        spms.transform_checkpoints(src_dir, str(tmp_path / "x"), "d", src, dst, 0)
    with pytest.raises(Exception, match="does not end in .safetensors"):
        spms.transform_checkpoint_by_rank(0, {0: "a.ckpt"}, str(tmp_path / "y.ckpt"), src, dst,
                                          output_format="safetensors")  # fmt: skip


def st_as_ckpt(st_dir, out_dir):
    """The safetensors rank files of `st_dir` saved again by MindSpore as .ckpt files (the same
    tensors) under `out_dir`."""
    for d in sorted(os.listdir(st_dir)):
        (out_dir / d).mkdir(parents=True)
        for f in os.listdir(os.path.join(st_dir, d)):
            params = ms.load_checkpoint(os.path.join(st_dir, d, f), format="safetensors")
            ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()],
                               str(out_dir / d / f.replace(".safetensors", ".ckpt")))  # fmt: skip
    return str(out_dir)


@pytest.mark.parametrize("src_l,dst_l,tag", CASES)
def test_safetensors_sources_transform_as_mindspore_does(tmp_path, src_l, dst_l, tag):
    """A distributed checkpoint MindSpore saved as safetensors files (rank_N/*.safetensors) is a
    source like a .ckpt one (before, savepoint refused it: "no rank_N directory with a .ckpt
    file"). The output equals MindSpore's transform of the same safetensors sources, header and
    bytes, except the bfloat16 tensors MindSpore mis-slices (see the module docstring); every
    tensor, bfloat16 included, equals savepoint's transform of the same tensors saved as .ckpt."""
    _, src, dst, st_dir = ms_reference(tmp_path, src_l, dst_l)
    spms.transform_checkpoints(st_dir, str(tmp_path / "sp"), "dst", src, dst,
                               output_format="safetensors")  # fmt: skip
    ck_dir = st_as_ckpt(st_dir, tmp_path / "st_as_ckpt")
    spms.transform_checkpoints(ck_dir, str(tmp_path / "via_ckpt"), "dst", src, dst,
                               output_format="safetensors")  # fmt: skip
    want, got = st_tree(tmp_path / "ms"), st_tree(tmp_path / "sp")
    via_ckpt = st_tree(tmp_path / "via_ckpt")
    assert sorted(got) == sorted(want) == sorted(via_ckpt) and want
    for k in want:
        assert got[k] == via_ckpt[k], k
        assert got[k][0] == want[k][0], k
        for name, data in got[k][1].items():
            if dict(dict(got[k][0])[name])["dtype"] != "BF16":
                assert data == want[k][1][name], (k, name)
