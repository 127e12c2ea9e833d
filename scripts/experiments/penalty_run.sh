#!/usr/bin/env bash
# One device call for the power-of-two study (docs/perf-notes.md, session 17): the release build and the
# measurement build (WGRAD_DIAG_VARIANTS=1) side by side, then
#   1. penalty_probe.py placement (release): the casts with q_t at several places in memory;
#   2. order-sweep (measurement build) of Colwise and the one-segment cast with and without the start delay
#      (WGRAD_QUANT_DIAG=32), on power-of-two and neighbouring column counts;
#   3. timelines (measurement build, WGRAD_QUANT_PROBE=2) of both at 8192 x 4096 and 8192 x 4224.
# Logs under $OUT. Env: PR_STEPS (default placement,delay,timeline; also calls and copies: penalty_probe.py
# calls / copies; bench: python -m wgrad bench --quant),
# PLACEMENT_SPACERS (MB list), PR_ORDERS / PR_KINDS / PR_SHAPES (the measurement build's order-sweep).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
t0=$(date +%s)
rm -rf /tmp/wgrad_diag && mkdir -p /tmp/wgrad_diag && cp -r csrc python scripts setup.py /tmp/wgrad_diag/
rm -f /tmp/wgrad_diag/python/wgrad/_C*.so
( cd /tmp/wgrad_diag && MAX_JOBS=8 WGRAD_DIAG_VARIANTS=1 ./scripts/build.sh > "$OUT/build_diag.log" 2>&1 || echo "DIAG BUILD FAILED" ) &
MAX_JOBS=8 ./scripts/build.sh > "$OUT/build.log" 2>&1 || { echo BUILD FAILED; grep error "$OUT/build.log" | head; exit 1; }
wait
echo "build $(( $(date +%s) - t0 )) s"
REL=$PWD/python:/tmp/site DIAGP=/tmp/wgrad_diag/python:/tmp/site
case "${PR_STEPS:-placement,delay,timeline}" in *calls*)
  PYTHONPATH=$REL python3 scripts/experiments/penalty_probe.py calls 2>&1 | tee "$OUT/calls.txt" ;; esac
case "${PR_STEPS:-placement,delay,timeline}" in *copies*)
  PYTHONPATH=$REL python3 scripts/experiments/penalty_probe.py copies 2>&1 | tee "$OUT/copies.txt" ;; esac
case "${PR_STEPS:-placement,delay,timeline}" in *bench*)
  PYTHONPATH=$REL python3 -m wgrad bench --quant --reps 15 2>&1 | tee "$OUT/bench.txt" ;; esac
case "${PR_STEPS:-placement,delay,timeline}" in *placement*)
  PYTHONPATH=$REL python3 scripts/experiments/penalty_probe.py placement ${PLACEMENT_SPACERS:-0,1,2,3,4,8,16,32} 2>&1 | tee "$OUT/placement.txt" ;; esac
case "${PR_STEPS:-placement,delay,timeline}" in *delay*)
  SWEEP_REPS=${SWEEP_REPS:-5} PYTHONPATH=$DIAGP python3 /tmp/wgrad_diag/scripts/profile_quant.py order-sweep "${PR_ORDERS:-default,WGRAD_QUANT_DIAG=32}" \
    "${PR_KINDS:-colwise,segments_one}" "${PR_SHAPES:-8192,4096 8192,4224 8192,2048 8192,2112}" 2>&1 | tee "$OUT/delay_sweep.txt" ;; esac
case "${PR_STEPS:-placement,delay,timeline}" in *timeline*)
  PYTHONPATH=$DIAGP python3 /tmp/wgrad_diag/scripts/profile_quant.py timeline colwise:8192,4096 segments_one:8192,4096 \
    colwise:8192,4224 segments_one:8192,4224 > "$OUT/timeline.log" 2>&1
  PYTHONPATH=$DIAGP python3 /tmp/wgrad_diag/scripts/profile_quant.py timeline-summary "$OUT/timeline.log" 2>&1 | tee "$OUT/timeline_summary.txt" ;; esac
