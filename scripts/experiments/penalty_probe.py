"""Probe (H200) of the segments casts' cost at power-of-two column counts (docs/perf-notes.md, sessions 14
and 16): the casts at 8192 x 4096 and 8192 x 4224 with the L2 flushed by a 256 MB write (the benchmark's
flush: the L2 left dirty), by a 256 MB read (left clean) or not at all, and with x at several base
offsets. % of a copy of the same bytes, timed call by call beside the cast.
    PYTHONPATH=python python3 scripts/experiments/penalty_probe.py"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import profile_quant  # noqa: E402
from wgrad import bench_quant  # noqa: E402


def pct(fn, copy, before, reps=15):
    ms, copy_ms = bench_quant._time_pair_ms(fn, copy, reps, before)
    return 100.0 * copy_ms / ms


def main():
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    flush_f = flush.view(torch.float32)
    sink = torch.empty((), device="cuda")
    befores = {
        "write-flush": flush.zero_,
        "read-flush": lambda: torch.sum(flush_f, dim=0, out=sink),
        "no-flush": lambda: None,
    }
    kinds = ["colwise", "segments32", "segments", "segments16"]
    print("shape x-offset flush " + " ".join(f"{k:>10}" for k in kinds))
    for rows, cols in ((8192, 4096), (8192, 4224)):
        for off in (0, 2048 + 1024 * 1024 // 2):  # elements: 0, 1 MB + 4 KB
            buf = torch.randn(rows * cols + off, dtype=torch.bfloat16, device="cuda")
            x = buf[off:].view(rows, cols)
            for name, before in befores.items():
                cells = []
                for kind in kinds:
                    cells.append(pct(profile_quant._kernel_fn(kind, x), profile_quant._copy_fn(kind, x), before))
                print(f"{rows}x{cols} {off * 2:>8} {name:<12} " + " ".join(f"{v:10.1f}" for v in cells), flush=True)
            del buf, x


if __name__ == "__main__":
    main()
