#!/usr/bin/env bash
# The benchmark of this tree against another build of wgrad, in one call on one SM90 GPU (machines differ by
# 10-20 %: only a same-call comparison says whether a change moved anything). Both builds run
# `python -m wgrad bench --json` in turn, ROUNDS times (default 1), and scripts/compare_bench.py prints
# after / before per row.
#   scripts/bench_against.sh BASE OUT_DIR [bench args ...]     (default bench args: --dense --grouped --quant)
# BASE: a folder holding a built `wgrad` package (BASE/wgrad/_C*.so), or a git revision of this repository,
# built here first (git archive into a temporary folder; MAX_JOBS honoured). This tree must be built.
set -uo pipefail
cd "$(dirname "$0")/.."
BASE="${1:?usage: scripts/bench_against.sh BASE OUT_DIR [bench args]}"; OUT="${2:-out}"; shift 2 || shift $#
ARGS=("$@"); [ ${#ARGS[@]} -gt 0 ] || ARGS=(--dense --grouped --quant)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d "$BASE/wgrad" ]; then
  base_python=$(cd "$BASE" && pwd)
else
  src=$(mktemp -d)
  git archive "$BASE" | tar -x -C "$src" || { echo "cannot export revision $BASE" >&2; exit 2; }
  ( cd "$src" && ./scripts/build.sh > "$OUT/build_base.log" 2>&1 ) || { echo "base build failed: $OUT/build_base.log" >&2; exit 1; }
  base_python=$src/python
fi
for round in $(seq 1 "${ROUNDS:-1}"); do
  for tree in base new; do
    [ $tree = base ] && path=$base_python || path=$PWD/python
    PYTHONPATH=$path${PYTHONPATH:+:$PYTHONPATH} python3 -m wgrad bench "${ARGS[@]}" \
      --json "$OUT/bench_${tree}_$round.json" > "$OUT/bench_${tree}_$round.txt" 2> "$OUT/bench_${tree}_$round.err"
    echo "$tree, round $round: exit status $?"
  done
  python3 scripts/compare_bench.py "$OUT/bench_base_$round.json" "$OUT/bench_new_$round.json" | tee "$OUT/compare_$round.txt"
done
