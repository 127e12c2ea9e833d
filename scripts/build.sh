#!/usr/bin/env bash
# Builds the extension in place (python/wgrad/_C*.so). Serialised with a lock so that parallel shells
# never share one half-written build tree. Honours MAX_JOBS and NVCC_THREADS; the log keeps ptxas's
# register/spill report of every kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -d /usr/local/cuda/include ]; then CUDA_HOME=/usr/local/cuda
  else CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"; fi
fi
export CUDA_HOME
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}"
mkdir -p build
exec 9>build/.lock
flock 9
python3 setup.py build_ext --inplace "$@" 2>&1 | tee build/build.log
