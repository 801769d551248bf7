"""A failure-time dump in MindSpore's layout (`savepoint controller --naming mindspore-ckpt`,
docs/FAILOVER.md "Names") against the real MindSpore (2.10, CPU): 3 Python ranks under the
controller (the savepoint CLI, path in SAVEPOINT_CLI), one SIGKILLed mid-training; every
per-rank file tft_saved_checkpoints-step_{n}/rank_{r}/ttp_rank_{r}-{epoch}_{step_in_epoch}.ckpt
loads in MindSpore's own load_checkpoint(..., crc_check=True) with the state of step n."""
import json
import os
import secrets
import signal
import sys

import mindspore as ms
import numpy as np
import pytest

from savepoint import failover

ms.set_context(device_target="CPU")
CLI = os.environ["SAVEPOINT_CLI"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import failover_job  # noqa: E402
from failover_job import progress  # noqa: E402
WORLD = 3
STEPS_PER_EPOCH = 4

# One rank (pure data parallel: every rank holds the same state, a function of the step). The
# source returns the state of the last step passed to end_update; each finished step is logged
# to <out>/progress<rank>. Stopped by the controller, the rank exits 75.
RANK = r"""
import sys, time
import numpy as np
from savepoint import failover

out, rank, steps, per_epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(4, 6)
b = np.zeros(5, np.int64)
done = 0
agent = failover.Agent(source=lambda: {"w": w, "b": b, "loader_pos": done})
progress = open(f"{out}/progress{rank}", "w")
try:
    for step in range(1, steps + 1):
        agent.begin_update(step)
        w *= np.float32(0.99)
        w += np.float32(step) * np.float32(0.001)
        b[:] = np.arange(5, dtype=np.int64) * step + 7
        done = step
        agent.end_update(step, epoch=(step - 1) // per_epoch + 1,
                         step_in_epoch=(step - 1) % per_epoch + 1)
        progress.write(f"{step}\n")
        progress.flush()
        time.sleep(0.005)
except failover.JobStopped as e:
    print("stopped:", e.reason, file=sys.stderr)
    sys.exit(75)
agent.close()
"""


def expected(n):
    """The ranks' state after step n, replayed as the rank script computes it."""
    w = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(4, 6)
    for step in range(1, n + 1):
        w *= np.float32(0.99)
        w += np.float32(step) * np.float32(0.001)
    return {"w": w, "b": np.arange(5, dtype=np.int64) * n + 7}


def start_controller(tmp_path, token):
    return failover_job.start_controller(CLI, tmp_path, WORLD, token, "--naming", "mindspore-ckpt")


def start_ranks(tmp_path, address, token, steps):
    return failover_job.start_ranks(tmp_path, RANK, address, token, WORLD, steps, STEPS_PER_EPOCH)


def scalar(v):
    """An Int64 value of the file as MindSpore returns it (a Parameter of shape () or (1,))."""
    a = v.asnumpy()
    assert a.dtype == np.int64 and a.size == 1, (a.dtype, a.shape)
    return int(a.reshape(()))


@pytest.mark.skipif(not failover.available(), reason="no failover agent (gRPC) in this build")
@pytest.mark.parametrize("victim", [1, 0])
def test_mindspore_loads_every_rank_file_of_a_failover_dump(tmp_path, victim):
    token = secrets.token_hex(16)
    ctl, address = start_controller(tmp_path, token)
    ranks = start_ranks(tmp_path, address, token, steps=4000)
    out, err, errs = failover_job.kill_after(ctl, ranks, tmp_path, victim)
    outcome = json.loads(out)
    assert ctl.returncode == 0, (out, err)
    assert outcome["failed_rank"] == victim and outcome["dumped"], (out, err)
    n = outcome["dump_step"]
    survivors = [r for r in range(WORLD) if r != victim]
    assert 1 <= n <= max(progress(tmp_path, r) for r in survivors), outcome
    epoch, step_in_epoch = (n - 1) // STEPS_PER_EPOCH + 1, (n - 1) % STEPS_PER_EPOCH + 1

    # The survivors were stopped (JobStopped), the victim killed.
    for r, p in enumerate(ranks):
        if r == victim:
            assert p.returncode == -signal.SIGKILL
            continue
        assert p.returncode == 75, errs[r]
        assert "stopped: job stopped: rank" in errs[r], errs[r]
        assert outcome["dump_path"] in errs[r], errs[r]

    # The layout: the dump alone in the directory (no temporary left), one file per rank.
    dump = tmp_path / "ckpt" / f"tft_saved_checkpoints-step_{n}"
    assert os.path.samefile(outcome["dump_path"], dump)
    assert os.listdir(tmp_path / "ckpt") == [dump.name]
    assert sorted(os.listdir(dump)) == [f"rank_{r}" for r in range(WORLD)]
    name = lambda r: f"ttp_rank_{r}-{epoch}_{step_in_epoch}.ckpt"  # noqa: E731
    for r in range(WORLD):
        assert os.listdir(dump / f"rank_{r}") == [name(r)]

    # Every rank's file, the dead rank's included, loads in MindSpore with the CRC checked.
    want = expected(n)
    for r in range(WORLD):
        # MindSpore only warns about a file without the CRC trailer: check it is there.
        assert (dump / f"rank_{r}" / name(r)).read_bytes()[-17:-10] == b"crc_num"
        got = ms.load_checkpoint(str(dump / f"rank_{r}" / name(r)), crc_check=True)
        assert sorted(got) == sorted(["w", "b", "loader_pos", "failover.step",
                                      "failover.source_rank", "epoch_num", "step_num",
                                      "savepoint.metadata"]), (r, sorted(got))  # fmt: skip
        for k, v in want.items():
            a = got[k].asnumpy()
            assert a.dtype == v.dtype and a.shape == v.shape, (r, k, a.dtype, a.shape)
            np.testing.assert_array_equal(a, v, err_msg=f"rank {r} {k}")
        assert scalar(got["loader_pos"]) == n
        assert scalar(got["failover.step"]) == n
        assert scalar(got["step_num"]) == n
        assert scalar(got["epoch_num"]) == epoch
        assert scalar(got["failover.source_rank"]) in outcome["writers"]
        assert scalar(got["failover.source_rank"]) != victim
        # savepoint's metadata, a string entry: {"metadata": <the dump's metadata>, ...}.
        record = json.loads(got["savepoint.metadata"])["metadata"]["savepoint.manager"]
        assert record["failover"] and record["step"] == n
        assert (record["epoch"], record["step_in_epoch"]) == (epoch, step_in_epoch)

    # The CRC is really there and checked: a copy with one byte of w's data flipped is refused.
    data = bytearray((dump / "rank_2" / name(2)).read_bytes())
    at = data.find(want["w"].tobytes())
    assert at > 0
    data[at + 5] ^= 0x40
    torn = tmp_path / "torn.ckpt"
    torn.write_bytes(bytes(data))
    with pytest.raises(ValueError) as refused:  # MindSpore wraps its own CRC error
        ms.load_checkpoint(str(torn), crc_check=True)
    assert "crc check is failed" in str(refused.value.__cause__), repr(refused.value.__cause__)
    np.testing.assert_raises(AssertionError, np.testing.assert_array_equal,
                             ms.load_checkpoint(str(torn))["w"].asnumpy(), want["w"])
