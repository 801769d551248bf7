#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds tests/consumer against it with
# find_package(savepoint). Usage: consumer_test.sh CMAKE BUILD_DIR CONSUMER_SRC
set -euo pipefail
cmake_bin="$1" build="$2" src="$3"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cmake_bin" --install "$build" --prefix "$work/prefix" >/dev/null
"$cmake_bin" -S "$src" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
"$cmake_bin" --build "$work/build" >/dev/null
export LD_LIBRARY_PATH="$work/prefix/lib:$work/prefix/lib64:${LD_LIBRARY_PATH:-}"
"$work/build/consumer" "$work/ckpt"
if [ -x "$work/build/consumer_mpi" ]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$work/build/consumer_mpi"
else
  echo "consumer_test: savepoint::savepoint_mpi was not installed (no MPI)" >&2
  exit 1
fi
