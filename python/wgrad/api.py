"""DeepGEMM-compatible Python entry points of the weight-gradient GEMMs, and the m-grouped expert GEMM of
MoE fprop and dgrad.

Scales may come as `[mn, ceil(K/128)]` in the TMA-aligned MN-major layout or as the plain
`[ceil(K/128), mn]` view of it (no copy in either case); any other float32 layout is copied into the
MN-major layout first (see `wgrad.scales.to_mn_major_scales`), which costs an extra kernel.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import torch

from . import _ops
from ._args import as_int, as_ints
from .scales import SCALE_BLOCK_K, ceil_div, num_k_blocks, to_mn_major_scales

Operand = Tuple[torch.Tensor, torch.Tensor]

# Groups of one launch of the packed layout (kMaxPackedGroups, csrc/kernels/gemm/kernel_sm90.cuh).
_PACKED_GROUPS_PER_LAUNCH = 96

# The ops the entry points hand their arguments to as they are (see _ran_as_given).
_DENSE_FP32 = torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt.default
_PACKED_FP32 = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt.default
_DENSE_BF16 = torch.ops.wgrad.wgrad_gemm_fp8_fp8_bf16_nt.default
_CONTIG_FP32 = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous.default
_CONTIG_BF16 = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous.default


def _ran_as_given(op, a, sa, b, sb, *rest) -> bool:
    """Runs `op` on the arguments as they are when both scales already have their first dim contiguous (the
    MN-major layout the casts write, the common case), leaving every check to the op's C++ checks; True when
    it ran. False, with nothing run, when the scales come in another layout, when torch.compile is tracing
    (which takes the converting path), or when the op rejects an argument: the caller then takes the
    converting path, which copies a scale layout the op does not take as it is, or raises the error that
    names the argument. (These ops launch one kernel after all their checks, so a rejected call did nothing;
    the packed layout takes this path only for the groups one launch holds.)
    This keeps the entry point's own host time to a few attribute reads: the host cost per call is what
    short-K GEMMs pay (docs/decisions/0034-host-path.md)."""
    if torch.compiler.is_compiling():
        return False
    try:
        if sa.stride(0) != 1 or sb.stride(0) != 1:
            return False
        op(a, sa, b, sb, *rest)
    except (RuntimeError, IndexError):
        return False
    return True


def _accumulate_into(out: torch.Tensor, c: Optional[torch.Tensor], check: Callable[[], None]) -> None:
    # DeepGEMM's d = c + a @ b^T: with c None or c aliasing out, the product accumulates into out.
    if c is None or c is out:
        return
    if torch.compiler.is_compiling():
        # No addresses while torch.compile traces: a c that is another view of out's exact memory is copied
        # onto itself (no change). A rejected call raises while the op is traced, before anything runs.
        out.copy_(c)
    elif not (c.data_ptr() == out.data_ptr() and c.stride() == out.stride()):
        # A rejected call must leave out untouched: check the operands (the fake kernel's checks,
        # which mirror the C++ ones) before c overwrites out.
        check()
        out.copy_(c)


def _check_2d(t: torch.Tensor, name: str, dims: str) -> None:
    # Before the scales are read against t's shape: a 3-D a would otherwise be reported as a scale shape.
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [{dims}], got {t.dim()}-D shape {list(t.shape)}")


def _check_grouped_out(out: torch.Tensor) -> None:
    if out.dim() != 3:
        raise ValueError(f"out must be 3-D [G, M, N], got {out.dim()}-D shape {list(out.shape)}")


def _dense_operands(lhs: Operand, rhs: Operand) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """a, sa, b, sb of a dense call, the scales in the MN-major layout."""
    a, sa = lhs
    b, sb = rhs
    _check_2d(a, "a", "M, K")
    _check_2d(b, "b", "N, K")
    m, k = a.shape
    kb = ceil_div(k, SCALE_BLOCK_K)  # (num_k_blocks without its sign check: a shape is >= 0)
    return a, to_mn_major_scales(sa, m, kb, "sa"), b, to_mn_major_scales(sb, b.shape[0], kb, "sb")


def wgrad_gemm_fp8_fp8_fp32_nt(lhs: Operand, rhs: Operand, out: torch.Tensor,
                               c: Optional[torch.Tensor] = None) -> None:
    """out += (a * sa) @ (b * sb)^T in fp32, with a [M, K], b [N, K] float8_e4m3fn (K-contiguous) and 1x128
    scales sa, sb. `c`, if given, is copied into out first (DeepGEMM's `d = c + a @ b^T`)."""
    a, sa = lhs
    b, sb = rhs
    if c is None and _ran_as_given(_DENSE_FP32, a, sa, b, sb, out):
        return
    a, sa, b, sb = _dense_operands(lhs, rhs)
    _accumulate_into(out, c, lambda: _ops._dense_fake(a, sa, b, sb, out))
    torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out)


def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs: Operand, rhs: Operand, out: torch.Tensor,
                                         batch_sizes: Sequence[int],
                                         c: Optional[torch.Tensor] = None) -> None:
    """One launch for G experts in DeepGEMM's packed layout: a holds the row-major [M, K_g] blocks one
    after another (flattened), b the [N, K_g] blocks; scales have sum_g ceil(K_g/128) blocks; out is
    [G, M, N] and out[g] += (a_g * sa_g) @ (b_g * sb_g)^T. Every K_g must be an integer, a multiple of 16;
    K_g == 0 leaves out[g] untouched."""
    a, sa = lhs
    b, sb = rhs
    ks = as_ints(batch_sizes, "batch_sizes")
    if c is None and len(ks) <= _PACKED_GROUPS_PER_LAUNCH and _ran_as_given(_PACKED_FP32, a, sa, b, sb, out, ks):
        return
    _check_grouped_out(out)
    m, n = out.shape[-2], out.shape[-1]
    # The scales' block count as given (no per-call loop over the groups): the op's check holds it to
    # sum_g ceil(K_g / 128).
    sa = _scales_as_given(sa, m, "sa")
    sb = _scales_as_given(sb, n, "sb")
    a, b = a.reshape(-1), b.reshape(-1)
    _accumulate_into(out, c, lambda: _ops._packed_fake(a, sa, b, sb, out, ks))
    torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out, ks)


def _scales_as_given(s: torch.Tensor, mn: int, name: str) -> torch.Tensor:
    """Scales of [mn, blocks] or [blocks, mn] (when mn == blocks both read the same), with the block count
    they have, in the MN-major layout."""
    if s.dim() != 2:
        raise ValueError(f"{name} must be 2-D [{mn}, blocks] or [blocks, {mn}], got shape {tuple(s.shape)}")
    return to_mn_major_scales(s, mn, s.shape[1] if s.shape[0] == mn else s.shape[0], name)


def _contiguous_operands(lhs: Operand, rhs: Operand) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """a, sa, b, sb of a contiguous-K call, the scales in the MN-major layout (their block columns as given)."""
    a, sa = lhs
    b, sb = rhs
    _check_2d(a, "a", "M, K_total")
    _check_2d(b, "b", "N, K_total")
    return a, _scales_as_given(sa, a.shape[0], "sa"), b, _scales_as_given(sb, b.shape[0], "sb")


def check_group_sizes(group_sizes: Union[torch.Tensor, Sequence[int]], k_total: int) -> None:
    """Host-side check of contiguous-K group sizes (synchronises with the device): raises ValueError
    naming the first bad size, or the sum, where the kernel would leave `out` untouched (a negative size,
    or a sum above k_total). The sizes must be integers (an integer tensor, or a sequence of ints), like
    k_total."""
    k_total = as_int(k_total, "k_total")
    if isinstance(group_sizes, torch.Tensor):
        if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
            raise ValueError(f"group_sizes must hold integers (an int32 tensor), got {group_sizes.dtype}")
        sizes = group_sizes.tolist()
    else:
        sizes = as_ints(group_sizes, "group_sizes")
    for g, k in enumerate(sizes):
        if k < 0:
            raise ValueError(f"group_sizes[{g}] must be >= 0, got {k}")
    if sum(sizes) > k_total:
        raise ValueError(f"sum(group_sizes) must be at most K_total = {k_total}, got {sum(sizes)}")


def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(lhs: Operand, rhs: Operand, out: torch.Tensor,
                                                    group_sizes: torch.Tensor) -> None:
    """One launch for G experts whose tokens are contiguous column ranges of a [M, K_total] and
    b [N, K_total] (what a transposed cast of the token-major MoE buffer produces). `group_sizes` is an
    int32 tensor [G] on the operands' device and is only read by the kernel: no host synchronisation,
    capturable in a CUDA graph. Each size must be >= 0 (any value: a group may start inside a 16-byte
    chunk, at some cost, see docs/contract.md) and they must sum to at most K_total (the columns past
    their sum are not read: the zero tail of the padded segments cast's output); the kernel checks this on
    the device and leaves `out` untouched when they do not (it cannot raise without a synchronisation: call
    `check_group_sizes` first when in doubt). Scales have `ceil(K_total/128) + G - 1` block columns (blocks
    restart at every group; trailing ones unused)."""
    a, sa = lhs
    b, sb = rhs
    if _ran_as_given(_CONTIG_FP32, a, sa, b, sb, out, group_sizes):
        return
    a, sa, b, sb = _contiguous_operands(lhs, rhs)
    torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(a, sa, b, sb, out, group_sizes)


def wgrad_gemm_fp8_fp8_bf16_nt(lhs: Operand, rhs: Operand, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The weight gradient in bf16, for a model without an fp32 gradient buffer: `out = (a * sa) @ (b * sb)^T`
    accumulated in fp32 over the whole K and rounded once to bf16 (the bits of `wgrad_gemm_fp8_fp8_fp32_nt`
    into zeros, then cast, for 2 bytes of output traffic per element against the 18 of the zero fill, the
    reduce-add and the cast), with a [M, K], b [N, K] float8_e4m3fn (K-contiguous) and 1x128 scales sa, sb.
    K == 0 writes zeros. Returns `out` ([M, N] bfloat16, row stride a multiple of 8; allocated when not
    given)."""
    a, sa = lhs
    b, sb = rhs
    if out is not None and _ran_as_given(_DENSE_BF16, a, sa, b, sb, out):
        return out
    a, sa, b, sb = _dense_operands(lhs, rhs)
    if out is None:
        out = torch.empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
    torch.ops.wgrad.wgrad_gemm_fp8_fp8_bf16_nt(a, sa, b, sb, out)
    return out


def k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(lhs: Operand, rhs: Operand, group_sizes: torch.Tensor,
                                                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous` in bf16, written: `out[g] = (a_g * sa_g) @ (b_g *
    sb_g)^T` accumulated in fp32 and rounded once to bf16; a group with no tokens gets zeros (the gradient of
    an expert that received none). The operands and `group_sizes` as there (validated by the kernel, which
    leaves `out` untouched when they break the rules). Returns `out` ([G, M, N] bfloat16, allocated when not
    given)."""
    a, sa = lhs
    b, sb = rhs
    if out is not None and _ran_as_given(_CONTIG_BF16, a, sa, b, sb, out, group_sizes):
        return out
    a, sa, b, sb = _contiguous_operands(lhs, rhs)
    if out is None:
        groups = group_sizes.shape[0] if group_sizes.dim() == 1 else 0
        out = torch.empty((groups, a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
    torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, group_sizes)
    return out


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs: Operand, rhs: Operand, group_sizes: torch.Tensor,
                                              out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The expert GEMM of an MoE layer's fprop and dgrad in one launch: for every group g,
    `out[rows of g] = (a * sa)[rows of g] @ (b[g] * sb[g])^T` in bf16, with a [T, K] float8_e4m3fn in 1x128
    blocks along K (the row-wise cast's `q, scales`), its rows grouped by expert (`group_sizes`: an int32
    tensor [G] on a's device, any counts, 0 included, summing to T), and b [G, N, K] float8_e4m3fn in 128x128
    blocks with scales sb [G, ceil(N/128), ceil(K/128)] (the weight cast's `q, scales` per expert).
    dgrad (`dX = dY W`) is the same call on the transposed weights: `q_t, scales_t` of each expert as
    [G, in, out] views (any strides with stride(2) == 1 and the others multiples of 16).
    Nothing reads group_sizes on the host (no synchronisation, capturable in a CUDA graph); the kernel
    validates them and leaves `out` untouched when they break the rules (a fresh `out` then holds
    whatever `torch.empty` gave: call `check_group_sizes(group_sizes, T)` first when in doubt).
    Returns `out` ([T, N] bfloat16, allocated when not given)."""
    a, sa = lhs
    b, sb = rhs
    _check_2d(a, "a", "T, K")
    if b.dim() != 3:
        raise ValueError(f"b must be 3-D [G, N, K], got {b.dim()}-D shape {list(b.shape)}")
    sa = to_mn_major_scales(sa, a.shape[0], num_k_blocks(a.shape[1]), "sa")
    if out is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)
    torch.ops.wgrad.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, group_sizes)
    return out
