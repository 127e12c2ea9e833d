"""What the quantization tests (test_quant*.py) share: random inputs, bit comparisons, the calls of the ops
by name (and of the private plan op), the layouts they promise, and the GPU check of one call against the
reference."""

from __future__ import annotations

import numpy as np
import torch

import wgrad
from wgrad import reference
from wgrad.quant import Q_T_ROW_ALIGN
from wgrad.scales import align_up, k_block_capacity, num_k_blocks

from helpers import gpu, on_poisoned_outputs

OPS = torch.ops.wgrad
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SCALE_NAN_BITS = 0x7FC00000  # a positive int32
E4M3_NAN = 0x7F

sm90 = gpu  # (the quantization tests' name for helpers.gpu)


def segment_sizes(rows, groups=8, align=1):
    """The benchmark's uneven split of `rows` into `groups` segments (sizes multiples of `align` but the last)."""
    from wgrad.bench.quant import segment_sizes as bench_segment_sizes

    return bench_segment_sizes(rows, groups, align)


# ------------------------------------------------------------------ inputs and comparisons --------------


def bits(t: torch.Tensor) -> torch.Tensor:
    """Logical values as integers on the CPU: uint8 for fp8, int32 for fp32 (any strides)."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int32)


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor, what: str):
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, (what, a.shape, e.shape)
    diff = (a != e).nonzero()
    assert diff.numel() == 0, (
        f"{what}: {diff.shape[0]} of {a.numel()} elements differ; first at {diff[0].tolist()}: "
        f"got {a[tuple(diff[0])].item():#x}, expected {e[tuple(diff[0])].item():#x}"
    )


def random_x(rows, cols, dtype, seed=0, device="cpu"):
    """Normal data whose 128-blocks span magnitudes 1e-8..1e8 (and some whole rows of tiny values)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((rows, cols), generator=g, dtype=torch.float64)
    mag = 10.0 ** torch.randint(-8, 9, (rows, num_k_blocks(cols)), generator=g).double()
    if dtype == torch.float16:  # keep float16 finite and out of its subnormals mostly
        mag = 10.0 ** torch.randint(-3, 4, (rows, num_k_blocks(cols)), generator=g).double()
    x = x * mag.repeat_interleave(128, dim=1)[:, :cols]
    return x.to(dtype).to(device)


def random_split(rows, groups, seed, empty_first_inner_last=False):
    """`groups` sizes summing to rows, cut at random points (so some empty and tiny); with
    empty_first_inner_last the first, the last and one inner segment surely empty."""
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.randint(0, rows + 1, (groups - 1,), generator=gen).sort().values
    if empty_first_inner_last:
        cuts[0], cuts[-1] = 0, rows
        cuts[groups // 2] = cuts[groups // 2 - 1]
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([rows])])
    return (bounds[1:] - bounds[:-1]).to(torch.int32)


def rounding_edge_cases(rows: int, seed: int = 53) -> torch.Tensor:
    """float32 [rows, 128] rows that each form one block: element 0 fixes the amax A (so the scale is
    s = RN(A / 448)), the others sit where x / s is hard to round right: e4m3 rounding boundaries M * s (ties
    of e4m3, normal and subnormal) and their fp32 neighbours up to 3 ulps away, values next to A = 448 s,
    tiny and subnormal values, signed zeros."""
    rng = np.random.default_rng(seed)
    e4m3_values = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    boundaries = ((e4m3_values[1:] + e4m3_values[:-1]) / 2).astype(np.float32)  # 2^-10 ... 432
    out = np.zeros((rows, 128), dtype=np.float32)
    for r in range(rows):
        # amax: random significand (the hard cases depend on it), magnitudes from 1e-3 to 1e6
        a = np.float32(rng.uniform(1.0, 2.0) * 2.0 ** rng.integers(-10, 20))
        s = np.float32(max(a, np.float32(1e-4)) / np.float32(448.0))
        row = [a]
        for m in rng.choice(boundaries, size=16, replace=False):
            c = np.float32(m * s)
            row += [c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))]
            c3 = c
            for _ in range(3):
                c3 = np.nextafter(c3, np.float32(np.inf))
            row.append(c3)
        near = a
        for _ in range(4):
            near = np.nextafter(near, np.float32(0))
            row.append(near)
        row += [np.float32(1e-30), np.float32(-1e-30), np.float32(1e-40), np.float32(-1e-40), np.float32(0.0),
                np.float32(-0.0), np.float32(2.0**-11) * s, np.float32(-(2.0**-11)) * s]
        vals = np.array(row[:128], dtype=np.float32)
        signs = np.where(rng.random(vals.shape[0]) < 0.5, -1, 1).astype(np.float32)
        signs[0] = 1
        vals[1:] *= signs[1:]
        out[r, : vals.shape[0]] = vals
    return torch.from_numpy(out)


def bf16_segment_casts(cases):
    """(x, sizes) of bf16 segments casts, one per (rows, cols, groups, seed): sizes cut at random rows
    (random_split), or with seed 0 the benchmark's 8-segment split."""
    for rows, cols, groups, seed in cases:
        if seed == 0:
            sizes = torch.tensor(segment_sizes(rows, groups), dtype=torch.int32)
        else:
            sizes = random_split(rows, groups, seed=seed)
        yield random_x(rows, cols, torch.bfloat16, seed=seed), sizes


# ------------------------------------------------------------------ the ops by name ---------------------


def segments_with_plan(x, sizes, ue8m0=False, plan="auto", pad=0):
    """The segments cast (pad 0: (q_t, scales_t); else the padded one: (q_t, scales_t, padded_sizes)) on the
    path `plan` names (csrc/quant/plan.h), through the private op."""
    outs = OPS._quantize_fp8_1x128_colwise_segments_with_plan(x, sizes, pad, ue8m0, plan)
    return outs if pad else outs[:2]


def call(op, x, ue8m0=False, sizes=None, plan=None):
    """op: rowwise, colwise, both or segments; a plan (segments only) takes the private op."""
    if op == "rowwise":
        return OPS.quantize_fp8_1x128_rowwise(x, ue8m0)
    if op == "colwise":
        return OPS.quantize_fp8_1x128_colwise(x, ue8m0)
    if op == "both":
        return OPS.quantize_fp8_1x128_both(x, ue8m0)
    if plan is not None:
        return segments_with_plan(x, sizes, ue8m0, plan)
    return OPS.quantize_fp8_1x128_colwise_segments(x, sizes, ue8m0)


def expected(op, x, ue8m0=False, sizes=None):
    if op == "rowwise":
        return reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0)
    if op == "colwise":
        return reference.quantize_fp8_1x128_colwise_reference(x, ue8m0)
    if op == "both":
        return (*reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0),
                *reference.quantize_fp8_1x128_colwise_reference(x, ue8m0))
    return reference.quantize_fp8_1x128_colwise_segments_reference(x, sizes.tolist(), ue8m0)


def check_layouts(x, outs, op, sizes=None):
    rows, cols = x.shape
    if op in ("rowwise", "both"):
        q, s = outs[0], outs[1]
        assert q.dtype == torch.float8_e4m3fn and q.shape == (rows, cols) and q.is_contiguous()
        assert s.dtype == torch.float32 and s.shape == (rows, num_k_blocks(cols))
        assert s.stride() == (1, align_up(max(rows, 1), 4))
    if op in ("colwise", "both", "segments"):
        q_t, s_t = outs[-2], outs[-1]
        kb = num_k_blocks(rows) if sizes is None else k_block_capacity(rows, len(sizes))
        assert q_t.dtype == torch.float8_e4m3fn and q_t.shape == (cols, rows)
        assert q_t.stride() == (align_up(max(rows, 1), Q_T_ROW_ALIGN), 1)
        assert s_t.dtype == torch.float32 and s_t.shape == (cols, kb)
        assert s_t.stride() == (1, align_up(max(cols, 1), 4))


def q_t_padding(q_t):
    rows, ld = q_t.shape[1], q_t.stride(0)
    full = q_t.as_strided((q_t.shape[0], ld), (ld, 1))
    return bits(full)[:, rows:]


def check_gpu_op(op, x_cpu, ue8m0, sizes=None, x_gpu=None, plan=None):
    """One call on the GPU (into poisoned outputs, so that unwritten bytes show) against the reference, bit
    for bit, q_t's row padding included."""
    x_gpu = x_cpu.cuda() if x_gpu is None else x_gpu
    sizes_gpu = None if sizes is None else sizes.cuda()
    outs, _ = on_poisoned_outputs(lambda: call(op, x_gpu, ue8m0, sizes_gpu, plan))
    torch.cuda.synchronize()
    check_layouts(x_cpu, outs, op, None if sizes is None else sizes.tolist())
    for i, (got, exp) in enumerate(zip(outs, expected(op, x_cpu, ue8m0, sizes))):
        assert_bits_equal(got, exp, f"{op} output {i}")
    if op != "rowwise" and x_cpu.shape[0] > 0:  # R == 0: no block, the padding is never touched
        assert bool((q_t_padding(outs[-2]) == 0).all()), "q_t padding must be written as 0"
    return outs


# ------------------------------------------------------------------ round trips through the GEMMs ------


def wgrad_round_trip(device):
    # dW = dy^T @ x with K = tokens: both operands quantized column-wise (K-contiguous, MN-major scales).
    tokens, n_in, n_out = 272, 200, 136
    x = random_x(tokens, n_in, torch.bfloat16, seed=19, device=device)
    dy = random_x(tokens, n_out, torch.bfloat16, seed=23, device=device)
    b, sb = wgrad.quantize_fp8_1x128_colwise(x)
    a, sa = wgrad.quantize_fp8_1x128_colwise(dy)
    out = torch.full((n_out, n_in), 0.5, device=device)
    OPS.wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out)
    exact = reference.wgrad_gemm_reference(a.cpu(), sa.cpu(), b.cpu(), sb.cpu()) + 0.5
    # The GEMM's own accuracy bar against float64 (issue 3): FP8 tensor-core accumulation is narrower than
    # fp32 between two promotions, so elementwise fp32 tolerances would be too tight on the GPU.
    rel_exact = (out.cpu().double() - exact).norm() / exact.norm()
    assert rel_exact <= 2e-4, rel_exact
    # and the dequantized operands approximate the bf16 product (FP8: ~2^-4 per element)
    approx = dy.double().cpu().t() @ x.double().cpu() + 0.5
    rel = (out.cpu().double() - approx).norm() / approx.norm()
    assert rel < 0.05


def grouped_round_trip(device):
    sizes_list = [0, 80, 192, 0, 48]  # the GEMM takes multiples of 16 (TMA-aligned group offsets)
    tokens, n_in, n_out = sum(sizes_list), 64, 48
    x = random_x(tokens, n_in, torch.float32, seed=29, device=device)
    dy = random_x(tokens, n_out, torch.float32, seed=31, device=device)
    sizes = torch.tensor(sizes_list, dtype=torch.int32, device=device)
    b, sb = wgrad.quantize_fp8_1x128_colwise_segments(x, sizes)
    a, sa = wgrad.quantize_fp8_1x128_colwise_segments(dy, sizes)
    out = torch.zeros((len(sizes_list), n_out, n_in), device=device)
    OPS.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(a, sa, b, sb, out, sizes)
    exact = reference.k_grouped_contiguous_reference(a.cpu(), sa.cpu(), b.cpu(), sb.cpu(), sizes_list)
    for g, e in enumerate(exact):
        if sizes_list[g] == 0:
            assert torch.all(out[g] == 0), f"empty group {g} written"
            continue
        rel_exact = (out[g].cpu().double() - e).norm() / e.norm()
        assert rel_exact <= 2e-4, (g, rel_exact)  # the GEMM's accuracy bar, as above

