"""Registrations of the GEMM ops that live in Python: the CPU kernels (reference math behind the C++
checks) and the fake kernels (shape/dtype/stride checks mirroring csrc/checks.cpp, for meta tensors,
torch.compile and opcheck)."""

from __future__ import annotations

from typing import Sequence

import torch

from . import reference
from .scales import k_block_capacity, num_k_blocks

_LIB = "wgrad"
_DENSE = "wgrad_gemm_fp8_fp8_fp32_nt"
_PACKED = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt"
_CONTIG = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous"
_MGROUPED = "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous"
_DENSE_BF16 = "wgrad_gemm_fp8_fp8_bf16_nt"
_CONTIG_BF16 = "k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous"


# ------------------------------------------------------------------ CPU kernels ---------------------


@torch.library.register_kernel(f"{_LIB}::{_DENSE}", "cpu")
def _dense_cpu(a, sa, b, sb, out):
    torch.ops.wgrad._check_wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out)
    if a.shape[1] == 0:
        return
    reference.accumulate_(out, reference.wgrad_gemm_reference(a, sa, b, sb))


@torch.library.register_kernel(f"{_LIB}::{_PACKED}", "cpu")
def _packed_cpu(a, sa, b, sb, out, ks):
    torch.ops.wgrad._check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out, ks)
    m, n = out.shape[1], out.shape[2]
    for g, prod in enumerate(reference.k_grouped_reference(a, sa, b, sb, ks, m, n)):
        if ks[g] > 0:
            reference.accumulate_(out[g], prod)


@torch.library.register_kernel(f"{_LIB}::{_CONTIG}", "cpu")
def _contig_cpu(a, sa, b, sb, out, ks):
    torch.ops.wgrad._check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(a, sa, b, sb, out, ks)
    sizes = ks.tolist()
    for g, prod in enumerate(reference.k_grouped_contiguous_reference(a, sa, b, sb, sizes)):
        if sizes[g] > 0:
            reference.accumulate_(out[g], prod)


def _write_bf16_(out: torch.Tensor, product: torch.Tensor) -> None:
    """out = product rounded to float32, then to bfloat16: the bits of the fp32 form into zeros, then cast."""
    out.copy_(product.to(torch.float32).to(torch.bfloat16))


@torch.library.register_kernel(f"{_LIB}::{_DENSE_BF16}", "cpu")
def _dense_bf16_cpu(a, sa, b, sb, out):
    torch.ops.wgrad._check_wgrad_gemm_fp8_fp8_bf16_nt(a, sa, b, sb, out)
    if out.numel() > 0:
        _write_bf16_(out, reference.wgrad_gemm_reference(a, sa, b, sb))


@torch.library.register_kernel(f"{_LIB}::{_CONTIG_BF16}", "cpu")
def _contig_bf16_cpu(a, sa, b, sb, out, ks):
    torch.ops.wgrad._check_k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, ks)
    for g, prod in enumerate(reference.k_grouped_contiguous_reference(a, sa, b, sb, ks.tolist())):
        _write_bf16_(out[g], prod)


@torch.library.register_kernel(f"{_LIB}::{_MGROUPED}", "cpu")
def _m_grouped_cpu(a, sa, b, sb, out, group_sizes):
    torch.ops.wgrad._check_m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, group_sizes)
    if out.numel() > 0:
        out.copy_(reference.m_grouped_reference(a, sa, b, sb, group_sizes.tolist()).to(torch.bfloat16))


# ------------------------------------------------------------------ fake kernels --------------------
# They mirror csrc/checks.cpp (the source of truth); tests/test_checks.py holds both to the same inputs.


def _fail(op: str, msg: str):
    raise RuntimeError(f"{op}: {msg}")


def _check_fp8_operand(op, name, t, rows, k):
    if t.dtype != torch.float8_e4m3fn:
        _fail(op, f"{name} must be float8_e4m3fn, got {t.dtype}")
    if t.dim() != 2 or tuple(t.shape) != (rows, k):
        _fail(op, f"{name} must have shape [{rows}, {k}], got {list(t.shape)}")
    if rows == 0 or k == 0:
        return
    if t.stride(1) != 1 and k != 1:
        _fail(op, f"{name} must be K-contiguous (stride(1) == 1), got strides {t.stride()}")
    if rows != 1 and (t.stride(0) % 16 != 0 or t.stride(0) < k):
        _fail(op, f"{name} row stride must be a multiple of 16 elements and >= K, got {t.stride(0)}")
    if t.storage_offset() % 16 != 0:
        _fail(op, f"{name} data pointer must be 16-byte aligned, got storage offset {t.storage_offset()}")


def _check_scales(op, name, s, mn, kb):
    if s.dtype != torch.float32:
        _fail(op, f"{name} must be float32, got {s.dtype}")
    if s.dim() != 2 or tuple(s.shape) != (mn, kb):
        _fail(op, f"{name} must have shape [{mn}, {kb}], got {list(s.shape)}")
    if mn == 0 or kb == 0:
        return
    if s.stride(0) != 1 and mn != 1:
        _fail(op, f"{name} must be MN-major (stride(0) == 1), got strides {s.stride()}")
    if kb != 1 and (s.stride(1) % 4 != 0 or s.stride(1) < mn):
        _fail(op, f"{name} stride(1) must be a multiple of 4 and >= {mn}, got {s.stride(1)}")
    if s.storage_offset() % 4 != 0:
        _fail(op, f"{name} data pointer must be 16-byte aligned, got storage offset {s.storage_offset()}")


def _check_out(op, out, m, n, dtype=torch.float32):
    if out.dtype != dtype:
        _fail(op, f"out must be {str(dtype).replace('torch.', '')}, got {out.dtype}")
    if tuple(out.shape[-2:]) != (m, n):
        _fail(op, f"out must end in [{m}, {n}], got {list(out.shape)}")
    if out.numel() == 0:
        return
    if out.stride(-1) != 1 and n != 1:
        _fail(op, f"out must have stride(-1) == 1, got strides {out.stride()}")
    multiple = 16 // out.element_size()  # 16 bytes (TMA): 4 float32, 8 bfloat16
    for i in range(out.dim() - 1):
        if out.stride(i) % multiple != 0 and out.shape[i] != 1:
            _fail(op, f"out stride({i}) must be a multiple of {multiple}, got {out.stride(i)}")
    if m != 1 and out.stride(-2) < n:
        _fail(op, f"out row stride must be >= N = {n}, got {out.stride(-2)}")
    if out.storage_offset() % multiple != 0:
        _fail(op, f"out data pointer must be 16-byte aligned, got storage offset {out.storage_offset()}")


def _check_devices(op, out, **tensors):
    for name, t in tensors.items():
        if t.device != out.device:
            _fail(op, f"{name} must be on {out.device} like out, got {t.device}")


def _byte_span(t):
    """[first, last) bytes of t's storage its elements span (numel > 0)."""
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    first = t.storage_offset() * t.element_size()
    return first, first + (last + 1) * t.element_size()


def _check_out_apart(op, out, **tensors):
    """The kernels write out while they read the operands: out's memory must not overlap theirs."""
    if out.numel() == 0:
        return
    o_first, o_last = _byte_span(out)
    for name, t in tensors.items():
        if t.numel() == 0 or not torch._C._is_alias_of(out, t):
            continue
        first, last = _byte_span(t)
        if first < o_last and o_first < last:
            _fail(op, f"out must not overlap {name} in memory (the kernel writes out while it reads {name}), got "
                      f"out at bytes [{o_first}, {o_last}) and {name} at bytes [{first}, {last}) of one storage")


def _dense_checks(op, contiguous_op, dtype, a, sa, b, sb, out):
    for name, t, dims in (("a", a, "M, K"), ("b", b, "N, K"), ("out", out, "M, N")):
        if t.dim() != 2:
            _fail(op, f"{name} must be 2-D [{dims}], got {t.dim()}-D {list(t.shape)}")
    m, k, n = a.shape[0], a.shape[1], b.shape[0]
    if b.shape[1] != k:
        _fail(op, f"b must have K = {k} columns like a, got {b.shape[1]}")
    if k % 16 != 0:
        _fail(op, f"K must be a multiple of 16 (16-byte TMA rows; {contiguous_op} takes any K as one group), got {k}")
    _check_devices(op, out, a=a, sa=sa, b=b, sb=sb)
    _check_fp8_operand(op, "a", a, m, k)
    _check_fp8_operand(op, "b", b, n, k)
    _check_scales(op, "sa", sa, m, num_k_blocks(k))
    _check_scales(op, "sb", sb, n, num_k_blocks(k))
    _check_out(op, out, m, n, dtype)
    _check_out_apart(op, out, a=a, sa=sa, b=b, sb=sb)


@torch.library.register_fake(f"{_LIB}::{_DENSE}")
def _dense_fake(a, sa, b, sb, out):
    _dense_checks(_DENSE, _CONTIG, torch.float32, a, sa, b, sb, out)


@torch.library.register_fake(f"{_LIB}::{_DENSE_BF16}")
def _dense_bf16_fake(a, sa, b, sb, out):
    _dense_checks(_DENSE_BF16, _CONTIG_BF16, torch.bfloat16, a, sa, b, sb, out)


def _check_group_size_tensor(op, name, s):
    """int32, 1-D [G], G >= 1, contiguous (csrc/checks.cpp: check_group_size_tensor). Returns G."""
    if s.dtype != torch.int32:
        _fail(op, f"{name} must be int32, got {s.dtype}")
    if s.dim() != 1:
        _fail(op, f"{name} must be 1-D [G], got {s.dim()}-D {list(s.shape)}")
    if not s.is_contiguous():
        _fail(op, f"{name} must be contiguous, got strides {s.stride()}")
    if s.shape[0] < 1:
        _fail(op, f"{name} must name at least one group, got an empty tensor")
    return s.shape[0]


def _check_grouped_out(op, out, groups):
    if out.dim() != 3:
        _fail(op, f"out must be 3-D [G, M, N], got {out.dim()}-D {list(out.shape)}")
    if out.shape[0] != groups:
        _fail(op, f"out.shape[0] must equal the number of groups {groups}, got {out.shape[0]}")


@torch.library.register_fake(f"{_LIB}::{_PACKED}")
def _packed_fake(a, sa, b, sb, out, ks: Sequence[int]):
    op = _PACKED
    if len(ks) < 1:
        _fail(op, "ks must name at least one group, got an empty list")
    _check_grouped_out(op, out, len(ks))
    _check_devices(op, out, a=a, sa=sa, b=b, sb=sb)
    m, n = out.shape[1], out.shape[2]
    for g, k in enumerate(ks):
        if k < 0:
            _fail(op, f"ks[{g}] must be >= 0, got {k}")
        if k % 16 != 0:
            _fail(op, f"ks[{g}] must be a multiple of 16, got {k}")
    k_total = sum(ks)
    kb_total = sum(num_k_blocks(k) for k in ks)
    for name, t, rows in (("a", a, m), ("b", b, n)):
        if t.dtype != torch.float8_e4m3fn:
            _fail(op, f"{name} must be float8_e4m3fn, got {t.dtype}")
        if not t.is_contiguous():
            _fail(op, f"{name} must be contiguous (packed groups), got strides {t.stride()}")
        if t.numel() != rows * k_total:
            _fail(op, f"{name} must hold {rows} * sum(ks) = {rows * k_total} elements, got {t.numel()}")
        if t.numel() != 0 and t.storage_offset() % 16 != 0:
            _fail(op, f"{name} data pointer must be 16-byte aligned, got storage offset {t.storage_offset()}")
    _check_scales(op, "sa", sa, m, kb_total)
    _check_scales(op, "sb", sb, n, kb_total)
    _check_out(op, out, m, n)
    _check_out_apart(op, out, a=a, sa=sa, b=b, sb=sb)


def _contig_checks(op, dtype, a, sa, b, sb, out, ks):
    groups = _check_group_size_tensor(op, "ks", ks)
    _check_grouped_out(op, out, groups)
    _check_devices(op, out, a=a, sa=sa, b=b, sb=sb, ks=ks)
    for name, t, dims in (("a", a, "M, K_total"), ("b", b, "N, K_total")):
        if t.dim() != 2:
            _fail(op, f"{name} must be 2-D [{dims}], got {t.dim()}-D {list(t.shape)}")
    m, n, k_total = out.shape[1], out.shape[2], a.shape[1]
    if b.shape[1] != k_total:
        _fail(op, f"b must have K_total = {k_total} columns like a, got {b.shape[1]}")
    _check_fp8_operand(op, "a", a, m, k_total)
    _check_fp8_operand(op, "b", b, n, k_total)
    cap = k_block_capacity(k_total, groups)
    for name, s, rows in (("sa", sa, m), ("sb", sb, n)):
        if s.dim() != 2 or s.shape[1] < cap:
            _fail(op, f"{name} must be [{rows}, >= {cap}], got {list(s.shape)}")
        _check_scales(op, name, s, rows, s.shape[1])
    _check_out(op, out, m, n, dtype)
    _check_out_apart(op, out, a=a, sa=sa, b=b, sb=sb, ks=ks)


@torch.library.register_fake(f"{_LIB}::{_CONTIG}")
def _contig_fake(a, sa, b, sb, out, ks):
    _contig_checks(_CONTIG, torch.float32, a, sa, b, sb, out, ks)


@torch.library.register_fake(f"{_LIB}::{_CONTIG_BF16}")
def _contig_bf16_fake(a, sa, b, sb, out, ks):
    _contig_checks(_CONTIG_BF16, torch.bfloat16, a, sa, b, sb, out, ks)


@torch.library.register_fake(f"{_LIB}::{_MGROUPED}")
def _m_grouped_fake(a, sa, b, sb, out, group_sizes):
    op = _MGROUPED
    sizes = group_sizes
    groups = _check_group_size_tensor(op, "group_sizes", sizes)
    _check_devices(op, out, a=a, sa=sa, b=b, sb=sb, group_sizes=sizes)
    if a.dim() != 2:
        _fail(op, f"a must be 2-D [T, K], got {a.dim()}-D {list(a.shape)}")
    if b.dim() != 3:
        _fail(op, f"b must be 3-D [G, N, K], got {b.dim()}-D {list(b.shape)}")
    t, k, n = a.shape[0], a.shape[1], b.shape[1]
    if b.shape[0] != groups:
        _fail(op, f"b.shape[0] must equal the number of groups {groups}, got {b.shape[0]}")
    if b.shape[2] != k:
        _fail(op, f"b must have K = {k} columns like a, got {b.shape[2]}")
    if k < 1:
        _fail(op, f"K must be positive, got {k}")
    if max(t, n, k) > 2**31 - 1:
        _fail(op, f"T, N and K must fit TMA's 32-bit coordinates, got {t}, {n} and {k}")
    if n % 2 != 0:
        _fail(op, f"N must be even (the kernel stores bf16 pairs), got {n}")
    _check_fp8_operand(op, "a", a, t, k)
    if b.dtype != torch.float8_e4m3fn:
        _fail(op, f"b must be float8_e4m3fn, got {b.dtype}")
    if b.numel() > 0:
        if b.stride(2) != 1 and k != 1:
            _fail(op, f"b must be K-contiguous (stride(2) == 1), got strides {b.stride()}")
        if (n != 1 and b.stride(1) % 16 != 0) or (groups != 1 and b.stride(0) % 16 != 0):
            _fail(op, f"b strides (0) and (1) must be multiples of 16 elements (16 bytes, TMA), got {b.stride()}")
        if b.storage_offset() % 16 != 0:
            _fail(op, f"b data pointer must be 16-byte aligned (TMA), got storage offset {b.storage_offset()}")
    kb = num_k_blocks(k)
    _check_scales(op, "sa", sa, t, kb)
    if sb.dtype != torch.float32:
        _fail(op, f"sb must be float32, got {sb.dtype}")
    nb = num_k_blocks(n)
    if sb.dim() != 3 or tuple(sb.shape) != (groups, nb, kb):
        _fail(op, f"sb must have shape [{groups}, {nb}, {kb}] (one scale per 128 x 128 block of b), got "
                  f"{list(sb.shape)}")
    if out.dtype != torch.bfloat16:
        _fail(op, f"out must be bfloat16, got {out.dtype}")
    if out.dim() != 2 or tuple(out.shape) != (t, n):
        _fail(op, f"out must have shape [{t}, {n}], got {list(out.shape)}")
    if out.numel() > 0:
        if out.stride(1) != 1:
            _fail(op, f"out must have stride(1) == 1, got strides {out.stride()}")
        if t != 1 and (out.stride(0) < n or out.stride(0) % 2 != 0):
            _fail(op, f"out row stride must be even and >= N = {n}, got {out.stride(0)}")
        if out.storage_offset() % 2 != 0:
            _fail(op, f"out data pointer must be 4-byte aligned, got storage offset {out.storage_offset()}")
    _check_out_apart(op, out, a=a, sa=sa, b=b, sb=sb, group_sizes=sizes)
