"""Probe (H200) of the segments casts' cost at power-of-two column counts (docs/perf-notes.md, sessions 14
and 16): the casts at 8192 x 4096 and 8192 x 4224 with the L2 flushed by a 256 MB write (the benchmark's
flush: the L2 left dirty), by a 256 MB read (left clean) or not at all, and with x at several base
offsets. % of a copy of the same bytes, timed call by call beside the cast.
    PYTHONPATH=python python3 scripts/experiments/penalty_probe.py

  placement [SPACERS_MB]: does where the outputs land decide it? The casts (Colwise, one segment of all R
rows, the 32-aligned split) after the benchmark's flush, with q_t carved out of one freed 512 MB block of
the caching allocator at each spacer's offset (MB, default 0,1,2,3,4,8,16,32), printing q_t's and the
scales' offsets from x and from the block.

  calls: the spread of single calls (us; 41 of each, a copy of the same bytes timed beside every call, the
benchmark's flush ahead of each): the casts CALLS_KINDS (default Colwise and the one-segment cast, twice) at
8192 x 4096 and 8192 x 4224, and the copy's median (and its bandwidth, bytes read + written).

  copies: the copy that the benchmark times beside each cast, at its exact size n (half the bytes the cast
moves) and at sizes near it (n rounded to 2 MiB, 64 KiB and 4 KiB, n + 16 and n + 4 KiB), TB/s (read +
written, median of 15 calls after the benchmark's flush): does the copy's bandwidth depend on n?"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import profile_quant  # noqa: E402
from wgrad import bench_quant  # noqa: E402


def pct(fn, ref, before, reps=15):
    """% of a copy of fn, ref being profile_quant._copy_fn's (copy, its bytes, the cast's bytes)."""
    copy, copy_bytes, nbytes = ref
    ms, copy_ms = bench_quant._time_pair_ms(fn, copy, reps, before)
    return profile_quant.pct(ms, copy_ms, copy_bytes, nbytes)


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


MB = 1 << 20


def placement(spacers_mb):
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    kinds = ["colwise", "segments_one", "segments32"]
    print("shape spacer_MB kind qt-x_MB qt-block_MB scales-block_MB pct")
    for rows, cols in ((8192, 4096), (8192, 4224)):
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        calls = {k: (profile_quant._kernel_fn(k, x), profile_quant._copy_fn(k, x)) for k in kinds}
        for fn, (copy, _, _) in calls.values():  # every lazy allocation and the copies' buffers before the block
            fn()
            copy()
        torch.cuda.synchronize()
        block = torch.empty(512 * MB, dtype=torch.uint8, device="cuda")
        base = block.data_ptr()
        del block  # cached: the allocations below are carved out of it, the spacer first
        for spacer_mb in spacers_mb:
            spacer = torch.empty(max(1, int(spacer_mb * MB)), dtype=torch.uint8, device="cuda") if spacer_mb else None
            for kind, (fn, ref) in calls.items():
                v = pct(fn, ref, flush.zero_)
                out = fn()
                qt, sc = out[0].data_ptr(), out[1].data_ptr()
                del out
                print(f"{rows}x{cols} {spacer_mb:g} {kind} {(qt - x.data_ptr()) / MB:.3f} {(qt - base) / MB:.3f} "
                      f"{(sc - base) / MB:.3f} {v:.1f}", flush=True)
            del spacer
        del x, calls


def calls():
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    print("shape kind: us min p10 p25 p50 p75 p90 max | copy p50")
    for rows, cols in ((8192, 4096), (8192, 4224)):
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        for kind in os.environ.get("CALLS_KINDS", "colwise,segments_one,colwise,segments_one").split(","):
            fn, (copy, copy_bytes, _) = profile_quant._kernel_fn(kind, x), profile_quant._copy_fn(kind, x)
            fn()
            copy()
            t, c = [], []
            for _ in range(41):
                c.append(1e3 * bench_quant._time_once_ms(copy, flush.zero_))
                t.append(1e3 * bench_quant._time_once_ms(fn, flush.zero_))
            t.sort()
            c.sort()
            q = [t[0], t[4], t[10], t[20], t[30], t[36], t[40]]
            print(f"{rows}x{cols} {kind}: " + " ".join(f"{v:.1f}" for v in q) + f" | {c[20]:.1f} "
                  f"({copy_bytes / c[20] / 1e6:.2f} TB/s)", flush=True)


def copies():
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    kinds = ["rowwise", "colwise", "both", "colwise_segments", "colwise_segments_pad32"]
    variants = ["n", "2MiB", "64KiB", "4KiB", "n+16", "n+4KiB"]
    print("shape kind n_bytes " + " ".join(f"{v:>8}" for v in variants) + "  (TB/s, read + written)")
    for rows, cols in bench_quant.DEFAULT_SHAPES + [(8192, 4224), (8192, 2048)]:
        for kind in kinds:
            n = bench_quant._bytes(kind, rows, cols, 2, bench_quant.SEGMENTS) // 2
            sizes = [n, n // (2 << 20) * (2 << 20), n // 65536 * 65536, n // 4096 * 4096, n + 16, n + 4096]
            cells = []
            for m in sizes:
                src = torch.empty(m, dtype=torch.uint8, device="cuda")
                dst = torch.empty_like(src)
                ms = bench_quant._time_ms(lambda: dst.copy_(src), 15, flush.zero_)
                cells.append(2 * m / ms / 1e9)
                del src, dst
            print(f"{rows}x{cols} {kind} {n} " + " ".join(f"{v:8.2f}" for v in cells), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "copies":
        copies()
    elif len(sys.argv) > 1 and sys.argv[1] == "calls":
        calls()
    elif len(sys.argv) > 1 and sys.argv[1] == "placement":
        placement([float(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "0,1,2,3,4,8,16,32").split(",")])
    else:
        main()
