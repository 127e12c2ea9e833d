#!/usr/bin/env bash
# Memory-side counters of the quantization kernels, one line per case (docs/perf-notes.md, session 13):
#   scripts/ncu_quant_metrics.sh "KIND:R,C[:ORDER] ..."
# KIND as scripts/profile_quant.py takes it (colwise, segments, segments16, segments32, ...); ORDER a
# WGRAD_SEGMENT_ORDER value (e.g. 1, c18). Each case is one kernel launch (the third) under ncu.
# NCU_CACHE_CONTROL=none: the L2 as the script leaves it (dirty with its 256 MB flush, as in the benchmark)
# instead of ncu's clean flush; NCU_METRICS: other metrics (e.g. only single-pass ones with it).
set -uo pipefail
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
M=$M,lts__t_requests_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
M=$M,lts__t_sectors_srcunit_tex_op_write_lookup_miss.sum,smsp__inst_executed.sum
M=$M,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum
M=${NCU_METRICS:-$M}
printf "%-32s" case; for m in ${M//,/ }; do printf " %s" "$m"; done; echo
for spec in $1; do
  IFS=: read -r kind shape order <<< "$spec"
  line=$( (if [ -n "${order:-}" ]; then export WGRAD_SEGMENT_ORDER=$order; fi
          ncu --clock-control none --cache-control "${NCU_CACHE_CONTROL:-all}" -k regex:quantize_fp8 \
              --launch-skip 2 --launch-count 1 --metrics "$M" --csv \
              python3 scripts/profile_quant.py "$kind" "$shape" 2>/dev/null) \
        | python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10 and r[0] != "ID"]
want = sys.argv[1].split(",")
vals = {r[-3]: r[-1] for r in rows}
print(" ".join(vals.get(m, "?").replace(",", "") for m in want))' "$M")
  printf "%-32s %s\n" "$spec" "$line"
done
