#!/usr/bin/env bash
# One command for an SM90 machine: build with every core, run every test (GPU ones included), the
# sanitizer on a few shapes, and the benchmark. Logs and JSON go to the folder given (default out/).
#   scripts/gpu_check.sh OUT_DIR [--wheel WHL] [--no-bench] [--bench-args "..."] [--pytest-args "..."]
# Wheels found in .whl/ (e.g. nvidia-cutlass for a machine without internet) are installed first.
# --wheel WHL: no build; the wheel (scripts/build_wheel.sh, built anywhere) is installed with
# `pip install --no-deps` and the tests run from outside the tree against that installed package.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-out}"; shift || true
BENCH=1; BENCH_ARGS=""; PYTEST_ARGS=""; SANITIZER=1; WHEEL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) BENCH=0 ;;
    --no-sanitizer) SANITIZER=0 ;;
    --bench-args) BENCH_ARGS="$2"; shift ;;
    --pytest-args) PYTEST_ARGS="$2"; shift ;;
    --wheel) WHEEL="$(readlink -f "$2")"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

source scripts/wheels.sh
install_wheels /tmp/wgrad-site || { note "wheel install failed"; exit 1; }
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$SUMMARY"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$SUMMARY"

if [ -n "$WHEEL" ]; then
  # The installed package only: an in-place build would hide it from the tests (tests/conftest.py).
  if compgen -G "python/wgrad/_C*.so" > /dev/null; then note "in-place build python/wgrad/_C*.so: remove it"; exit 1; fi
  python3 -m pip install -q --no-deps --force-reinstall "$WHEEL" || { note "wheel install failed"; exit 1; }
  note "wheel: $(basename "$WHEEL")"
else
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  t0=$(date +%s)
  if ! ./scripts/build.sh > "$OUT/build.log" 2>&1; then
    note "BUILD FAILED ($(( $(date +%s) - t0 )) s)"; grep -E "error" "$OUT/build.log" | head -30; exit 1
  fi
  note "build: $(( $(date +%s) - t0 )) s"
  grep -E "Compiling entry|registers|spill" "$OUT/build.log" | grep -B1 -A1 "wgrad_gemm_kernel\|quant" | grep -E "registers|spill" | sort | uniq -c | head -40 >> "$SUMMARY"
  if grep -E "[1-9][0-9]* bytes spill" "$OUT/build.log" > /dev/null; then note "WARNING: spills in build log"; fi
fi
(cd /tmp && python3 -m wgrad info) | tee -a "$SUMMARY"

if [ -x build/cpp/wgrad_cpp_tests ] || cmake -S . -B build/cpp -DCMAKE_BUILD_TYPE=Release > /dev/null 2>&1; then
  cmake --build build/cpp -j "$MAX_JOBS" > /dev/null 2>&1 || note "C++ test build failed"
fi

t0=$(date +%s)
# (From outside the tree: `import wgrad` finds the package under test, installed or on PYTHONPATH.)
REPO="$PWD"
(cd /tmp && python3 -m pytest "$REPO/tests" -q -rs --maxfail=10 --durations=15 $PYTEST_ARGS) > "$OUT/pytest.log" 2>&1
rc=$?
note "pytest rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/pytest.log")"

if [ "$SANITIZER" = 1 ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 python3 scripts/sanitizer_cases.py >> "$OUT/sanitizer.log" 2>&1
    note "compute-sanitizer $tool rc=$?"
  done
fi

if [ "$BENCH" = 1 ]; then
  t0=$(date +%s)
  python3 -m wgrad bench --json "$OUT/bench.json" $BENCH_ARGS > "$OUT/bench.txt" 2> "$OUT/bench.err"
  note "bench rc=$? ($(( $(date +%s) - t0 )) s)"
  tail -40 "$OUT/bench.txt"
fi
cat "$SUMMARY"
exit $rc
