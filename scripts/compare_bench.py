#!/usr/bin/env python3
"""Compares two `python -m wgrad bench --json` documents row by row: after / before for every GEMM row
(TFLOPS) and every quantization row (% of a copy's bandwidth), the geometric mean of each, and the rows that
moved by more than a tolerance. Take both documents from one device call (machines differ by 10-20 %).

    python3 scripts/compare_bench.py BEFORE.json AFTER.json [--tol 0.02]

Exit status 1 when a row moved by more than the tolerance (either way), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Dict, Tuple


def gemm_rows(doc: dict) -> Dict[Tuple, float]:
    return {(kind, r["shape"], r["impl"]): r["tflops"] for kind in ("dense", "grouped")
            for r in doc.get(kind) or [] if r.get("tflops")}


def quant_rows(doc: dict) -> Dict[Tuple, float]:
    return {(r["name"], tuple(r["shape"])): r["pct_of_copy"] for r in doc.get("quant") or []}


def compare(before: dict, after: dict, tol: float) -> Tuple[list, int]:
    lines, moved = [], 0
    for title, rows in (("GEMM TFLOPS", gemm_rows), ("cast % of copy", quant_rows)):
        b, a = rows(before), rows(after)
        ratios = []
        lines.append(f"{title}: before, after, after / before")
        for key in b:
            if key not in a:
                continue
            r = a[key] / b[key]
            ratios.append(r)
            flag = "" if abs(r - 1) <= tol else f"  moved by more than {tol:.0%}"
            moved += bool(flag)
            lines.append(f"  {' '.join(map(str, key)):<64} {b[key]:9.1f} {a[key]:9.1f} {r:7.3f}{flag}")
        if ratios:
            lines.append(f"  geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f} over {len(ratios)} rows")
    return lines, moved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--tol", type=float, default=0.02, help="relative move that counts (default 0.02)")
    args = parser.parse_args(argv)
    with open(args.before) as f, open(args.after) as g:
        lines, moved = compare(json.load(f), json.load(g), args.tol)
    print("\n".join(lines))
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
