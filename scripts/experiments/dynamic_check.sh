#!/usr/bin/env bash
# One device call for the carry kernel's experiments (the dynamic tail, WGRAD_CARRY_DYNAMIC; the L2 prefetch
# before the table, WGRAD_CARRY_PREFETCH): build (reusing a carried .device_cache), the timeline probe per
# setting, the carry kernel's GPU tests and the knob tests, the quantization GPU tests (DYN_ALL_TESTS=1), then
# the order sweep of the settings side by side and the benchmark. Logs under $OUT.
#   OUT=... scripts/experiments/dynamic_check.sh
# env DYN_SETTINGS (probe: "off 0:1 1:1 ...", each optionally +pfN or +pfboxN: the L2 prefetch of N tiles, a
# row or a TMA box at a time, else none), DYN_CASES (probe: R x C x G x align), DYN_TOKENS (sweep), ORDER_KINDS,
# ORDER_SHAPES, SWEEP_REPS; DYN_BENCH=N: then N runs of `python -m wgrad bench --quant --reps 15` (bench.txt),
# under each VAR=VALUE of DYN_BENCH_ENVS (space-separated; default: none); DYN_PYTEST_K: the -k of the carry
# tests; DYN_HAND_BACK=DIR: a fresh build handed back there (scripts/build_cache.sh; $OUT returns at most ~8
# files); DYN_SANITIZER=1: compute-sanitizer memcheck and racecheck on the carry kernel's cases
# (`scripts/sanitizer_cases.py carry`: every tile shape, the tail, both prefetch forms, the padded form).
# Sessions 35-36's plan for the prefetch (docs/perf-notes.md), two calls (carry [".whl"]):
#   1. DYN_SETTINGS="off+pf0 off+pf1 off+pf2 off+pfbox1 off+pfbox2 off+pfbox4 0:1:198+pf0 0:1:198+pf1 0:1:198+pfbox2" \
#      DYN_CASES="4096x7168x8x1 8192x2112x8x1 8192x4096x8x1 8192x2112x8x16" DYN_ALL_TESTS=1 \
#      DYN_TOKENS="WGRAD_CARRY_PREFETCH=0,WGRAD_CARRY_PREFETCH=1,WGRAD_CARRY_PREFETCH=2,WGRAD_CARRY_PREFETCH=box1,WGRAD_CARRY_PREFETCH=box2,WGRAD_CARRY_PREFETCH=box4" \
#      ORDER_KINDS="segments,segments16" DYN_SANITIZER=1 OUT=$OUT scripts/experiments/dynamic_check.sh
#      (DYN_ALL_TESTS=1 also runs the padded carry form's GPU tests, tests/test_quant_padded.py; DYN_SANITIZER
#      the carry kernel under compute-sanitizer, never run there before session 37.)
#   2. the padded cast through the carry kernel (session 36) against the TMA kernel, and the benchmark under
#      the best prefetch and under the carry kernel for every segments cast, beside none:
#      DYN_SETTINGS=off DYN_PYTEST_K=prefetch ORDER_KINDS=segments_pad32 \
#      DYN_TOKENS="WGRAD_SEGMENT_KERNEL=tma,WGRAD_SEGMENT_KERNEL=carry,WGRAD_SEGMENT_KERNEL=carry+WGRAD_CARRY_PREFETCH=<best>" \
#      DYN_BENCH=1 DYN_BENCH_ENVS="WGRAD_CARRY_PREFETCH=0 WGRAD_CARRY_PREFETCH=<best> WGRAD_SEGMENT_KERNEL=carry" \
#      OUT=$OUT scripts/experiments/dynamic_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-out}"; mkdir -p "$OUT"
source scripts/wheels.sh
install_wheels /tmp/site > /dev/null 2>&1 || echo "wheel install failed"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONPATH=$PWD/python:/tmp/site PYTHONUNBUFFERED=1
t0=$(date +%s)
source scripts/build_cache.sh
( /usr/local/cuda/bin/nvcc -std=c++20 -arch=sm_90a -O3 -I csrc -I scripts/experiments \
    scripts/experiments/carry_timeline_probe.cu -o /tmp/carry_probe > "$OUT/probe_build.log" 2>&1 || echo PROBE BUILD FAILED ) &
build_release "$(nproc)" "$OUT/build.log" .device_cache "${DYN_HAND_BACK:--}" || { echo BUILD FAILED; grep -E "error" "$OUT/build.log" | head -30; exit 1; }
wait
echo "build $(( $(date +%s) - t0 )) s; spills: $(grep -c -E '[1-9][0-9]* bytes spill stores' "$OUT/build.log")"
CASES=${DYN_CASES:-"4096x7168x8x1 8192x2112x8x1 8192x4096x8x1"}
for s in ${DYN_SETTINGS:-off 0:1:198 0:1}; do
  echo "== probe $s"
  dyn=${s%%+pf*}; pf=0; [[ $s == *+pf* ]] && pf=${s##*+pf}
  if [ "$dyn" = off ]; then CARRY_PREFETCH=$pf timeout 120 /tmp/carry_probe $CASES
  else CARRY_PREFETCH=$pf CARRY_DYNAMIC=$dyn timeout 120 /tmp/carry_probe $CASES; fi
done > "$OUT/probe.txt" 2>&1
echo "probe done"; grep -E "^==|kernel|memset|CTA ends|COUNTER|entry spread|after the table|tile 1" "$OUT/probe.txt"
t0=$(date +%s)
timeout 400 python3 -m pytest tests/test_quant.py -q --maxfail=10 -k "${DYN_PYTEST_K:-carry or reject_bad_values}" > "$OUT/pytest_carry.log" 2>&1
echo "pytest (carry, knobs) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest_carry.log")"
if [ "${DYN_ALL_TESTS:-0}" = 1 ]; then
  t0=$(date +%s)
  timeout 300 python3 -m pytest tests/test_quant.py tests/test_quant_padded.py -q --maxfail=10 -k "gpu or cuda" > "$OUT/pytest.log" 2>&1
  echo "pytest (quant) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest.log")"
fi
grep -h -E "^FAILED|^E  " "$OUT"/pytest_*.log | head -20
t0=$(date +%s)
timeout 300 python3 scripts/profile_quant.py order-sweep \
    "${DYN_TOKENS:-WGRAD_SEGMENT_KERNEL=carry+WGRAD_CARRY_DYNAMIC=off,WGRAD_SEGMENT_KERNEL=carry,WGRAD_SEGMENT_KERNEL=carry+WGRAD_CARRY_DYNAMIC=0:1}" \
    "${ORDER_KINDS:-segments,segments16}" "${ORDER_SHAPES:-4096,7168 8192,2112 8192,4096 16384,7168 4096,24576}" \
    > "$OUT/orders.txt" 2>&1
echo "orders rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/orders.txt"
for benv in ${DYN_BENCH_ENVS:--}; do
  for run in $(seq 1 "${DYN_BENCH:-0}"); do
    t0=$(date +%s); echo "== bench run $run ($benv)" >> "$OUT/bench.txt"
    if [ "$benv" = - ]; then python3 -m wgrad bench --quant --reps 15 >> "$OUT/bench.txt" 2>&1
    else env "$benv" python3 -m wgrad bench --quant --reps 15 >> "$OUT/bench.txt" 2>&1; fi
    echo "bench run $run ($benv) rc=$? $(( $(date +%s) - t0 )) s"
  done
done
[ -f "$OUT/bench.txt" ] && grep -E "^== bench|^quantize.*[0-9]+ x [0-9]+ " "$OUT/bench.txt"
if [ "${DYN_SANITIZER:-0}" = 1 ]; then  # last: the carry kernel's cases of sanitizer_cases.py
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout 150 "$san" --tool $tool --error-exitcode 9 python3 scripts/sanitizer_cases.py carry > /tmp/san.log 2>&1
    echo "$tool rc=$? $(( $(date +%s) - t0 )) s: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" /tmp/san.log | tail -1)"
    { echo "== $tool"; head -c 200000 /tmp/san.log; } >> "$OUT/sanitizer.log"
  done
fi
