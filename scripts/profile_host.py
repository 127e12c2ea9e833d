"""The host cost of a call: how long the CPU takes to enqueue each op on tiny inputs (where the GPU work
is a few microseconds and never the limit), beside two plain PyTorch ops for scale.

  python3 scripts/profile_host.py [CALLS]

For every call: CALLS (default 2000) back-to-back calls without synchronisation; prints the wall time
per call until the last one is enqueued ("enqueue") and until the GPU has finished them ("total"),
in us, the median of 5 repetitions. enqueue ~ total means the CPU is the limit.
"""

import statistics
import sys
import time

import torch

import wgrad


def _calls():
    dev = "cuda"
    x = torch.randn(128, 128, dtype=torch.bfloat16, device=dev)
    sizes = torch.tensor([16, 0, 100, 12], dtype=torch.int32, device=dev)
    a = torch.randn(128, 256, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(128, 256, device=dev).to(torch.float8_e4m3fn)
    sa = torch.rand(128, 2, device=dev) + 0.5
    sb = torch.rand(128, 2, device=dev) + 0.5
    sa_t = sa.t().contiguous().t()  # the MN-major layout the ops take without a copy
    sb_t = sb.t().contiguous().t()
    out = torch.zeros(128, 128, device=dev)
    ops = torch.ops.wgrad
    ga = torch.randn(128, 256, device=dev).to(torch.float8_e4m3fn)
    gsizes = torch.tensor([128, 128], dtype=torch.int32, device=dev)
    gsa = torch.rand(128, 3, device=dev).t().contiguous().t()
    gout = torch.zeros(2, 128, 128, device=dev)
    return [
        ("torch: x.add(1)", lambda: x.add(1)),
        ("torch: empty_like + copy_", lambda: torch.empty_like(x).copy_(x)),
        ("op rowwise", lambda: ops.quantize_fp8_1x128_rowwise(x, False)),
        ("op colwise", lambda: ops.quantize_fp8_1x128_colwise(x, False)),
        ("op both", lambda: ops.quantize_fp8_1x128_both(x, False)),
        ("op segments (G=4)", lambda: ops.quantize_fp8_1x128_colwise_segments(x, sizes, False)),
        ("op segments_padded (G=4)", lambda: ops.quantize_fp8_1x128_colwise_segments_padded(x, sizes, 32, False)),
        ("wgrad.quantize_fp8_1x128_colwise", lambda: wgrad.quantize_fp8_1x128_colwise(x)),
        ("op dense gemm 128x128x256", lambda: ops.wgrad_gemm_fp8_fp8_fp32_nt(a, sa_t, b, sb_t, out)),
        ("wgrad.wgrad_gemm_fp8_fp8_fp32_nt", lambda: wgrad.wgrad_gemm_fp8_fp8_fp32_nt((a, sa_t), (b, sb_t), out)),
        ("op contiguous gemm (G=2)",
         lambda: ops.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(ga, gsa, ga, gsa, gout, gsizes)),
    ]


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(f"{'call':40s} {'enqueue us':>10s} {'total us':>9s}   ({calls} calls, median of 5)")
    for name, fn in _calls():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        enq, tot = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            enq.append((t1 - t0) / calls * 1e6)
            tot.append((t2 - t0) / calls * 1e6)
        print(f"{name:40s} {statistics.median(enq):10.1f} {statistics.median(tot):9.1f}", flush=True)


if __name__ == "__main__":
    main()
