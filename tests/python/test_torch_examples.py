"""The PyTorch distributed examples run end to end: examples/torch_ddp.py and torch_dtensor.py
(4 gloo ranks train, are killed with SIGKILL, and 2 ranks resume from the latest committed
checkpoint) and recis_train.py (2 workers, one killed, 3 resume); each example checks that the
result equals an uninterrupted run bit for bit."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


@pytest.mark.parametrize("example", ["torch_ddp.py", "torch_dtensor.py"])
def test_example_resumes_bit_for_bit(tmp_path, example):
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, example), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bit for bit: OK" in r.stdout
    assert "exit codes [-9, -9, -9, -9]" in r.stdout


def test_recis_example_resumes_on_more_workers(tmp_path):
    """examples/recis_train.py: savepoint.recis, 2 workers killed, 3 resume; bit-exact."""
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "recis_train.py"), "--dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "-9]" in r.stdout  # worker 1 was SIGKILLed
    assert "bit-exact: True" in r.stdout
