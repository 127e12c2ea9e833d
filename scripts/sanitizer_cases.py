"""A few small GEMM calls for compute-sanitizer (memcheck, racecheck): partial tiles, a strided out,
K not a multiple of 128, and both k-grouped layouts with an empty and an unaligned group; the quantization
kernels on awkward shapes. With the argument `quant`, the quantization calls only (for racecheck); with
`carry`, the carry kernel's only (carry_cases)."""

import sys

import torch

import wgrad
from wgrad.scales import empty_mn_major_scales, k_block_capacity, num_k_blocks


def operand(rows, k, dev):
    q = torch.randn(rows, k, device=dev).to(torch.float8_e4m3fn)
    return q


def scales(mn, kb, dev):
    s = empty_mn_major_scales(mn, kb, dev)
    s.copy_(torch.rand(mn, kb, device=dev) + 0.5)
    return s


def main(which):
    dev = "cuda"
    if which == "all":
        gemm_cases(dev)
    if which in ("all", "quant"):
        quant_cases(dev)
    carry_cases(dev)
    torch.cuda.synchronize()
    print("sanitizer cases done")


def gemm_cases(dev):
    for m, n, k in ((129, 100, 144), (33, 257, 1008), (256, 304, 256)):
        a, b = operand(m, k, dev), operand(n, k, dev)
        big = torch.zeros(m, (n + 3) // 4 * 4 + 8, device=dev)  # 16-byte rows, a strided window
        out = big[:, 4 : 4 + n]
        wgrad.wgrad_gemm_fp8_fp8_fp32_nt((a, scales(m, num_k_blocks(k), dev)), (b, scales(n, num_k_blocks(k), dev)), out)
    m, n = 130, 150
    # contiguous-K sizes: multiples of 16 (aligned loads), then any sizes (groups starting inside 16-byte
    # chunks: shifted loads, the 16 bytes past each window read by the producer warps, the group's end
    # in the last row's padding)
    for ks in ([16, 0, 112, 1008], [100, 1, 0, 1007, 37]):
        kt = sum(ks)
        a, b = operand(m, kt, dev), operand(n, kt, dev)
        # contiguous-K operands need 16-element row strides
        a16 = torch.zeros(m, (kt + 15) // 16 * 16, device=dev).to(torch.float8_e4m3fn)[:, :kt]
        b16 = torch.zeros(n, (kt + 15) // 16 * 16, device=dev).to(torch.float8_e4m3fn)[:, :kt]
        a16.copy_(a)
        b16.copy_(b)
        cap = k_block_capacity(kt, len(ks))
        out = torch.zeros(len(ks), m, (n + 3) // 4 * 4, device=dev)[..., :n]  # 16-byte rows
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(
            (a16, scales(m, cap, dev)), (b16, scales(n, cap, dev)), out, torch.tensor(ks, dtype=torch.int32, device=dev))
    ks = [16, 0, 112, 1008]
    out = torch.zeros(len(ks), m, (n + 3) // 4 * 4, device=dev)[..., :n]
    kb = sum(num_k_blocks(k) for k in ks)
    a = torch.randn(m * sum(ks), device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n * sum(ks), device=dev).to(torch.float8_e4m3fn)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, scales(m, kb, dev)), (b, scales(n, kb, dev)), out, ks)


def quant_cases(dev):
    # Quantization: partial blocks, C % 8 != 0 (fallback path), several tiles per CTA, MoE segments with
    # an empty and unaligned segments.
    for r, c, dt in ((129, 100, torch.bfloat16), (1000, 257, torch.float32), (4097, 640, torch.bfloat16),
                     (130, 136, torch.float16)):
        x = torch.randn(r, c, device=dev, dtype=dt)
        wgrad.quantize_fp8_1x128_rowwise(x)
        wgrad.quantize_fp8_1x128_colwise(x)
        wgrad.quantize_fp8_1x128_both(x, True)
        sizes = [r // 3, 0, r - r // 3 - 17, 17]
        wgrad.quantize_fp8_1x128_colwise_segments(x, torch.tensor(sizes, dtype=torch.int32, device=dev))
        for pad in (16, 32):  # padded segments: zero columns between segments and after the last
            wgrad.quantize_fp8_1x128_colwise_segments_padded(x, torch.tensor(sizes, dtype=torch.int32, device=dev),
                                                             pad)
    # The segments cast's forced paths (the private plan op, csrc/quant/plan.h): shared strips and shared ranges
    # (a CTA's consumer groups hand the sectors between their blocks to each other through shared memory;
    # these inputs are too small for the automatic order to take them), packed tiles on and off, also on
    # many short segments (packed by default: 30 rows per segment).
    x = torch.randn(6000, 1000, device=dev, dtype=torch.bfloat16)
    short = [(g * 37) % 61 for g in range(199)]
    for plan in ("kernel=tma,order=c4", "kernel=tma,order=cranges", "kernel=tma,packed=on", "kernel=tma,packed=off"):
        for sizes in ([1000, 37, 0, 2963, 5, 1995], [1008, 48, 0, 2944, 16, 1984], short + [6000 - sum(short)]):
            segments_with_plan(x, sizes, plan)


def carry_cases(dev):
    # The segments cast's carry kernel, forced (these inputs are below its automatic rule): 17 column tiles of
    # ~50 blocks, so that the CTAs walk 1-3 tiles and carry sectors between them (its shared ring), with the
    # dynamic tail on every launch and without it.
    x = torch.randn(6000, 2112, device=dev, dtype=torch.bfloat16)
    for plan in ("kernel=carry", "kernel=carry,tail=on", "kernel=carry,tail=off"):
        segments_with_plan(x, [700, 0, 13, 1287, 1000, 3000], plan)


def segments_with_plan(x, sizes, plan):
    sizes = torch.tensor(sizes, dtype=torch.int32, device=x.device)
    torch.ops.wgrad._quantize_fp8_1x128_colwise_segments_with_plan(x, sizes, 0, False, plan)


if __name__ == "__main__":
    main(sys.argv[1] if sys.argv[1:] else "all")
