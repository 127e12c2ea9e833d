#!/usr/bin/env bash
# Builds the one wheel of wgrad into dist/: wgrad-<version>-cp310-abi3-manylinux_2_<glibc>_x86_64.whl (sm_90a;
# torch's stable ABI from 2.11 on, Python's limited API from 3.10 on; torch is a dependency, not bundled; the
# glibc in the tag is the newest the built library needs, see setup.py). The version
# comes from git (setup.py). Reproducible: the archive's time stamps are the commit's (SOURCE_DATE_EPOCH), so
# two builds of one commit in one place with one toolchain give the same bytes.
#
# Needs torch, nvidia-cutlass and ninja in the python3 on PATH (no build isolation: the build compiles against
# that torch) and nvcc (CUDA_HOME). Honours MAX_JOBS and NVCC_THREADS; build/wheel.log keeps ptxas's report.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${WGRAD_DIAG_VARIANTS:-0}" = 1 ]; then
  echo "WGRAD_DIAG_VARIANTS=1 makes a measurement build: never a wheel" >&2
  exit 2
fi
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -d /usr/local/cuda/include ]; then CUDA_HOME=/usr/local/cuda
  else CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"; fi
fi
export CUDA_HOME
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}"
mkdir -p build dist
exec 9>build/.lock
flock 9
rm -f dist/wgrad-*.whl
python3 -m pip wheel --no-build-isolation --no-deps --no-cache-dir -v -w dist . > build/wheel.log 2>&1 || {
  tail -40 build/wheel.log >&2
  echo "wheel build failed: build/wheel.log" >&2
  exit 1
}
ls dist/wgrad-*.whl
