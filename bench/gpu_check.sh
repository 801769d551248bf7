#!/usr/bin/env bash
# The GPU checks of issue 35 in one prepared run, for a lent CUDA machine (docs/PERFORMANCE.md,
# "GPU"): the CUDA tests, then the GPU benchmarks, each with its log in OUT_DIR.
#   WHEEL=dist/savepoint-*.whl bench/gpu_check.sh OUT_DIR [GIB]
# WHEEL (optional): a savepoint wheel for this machine's Python, installed into /tmp/site first
# (the machine has torch, Lightning and transformers but cannot build savepoint's dependencies).
# GIB: the state size of bench/gpu_paths.py's manager section (default 8).
# Steps: tests/python/test_cuda.py and test_lightning.py, the GPU tests of test_hf.py and
# test_accelerate.py (pytest); bench/frameworks_bench.py on the
# GPU (GPT-2, 124M parameters, AdamW; Lightning and Accelerate); bench/gpu_paths.py --sections
# manager.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/gpu_check.sh OUT_DIR [GIB]}
gib=${2:-8}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -n "${WHEEL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEEL || exit 1
  cp python/savepoint/*.py /tmp/site/savepoint/  # this tree's Python over the wheel's
  export PYTHONPATH=/tmp/site
fi
failed=""
step() {  # step NAME SECONDS COMMAND...: runs, logs, times; a failure does not stop the others
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || failed="$failed $name"
  echo "== $name: rc $rc in $(($(date +%s) - t0)) s"
  tail -n 25 "$out/$name.log"
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch, lightning, transformers, savepoint
print(sys.version.split()[0], 'torch', torch.__version__, 'lightning', lightning.__version__,
      'transformers', transformers.__version__, 'savepoint', savepoint.__file__)"
  nproc
} 2>&1 | tee "$out/machine.txt"
step tests 200 python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_cuda.py \
  tests/python/test_lightning.py
step hf_tests 120 python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_hf.py \
  tests/python/test_accelerate.py -k "gpu or cuda"
step frameworks_bench 200 python3 bench/frameworks_bench.py --accelerator gpu --dir /tmp/sp_fbench
step gpu_paths 200 python3 bench/gpu_paths.py --gib "$gib" --sections manager --dir /tmp/sp_gpu
[ -z "$failed" ] || { echo "== failed:$failed"; exit 1; }
