#!/usr/bin/env bash
# Builds the core with plain CMake and runs every test: ctest (C++ tests and the C
# host program), then pytest against the installed package. The CUDA sources are
# compiled by the package build (pip install .), which enables them when nvcc exists;
# the ctest build leaves them out so they are not compiled twice. Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)

echo "== cmake build (core, C ABI library, C/C++ tests) =="
cmake -S . -B build/ctest "${gen[@]}" -DLLMCORE_BUILD_PYTHON=OFF -DLLMCORE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/ctest -j "$jobs"

echo "== ctest =="
ctest --test-dir build/ctest --output-on-failure -j "$jobs"

echo "== pytest =="
# Run from the tests' point of view against the installed package, not the source tree.
set +e
python -m pytest --durations=25 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
