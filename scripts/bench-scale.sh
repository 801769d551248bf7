#!/usr/bin/env bash
# scripts/bench --scale: coordination at 64 .. 16,384 simulated ranks and the failover controller
# at 64 .. 1,024 agents (docs/PERFORMANCE.md, "Scale"; run by scripts/bench, not on its own).
#
#   scripts/bench --scale [--ranks 64,1024,4096,16384] [--dcp-ranks 64,1024,4096]
#                         [--agents 64,256,1024] [--out DIR] [--build-dir B]
#
#   --ranks      world sizes of bench/scale_bench (savepoint's save coordination and load planning,
#                through the real code; ~6 GiB of memory at 16,384), run with the indexed manifest
#                of compact records (format version 4), of fixed ones (3) and with the JSON one (2)
#   --dcp-ranks  world sizes of bench/scale_dcp.py, PyTorch DCP's default planners on the same
#                layout (minutes per point beyond 1,024 ranks: DCP's planning is pure Python);
#                "none" skips it
#   --agents     agent counts of bench/controller_scale_bench; "none" skips it
#   --out        where the JSON lines and scale.png go (default build/bench-scale)
# Ends with: scale: ranks N, coordinate S s, coordinator peak M MiB, manifest B MiB,
#            rank load plan P ms, dcp coordinate D s
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=64,1024,4096,16384
dcp_ranks=64,1024,4096
agents=64,256,1024
out=build/bench-scale
build_dir=build
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) shift ;;
    --ranks) ranks="$2"; shift 2 ;;
    --dcp-ranks) dcp_ranks="$2"; shift 2 ;;
    --agents) agents="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "scripts/bench --scale: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
python=$(scripts/venv)
"$python" -c "import matplotlib" 2>/dev/null || "$python" -m pip install -q matplotlib >&2
NINJA_TARGETS="scale_bench controller_scale_bench savepoint_cli" scripts/build "$build_dir" \
  -DSAVEPOINT_BUILD_PYTHON=ON -DPython_EXECUTABLE="$python" -DSAVEPOINT_PYTHON="$python" >&2
mkdir -p "$out"
: > "$out/savepoint.jsonl"; : > "$out/savepoint-v2.jsonl"; : > "$out/savepoint-v3.jsonl"
: > "$out/dcp.jsonl"
: > "$out/controller.jsonl"
echo "== machine: $(nproc) cpus, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
echo "== savepoint: bench/scale_bench --ranks $ranks --format-version 4"
"$build_dir/bench/scale_bench" --ranks "$ranks" --dir "$out" --format-version 4 |
  tee "$out/savepoint.jsonl"
echo "== savepoint: bench/scale_bench --ranks $ranks --format-version 3"
"$build_dir/bench/scale_bench" --ranks "$ranks" --dir "$out" --format-version 3 |
  tee "$out/savepoint-v3.jsonl"
echo "== savepoint: bench/scale_bench --ranks $ranks --format-version 2"
"$build_dir/bench/scale_bench" --ranks "$ranks" --dir "$out" --format-version 2 |
  tee "$out/savepoint-v2.jsonl"
if [ "$dcp_ranks" != none ]; then
  echo "== DCP: bench/scale_dcp.py --ranks $dcp_ranks"
  "$python" bench/scale_dcp.py --ranks "$dcp_ranks" | tee "$out/dcp.jsonl"
fi
if [ "$agents" != none ]; then
  echo "== controller: bench/controller_scale_bench --agents $agents"
  "$build_dir/bench/controller_scale_bench" --cli "$build_dir/tools/savepoint" \
    --agents "$agents" | tee "$out/controller.jsonl"
fi
"$python" bench/scale_report.py "$out/savepoint.jsonl" "$out/dcp.jsonl" "$out/controller.jsonl" \
  "$out/scale.png" "$out/savepoint-v2.jsonl" "$out/savepoint-v3.jsonl"
