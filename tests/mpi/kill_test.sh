#!/usr/bin/env bash
# A rank killed (SIGKILL) mid-save: the job must end without hanging (ctest's TIMEOUT catches a
# hang) and without a committed checkpoint.
#   kill_test.sh MPIEXEC NP CHECK_BINARY DIR
set -u
mpiexec=$1 np=$2 check=$3 dir=$4
rm -rf "$dir"
"$mpiexec" -np "$np" --oversubscribe --allow-run-as-root "$check" kill "$dir"
rc=$?
if [ "$rc" -eq 0 ]; then echo "FAIL: the job succeeded although a rank was killed"; exit 1; fi
if [ -e "$dir/ckpt" ]; then echo "FAIL: $dir/ckpt was committed"; exit 1; fi
echo "OK: job ended with status $rc and no commit"
