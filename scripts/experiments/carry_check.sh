#!/usr/bin/env bash
# One device call for the carried-sectors segments kernel (csrc/kernels/quantize_segments_carry.cuh):
# build (reusing a carried .device_cache), the segments GPU tests with WGRAD_SEGMENT_KERNEL=carry (every
# eligible cast takes it), the knob tests without it, then the order sweep of the kernels side by side:
#   OUT=... scripts/experiments/carry_check.sh ["TOKENS"]   (default: tma, carry)
# env ORDER_KINDS, ORDER_SHAPES, SWEEP_REPS as for scripts/device_run.sh --orders; SKIP_TESTS=1 skips them.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-out}"; mkdir -p "$OUT"
TOKENS=${1:-"WGRAD_SEGMENT_KERNEL=tma,WGRAD_SEGMENT_KERNEL=carry"}
./scripts/device_run.sh --no-tests --sweep none || exit 1
source scripts/wheels.sh
install_wheels /tmp/site > /dev/null || true
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  t0=$(date +%s)
  WGRAD_SEGMENT_KERNEL=carry python3 -m pytest tests -q -k "segments and gpu and not reject_bad_values" \
      > "$OUT/pytest_carry.log" 2>&1
  echo "pytest (carry) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest_carry.log")"
  python3 -m pytest tests -q -k "carry or reject_bad_values" > "$OUT/pytest_knobs.log" 2>&1
  echo "pytest (knobs) rc=$?: $(tail -1 "$OUT/pytest_knobs.log")"
  grep -h -E "^FAILED|^E  " "$OUT"/pytest_*.log | head -20
fi
t0=$(date +%s)
python3 scripts/profile_quant.py order-sweep "$TOKENS" "${ORDER_KINDS:-segments,segments16,segments_one}" \
    "${ORDER_SHAPES:-4096,7168 8192,2112 8192,4096 16384,7168 4096,24576}" > "$OUT/orders.txt" 2>&1
echo "orders $(( $(date +%s) - t0 )) s"; cat "$OUT/orders.txt"
