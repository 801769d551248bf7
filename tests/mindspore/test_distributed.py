"""MindSpore distributed checkpoints without an offline step, against the real MindSpore (2.10,
CPU): savepoint.mindspore.load_distributed gives a destination rank exactly what MindSpore's own
transform_checkpoints writes for it, and any layout's boxes exactly the slices of MindSpore's own
merge. Fixtures (strategies, sources cut by MindSpore) come from test_transform.py."""
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore.parallel import transform_checkpoints as ms_transform

from savepoint import _errors
from savepoint import mindspore as spms

from test_transform import DP8, DP2MP4, MP4, MP8, STAGE0, STAGE1, contents, merged_pipeline, \
    source, whole_model, write_strategy  # fmt: skip


def as_bytes(arrays):
    return {k: (tuple(np.shape(v)), np.ascontiguousarray(v).tobytes()) for k, v in arrays.items()}


def ms_files(root):
    """{rank: contents} of MindSpore's transform output root/rank_N/*.ckpt (no _part files)."""
    out = {}
    for d in os.listdir(root):
        files = sorted(f for f in os.listdir(os.path.join(root, d)) if f.endswith(".ckpt"))
        out[int(d[5:])] = contents(os.path.join(root, d, files[-1]))
    return out


def ms_arrays(path):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items()}


def strip(c):
    return {k: (shape, data) for k, (_, shape, data) in c.items()}


@pytest.mark.parametrize("src_l,dst_l", [(DP2MP4, MP4), (MP8, DP2MP4)])
def test_rank_form_equals_mindspores_transform(tmp_path, src_l, dst_l):
    src_dir, src = source(tmp_path, src_l)
    dst = write_strategy(tmp_path / "dst.ckpt", dst_l)
    ms_transform(src_dir, str(tmp_path / "ms"), "d", src, dst)
    for rank, want in ms_files(tmp_path / "ms").items():
        got = spms.load_distributed(src_dir, src, rank_id=rank, dst_strategy_file=dst)
        assert as_bytes(got) == strip(want), rank


def test_rank_form_into_a_pipeline_and_from_one(tmp_path):
    merged, _ = merged_pipeline(tmp_path)
    src_dir, src = source(tmp_path, MP8)
    ms_transform(src_dir, str(tmp_path / "ms_pp"), "d", src, merged)
    for rank, want in ms_files(tmp_path / "ms_pp").items():
        got = spms.load_distributed(src_dir, src, rank_id=rank, dst_strategy_file=merged)
        assert as_bytes(got) == strip(want), rank
    # From the 2 x 4 pipeline back to the whole model (dst None: not split).
    ms_transform(src_dir, str(tmp_path / "pp"), "s", src, merged)
    ms_transform(str(tmp_path / "pp"), str(tmp_path / "ms_whole"), "w", merged, None)
    got = spms.load_distributed(str(tmp_path / "pp"), merged, rank_id=0)
    assert as_bytes(got) == strip(ms_files(tmp_path / "ms_whole")[0])


def test_layout_form_equals_slices_of_mindspores_merge(tmp_path):
    src_dir, src = source(tmp_path, DP2MP4)
    ms_transform(src_dir, str(tmp_path / "ms_whole"), "w", src, None)
    whole = ms_arrays(tmp_path / "ms_whole" / "rank_0" / "w0.ckpt")
    # Rank 1 of 3, a layout MindSpore cannot express: uneven thirds along another dim.
    layout = {"w1": ((16, 8), (0, 2), (16, 3)), "w2": ((8, 16), (2, 0), (3, 16)),
              "adam_m.w1": ((16, 8), (5, 0), (6, 8)), "b": ((16,), (0,), (16,))}  # fmt: skip
    got = spms.load_distributed(src_dir, src, layout=layout)
    assert sorted(got) == sorted(layout)
    for name, (_, off, size) in layout.items():
        want = whole[name][tuple(slice(o, o + s) for o, s in zip(off, size))]
        assert got[name].dtype.itemsize == whole[name].dtype.itemsize
        assert np.ascontiguousarray(want).tobytes() == got[name].tobytes(), name


def test_layout_form_from_a_pipeline_source(tmp_path):
    merged, _ = merged_pipeline(tmp_path)
    whole_dir = whole_model(tmp_path / "whole")
    ms_transform(whole_dir, str(tmp_path / "pp"), "s", None, merged)
    whole = ms_arrays(os.path.join(whole_dir, "rank_0", "whole.ckpt"))
    layout = {"w1": ((16, 8), (4, 0), (8, 8)), "b": ((16,), (3,), (7,)),
              "global_step": ((1,), (0,), (1,))}  # fmt: skip
    got = spms.load_distributed(str(tmp_path / "pp"), merged, layout=layout)
    for name, (_, off, size) in layout.items():
        want = whole[name][tuple(slice(o, o + s) for o, s in zip(off, size))]
        assert np.ascontiguousarray(want).tobytes() == got[name].tobytes(), name


def test_errors_name_the_parameter(tmp_path):
    src_dir, src = source(tmp_path, MP8)
    with pytest.raises(_errors.InvalidArgumentError, match='"w1"'):
        spms.load_distributed(src_dir, src, layout={"w1": ((16, 9), (0, 0), (16, 9))})
    with pytest.raises(_errors.NotFoundError, match='"nope"'):
        spms.load_distributed(src_dir, src, layout={"nope": ((1,), (0,), (1,))})
    with pytest.raises(ValueError):
        spms.load_distributed(src_dir, src)
    with pytest.raises(_errors.InvalidArgumentError, match="ranks"):
        spms.load_distributed(src_dir, src, rank_id=8, dst_strategy_file=src)


def ms_assignment(strategy_file, ranks, initial_rank=0):
    """{rank: names} MindSpore's remove_redundancy saves (mindspore/train/_utils.py)."""
    from mindspore.train._utils import get_parameter_redundancy, remove_param_redundancy
    redundancy = get_parameter_redundancy(strategy_file, initial_rank=initial_rank)
    single = remove_param_redundancy(redundancy)
    return {r: set(single.get(r, ())) for r in ranks}, set(redundancy)


def check_redundancy_free(tmp_path, src_dir, strategy, ranks, initial_rank=0, tag="rr"):
    want, laid_out = ms_assignment(strategy, ranks, initial_rank)
    seen = []
    for r in ranks:
        local = ms.load_checkpoint(os.path.join(src_dir, f"rank_{r}", f"src{r}.ckpt"))
        local = {k: v for k, v in local.items() if k in laid_out or not k.startswith(("0-", "1-"))}
        out = tmp_path / tag / f"rank_{r}" / f"r{r}.ckpt"
        spms.save_checkpoint_without_redundancy(local, out, strategy, r)
        got = contents(out)
        assert set(got) == want[r] | (set(local) - laid_out), r
        for k, (_, shape, data) in got.items():
            assert data == local[k].asnumpy().tobytes(), (r, k)
        seen += [k for k in got if k in laid_out]
    return seen


@pytest.mark.parametrize("layouts", [DP8, DP2MP4, MP8], ids=["dp8", "dp2mp4", "mp8"])
def test_redundancy_free_matches_mindspores_assignment(tmp_path, layouts):
    src_dir, src = source(tmp_path, layouts)
    seen = check_redundancy_free(tmp_path, src_dir, src, range(8))
    # Every parameter's every distinct slice is saved by exactly one rank of its group.
    assert set(seen) == set(layouts)


def test_redundancy_free_per_pipeline_stage(tmp_path):
    merged, _ = merged_pipeline(tmp_path)
    whole_dir = whole_model(tmp_path / "whole")
    ms_transform(whole_dir, str(tmp_path / "pp"), "src", None, merged)
    for stage, layouts in ((0, STAGE0), (1, STAGE1)):
        own = write_strategy(tmp_path / f"stage{stage}.ckpt", layouts, stage)
        ranks = range(4 * stage, 4 * stage + 4)
        want, _ = ms_assignment(own, ranks, 4 * stage)
        for r in ranks:  # the merged file gives the same files as the stage's own
            local = ms.load_checkpoint(os.path.join(tmp_path, "pp", f"rank_{r}", f"src{r}.ckpt"))
            spms.save_checkpoint_without_redundancy(local, tmp_path / f"m{r}.ckpt", merged, r)
            spms.save_checkpoint_without_redundancy(local, tmp_path / f"o{r}.ckpt", own, r)
            assert set(contents(tmp_path / f"m{r}.ckpt")) == want[r] | {"global_step"}
            assert contents(tmp_path / f"m{r}.ckpt") == contents(tmp_path / f"o{r}.ckpt")


def test_redundancy_free_needs_every_parameter(tmp_path):
    src_dir, src = source(tmp_path, DP8)
    local = ms.load_checkpoint(os.path.join(src_dir, "rank_0", "src0.ckpt"))
    del local["w2"]
    with pytest.raises(_errors.NotFoundError, match='"w2"'):
        spms.save_checkpoint_without_redundancy(local, tmp_path / "x.ckpt", src, 0)


@pytest.mark.parametrize("pipeline", [False, True], ids=["mp", "pipeline"])
def test_export_equals_mindspores_transform_of_the_merged_checkpoint(tmp_path, pipeline):
    import savepoint
    whole_dir = whole_model(tmp_path / "whole")
    arrays = ms_arrays(os.path.join(whole_dir, "rank_0", "whole.ckpt"))
    savepoint.save(arrays, str(tmp_path / "native"))
    dst = merged_pipeline(tmp_path)[0] if pipeline else write_strategy(tmp_path / "d.ckpt", DP2MP4)
    ms_transform(whole_dir, str(tmp_path / "ms"), "d", None, dst)
    spms.export_distributed(tmp_path / "native", tmp_path / "sp", "d", dst)
    assert ms_files(tmp_path / "sp") == ms_files(tmp_path / "ms")
