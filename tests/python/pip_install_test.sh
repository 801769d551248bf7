#!/usr/bin/env bash
# Proves `pip install .` works and installs the whole product: installs the package into the
# virtual environment of $1 (its python) from the source tree $2, then imports the *installed* copy
# from a neutral directory without PYTHONPATH, round-trips a small torch + numpy state through it,
# finds the failover agent, and runs the `savepoint` command from the environment's bin (the C++
# CLI shipped in the package) on the checkpoint: ls, verify, inspect and an unknown subcommand.
# The build directory (build-pip-<tag>, pyproject.toml) is kept, so repeated runs are incremental,
# and ccache shares the library's objects with a Release build in build-release/ (.ci/run).
set -euo pipefail
PY="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # absolute, symlinks kept (a venv)
SRC=$2
# shellcheck source=scripts/pip-env.sh
. "$SRC/scripts/pip-env.sh"
start=$(date +%s)
"$PY" -m pip install --no-build-isolation --no-deps --force-reinstall --disable-pip-version-check \
  -q "$SRC"
echo "pip install . took $(($(date +%s) - start)) s"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
env -u PYTHONPATH "$PY" - <<'PYEOF'
import os, sysconfig
import numpy as np
import torch
import savepoint

site = os.path.realpath(sysconfig.get_paths()["platlib"])
assert os.path.realpath(savepoint.__file__).startswith(site), savepoint.__file__
assert os.path.exists(os.path.join(os.path.dirname(savepoint.__file__), "py.typed"))
state = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "a": np.ones(5, np.int16), "step": 3}
savepoint.save(state, "ckpt")
back = savepoint.load("ckpt")
assert torch.equal(back["w"], state["w"]) and (back["a"] == state["a"]).all() and back["step"] == 3
import savepoint.failover
assert savepoint.failover.available(), "the installed package has no failover agent"
print("installed savepoint", savepoint.__version__, "from", os.path.dirname(savepoint.__file__), "OK")
PYEOF
# The console script, found on the environment's PATH as a user of the venv finds it.
BIN=$(dirname "$PY")
cli() { env -u PYTHONPATH PATH="$BIN:/usr/bin:/bin" savepoint "$@"; }
[ "$(env PATH="$BIN:/usr/bin:/bin" sh -c 'command -v savepoint')" = "$BIN/savepoint" ]
cli --version | grep -q '^savepoint '
cli ls . | grep -q ckpt
cli verify ckpt
cli inspect ckpt | grep -q '\bw\b'
cli controller --help | grep -qi 'dump'
cli launch --help >launch-help.txt  # (not into grep -q, which may close the pipe first)
grep -q 'torchrun' launch-help.txt
# `savepoint launch`: the packaged controller, then torchrun, one rank whose agent finds them.
cat >rank.py <<'PYEOF'
from savepoint import failover
agent = failover.Agent()
agent.begin_update(1)
agent.end_update(1)
agent.close()
# A file per rank: the ranks share one stdout, whose writes may interleave.
open(f"launched.{agent.rank}.of.{agent.world}", "w").close()
PYEOF
cli launch --dump-dir dumps --standalone --nproc-per-node 2 rank.py
[ -e launched.0.of.2 ] && [ -e launched.1.of.2 ]
if cli no-such-subcommand 2>/dev/null; then echo "an unknown subcommand succeeded" >&2; exit 1; fi
echo "savepoint command from $BIN: OK"
