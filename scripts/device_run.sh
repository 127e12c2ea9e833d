#!/usr/bin/env bash
# One device call for kernel work: build, GPU tests, BLOCK_N sweep (scripts/profile_dense.py), an ncu
# profile of one dense shape, optionally the full benchmark. Logs under $OUT (default out/).
#   scripts/device_run.sh [--no-tests] [--memcheck] [--racecheck] [--ncu M,N,K] [--bench "ARGS"] [--sweep "M,N,K ..."|all|none]
#                         [--diag "BITS,BITS,..."] [--probe "R,C R,C ..."|default] [--ncu-quant "KIND:R,C ..."]
#                         [--orders "ORDERS"] [--quant-diag "ORDERS"] [--quant-probe "MODES"]
#                         [--timeline "KIND:R,C ..."]
# --diag: also build the measurement variant (WGRAD_DIAG_VARIANTS=1, in a copy of the tree, beside the
# release build) and time the dense seed shapes with each WGRAD_DIAG value (docs/perf-notes.md, session 9).
# --probe: the quantization start-up study (scripts/profile_quant.py startup) in the release build and,
# for its clock probes, in the measurement build (built as for --diag).
# --ncu-quant: ncu (full set) of the quantization kernel KIND (scripts/profile_quant.py) on R x C, each;
# the details of all of them in one file, ncu_quant.txt (NCU_QUANT_SASS=1: and each one's SASS with its
# stall samples, ncu_sass_KIND_R_C.csv).
# GPU tests: those pytest -k "gpu or cuda" selects (env PYTEST_K: another expression).
# --orders: the segments cast's tile orders (scripts/profile_quant.py order-sweep ORDERS) on the benchmark's
# shapes, unaligned, 16- and 32-aligned splits (env ORDER_KINDS, ORDER_SHAPES "R,C R,C ...": others).
# --quant-diag: the same sweep in the measurement build (built as for --diag), ORDERS tokens with the
# knob WGRAD_QUANT_DIAG (e.g. "WGRAD_SEGMENT_ORDER=c18+WGRAD_QUANT_DIAG=1,..."), over QUANT_DIAG_KINDS
# (default segments,segments32,colwise) and QUANT_DIAG_SHAPES (default 8192,4096 4096,7168).
# --quant-probe: scripts/experiments/penalty_probe.py in the release build, once per MODE (e.g. "calls
# copies", "placement", "default"; docs/perf-notes.md, session 17).
# --timeline: every consumer group's timeline of each cast, once after an L2 flush, in the measurement
# build (built as for --diag; scripts/profile_quant.py timeline), and its summary.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out}"; mkdir -p "$OUT"
TESTS=1; MEMCHECK=0; RACECHECK=0; NCU=""; BENCH=""; SWEEP=all; DIAG=""; PROBE=""; NCU_QUANT=""; ORDERS=""; QDIAG=""; QPROBE=""
TIMELINE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) TESTS=0 ;;
    --memcheck) MEMCHECK=1 ;;
    --racecheck) RACECHECK=1 ;;
    --ncu) NCU="$2"; shift ;;
    --bench) BENCH="$2"; shift ;;
    --sweep) SWEEP="$2"; shift ;;
    --diag) DIAG="$2"; shift ;;
    --probe) PROBE="$2"; shift ;;
    --ncu-quant) NCU_QUANT="$2"; shift ;;
    --orders) ORDERS="$2"; shift ;;
    --quant-diag) QDIAG="$2"; shift ;;
    --quant-probe) QPROBE="$2"; shift ;;
    --timeline) TIMELINE="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
source scripts/wheels.sh
install_wheels /tmp/site || echo "wheel install failed"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader
t0=$(date +%s); JOBS=$MAX_JOBS
if [ -n "$DIAG$PROBE$QDIAG$TIMELINE" ]; then  # the measurement build, in a copy, beside the release build (half the jobs each)
  JOBS=$(( MAX_JOBS / 2 > 0 ? MAX_JOBS / 2 : 1 ))
  rm -rf /tmp/wgrad_diag && mkdir -p /tmp/wgrad_diag && cp -r csrc python scripts setup.py /tmp/wgrad_diag/
  rm -f /tmp/wgrad_diag/python/wgrad/_C*.so
  ( cd /tmp/wgrad_diag && MAX_JOBS=$JOBS WGRAD_DIAG_VARIANTS=1 ./scripts/build.sh > "$OUT/build_diag.log" 2>&1 \
      || echo "DIAG BUILD FAILED" ) &
fi
source scripts/build_cache.sh  # (the release build reused from a carried .device_cache when its inputs match)
build_release "$JOBS" "$OUT/build.log" || { echo BUILD FAILED; grep -E "error" "$OUT/build.log" | head -30; exit 1; }
wait
echo "build $(( $(date +%s) - t0 )) s"
if [ "$TESTS" = 1 ]; then
  t0=$(date +%s); python3 -m pytest tests -q --maxfail=10 -k "${PYTEST_K:-gpu or cuda}" > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/pytest.log)"
  grep -E "FAILED|Error|error" "$OUT/pytest.log" | head -20
fi
if [ "$MEMCHECK" = 1 ]; then
  t0=$(date +%s)
  compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/sanitizer_cases.py > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(( $(date +%s) - t0 )) s: $(grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tail -1)"
fi
if [ "$RACECHECK" = 1 ]; then  # shared-memory hazards of the quantization kernels
  t0=$(date +%s)
  compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/sanitizer_cases.py quant > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$? $(( $(date +%s) - t0 )) s: $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUT/racecheck.log" | tail -1)"
fi
if [ "$SWEEP" != none ]; then
  t0=$(date +%s)
  if [ "$SWEEP" = all ]; then python3 scripts/profile_dense.py sweep > "$OUT/sweep.txt" 2>&1
  else python3 scripts/profile_dense.py sweep $SWEEP > "$OUT/sweep.txt" 2>&1; fi
  echo "sweep $(( $(date +%s) - t0 )) s"; cat "$OUT/sweep.txt"
fi
if [ -n "$DIAG" ]; then
  t0=$(date +%s)
  ( cd /tmp/wgrad_diag && PYTHONPATH=/tmp/wgrad_diag/python:${PYTHONPATH#*:} SWEEP_BN=auto SWEEP_ENV=WGRAD_DIAG=$DIAG \
      python3 scripts/profile_dense.py sweep ) > "$OUT/diag_sweep.txt" 2>&1
  echo "diag sweep $(( $(date +%s) - t0 )) s"; cat "$OUT/diag_sweep.txt"
fi
if [ -n "$PROBE" ]; then
  t0=$(date +%s); [ "$PROBE" = default ] && PROBE=""
  python3 scripts/profile_quant.py startup $PROBE > "$OUT/startup.txt" 2>&1
  ( cd /tmp/wgrad_diag && PYTHONPATH=/tmp/wgrad_diag/python:${PYTHONPATH#*:} \
      python3 scripts/profile_quant.py startup $PROBE ) > "$OUT/startup_diag.txt" 2>&1
  echo "startup $(( $(date +%s) - t0 )) s"; cat "$OUT/startup.txt"; grep -v "^probe" "$OUT/startup_diag.txt" | head -40
fi
if [ -n "$ORDERS" ]; then
  t0=$(date +%s)
  python3 scripts/profile_quant.py order-sweep "$ORDERS" "${ORDER_KINDS:-segments,segments16,segments32}" \
      ${ORDER_SHAPES:+"$ORDER_SHAPES"} > "$OUT/orders.txt" 2>&1
  echo "orders $(( $(date +%s) - t0 )) s"; cat "$OUT/orders.txt"
fi
if [ -n "$QDIAG" ]; then
  t0=$(date +%s)
  ( cd /tmp/wgrad_diag && PYTHONPATH=/tmp/wgrad_diag/python:${PYTHONPATH#*:} python3 scripts/profile_quant.py order-sweep \
      "$QDIAG" "${QUANT_DIAG_KINDS:-segments,segments32,colwise}" "${QUANT_DIAG_SHAPES:-8192,4096 4096,7168}" ) \
      > "$OUT/quant_diag.txt" 2>&1
  echo "quant-diag $(( $(date +%s) - t0 )) s"; cat "$OUT/quant_diag.txt"
fi
if [ -n "$NCU_QUANT" ]; then
  t0=$(date +%s)
  for spec in $NCU_QUANT; do
    echo "==== $spec" >> "$OUT/ncu_quant.txt"
    ncu --clock-control none -k regex:quantize_fp8 --launch-skip 2 --launch-count 1 --set full --import-source no \
        -o /tmp/ncu_q python3 scripts/profile_quant.py "${spec%%:*}" "${spec#*:}" > /tmp/ncu_q.log 2>&1
    ncu -i /tmp/ncu_q.ncu-rep --page details >> "$OUT/ncu_quant.txt" 2>&1
    [ -n "${NCU_QUANT_SASS:-}" ] && ncu -i /tmp/ncu_q.ncu-rep --page source --csv --print-source sass \
        > "$OUT/ncu_sass_${spec//[:,]/_}.csv" 2>&1
    rm -f /tmp/ncu_q.ncu-rep
  done
  echo "ncu-quant $(( $(date +%s) - t0 )) s"
  grep -E "^====|Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps" "$OUT/ncu_quant.txt"
fi
if [ -n "$NCU" ]; then
  t0=$(date +%s); tag=ncu_${NCU//,/x}
  ncu --clock-control none -k regex:wgrad_gemm --launch-skip 2 --launch-count 1 --set full --import-source no \
      -o "$OUT/$tag" python3 scripts/profile_dense.py ncu $NCU > "$OUT/$tag.log" 2>&1
  ncu -i "$OUT/$tag.ncu-rep" --page details > "$OUT/$tag.txt" 2>&1
  ncu -i "$OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/${tag}_sass.csv" 2>&1
  rm -f "$OUT/$tag.ncu-rep"
  echo "ncu $NCU $(( $(date +%s) - t0 )) s"; grep -E "Duration|Elapsed Cycles|SM Frequency|Tensor is" "$OUT/$tag.txt"
fi
if [ -n "$BENCH" ]; then
  t0=$(date +%s); python3 -m wgrad bench --json "$OUT/bench.json" $BENCH > "$OUT/bench.txt" 2> "$OUT/bench.err"
  echo "bench rc=$? $(( $(date +%s) - t0 )) s"; tail -45 "$OUT/bench.txt"; tail -5 "$OUT/bench.err"
fi
for mode in $QPROBE; do
  t0=$(date +%s); [ "$mode" = default ] && arg="" || arg=$mode
  python3 scripts/experiments/penalty_probe.py $arg > "$OUT/penalty_$mode.txt" 2>&1
  echo "penalty_probe $mode $(( $(date +%s) - t0 )) s"; cat "$OUT/penalty_$mode.txt"
done
if [ -n "$TIMELINE" ]; then
  t0=$(date +%s)
  ( cd /tmp/wgrad_diag && PYTHONPATH=/tmp/wgrad_diag/python:${PYTHONPATH#*:} python3 scripts/profile_quant.py timeline \
      $TIMELINE ) > "$OUT/timeline.log" 2>&1
  python3 scripts/profile_quant.py timeline-summary "$OUT/timeline.log" > "$OUT/timeline_summary.txt" 2>&1
  echo "timeline $(( $(date +%s) - t0 )) s"; cat "$OUT/timeline_summary.txt"
fi
