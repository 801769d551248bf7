"""The `savepoint transform` and `savepoint strategy` commands against the real MindSpore (2.10,
CPU): the CLI writes the files mindspore.parallel.transform_checkpoints writes, lists the source
ranks a destination rank needs, shows and merges strategy files, and fails clearly on lies.
Fixture builders are test_transform.py's."""
import json
import os
import subprocess

import pytest
from mindspore.parallel import transform_checkpoints as ms_transform
from test_transform import (DP2MP4, MP4, MP8, STAGE0, STAGE1, lay, merged_pipeline, source,
                            tree, write_strategy)  # fmt: skip

from savepoint import _errors
from savepoint import mindspore as spms

CLI = os.environ["SAVEPOINT_CLI"]


def cli(*args, code=0):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == code, r.stdout + r.stderr
    return r


def test_transform_command_writes_what_mindspore_writes(tmp_path):
    src_dir, src = source(tmp_path, DP2MP4)
    dst = write_strategy(tmp_path / "dst.ckpt", MP4)
    ms_transform(src_dir, str(tmp_path / "ms"), "dst", src, dst)
    out = cli("transform", "--src", src_dir, "--dst", tmp_path / "sp", "--src-strategy", src,
              "--dst-strategy", dst, "--prefix", "dst")  # fmt: skip
    assert "OK: transformed" in out.stdout
    assert tree(tmp_path / "sp") == tree(tmp_path / "ms")
    # Only the listed destination ranks.
    cli("transform", "--src", src_dir, "--dst", tmp_path / "some", "--src-strategy", src,
        "--dst-strategy", dst, "--prefix", "dst", "--rank", 1, "--rank", 3, "--json")  # fmt: skip
    assert sorted(tree(tmp_path / "some")) == ["rank_1/dst1.ckpt", "rank_3/dst3.ckpt"]
    assert tree(tmp_path / "some")["rank_3/dst3.ckpt"] == tree(tmp_path / "ms")["rank_3/dst3.ckpt"]


def test_transform_command_refuses_a_lying_strategy(tmp_path):
    src_dir, src = source(tmp_path, MP8)
    bad = write_strategy(tmp_path / "bad.ckpt", dict(MP4, w1=lay([4], [1, -1])))
    out = cli("transform", "--src", src_dir, "--dst", tmp_path / "out", "--src-strategy", src,
              "--dst-strategy", bad, "--json", code=1)  # fmt: skip
    report = json.loads(out.stdout)
    assert not report["ok"] and "bad.ckpt" in report["error"] and '"w1"' in report["error"]
    assert not any(f.endswith(".ckpt") for _, _, fs in os.walk(tmp_path / "out") for f in fs)


def test_strategy_ranks_show_and_merge(tmp_path):
    src = write_strategy(tmp_path / "src.ckpt", MP8)
    dst = write_strategy(tmp_path / "dst.ckpt", MP4)
    for rank in range(4):
        got = json.loads(cli("strategy", "ranks", "--rank", rank, "--src-strategy", src,
                             "--dst-strategy", dst, "--json").stdout)  # fmt: skip
        assert got["source_ranks"] == spms.rank_list_for_transform(rank, src, dst)
    shown = json.loads(cli("strategy", "show", src, "--json").stdout)
    assert shown["stage_devices"] == 8 and shown["stages"] == 1
    by_name = {p["name"]: p for p in shown["params"]}
    assert by_name["w1"]["split_counts"] == [8, 1] and by_name["w2"]["split_counts"] == [1, 8]
    table = cli("strategy", "show", src).stdout
    assert "w1" in table and "8x1" in table
    ms_file, _ = merged_pipeline(tmp_path)
    stages = tmp_path / "stages_pb"
    cli("strategy", "merge", stages, tmp_path / "cli_merged.ckpt")
    assert spms.strategy_layouts(tmp_path / "cli_merged.ckpt") == spms.strategy_layouts(ms_file)
    merged = json.loads(cli("strategy", "show", tmp_path / "cli_merged.ckpt", "--json").stdout)
    assert merged["stages"] == 2
    assert {p["name"] for p in merged["params"]} == set(STAGE0) | set(STAGE1)


def test_strategy_show_of_a_file_that_is_not_one(tmp_path):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    out = cli("strategy", "show", junk, code=2)
    assert "junk.ckpt" in out.stderr


def test_transform_command_native_output(tmp_path):
    """--format native: each destination rank is a savepoint checkpoint directory that verifies,
    and converts back into the .ckpt MindSpore's transform writes, bit for bit."""
    src_dir, src = source(tmp_path, DP2MP4)
    dst = write_strategy(tmp_path / "dst.ckpt", MP4)
    ms_transform(src_dir, str(tmp_path / "ms"), "dst", src, dst)
    cli("transform", "--src", src_dir, "--dst", tmp_path / "nat", "--src-strategy", src,
        "--dst-strategy", dst, "--prefix", "dst", "--format", "native")  # fmt: skip
    want = tree(tmp_path / "ms")
    for r in range(4):
        ckpt_dir = tmp_path / "nat" / f"rank_{r}" / f"dst{r}"
        assert (ckpt_dir / "MANIFEST").is_file()
        cli("verify", ckpt_dir)
        cli("convert", ckpt_dir, tmp_path / "back" / f"rank_{r}" / f"dst{r}.ckpt")
    assert tree(tmp_path / "back") == want
    # The Python face takes the same name; a .ckpt name for a native destination is refused.
    spms.transform_checkpoints(src_dir, str(tmp_path / "py"), "dst", src, dst,
                               output_format="native")  # fmt: skip
    assert sorted(os.listdir(tmp_path / "py" / "rank_2")) == ["dst2"]
    with pytest.raises(_errors.InvalidArgumentError, match="checkpoint directory"):
        spms.transform_checkpoint_by_rank(0, {r: os.path.join(src_dir, f"rank_{r}", "src.ckpt")
                                              for r in range(8)},
                                          str(tmp_path / "x.ckpt"), src, dst,
                                          output_format="native")  # fmt: skip
