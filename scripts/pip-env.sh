# Sourced (not run) by the scripts that build the Python package with pip (scripts/wheel,
# tests/python/pip_install_test.sh), with SRC set to the source tree: the environment that makes
# scikit-build-core's compile lines match those of .ci/run's Release build, so that ccache serves
# the library's objects from it.
# ccache: paths relative to the source tree's parent, as the CMake builds use them.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd "$SRC/.." && pwd)}"
# scikit-build-core runs the first `cmake` on PATH. The system's is the one .ci/run's Release build
# uses; another (a PyPI cmake in a pyenv shim, say) orders flags differently and picks `g++` for
# `c++`, so no compile line would match the Release build's and ccache would miss every object.
if [ -x /usr/bin/cmake ]; then export PATH="/usr/bin:$PATH"; fi
# Likewise the compilers: without CC / CXX, scikit-build-core passes Python's own (sysconfig's
# "gcc" / "g++"), where a plain CMake build finds `cc` / `c++`: the same binaries under other
# names, which ccache keys apart.
export CC="${CC:-cc}" CXX="${CXX:-c++}"
