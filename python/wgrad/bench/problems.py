"""The GEMM problems the benchmark runs: random FP8 operands with 1x128 scales, the float64 reference
product, the starting value of `out`, the work one call does (FLOPs, bytes) and the accuracy measure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Sequence

import torch

from .. import reference
from ..scales import empty_mn_major_scales, k_block_capacity, num_k_blocks

# Initial out = this fraction of the reference's RMS times N(0, 1): an impl that overwrites out instead
# of accumulating shows an error of this size, while fp32 rounding of the add stays far below 2e-4.
OUT_INIT_FRACTION = 0.1

BYTES_NOTE = ("GB/s counts a + b + their scales read once and out read and written once "
              "(fp32, 8 bytes per element); bf16 counts its bf16 operands instead of fp8 + scales")


# ------------------------------------------------------------------ work of one call ----------------


def dense_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def fp8_bytes(m: int, n: int, k: int) -> int:
    """Bytes one 1x128-scaled FP8 wgrad call must move: fp8 a and b, their fp32 scales, out read+written."""
    return (m + n) * k + 4 * (m + n) * num_k_blocks(k) + 8 * m * n


def bf16_bytes(m: int, n: int, k: int) -> int:
    return 2 * (m + n) * k + 8 * m * n


def grouped_bytes(m: int, n: int, ks: Sequence[int]) -> int:
    """Sum over groups; a group with K_g == 0 leaves out[g] alone and moves nothing."""
    return sum(fp8_bytes(m, n, k) for k in ks if k > 0)


# ------------------------------------------------------------------ operands ------------------------


def random_scales(mn: int, kb: int, device, generator: torch.Generator) -> torch.Tensor:
    """1x128 scales 2**U(-8, 2) (a range of 2**10) in the TMA-aligned MN-major layout."""
    s = empty_mn_major_scales(mn, kb, device)
    exps = torch.rand((mn, kb), device=device, generator=generator) * 10.0 - 8.0
    s.copy_(torch.exp2(exps))
    return s


def random_fp8(rows: int, cols: int, device, generator: torch.Generator) -> torch.Tensor:
    return torch.randn((rows, cols), device=device, generator=generator).to(torch.float8_e4m3fn)


def _out_init(ref: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    rms = float(ref.pow(2).mean().sqrt()) if ref.numel() else 1.0
    noise = torch.randn(ref.shape, device=ref.device, generator=generator)
    return noise.mul_(OUT_INIT_FRACTION * (rms if rms > 0 else 1.0))


@dataclass
class DenseProblem:
    m: int
    n: int
    k: int
    a: torch.Tensor  # [M, K] e4m3
    sa: torch.Tensor  # [M, ceil(K/128)] fp32, MN-major
    b: torch.Tensor  # [N, K] e4m3
    sb: torch.Tensor  # [N, ceil(K/128)] fp32, MN-major
    ref: torch.Tensor  # [M, N] float64 exact product
    out_init: torch.Tensor  # [M, N] fp32 starting value of every impl's out

    @property
    def device(self) -> torch.device:
        return self.a.device


def make_dense_problem(m: int, n: int, k: int, device, seed: int = 0) -> DenseProblem:
    gen = torch.Generator(device=device).manual_seed(seed)
    kb = num_k_blocks(k)
    a, b = random_fp8(m, k, device, gen), random_fp8(n, k, device, gen)
    sa, sb = random_scales(m, kb, device, gen), random_scales(n, kb, device, gen)
    ref = reference.wgrad_gemm_reference(a, sa, b, sb)
    return DenseProblem(m, n, k, a, sa, b, sb, ref, _out_init(ref, gen))


@dataclass
class GroupedProblem:
    """G experts sharing (M, N) with token counts `ks`, in both layouts over the same values:
    packed (row-major [M, K_g] blocks one after another) and contiguous-K ([M, sum K] columns)."""
    m: int
    n: int
    ks: List[int]
    a_packed: torch.Tensor  # [M * sum K] e4m3
    b_packed: torch.Tensor  # [N * sum K] e4m3
    sa_packed: torch.Tensor  # [M, sum_g ceil(K_g/128)] MN-major
    sb_packed: torch.Tensor  # [N, sum_g ceil(K_g/128)] MN-major
    a_contig: torch.Tensor  # [M, sum K] e4m3
    b_contig: torch.Tensor  # [N, sum K] e4m3
    sa_contig: torch.Tensor  # [M, k_block_capacity(sum K, G)] MN-major (the packed columns first)
    sb_contig: torch.Tensor  # [N, k_block_capacity(sum K, G)] MN-major
    sizes: torch.Tensor  # [G] int32 on the device
    refs: List[torch.Tensor]  # G x [M, N] float64
    out_init: torch.Tensor  # [G, M, N] fp32

    @property
    def device(self) -> torch.device:
        return self.a_contig.device

    @property
    def groups(self) -> int:
        return len(self.ks)

    def group_operands(self, g: int):
        """Group g as dense operands: views into the packed layout (no copies)."""
        a_g = reference.packed_group_operands(self.a_packed, self.m, self.ks)[g]
        b_g = reference.packed_group_operands(self.b_packed, self.n, self.ks)[g]
        sa_g = reference.group_scale_columns(self.sa_packed, self.ks)[g]
        sb_g = reference.group_scale_columns(self.sb_packed, self.ks)[g]
        return a_g, sa_g, b_g, sb_g


def _concat_fp8(parts: List[torch.Tensor]) -> torch.Tensor:
    # Through uint8: torch.cat of float8 is not implemented on every backend.
    flat = [p.contiguous().view(torch.uint8).reshape(-1) for p in parts]
    return torch.cat(flat).view(torch.float8_e4m3fn)


def make_grouped_problem(m: int, n: int, ks: Sequence[int], device, seed: int = 0) -> GroupedProblem:
    gen = torch.Generator(device=device).manual_seed(seed)
    ks = [int(k) for k in ks]
    total_k = sum(ks)
    total_kb = sum(num_k_blocks(k) for k in ks)
    cap = k_block_capacity(total_k, len(ks))
    a_c, b_c = random_fp8(m, total_k, device, gen), random_fp8(n, total_k, device, gen)
    offs = [sum(ks[:g]) for g in range(len(ks))]
    a_p = _concat_fp8([a_c[:, o : o + k] for o, k in zip(offs, ks)])
    b_p = _concat_fp8([b_c[:, o : o + k] for o, k in zip(offs, ks)])
    sa_p, sb_p = random_scales(m, total_kb, device, gen), random_scales(n, total_kb, device, gen)
    sa_c, sb_c = empty_mn_major_scales(m, cap, device), empty_mn_major_scales(n, cap, device)
    sa_c.fill_(1.0)
    sb_c.fill_(1.0)
    sa_c[:, :total_kb].copy_(sa_p)
    sb_c[:, :total_kb].copy_(sb_p)
    refs = reference.k_grouped_contiguous_reference(a_c, sa_c, b_c, sb_c, ks)
    out_init = torch.stack([_out_init(r, gen) for r in refs]) if refs else torch.empty(0, m, n)
    sizes = torch.tensor(ks, dtype=torch.int32, device=device)
    return GroupedProblem(m, n, ks, a_p, b_p, sa_p, sb_p, a_c, b_c, sa_c, sb_c, sizes, refs, out_init)


# ------------------------------------------------------------------ timing-only calls ---------------


def dense_wgrad_call(m: int, n: int, k: int, bf16: bool, device, generator: torch.Generator) -> Callable[[], object]:
    """One dense weight-gradient call on fresh random operands (no reference: for sweeps that only time):
    into a zero fp32 out, or written in bf16."""
    from .. import api

    a, b = random_fp8(m, k, device, generator), random_fp8(n, k, device, generator)
    kb = num_k_blocks(k)
    sa, sb = random_scales(m, kb, device, generator), random_scales(n, kb, device, generator)
    if bf16:
        out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        return lambda: api.wgrad_gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    out = torch.zeros(m, n, device=device)
    return lambda: api.wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out)


def contiguous_wgrad_call(m: int, n: int, ks: Sequence[int], bf16: bool, device,
                          generator: torch.Generator) -> Callable[[], object]:
    """One contiguous-K weight-gradient call over the token counts `ks` on fresh random operands (timing only),
    into a zero fp32 out [G, M, N] or written in bf16."""
    from .. import api

    total = sum(ks)
    a, b = random_fp8(m, total, device, generator), random_fp8(n, total, device, generator)
    cap = k_block_capacity(total, len(ks))
    sa, sb = random_scales(m, cap, device, generator), random_scales(n, cap, device, generator)
    sizes = torch.tensor(list(ks), dtype=torch.int32, device=device)
    if bf16:
        out = torch.empty(len(ks), m, n, device=device, dtype=torch.bfloat16)
        return lambda: api.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), sizes, out)
    out = torch.zeros(len(ks), m, n, device=device)
    return lambda: api.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((a, sa), (b, sb), out, sizes)


# ------------------------------------------------------------------ accuracy ------------------------


def relative_error(after: torch.Tensor, before: torch.Tensor, ref: torch.Tensor) -> float:
    """||(after - before) - ref||_F / ||ref||_F, in float64: the error of what one call accumulated."""
    delta = after.double() - before.double()
    denom = torch.linalg.vector_norm(ref)
    num = torch.linalg.vector_norm(delta - ref)
    if float(denom) == 0.0:
        return float(num)
    return float(num / denom)


def grouped_relative_error(after: torch.Tensor, before: torch.Tensor, refs: Sequence[torch.Tensor]) -> float:
    """Worst group's relative error (groups with an all-zero product are compared in absolute terms)."""
    errs = [relative_error(after[g], before[g], refs[g]) for g in range(len(refs))]
    return max(errs) if errs else 0.0
