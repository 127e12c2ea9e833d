"""The fp32 GEMMs' epilogue x tile width, side by side on one SM90 GPU: for each shape, the heuristic's choice
("auto") and each forced configuration (WGRAD_FP32_EPILOGUE, WGRAD_BLOCK_N), their calls interleaved in one
process, the L2 flushed before every call, medians of the GPU time (the host's enqueue hidden). Shapes: the
short-K MoE and dense cases of select_fp32_config (tile_config.h) and a few long-K seed shapes (auto only).
The bf16 forms' rows sweep the tile width alone.

  python3 scripts/sweep_fp32_epilogues.py [--reps N] [--configs reduce-add:0,loaded:128,...] [--only TEXT;TEXT]
                                          [--json PATH]

A configuration is EPILOGUE:BLOCK_N; BLOCK_N 0 leaves the width to the heuristic.
"""

import argparse
import json
import os
import random

import torch

import wgrad
from wgrad.bench.layers import time_interleaved
from wgrad.bench.problems import contiguous_wgrad_call, dense_wgrad_call, random_fp8, random_scales
from wgrad.scales import num_k_blocks

DEV = "cuda"
KNOBS = ("WGRAD_FP32_EPILOGUE", "WGRAD_BLOCK_N")


def uneven(groups, tokens, seed):
    """Token counts that sum to `tokens`, each within 0.5-1.5x of the mean, multiples of 32 (the padded cast)."""
    r = random.Random(seed)
    w = [r.uniform(0.5, 1.5) for _ in range(groups)]
    ks = [int(tokens * x / sum(w)) // 32 * 32 for x in w]
    ks[0] += tokens - sum(ks)
    return ks


def contiguous(gen, m, n, ks, bf16=False):
    return contiguous_wgrad_call(m, n, ks, bf16, DEV, gen)


def packed(gen, m, n, ks):
    total, kb = sum(ks), sum(num_k_blocks(k) for k in ks)
    a, b = random_fp8(1, m * total, DEV, gen).view(-1), random_fp8(1, n * total, DEV, gen).view(-1)
    sa, sb = random_scales(m, kb, DEV, gen), random_scales(n, kb, DEV, gen)
    out = torch.zeros(len(ks), m, n, device=DEV)
    return lambda: wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out, list(ks))


def dense(gen, m, n, k):
    return dense_wgrad_call(m, n, k, False, DEV, gen)


# name -> (kind, make): kind "fp32" sweeps the configurations, "bf16" the widths, "auto" times the heuristic only.
SHAPES = {
    "packed 64x4096x7168 K256": ("fp32", lambda g: packed(g, 4096, 7168, [256] * 64)),
    "packed 64x7168x2048 K256": ("fp32", lambda g: packed(g, 7168, 2048, [256] * 64)),
    "packed 16x4096x7168 K1024": ("fp32", lambda g: packed(g, 4096, 7168, [1024] * 16)),
    "packed 16x7168x2048 K1024": ("fp32", lambda g: packed(g, 7168, 2048, [1024] * 16)),
    "contig 32x2048x7168 ~512": ("fp32", lambda g: contiguous(g, 2048, 7168, uneven(32, 16384, 1))),
    "contig 32x7168x2048 ~512": ("fp32", lambda g: contiguous(g, 7168, 2048, uneven(32, 16384, 2))),
    "contig 16x2048x7168 ~1024": ("fp32", lambda g: contiguous(g, 2048, 7168, uneven(16, 16384, 4))),
    "contig 8x2048x7168 ~2048": ("fp32", lambda g: contiguous(g, 2048, 7168, uneven(8, 16384, 3))),
    "bf16 contig 32x2048x7168 ~512": ("bf16", lambda g: contiguous(g, 2048, 7168, uneven(32, 16384, 1), True)),
    "bf16 contig 32x7168x2048 ~512": ("bf16", lambda g: contiguous(g, 7168, 2048, uneven(32, 16384, 2), True)),
    "bf16 contig 16x2048x7168 ~1024": ("bf16", lambda g: contiguous(g, 2048, 7168, uneven(16, 16384, 4), True)),
    "bf16 contig 8x2048x7168 ~2048": ("bf16", lambda g: contiguous(g, 2048, 7168, uneven(8, 16384, 3), True)),
    "dense 4096x4096x1024": ("fp32", lambda g: dense(g, 4096, 4096, 1024)),
    "dense 4096x4096x2048": ("fp32", lambda g: dense(g, 4096, 4096, 2048)),
    "dense 7168x2112x512": ("fp32", lambda g: dense(g, 7168, 2112, 512)),
    "seed 7168x2112x4096": ("auto", lambda g: dense(g, 7168, 2112, 4096)),
    "seed 16384x7168x4096": ("auto", lambda g: dense(g, 16384, 7168, 4096)),
    "seed 2048x7168x8192": ("auto", lambda g: dense(g, 2048, 7168, 8192)),
    "seed 1536x24576x4096": ("auto", lambda g: dense(g, 1536, 24576, 4096)),
    "seed 7168x4096x8192": ("auto", lambda g: dense(g, 7168, 4096, 8192)),
    "seed packed 8x7168x4096x4096": ("auto", lambda g: packed(g, 7168, 4096, [4096] * 8)),
}


def with_knobs(fn, epilogue, block_n):
    def call():
        os.environ["WGRAD_FP32_EPILOGUE"] = epilogue
        os.environ["WGRAD_BLOCK_N"] = block_n if block_n != "0" else ""
        fn()
    return call


def heuristic(fn):
    def call():
        for knob in KNOBS:
            os.environ.pop(knob, None)
        fn()
    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--configs", default="reduce-add:0,loaded:128,loaded:144,loaded:160")
    parser.add_argument("--only", default=None, help="';'-separated substrings of the shape names to run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    configs = [c.split(":") for c in args.configs.split(",")]
    gen = torch.Generator(device=DEV).manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    results = {}
    for name, (kind, make) in SHAPES.items():
        if args.only and not any(s in name for s in args.only.split(";")):
            continue
        fn = make(gen)
        fns = {"auto": heuristic(fn)}
        if kind == "fp32":
            fns.update({f"{e}/{bn}": with_knobs(fn, e, bn) for e, bn in configs})
        elif kind == "bf16":
            fns.update({f"bf16/{bn}": with_knobs(fn, "", bn) for bn in ("128", "144", "160")})
        t = time_interleaved(fns, args.reps, flush, host=False)
        base = t["auto"].gpu_ms
        print(f"{name}: " + "  ".join(f"{k} {v.gpu_ms:.3f} ({v.gpu_ms / base:.3f})" for k, v in t.items()), flush=True)
        results[name] = {k: v.gpu_ms for k, v in t.items()}
        del fn, fns
        torch.cuda.empty_cache()
    for knob in KNOBS:
        os.environ.pop(knob, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
