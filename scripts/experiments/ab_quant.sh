#!/usr/bin/env bash
# One device call: the working tree's build against a base tree's (scripts/experiments/base.tar, `git archive
# HEAD csrc python scripts setup.py`), built side by side; the quantization GPU tests on the working tree;
# the segments casts' order sweep in both builds, interleaved; the quantization benchmark of the working tree.
# Logs under $OUT. Env: AB_TESTS (quant, or all), AB_ORDERS (auto,1), AB_KINDS (segments,segments16), AB_SHAPES (the benchmark's), AB_ROUNDS
# (2: new, base, new, base, ...).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-out}"; mkdir -p "$OUT"
source scripts/wheels.sh
install_wheels /tmp/site || echo "wheel install failed"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1
JOBS=$(( $(nproc) / 2 ))
rm -rf /tmp/wgrad_base && mkdir -p /tmp/wgrad_base && tar -xf scripts/experiments/base.tar -C /tmp/wgrad_base
t0=$(date +%s)
# (Either build is reused from a carried .device_cache of the same inputs, scripts/build_cache.sh; the working
# tree's fresh build is handed back under $OUT/device_cache.)
source scripts/build_cache.sh
REPO=$PWD
( cd /tmp/wgrad_base && build_release "$JOBS" "$OUT/build_base.log" "$REPO/.device_cache" - || echo "BASE BUILD FAILED" ) &
build_release "$JOBS" "$OUT/build.log" || { echo BUILD FAILED; grep -E "error" "$OUT/build.log" | head -30; exit 1; }
wait
echo "builds $(( $(date +%s) - t0 )) s; spills: $(grep -c -E '[1-9][0-9]* bytes spill stores' "$OUT/build.log")"
NEW=$PWD/python:/tmp/site; BASE=/tmp/wgrad_base/python:/tmp/site
t0=$(date +%s)
# (AB_TESTS=all: every GPU test of the working tree, as scripts/device_run.sh runs them.)
if [ "${AB_TESTS:-quant}" = all ]; then TESTS=(tests); else TESTS=(tests/test_quant.py tests/test_quant_padded.py); fi
PYTHONPATH=$NEW timeout 300 python3 -m pytest "${TESTS[@]}" -q -x -k "gpu or cuda" > "$OUT/pytest.log" 2>&1
echo "tests (${AB_TESTS:-quant}) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest.log")"
grep -E "FAILED|Error" "$OUT/pytest.log" | head -10
ORDERS=${AB_ORDERS:-auto,1}; KINDS=${AB_KINDS:-segments,segments16}
SHAPES=${AB_SHAPES:-8192,2112 8192,4096 4096,7168 16384,7168 4096,24576}
t0=$(date +%s)
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for side in new base; do
    if [ $side = new ]; then P=$NEW; else P=$BASE; fi
    echo "== $side (round $round)"
    PYTHONPATH=$P timeout 200 python3 scripts/profile_quant.py order-sweep "$ORDERS" "$KINDS" "$SHAPES" 2>&1 | tee -a "$OUT/orders_$side.txt"
  done
done
echo "orders $(( $(date +%s) - t0 )) s"
if [ -z "${AB_NO_BENCH:-}" ]; then
  t0=$(date +%s); PYTHONPATH=$NEW python3 -m wgrad bench --json "$OUT/bench.json" --quant --reps 15 > "$OUT/bench.txt" 2> "$OUT/bench.err"
  echo "bench rc=$? $(( $(date +%s) - t0 )) s"; tail -45 "$OUT/bench.txt"; tail -5 "$OUT/bench.err"
fi
