"""Where does the dense kernel's time go? Two modes, for an SM90 machine.

  sweep: for each shape, time our kernel for every BLOCK_N candidate (the knob WGRAD_BLOCK_N) and
         the heuristic's pick, cold (L2 flushed before each call, as `python -m wgrad bench`) and warm
         (back-to-back calls, mean over a CUDA-graph replay of many), beside cuBLAS FP8 with one scale
         per tensor (the tensor-core ceiling without fine-grained promotion).
  ncu:   run one shape a few times, for `ncu -k regex:wgrad_gemm --launch-skip 2 --launch-count 1`.

  python3 scripts/profile_dense.py sweep [M,N,K ...]
  python3 scripts/profile_dense.py ncu M,N,K
"""

import os
import statistics
import sys

import torch

import wgrad
from wgrad.bench.common import first_line
from wgrad.bench.problems import random_fp8, random_scales
from wgrad.bench.shapes import DENSE_SEED_SHAPES
from wgrad.bench.timing import L2_FLUSH_BYTES, time_calls


class Problem:
    def __init__(self, m, n, k):
        gen = torch.Generator(device="cuda")
        gen.manual_seed(0)
        kb = (k + 127) // 128
        self.a = random_fp8(m, k, "cuda", gen)
        self.b = random_fp8(n, k, "cuda", gen)
        self.sa = random_scales(m, kb, "cuda", gen)
        self.sb = random_scales(n, kb, "cuda", gen)
        self.out = torch.zeros(m, n, device="cuda")


def shapes_from(args):
    if args:
        return [tuple(int(x) for x in a.split(",")) for a in args]
    return list(DENSE_SEED_SHAPES)


_flush = None


def cold_ms(fn, reps=15):
    """Median of single calls with the L2 flushed before each, as `python -m wgrad bench` does."""
    global _flush
    if _flush is None:
        _flush = torch.empty(L2_FLUSH_BYTES // 4, device="cuda")
    return statistics.median(time_calls(fn, reps, 3, _flush, torch.device("cuda")))


def warm_ms(fn, calls=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return min(times)


# SWEEP_ENV="NAME=v1,v2": also sweep an environment knob, e.g. in a measurement build (WGRAD_DIAG_VARIANTS=1)
# WGRAD_DIAG=0,1,2,4 (csrc/kernels/common/diag.h: which part of the work costs what).
SWEEP_NAME, _, _values = os.environ.get("SWEEP_ENV", "").partition("=")
SWEEP_VALUES = _values.split(",") if SWEEP_NAME else [""]
# SWEEP_BN="auto,160": the BLOCK_N settings to time (default: the heuristic's pick and every candidate).
SWEEP_BN = [("" if b == "auto" else b) for b in os.environ.get("SWEEP_BN", "auto,128,144,160").split(",")]


def sweep(args):
    print(f"{'shape':>22} {'BN':>5} {'cold TF':>8} {'warm TF':>8}", flush=True)
    for m, n, k in shapes_from(args):
        p = Problem(m, n, k)
        flops = 2.0 * m * n * k

        def ours():
            wgrad.wgrad_gemm_fp8_fp8_fp32_nt((p.a, p.sa), (p.b, p.sb), p.out)

        for value in SWEEP_VALUES:
            if SWEEP_NAME:
                os.environ[SWEEP_NAME] = value
            for bn in SWEEP_BN:
                os.environ["WGRAD_BLOCK_N"] = bn
                c, w = cold_ms(ours), warm_ms(ours)
                label = (bn or "auto") + (f"/{value}" if SWEEP_NAME else "")
                print(f"{m:>6}x{n:>6}x{k:>6} {label:>9} {flops / c / 1e9:8.0f} {flops / w / 1e9:8.0f}", flush=True)
        os.environ["WGRAD_BLOCK_N"] = ""
        if SWEEP_NAME:
            os.environ.pop(SWEEP_NAME, None)
        # cuBLAS FP8, one scale per tensor, fp32 out: the ceiling without fine-grained promotion.
        one = torch.ones((), device="cuda")
        bt = p.b.t()

        def tensorwise():
            torch._scaled_mm(p.a, bt, one, one, out_dtype=torch.float32)

        try:
            c, w = cold_ms(tensorwise), warm_ms(tensorwise)
            print(f"{m:>6}x{n:>6}x{k:>6} {'cuBLAS-1s':>5} {flops / c / 1e9:8.0f} {flops / w / 1e9:8.0f}", flush=True)
        except Exception as e:  # noqa: BLE001 - informational only
            print("cuBLAS tensorwise failed:", first_line(e))
        del p
        torch.cuda.empty_cache()


def ncu(args):
    (m, n, k), = shapes_from(args)
    p = Problem(m, n, k)
    for _ in range(3):
        wgrad.wgrad_gemm_fp8_fp8_fp32_nt((p.a, p.sa), (p.b, p.sb), p.out)
    torch.cuda.synchronize()


if __name__ == "__main__":
    {"sweep": sweep, "ncu": ncu}[sys.argv[1]](sys.argv[2:])
