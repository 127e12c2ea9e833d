"""The TMA-aligned, MN-major scale layout and the conversions into it (docs/contract.md).

A scale tensor for an operand with `mn` rows and `kb` 128-wide K blocks is seen as `[mn, kb]` with
strides `(1, ld)`, `ld = align_up(mn, 4)`: element `(m, kb)` sits at `kb * ld + m`, so every K block's
column of scales is one 16-byte-aligned run that TMA can load.
"""

from __future__ import annotations

import torch

from ._args import check_non_negative

SCALE_BLOCK_K = 128


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def align_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def num_k_blocks(k: int) -> int:
    """1x128 blocks along K (the last one may be partial). K < 0 raises ValueError."""
    check_non_negative(k, "k")
    return ceil_div(k, SCALE_BLOCK_K)


def k_block_capacity(k_total: int, groups: int) -> int:
    """Most blocks a split of `k_total` columns into `groups` segments can need (blocks restart at each
    segment, so every boundary adds at most one partial block). Scales of the contiguous-K grouped GEMM
    have this many columns. A negative argument raises ValueError."""
    check_non_negative(groups, "groups")
    check_non_negative(k_total, "k_total")
    return max(0, num_k_blocks(k_total) + groups - 1)


def empty_mn_major_scales(mn: int, kb: int, device=None) -> torch.Tensor:
    """An uninitialised `[mn, kb]` float32 tensor in the TMA-aligned MN-major layout."""
    ld = align_up(max(mn, 1), 4)
    return torch.empty((kb, ld), dtype=torch.float32, device=device)[:, :mn].t()


def is_mn_major(s: torch.Tensor) -> bool:
    """True when `s` ([mn, kb]) already has the layout the GEMMs take without a copy."""
    mn, kb = s.shape
    return _is_mn_major(s, mn, kb)


def _is_mn_major(s: torch.Tensor, mn, kb) -> bool:
    # (s's shape given: this check runs twice per GEMM call, on the host's critical path)
    if mn == 0 or kb == 0:
        return True
    stride_mn, stride_kb = s.stride()
    if mn > 1 and stride_mn != 1:
        return False
    if kb > 1 and (stride_kb % 4 != 0 or stride_kb < mn):
        return False
    if torch.compiler.is_compiling():
        # Neither address nor storage offset while tracing: the layout is taken as it is, and an unaligned
        # one then meets the op's own check, which names it.
        return True
    return s.storage_offset() % 4 == 0 if s.is_meta else s.data_ptr() % 16 == 0


def to_mn_major_scales(s: torch.Tensor, mn: int, kb: int, name: str = "scales") -> torch.Tensor:
    """Returns `s` as an `[mn, kb]` MN-major view, accepting:

    - `[mn, kb]` already MN-major (returned as is);
    - `[kb, mn]` whose rows are 16-byte aligned (a transposed view is returned: no copy);
    - any other `[mn, kb]` or `[kb, mn]` float32 tensor: **copied** into a new MN-major tensor (slower;
      the quantization kernels of this package write the right layout directly).
    """
    if s.dim() != 2:
        raise ValueError(f"{name} must be 2-D [{mn}, {kb}] or [{kb}, {mn}], got shape {tuple(s.shape)}")
    if s.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {s.dtype}")
    shape = s.shape
    if shape == (mn, kb):
        cand = s
    elif shape == (kb, mn):
        cand = s.t()
    else:
        raise ValueError(f"{name} must have shape [{mn}, {kb}] or [{kb}, {mn}], got {tuple(shape)}")
    if _is_mn_major(cand, mn, kb):
        return cand
    out = empty_mn_major_scales(mn, kb, device=s.device)
    out.copy_(cand)
    return out
