#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds tests/consumer against it with
# find_package(savepoint), after checking that the installed libraries export no internal symbol.
# Usage: consumer_test.sh CMAKE BUILD_DIR CONSUMER_SRC
set -euo pipefail
cmake_bin="$1" build="$2" src="$3"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cmake_bin" --install "$build" --prefix "$work/prefix" >/dev/null
# The installed libraries export the public API only: no symbol of an internal namespace
# (savepoint::engine::, savepoint::io::, ...; public names below savepoint:: are capitalised).
for lib in $(find "$work/prefix" -name 'libsavepoint*.so*' -type f); do
  count=$(nm -DC --defined-only "$lib" | grep -c ' savepoint::' || true)
  internal=$(nm -DC --defined-only "$lib" | grep -E ' savepoint::[a-z_]+::' || true)
  if [ -n "$internal" ]; then
    echo "consumer_test: $lib exports internal symbols:" >&2
    echo "$internal" | head -n 20 >&2
    exit 1
  fi
  echo "consumer_test: $(basename "$lib") exports $count savepoint:: symbols, none internal"
done
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
