"""savepoint.CheckpointManager(format="ckpt") against the real MindSpore (2.10, CPU): a directory
MindSpore's own ModelCheckpoint filled during training is indexed and restored by the manager,
and the files the manager writes (CRC, each cipher, async) load in MindSpore's load_checkpoint
with the same values."""
import os

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Model, nn
from mindspore.train import CheckpointConfig, ModelCheckpoint

import savepoint

ms.set_context(device_target="CPU")
STEPS_PER_EPOCH = 6


def _train_with_model_checkpoint(directory):
    """Two epochs of a tiny net; ModelCheckpoint saves every 2 steps as net-{epoch}_{step}.ckpt."""

    def batches():
        rng = np.random.default_rng(0)
        for _ in range(STEPS_PER_EPOCH):
            yield (rng.standard_normal((4, 8)).astype(np.float32),
                   rng.standard_normal((4, 2)).astype(np.float32))  # fmt: skip

    net = nn.Dense(8, 2)
    model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    config = CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=10,
                              append_info=["epoch_num", "step_num"])  # fmt: skip
    callback = ModelCheckpoint(prefix="net", directory=str(directory), config=config)
    model.train(2, ds.GeneratorDataset(batches, ["x", "y"]), callbacks=[callback],
                dataset_sink_mode=False)  # fmt: skip


def _ms_values(path, **kw):
    return {k: v if isinstance(v, str) else v.asnumpy()
            for k, v in ms.load_checkpoint(str(path), **kw).items()}  # fmt: skip


def test_manager_indexes_and_restores_what_model_checkpoint_wrote(tmp_path):
    _train_with_model_checkpoint(tmp_path)
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".ckpt"))
    assert names[-1] == "net-2_6.ckpt"
    with savepoint.CheckpointManager(tmp_path, format="ckpt", prefix="net", keep_all=True,
                                     steps_per_epoch=STEPS_PER_EPOCH) as mgr:  # fmt: skip
        assert mgr.all_steps() == [2, 4, 6, 8, 10, 12]
        latest = mgr.restore()
        want = _ms_values(tmp_path / "net-2_6.ckpt")
        assert sorted(latest) == sorted(want)
        for k, v in want.items():
            assert latest[k].dtype == v.dtype and latest[k].tobytes() == v.tobytes(), k
        assert int(latest["step_num"]) == 12 and mgr.global_step == 12
        # Training goes on in the same series of names, in MindSpore's layout.
        assert mgr.save(14, {k: v for k, v in latest.items() if k not in ("epoch_num", "step_num")},
                        epoch=3, step_in_epoch=2)  # fmt: skip
        assert mgr.checkpoints()[-1]["name"] == "net-3_2.ckpt"
    assert _ms_values(tmp_path / "net-3_2.ckpt")["weight"].tobytes() == latest["weight"].tobytes()


@pytest.mark.parametrize("enc_mode", [None, "AES-GCM", "AES-CBC", "SM4-CBC"])
@pytest.mark.parametrize("async_", [False, True])
def test_files_the_manager_writes_load_in_mindspore(tmp_path, enc_mode, async_):
    rng = np.random.default_rng(7)
    key = b"0123456789abcdef" if enc_mode else None
    extra = {"enc_mode": enc_mode} if enc_mode else {}
    states = {step: {"w": rng.standard_normal((33, 17)).astype(np.float32),
                     "b": rng.integers(-100, 100, (5,)).astype(np.int64)}
              for step in (1, 2, 3)}  # fmt: skip
    with savepoint.CheckpointManager(tmp_path, format="ckpt", crc_check=True, keep_last_n=2,
                                     append_info=["step_num"], async_=async_, key=key,
                                     **extra) as mgr:  # fmt: skip
        for step, state in states.items():
            assert mgr.save(step, state)
        mgr.wait()
        assert [c["name"] for c in mgr.checkpoints()] == ["ckpt-1_2.ckpt", "ckpt-1_3.ckpt"]
        back = mgr.restore(name="ckpt-1_2")
        assert back["w"].tobytes() == states[2]["w"].tobytes()
    files = sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt-"))
    assert files[0] == "ckpt-1_2.ckpt" and "ckpt-1_1.ckpt" not in files
    kw = {"dec_key": key, "dec_mode": enc_mode} if enc_mode else {}
    for step in (2, 3):
        got = _ms_values(tmp_path / f"ckpt-1_{step}.ckpt", crc_check=True, **kw)
        assert got["w"].tobytes() == states[step]["w"].tobytes()
        assert got["b"].tobytes() == states[step]["b"].tobytes()
        assert int(got["step_num"]) == step


def test_safetensors_files_the_manager_writes_load_in_mindspore_with_crc(tmp_path):
    state = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "n": np.arange(5, dtype=np.int64)}
    with savepoint.CheckpointManager(tmp_path, format="safetensors", crc_check=True) as mgr:
        assert mgr.save(1, state)
    got = _ms_values(tmp_path / "ckpt-1_1.safetensors", format="safetensors", crc_check=True)
    assert got["w"].tobytes() == state["w"].tobytes() and got["n"].tobytes() == state["n"].tobytes()
