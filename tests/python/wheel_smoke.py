"""Run by tests/python/wheel_test.sh with the python of a fresh venv into which only the repaired
wheel (and numpy, ml_dtypes) was installed, from a neutral directory without PYTHONPATH:
  wheel_smoke.py ALLOWED_LIBS
1. the package imported is the venv's; a save / load round trip (bf16 included);
2. the `savepoint` command from the venv's bin: --version, verify, ls;
3. the failover agent: a `savepoint controller` from the wheel, two numpy ranks, one SIGKILLed:
   the dump holds the last step, replayed bit for bit;
4. every shared library that a file of the wheel loads resolves inside the venv, or is one of the
   manylinux policy's (ALLOWED_LIBS, a comma-separated list of sonames).
Prints OK."""

import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig

import ml_dtypes
import numpy as np

import savepoint
from savepoint import failover

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE)))  # tests/: failover_job
import failover_job  # noqa: E402

SITE = os.path.realpath(sysconfig.get_paths()["platlib"])
BIN = os.path.dirname(sys.executable)
TOKEN = "wheel-smoke-token-0123456789abcdef"


def round_trip(work):
    assert os.path.realpath(savepoint.__file__).startswith(SITE), savepoint.__file__
    state = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
             "h": np.ones(5, ml_dtypes.bfloat16), "step": 3}  # fmt: skip
    savepoint.save(state, work / "ckpt")
    back = savepoint.load(work / "ckpt")
    assert (back["w"] == state["w"]).all() and back["h"].dtype == ml_dtypes.bfloat16
    assert back["step"] == 3


def cli(work):
    exe = os.path.join(BIN, "savepoint")
    run = lambda *a: subprocess.run([exe, *a], capture_output=True, text=True, check=True).stdout
    assert run("--version").startswith("savepoint ")
    assert "OK" in run("verify", str(work / "ckpt"))
    assert "ckpt" in run("ls", str(work))
    return exe


def failover_run(work, exe):
    assert failover.available()
    tmp = work / "job"
    tmp.mkdir()
    ctl, address = failover_job.start_controller(exe, tmp, 2, TOKEN)
    ranks = failover_job.start_ranks(tmp, failover_job.NUMPY_RANK, address, TOKEN, 2, 3000)
    out, err, errs = failover_job.kill_after(ctl, ranks, tmp, 1)
    outcome = json.loads(out)
    assert outcome["failed_rank"] == 1 and outcome["dumped"], (out, err, errs)
    n = outcome["dump_step"]
    dump = savepoint.load(outcome["dump_path"])
    w, m = np.zeros(1000, np.float32), np.zeros(1000, np.float32)
    for step in range(1, n + 1):  # the ranks' updates, replayed
        m[:] = 0.9 * m + np.float32(step % 7)
        w -= np.float32(0.01) * m
    assert dump["step"] == n and (dump["w"] == w).all() and (dump["m"] == m).all()


def libraries(allowed):
    """Every ELF file of the wheel (package and savepoint.libs/): ldd's resolutions."""
    files = [p for d in ("savepoint", "savepoint.libs") for p in pathlib.Path(SITE, d).rglob("*")
             if p.is_file() and p.open("rb").read(4) == b"\x7fELF"]  # fmt: skip
    assert len(files) >= 4, files  # _core, libsavepoint, libsavepoint_failover, the CLI
    outside = set()
    for f in files:
        out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, check=True).stdout
        assert "not found" not in out, (f, out)
        for name, path in re.findall(r"^\s*(\S+) => (\S+)", out, re.M):
            if not os.path.realpath(path).startswith(SITE) and name not in allowed:
                outside.add(f"{f.name}: {name} => {path}")
    assert not outside, "resolved outside the wheel:\n" + "\n".join(sorted(outside))
    return len(files)


if __name__ == "__main__":
    allowed = set(sys.argv[1].split(","))
    work = pathlib.Path.cwd()
    round_trip(work)
    exe = cli(work)
    failover_run(work, exe)
    n = libraries(allowed)
    print(f"wheel smoke: {savepoint.__file__}, {n} ELF files, OK")
