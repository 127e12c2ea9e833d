"""Pure-PyTorch references, shared by the CPU kernels of the ops, the tests and the benchmark.

Everything here is the definition: the CUDA kernels are tested against these functions.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .scales import SCALE_BLOCK_K, align_up, num_k_blocks


# ------------------------------------------------------------------ GEMMs ---------------------------


def dequantize_1x128(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float64 `q * s` for an operand `q` [mn, K] with one scale per row per 128-wide K block,
    `s` [mn, ceil(K/128)] (any strides)."""
    mn, k = q.shape
    assert s.shape == (mn, num_k_blocks(k)), (tuple(s.shape), mn, k)
    expanded = s.double().repeat_interleave(SCALE_BLOCK_K, dim=1)[:, :k]
    return q.double() * expanded


def wgrad_gemm_reference(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """float64 `(a * sa) @ (b * sb)^T`, [M, N]: the exact value of the 1x128-scaled product."""
    return dequantize_1x128(a, sa) @ dequantize_1x128(b, sb).t()


def packed_group_operands(t: torch.Tensor, rows: int, ks: Sequence[int]) -> List[torch.Tensor]:
    """Views [rows, ks[g]] of a packed k-grouped operand (group g's row-major block starts at element
    rows * sum(ks[:g]))."""
    flat = t.reshape(-1)
    views, start = [], 0
    for k in ks:
        views.append(flat[start : start + rows * k].view(rows, k))
        start += rows * k
    return views


def group_scale_columns(s: torch.Tensor, ks: Sequence[int]) -> List[torch.Tensor]:
    """Group g's scale columns: blocks restart at every group."""
    views, start = [], 0
    for k in ks:
        kb = num_k_blocks(k)
        views.append(s[:, start : start + kb])
        start += kb
    return views


def k_grouped_reference(a, sa, b, sb, ks: Sequence[int], m: int, n: int) -> List[torch.Tensor]:
    """float64 per-group products of the packed layout: a list of G [M, N] tensors."""
    a_g = packed_group_operands(a, m, ks)
    b_g = packed_group_operands(b, n, ks)
    sa_g = group_scale_columns(sa, ks)
    sb_g = group_scale_columns(sb, ks)
    return [wgrad_gemm_reference(a_g[g], sa_g[g], b_g[g], sb_g[g]) for g in range(len(ks))]


def k_grouped_contiguous_reference(a, sa, b, sb, ks: Sequence[int]) -> List[torch.Tensor]:
    """float64 per-group products of the contiguous-K layout: group g owns columns
    [sum(ks[:g]), sum(ks[:g+1])) of a [M, K_total] and b [N, K_total]; the columns past sum(ks) are not read."""
    sa_g = group_scale_columns(sa, ks)
    sb_g = group_scale_columns(sb, ks)
    outs, off = [], 0
    for g, k in enumerate(ks):
        outs.append(wgrad_gemm_reference(a[:, off : off + k], sa_g[g], b[:, off : off + k], sb_g[g]))
        off += k
    return outs


def m_grouped_reference(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                        sizes: Sequence[int]) -> torch.Tensor:
    """float64 [T, N]: the rows of group g (rows sum(sizes[:g]) onwards, sizes[g] of them) of the dequantized
    `a` [T, K] (1x128 scales `sa`) times the dequantized `b[g]`^T ([N, K], 128x128 block scales `sb[g]`)."""
    t, n = a.shape[0], b.shape[1]
    deq_a = dequantize_1x128(a, sa)
    out = torch.zeros((t, n), dtype=torch.float64)
    start = 0
    for g, rows in enumerate(sizes):
        if rows > 0:
            out[start:start + rows] = deq_a[start:start + rows] @ dequantize_128x128(b[g], sb[g]).t()
        start += rows
    return out


def accumulate_(out: torch.Tensor, product: torch.Tensor) -> None:
    """out += product, rounded once to float32 (the CPU kernels' accumulation rule)."""
    out.copy_((out.double() + product).to(torch.float32))


# ------------------------------------------------------------------ quantization --------------------
# The single definition of the FP8 1x128 quantization numerics. The CUDA kernels
# (csrc/kernels/quant/) match these functions bit for bit, and the CPU kernels of the
# quantize_fp8_1x128_* ops are these functions.

FP8_E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4  # as float32; an all-zero block gets scale 1e-4 / 448 and q == 0
SCALE_NAN_BITS = 0x7FC00000  # float32 scale of a block holding NaN or Inf
Q_NAN_BITS = 0x7F  # float8_e4m3fn NaN: every q of such a block


def _f32_full_like(t: torch.Tensor, value: float) -> torch.Tensor:
    # A tensor operand rather than a Python scalar, so that no backend can turn "/ 448" into
    # "* (1 / 448)": the rules are IEEE float32 divisions.
    return torch.full_like(t, value, dtype=torch.float32)


def fp8_1x128_block_scales(amax: torch.Tensor, ue8m0: bool = False) -> torch.Tensor:
    """float32 scales from float32 block amaxes (non-finite blocks carry amax = +inf):

    - `scale = max(amax, 1e-4) / 448`, IEEE float32 division;
    - `ue8m0`: `scale = 2^ceil(log2(scale))`, computed exactly from the float32 bits (scale is a positive
      normal number, so: unchanged if its mantissa is 0, else exponent + 1 and mantissa 0);
    - `amax == inf` (the block holds a NaN or an Inf): `scale = NaN` (bits 0x7FC00000).
    """
    assert amax.dtype == torch.float32
    nonfinite = torch.isinf(amax)
    scale = torch.maximum(amax, _f32_full_like(amax, AMAX_FLOOR)) / _f32_full_like(amax, FP8_E4M3_MAX)
    if ue8m0:
        bits = scale.view(torch.int32)
        rounded = (bits & 0x7F800000) + 0x00800000
        scale = torch.where((bits & 0x007FFFFF) != 0, rounded, bits).view(torch.float32)
    nan = torch.tensor(SCALE_NAN_BITS, dtype=torch.int32).view(torch.float32)
    return torch.where(nonfinite, nan, scale)


def quantize_fp8_1x128_rowwise_reference(x: torch.Tensor, ue8m0: bool = False):
    """The numerics of every quantization op, for 1x128 blocks along the last dim of `x` [R, C]
    (bfloat16 / float16 / float32). Returns `q` [R, C] float8_e4m3fn (contiguous) and `scales`
    [R, ceil(C/128)] float32 (contiguous), with `x ~= q * scales` blockwise:

    1. `a = |float32(x)|`, with NaN and +-Inf mapped to +Inf; `amax = max(a)` over the block (the
       last block of a row may be partial: missing elements do not count);
    2. `scale` from `amax` by `fp8_1x128_block_scales` (floor 1e-4, / 448, optional UE8M0 rounding up);
    3. `r = 1 / scale` (IEEE float32 division, once per block) and
       `q = e4m3_rne(clamp(float32(x) * r, -448, 448))`: the float32 product, rounded to nearest even by
       torch's float32 -> float8_e4m3fn conversion. This is DeepGEMM's `per_token_cast_to_fp8` rule
       (`x * (1.0 / sf)`, sf = amax / 448), bit for bit; with UE8M0 scales r is exact, so q is the
       exact quotient x / scale rounded (and never beyond 448);
    4. a block holding any NaN or Inf has `scale = NaN` and every `q = NaN` (0x7F), so that any GEMM
       consuming it yields NaN rather than a silently wrong number. An all-zero block has `q = 0` and the
       finite scale `1e-4 / 448` (UE8M0: 2^-22).
    """
    assert x.dim() == 2, x.shape
    rows, cols = x.shape
    kb = num_k_blocks(cols)
    xf = torch.zeros((rows, kb * SCALE_BLOCK_K), dtype=torch.float32)
    xf[:, :cols] = x.detach().to("cpu", torch.float32)
    blocks = xf.view(rows, kb, SCALE_BLOCK_K)
    a = blocks.abs()
    a = torch.where(a <= torch.finfo(torch.float32).max, a, torch.full_like(a, float("inf")))
    amax = a.amax(dim=2) if kb > 0 else torch.zeros((rows, 0), dtype=torch.float32)
    scales = fp8_1x128_block_scales(amax, ue8m0)
    r = _f32_full_like(scales, 1.0) / scales
    t = blocks * r.unsqueeze(2)
    t = torch.clamp(t, -FP8_E4M3_MAX, FP8_E4M3_MAX)
    q = t.to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(torch.isnan(scales).unsqueeze(2), torch.full_like(q, Q_NAN_BITS), q)
    q = q.reshape(rows, kb * SCALE_BLOCK_K)[:, :cols].contiguous().view(torch.float8_e4m3fn)
    return q, scales


def quantize_fp8_1x128_colwise_reference(x: torch.Tensor, ue8m0: bool = False):
    """1x128 blocks along the rows of `x` [R, C] (along the token dim of an activation), output transposed:
    `q_t` [C, R] float8_e4m3fn (contiguous) and `scales_t` [C, ceil(R/128)] float32. A column block of x is
    a row block of x^T, so this is exactly the row-wise rule applied to x^T."""
    return quantize_fp8_1x128_rowwise_reference(x.t(), ue8m0)


def quantize_fp8_1x128_colwise_segments_reference(x: torch.Tensor, sizes: Sequence[int], ue8m0: bool = False):
    """The column-wise rule over row segments of `x` [R, C] (segment g: rows [sum(sizes[:g]),
    sum(sizes[:g+1]))), blocks restarting at every segment: `q_t` [C, R] (each segment's columns quantized
    on their own) and `scales_t` [C, ceil(R/128) + G - 1] float32, segment g's j-th block in column
    sum_{h<g} ceil(sizes[h]/128) + j, unused trailing columns 0."""
    sizes = [int(s) for s in sizes]
    rows, cols = x.shape
    assert all(s >= 0 for s in sizes) and sum(sizes) == rows, (sizes, rows)
    cap = max(0, num_k_blocks(rows) + len(sizes) - 1)
    q_t = torch.zeros((cols, rows), dtype=torch.uint8)
    scales_t = torch.zeros((cols, cap), dtype=torch.float32)
    off = blk = 0
    for s in sizes:
        q_g, s_g = quantize_fp8_1x128_colwise_reference(x[off : off + s], ue8m0)
        q_t[:, off : off + s] = q_g.view(torch.uint8)
        scales_t[:, blk : blk + s_g.shape[1]] = s_g
        off += s
        blk += s_g.shape[1]
    return q_t.view(torch.float8_e4m3fn), scales_t


def padded_segment_columns(rows: int, groups: int, pad: int) -> int:
    """q_t columns of the padded segments cast: the most sum_g align_up(size_g, pad) can be for `groups`
    sizes summing to `rows` (a multiple of `pad`)."""
    return (rows + groups * (pad - 1)) // pad * pad


def quantize_fp8_1x128_colwise_segments_padded_reference(x: torch.Tensor, sizes: Sequence[int], pad: int,
                                                         ue8m0: bool = False):
    """The segments rule with every segment's q_t columns padded with zero columns to a multiple of `pad`
    (16, 32, 64 or 128). Returns `q_t` [C, K] (K = padded_segment_columns(R, G, pad); segment g's columns
    start at sum_{h<g} padded[h], every other column is 0), `scales_t` [C, ceil(K/128) + G - 1] (the same
    columns as the unpadded rule's, 0 after them) and `padded` (a list: align_up(sizes[g], pad), summing
    to at most K), the sizes the contiguous-K GEMM takes with them (it does not read the columns past their
    sum). pad divides 128, so every segment keeps its block count."""
    sizes = [int(s) for s in sizes]
    rows, cols = x.shape
    k = padded_segment_columns(rows, len(sizes), pad)
    q_u, s_u = quantize_fp8_1x128_colwise_segments_reference(x, sizes, ue8m0)
    padded = [align_up(s, pad) for s in sizes]
    q_t = torch.zeros((cols, k), dtype=torch.uint8)
    src = dst = 0
    for s, p in zip(sizes, padded):
        q_t[:, dst : dst + s] = q_u.view(torch.uint8)[:, src : src + s]
        src += s
        dst += p
    scales_t = torch.zeros((cols, max(0, num_k_blocks(k) + len(sizes) - 1)), dtype=torch.float32)
    scales_t[:, : s_u.shape[1]] = s_u
    return q_t.view(torch.float8_e4m3fn), scales_t, padded


def quantize_fp8_128x128_reference(w: torch.Tensor, ue8m0: bool = False):
    """The 1x128 rule of `quantize_fp8_1x128_rowwise_reference` with the amax taken over 128 x 128 blocks of
    `w` [N, K] (a weight): `q` [N, K] float8_e4m3fn (contiguous) and `scales` [ceil(N/128), ceil(K/128)]
    float32, one per block (partial blocks at the edges count only their elements). Blocks holding NaN or
    Inf get a NaN scale and NaN codes; all-zero blocks the finite scale 1e-4 / 448."""
    assert w.dim() == 2, w.shape
    rows, cols = w.shape
    nb, kb = num_k_blocks(rows), num_k_blocks(cols)
    wf = torch.zeros((nb * SCALE_BLOCK_K, kb * SCALE_BLOCK_K), dtype=torch.float32)
    wf[:rows, :cols] = w.detach().to("cpu", torch.float32)
    blocks = wf.view(nb, SCALE_BLOCK_K, kb, SCALE_BLOCK_K).permute(0, 2, 1, 3)  # [nb, kb, 128, 128]
    a = blocks.abs()
    a = torch.where(a <= torch.finfo(torch.float32).max, a, torch.full_like(a, float("inf")))
    amax = a.amax(dim=(2, 3)) if nb * kb > 0 else torch.zeros((nb, kb), dtype=torch.float32)
    scales = fp8_1x128_block_scales(amax, ue8m0)
    r = _f32_full_like(scales, 1.0) / scales
    t = torch.clamp(blocks * r[:, :, None, None], -FP8_E4M3_MAX, FP8_E4M3_MAX)
    q = t.to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(torch.isnan(scales)[:, :, None, None], torch.full_like(q, Q_NAN_BITS), q)
    q = q.permute(0, 2, 1, 3).reshape(nb * SCALE_BLOCK_K, kb * SCALE_BLOCK_K)[:rows, :cols]
    return q.contiguous().view(torch.float8_e4m3fn), scales


def dequantize_128x128(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float64 `q * s` for `q` [N, K] with one scale per 128 x 128 block, `s` [ceil(N/128), ceil(K/128)]."""
    rows, cols = q.shape
    assert s.shape == (num_k_blocks(rows), num_k_blocks(cols)), (tuple(s.shape), rows, cols)
    expanded = s.double().repeat_interleave(SCALE_BLOCK_K, 0).repeat_interleave(SCALE_BLOCK_K, 1)
    return q.double() * expanded[:rows, :cols]
