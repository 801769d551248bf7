#!/usr/bin/env bash
# Failover with real processes (docs/FAILOVER.md): a rank with a wrong job token is refused, and
# killing the controller (SIGKILL) leaves the ranks training to the end unprotected.
# Usage: process_test.sh SAVEPOINT_CLI FAILOVER_TRAIN
set -euo pipefail
cli="$1" train="$2"
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export SAVEPOINT_JOB_TOKEN="process-test-token-0123456789"
"$cli" controller --world 2 --dir "$work/ckpt" --port-file "$work/port" 2>"$work/controller.log" &
ctl=$!
for _ in $(seq 500); do [ -s "$work/port" ] && break; sleep 0.01; done
export SAVEPOINT_CONTROLLER="127.0.0.1:$(cat "$work/port")" SAVEPOINT_WORLD_SIZE=2

# A stray process with another token cannot register.
if SAVEPOINT_JOB_TOKEN="wrong-token-wrong-token-00" SAVEPOINT_RANK=0 "$train" --dir "$work/ckpt" \
  --steps 5 2>"$work/stray.log"; then
  echo "process_test: a rank with a wrong token was accepted" >&2
  exit 1
fi
grep -q unauthenticated "$work/stray.log" || { cat "$work/stray.log" >&2; exit 1; }

# The job; the controller is killed mid-training; the ranks go on to the last step.
pids=()
for r in 0 1; do
  SAVEPOINT_RANK=$r "$train" --dir "$work/ckpt" --steps 60 --save-every 0 --step-ms 10 \
    --log "$work/loss.$r" >"$work/rank$r.log" 2>&1 &
  pids+=($!)
done
while [ "$(cat "$work/loss.0" 2>/dev/null | wc -l)" -lt 10 ]; do sleep 0.005; done
kill -9 "$ctl"
wait "$ctl" 2>/dev/null || true
for p in "${pids[@]}"; do wait "$p" || { echo "process_test: a rank failed" >&2; cat "$work"/rank*.log >&2; exit 1; }; done
for r in 0 1; do
  [ "$(wc -l <"$work/loss.$r")" = 60 ] || { echo "process_test: rank $r stopped early" >&2; exit 1; }
done
grep -q "lost the failover controller" "$work/rank0.log"
echo "process_test: wrong token refused; controller killed, ranks finished unprotected"
