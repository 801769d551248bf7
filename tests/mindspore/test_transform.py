"""MindSpore distributed-checkpoint transforms against the real MindSpore (2.10, CPU):
savepoint.mindspore.transform_checkpoints / transform_checkpoint_by_rank / rank_list_for_transform /
merge_pipeline_strategys give bit-exactly the files mindspore.parallel's functions give.

Fixtures: a whole model (rank_0/, no strategy) is cut into source layouts by MindSpore's own
transform_checkpoints, so the source rank files are MindSpore's; strategy files are written with
MindSpore's protobuf module (mindspore.train.node_strategy_pb2) or as JSON. Tensors are tiny."""
import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor
from mindspore.parallel import merge_pipeline_strategys as ms_merge
from mindspore.parallel import rank_list_for_transform as ms_rank_list
from mindspore.parallel import transform_checkpoints as ms_transform
from mindspore.train import node_strategy_pb2 as pb

from savepoint import mindspore as spms
from savepoint import _errors

ms.set_context(device_target="CPU")

# name -> (shape, dtype)
MODEL = {
    "w1": ((16, 8), ms.float32),
    "w2": ((8, 16), ms.bfloat16),
    "b": ((16,), ms.float16),
    "adam_m.w1": ((16, 8), ms.float32),
}


def lay(dev, tmap, k=0, step=0):
    return {"dev_matrix": dev, "tensor_map": tmap, "opt_weight_shard_size": k,
            "opt_weight_shard_step": step}  # fmt: skip


DP8 = {n: lay([8], [-1] * len(s)) for n, (s, _) in MODEL.items()}
MP8 = {"w1": lay([8], [0, -1]), "w2": lay([8], [-1, 0]), "b": lay([8], [0]),
       "adam_m.w1": lay([8], [0, -1])}  # fmt: skip
# dp 2 x mp 4, optimizer state sharded over the dp axis (rank stride 4).
DP2MP4 = {"w1": lay([2, 4], [0, -1]), "w2": lay([2, 4], [-1, 0]), "b": lay([2, 4], [0]),
          "adam_m.w1": lay([2, 4], [0, -1], k=2, step=4)}  # fmt: skip
MP4 = {"w1": lay([4], [0, -1]), "w2": lay([4], [-1, 0]), "b": lay([4], [-1]),
       "adam_m.w1": lay([4], [0, -1])}  # fmt: skip
MP2 = {"w1": lay([2], [-1, 0]), "w2": lay([2], [0, -1]), "b": lay([2], [0]),
       "adam_m.w1": lay([2], [0, -1])}  # fmt: skip
STAGE0 = {"w1": lay([4], [0, -1]), "adam_m.w1": lay([4], [0, -1])}
STAGE1 = {"w2": lay([4], [-1, 0]), "b": lay([4], [0])}


def write_strategy(path, layouts, stage=0, as_json=False):
    if as_json:
        doc = {"current_stage": stage,
               "parallel_strategy_item": {f"op{stage}": {"stage": stage,
                                                         "parallel_strategy": [[1]]}},
               "parallel_layout_item": {n: dict(l, field=0) for n, l in layouts.items()}}
        path.write_text(json.dumps(doc))
        return str(path)
    m = pb.ParallelStrategyMap()
    m.current_stage = stage
    item = m.parallel_strategy_item.add()
    item.node_name = f"op{stage}"
    item.parallel_strategys.stage = stage
    item.parallel_strategys.parallel_strategy.add().dim.extend([1])
    for name, l in layouts.items():
        li = m.parallel_layout_item.add()
        li.param_name = name
        p = li.parallel_layouts
        p.dev_matrix.add().dim.extend(l["dev_matrix"])
        p.tensor_map.add().dim.extend(l["tensor_map"])
        p.param_split_shape.add()
        p.indices_offset.add()
        p.field = 0
        p.opt_weight_shard_step = l["opt_weight_shard_step"]
        p.opt_weight_shard_size = l["opt_weight_shard_size"]
    path.write_bytes(m.SerializeToString())
    return str(path)


def merged_pipeline(tmp_path, as_json=False):
    d = tmp_path / ("stages_json" if as_json else "stages_pb")
    d.mkdir()
    ext = ".json" if as_json else ".ckpt"
    write_strategy(d / f"s0{ext}", STAGE0, 0, as_json)
    write_strategy(d / f"s1{ext}", STAGE1, 1, as_json)
    ms_merge(str(d), str(tmp_path / f"ms_merged{ext}"))
    spms.merge_pipeline_strategys(str(d), str(tmp_path / f"sp_merged{ext}"))
    return str(tmp_path / f"ms_merged{ext}"), str(tmp_path / f"sp_merged{ext}")


def whole_model(root, seed=0):
    rng = np.random.default_rng(seed)
    items = []
    for name, (shape, dt) in MODEL.items():
        data = rng.standard_normal(shape).astype(np.float32) * 10
        items.append({"name": name, "data": Parameter(Tensor(data, dt), name=name)})
    items.append({"name": "global_step",
                  "data": Parameter(Tensor(np.array([7], np.int32)), name="global_step")})
    (root / "rank_0").mkdir(parents=True)
    ms.save_checkpoint(items, str(root / "rank_0" / "whole.ckpt"))
    return str(root)


def contents(path):
    out = {}
    for k, v in ms.load_checkpoint(str(path)).items():
        out[k] = (str(v.dtype), tuple(v.shape), v.asnumpy().tobytes())
    return out


def tree(root):
    """{relative path: contents} of every .ckpt under root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".ckpt"):
                p = os.path.join(d, f)
                out[os.path.relpath(p, root)] = contents(p)
    return out


def source(tmp_path, layouts, name="src", as_json=False):
    """A source checkpoint cut by MindSpore into `layouts`, and its strategy file."""
    whole = whole_model(tmp_path / f"{name}_whole")
    strategy = write_strategy(tmp_path / f"{name}.{'json' if as_json else 'ckpt'}", layouts,
                              as_json=as_json)  # fmt: skip
    ms_transform(whole, str(tmp_path / name), "src", None, strategy)
    return str(tmp_path / name), strategy


def both(tmp_path, src_dir, src, dst, tag):
    ms_out, sp_out = tmp_path / f"ms_{tag}", tmp_path / f"sp_{tag}"
    ms_transform(src_dir, str(ms_out), "dst", src, dst)
    spms.transform_checkpoints(src_dir, str(sp_out), "dst", src, dst)
    want, got = tree(ms_out), tree(sp_out)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], k
    return got


@pytest.mark.parametrize("src_l,dst_l,tag", [
    (DP8, MP8, "dp_to_mp"), (MP8, DP8, "mp_to_dp"), (MP8, MP4, "8_to_4"), (MP2, MP8, "2_to_8"),
    (DP2MP4, MP8, "optshard_to_flat"), (MP8, DP2MP4, "flat_to_optshard"),
])  # fmt: skip
def test_transform_matches_mindspore(tmp_path, src_l, dst_l, tag):
    src_dir, src = source(tmp_path, src_l)
    dst = write_strategy(tmp_path / "dst.ckpt", dst_l)
    both(tmp_path, src_dir, src, dst, tag)


def test_cut_from_whole_and_merge_back(tmp_path):
    whole = whole_model(tmp_path / "whole")
    dst = write_strategy(tmp_path / "dst.ckpt", DP2MP4)
    both(tmp_path, whole, None, dst, "cut")
    got = both(tmp_path, str(tmp_path / "sp_cut"), dst, None, "merge")
    assert got["rank_0/dst0.ckpt"] == contents(os.path.join(whole, "rank_0", "whole.ckpt"))


def test_protobuf_and_json_strategies_agree(tmp_path):
    src_dir, src_pb = source(tmp_path, DP2MP4)
    src_json = write_strategy(tmp_path / "src.json", DP2MP4, as_json=True)
    dst_pb = write_strategy(tmp_path / "dst.ckpt", MP4)
    dst_json = write_strategy(tmp_path / "dst.json", MP4, as_json=True)
    spms.transform_checkpoints(src_dir, str(tmp_path / "a"), "p", src_pb, dst_pb)
    spms.transform_checkpoints(src_dir, str(tmp_path / "b"), "p", src_json, dst_json)
    assert tree(tmp_path / "a") == tree(tmp_path / "b")


def test_merged_pipeline_strategies(tmp_path):
    for as_json in (False, True):
        ms_file, sp_file = merged_pipeline(tmp_path, as_json)
        assert spms.strategy_layouts(ms_file) == spms.strategy_layouts(sp_file)
        if as_json:
            assert json.load(open(ms_file)) == json.load(open(sp_file))
        else:
            a, b = pb.ParallelStrategyMap(), pb.ParallelStrategyMap()
            a.ParseFromString(open(ms_file, "rb").read())
            b.ParseFromString(open(sp_file, "rb").read())
            assert a == b and a.current_stage == 1


def test_pipeline_to_flat_and_back(tmp_path):
    merged, _ = merged_pipeline(tmp_path)
    flat = write_strategy(tmp_path / "flat.ckpt", MP8)
    # A 2 x 4 pipeline source cut by MindSpore from the whole model, then both directions.
    whole = whole_model(tmp_path / "whole")
    ms_transform(whole, str(tmp_path / "pp"), "src", None, merged)
    both(tmp_path, str(tmp_path / "pp"), merged, flat, "pp_to_flat")
    src_dir, _ = source(tmp_path, MP8, name="flat_src")
    both(tmp_path, src_dir, flat, merged, "flat_to_pp")


def test_one_stage_into_full_model_gives_part_files(tmp_path):
    merged, _ = merged_pipeline(tmp_path)
    whole = whole_model(tmp_path / "whole")
    ms_transform(whole, str(tmp_path / "pp"), "src", None, merged)
    stage1 = write_strategy(tmp_path / "stage1.ckpt", STAGE1, stage=1)
    full = write_strategy(tmp_path / "full.ckpt", MP4)
    got = both(tmp_path, str(tmp_path / "pp"), stage1, full, "part")
    assert sorted(got) == [f"rank_{r}/dst{r}_part1.ckpt" for r in range(4)]


def test_by_rank_equals_whole_directory_and_rank_lists(tmp_path):
    src_dir, src = source(tmp_path, MP8)
    dst = write_strategy(tmp_path / "dst.ckpt", MP4)
    spms.transform_checkpoints(src_dir, str(tmp_path / "all"), "dst", src, dst)
    for r in range(4):
        ranks = spms.rank_list_for_transform(r, src, dst)
        assert ranks == sorted(ranks, reverse=True)
        assert set(ranks) <= set(ms_rank_list(r, src, dst))
        files = {s: os.path.join(src_dir, f"rank_{s}", f"src{s}.ckpt") for s in ranks}
        out = tmp_path / "by_rank" / f"r{r}.ckpt"
        spms.transform_checkpoint_by_rank(r, files, str(out), src, dst)
        assert contents(out) == contents(tmp_path / "all" / f"rank_{r}" / f"dst{r}.ckpt")
    assert spms.rank_list_for_transform(0) == ms_rank_list(0) == [0]


def test_decoy_older_ckpt_in_a_rank_dir(tmp_path):
    src_dir, src = source(tmp_path, MP8)
    decoy = os.path.join(src_dir, "rank_3", "aaa_older.ckpt")
    ms.save_checkpoint([{"name": "w1", "data": Parameter(Tensor(np.zeros((2, 8), np.float32)),
                                                         name="w1")}], decoy)  # fmt: skip
    both(tmp_path, src_dir, src, write_strategy(tmp_path / "dst.ckpt", DP8), "decoy")


def test_bf16_nan_payloads_are_kept(tmp_path):
    import ml_dtypes
    root = tmp_path / "whole"
    (root / "rank_0").mkdir(parents=True)
    bits = np.array([0x7FC1, 0xFF81, 0x7F80, 0x3F80] * 4, np.uint16).reshape(8, 2)
    spms.save_checkpoint({"w": bits.view(ml_dtypes.bfloat16)}, str(root / "rank_0" / "w.ckpt"))
    dst = write_strategy(tmp_path / "dst.ckpt", {"w": lay([2], [0, -1])})
    spms.transform_checkpoints(str(root), str(tmp_path / "out"), "d", None, dst)
    parts = [contents(tmp_path / "out" / f"rank_{r}" / f"d{r}.ckpt")["w"] for r in (0, 1)]
    assert parts[0][0] == "BFloat16"
    assert b"".join(p[2] for p in parts) == bits.tobytes()  # MindSpore's own gives 0x7FC0


def test_int4_parameters_keep_their_type(tmp_path):
    """MindSpore's transform writes Int4 (qint4x2) parameters back as Int8, cut or whole; savepoint
    writes the same bytes and keeps the Int4 type."""
    root = tmp_path / "whole"
    (root / "rank_0").mkdir(parents=True)
    q = np.arange(64, dtype=np.int8).reshape(8, 8)
    ms.save_checkpoint([{"name": n, "data": Parameter(Tensor(q, ms.qint4x2), name=n)}
                        for n in ("cut", "whole")], str(root / "rank_0" / "m.ckpt"))  # fmt: skip
    dst = write_strategy(tmp_path / "dst.ckpt", {"cut": lay([4], [0, -1])})
    ms_transform(str(root), str(tmp_path / "ms"), "d", None, dst)
    spms.transform_checkpoints(str(root), str(tmp_path / "sp"), "d", None, dst)
    for r in range(4):
        want = contents(tmp_path / "ms" / f"rank_{r}" / f"d{r}.ckpt")
        got = contents(tmp_path / "sp" / f"rank_{r}" / f"d{r}.ckpt")
        assert sorted(got) == sorted(want) == ["cut", "whole"]
        for n in want:
            assert want[n][0] == "Int8" and got[n][0] == "Int4"
            assert got[n][1:] == want[n][1:], (r, n)  # same shape and bytes
        assert got["cut"][2] == q[2 * r:2 * r + 2].tobytes()


def lying(tmp_path, layouts_src, dst_layouts, mutate=None):
    src_dir, src = source(tmp_path, layouts_src)
    if mutate:
        mutate(src_dir)
    dst = write_strategy(tmp_path / "dst.ckpt", dst_layouts)
    return src_dir, src, dst


def assert_fails(tmp_path, src_dir, src, dst, exc, *words):
    out = tmp_path / "out"
    with pytest.raises(exc) as e:
        spms.transform_checkpoints(src_dir, str(out), "dst", src, dst)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert not any(f.endswith(".ckpt") for _, _, fs in os.walk(out) for f in fs)


def test_strategy_naming_a_missing_device_axis(tmp_path):
    src_dir, src, _ = lying(tmp_path, MP8, MP4)
    bad = write_strategy(tmp_path / "bad.ckpt", dict(MP4, w1=lay([4], [1, -1])))
    assert_fails(tmp_path, src_dir, src, bad, _errors.InvalidArgumentError, "bad.ckpt", '"w1"')


def test_dev_matrix_product_not_matching_the_ranks(tmp_path):
    src_dir, _, dst = lying(tmp_path, MP8, MP4)
    liar = write_strategy(tmp_path / "liar.ckpt", MP4)  # says 4 ranks; the directory holds 8
    assert_fails(tmp_path, src_dir, liar, dst, _errors.InvalidArgumentError, "liar.ckpt",
                 "4 ranks", "rank_7")


def test_shape_not_divisible_by_the_split(tmp_path):
    src_dir, src, _ = lying(tmp_path, MP8, MP4)
    bad = write_strategy(tmp_path / "bad.ckpt", {"b": lay([3, 1], [1])})  # 16 rows over 3
    assert_fails(tmp_path, src_dir, src, bad, _errors.InvalidArgumentError, '"b"')


def test_missing_rank_dir_and_missing_param(tmp_path):
    import shutil
    src_dir, src, dst = lying(tmp_path, MP8, MP4,
                              lambda d: shutil.rmtree(os.path.join(d, "rank_5")))  # fmt: skip
    assert_fails(tmp_path, src_dir, src, dst, _errors.InvalidArgumentError, "rank_5 ")
    src_dir2, src2 = source(tmp_path, MP8, name="src2")
    listed = write_strategy(tmp_path / "listed.ckpt", dict(MP8, extra=lay([8], [0])))
    assert_fails(tmp_path, src_dir2, listed, dst, _errors.NotFoundError, '"extra"')


def test_two_stages_claiming_one_param_differently(tmp_path):
    d = tmp_path / "stages"
    d.mkdir()
    write_strategy(d / "s0.ckpt", {"w1": lay([4], [0, -1])}, 0)
    write_strategy(d / "s1.ckpt", {"w1": lay([4], [-1, 0])}, 1)
    spms.merge_pipeline_strategys(str(d), str(tmp_path / "m.ckpt"))
    with pytest.raises(_errors.InvalidArgumentError) as e:
        spms.rank_list_for_transform(0, str(tmp_path / "m.ckpt"), None)
    assert "m.ckpt" in str(e.value) and '"w1"' in str(e.value)
