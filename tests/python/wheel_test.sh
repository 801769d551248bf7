#!/usr/bin/env bash
# Proves the self-contained wheel works (scripts/wheel): builds and repairs it from the source
# tree $2, checks `auditwheel show` names a manylinux tag, installs it into a fresh venv of the
# same Python as $1 (the build venv's python, which has auditwheel) with only numpy and ml_dtypes
# beside it, and runs tests/python/wheel_smoke.py there from a neutral directory: a round trip,
# the CLI, a failover dump, and an ldd check that nothing resolves outside the wheel but the
# manylinux policy's libraries.
set -euo pipefail
PY="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
SRC=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
wheel=$("$SRC/scripts/wheel" "$work/dist" | tail -1)
echo "scripts/wheel took $(($(date +%s) - start)) s: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
tag=$("$PY" -m auditwheel show "$wheel" | grep -o 'manylinux_[0-9]*_[0-9]*_x86_64' | head -1)
[ -n "$tag" ] || { echo "auditwheel show names no manylinux tag" >&2; exit 1; }
# The policy's libraries (those a manylinux wheel may load from the system).
allowed=$("$PY" - "$tag" <<'PYEOF'
import json, pathlib, sys
import auditwheel
policies = json.loads((pathlib.Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json").read_text())
tag = sys.argv[1].removesuffix("_x86_64")
(p,) = [p for p in policies if p["name"] == tag or tag in p.get("aliases", [])]
print(",".join(sorted(set(p["lib_whitelist"]) | {"linux-vdso.so.1"})))
PYEOF
)
base=$("$PY" -c "import sys; print(sys._base_executable)")
"$base" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check numpy ml_dtypes
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
mkdir "$work/run"
cd "$work/run"
env -u PYTHONPATH "$work/venv/bin/python" "$SRC/tests/python/wheel_smoke.py" "$allowed"
echo "wheel $tag: OK"
