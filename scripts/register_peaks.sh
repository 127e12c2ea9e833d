#!/usr/bin/env bash
# Where a kernel's registers peak, from a compiled object (no GPU needed): nvdisasm's live-register count
# per instruction (-plr) joined with its source lines (-g). Prints, per kernel in the object, the most
# registers live at once, how many instructions run with at least PEAK_MIN (default 66) live, the source
# lines they come from, and every spill (STL/LDL) with its line and live count.
#   scripts/register_peaks.sh OBJ.o
# An object of the build (build/temp.*/csrc/quant/segments.o), or a .cu that includes one kernel's header
# (e.g. kernels/quant/colwise_kernel_sm90.cuh) and instantiates it, compiled with the build's nvcc flags
# (build/build.log has them; -lineinfo gives the source lines).
set -euo pipefail
OBJ=$(readlink -f "$1")
tool() {  # cuobjdump / nvdisasm: on PATH, in CUDA_HOME, or from the nvidia-cuda-* wheels
  command -v "$1" 2>/dev/null && return
  [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/$1" ] && { echo "${CUDA_HOME:-/usr/local/cuda}/bin/$1"; return; }
  python3 - "$1" <<'PY'
import glob, site, sys
for d in site.getsitepackages():
    for p in glob.glob(f"{d}/**/bin/{sys.argv[1]}", recursive=True):
        print(p); sys.exit(0)
sys.exit(1)
PY
}
CUOBJDUMP=$(tool cuobjdump) NVDISASM=$(tool nvdisasm)
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$TMP" && "$CUOBJDUMP" -xelf all "$OBJ" > /dev/null
for cubin in *.cubin; do
  "$NVDISASM" -g -c "$cubin" > g.dis
  "$NVDISASM" -c -plr -lrm count "$cubin" > plr.dis
  PEAK_MIN=${PEAK_MIN:-66} python3 - <<'PY'
import os, re
from collections import Counter
line_of, cur, kernel_of, kernel = {}, None, {}, None
for l in open("g.dis"):
    k = re.match(r"\s*\.text\.(\S+):", l)
    if k: kernel = k.group(1)
    m = re.search(r'## File "([^"]+)", line (\d+)', l)
    if m: cur = f"{os.path.basename(m.group(1))}:{m.group(2)}"
    a = re.search(r"/\*([0-9a-f]+)\*/", l)
    if a: line_of[(kernel, a.group(1))] = cur
rows, kernel = [], None
for l in open("plr.dis"):
    k = re.match(r"\s*\.text\.(\S+):", l)
    if k: kernel = k.group(1)
    m = re.search(r"/\*([0-9a-f]+)\*/\s+(.*?);\s*// \|\s*(\d+)\s*\|", l)
    if m: rows.append((kernel, int(m.group(3)), line_of.get((kernel, m.group(1))), m.group(2).split()[0]))
lo = int(os.environ["PEAK_MIN"])
for kern in dict.fromkeys(r[0] for r in rows):
    mine = [r for r in rows if r[0] == kern]
    print(f"{kern[:100]}\n  max live {max(r[1] for r in mine)}; instructions with >= {lo} live: "
          f"{sum(r[1] >= lo for r in mine)}")
    for src, n in Counter(r[2] for r in mine if r[1] >= lo).most_common(8): print(f"    {n:5d}  {src}")
    for r in mine:
        if r[3].startswith(("STL", "LDL")): print(f"  spill {r[3]} at {r[2]} ({r[1]} live)")
PY
done
