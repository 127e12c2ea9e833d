"""FP8 1x128 quantization: x (bfloat16 / float16 / float32) to float8_e4m3fn with one float32 scale per
128 elements, written directly in the layouts the weight-gradient GEMMs take (docs/contract.md).

- `quantize_fp8_1x128_rowwise(x)`: blocks along the last dim, `q` [R, C] and `scales` [R, ceil(C/128)];
- `quantize_fp8_1x128_colwise(x)`: blocks along the rows (the token dim), output transposed:
  `q_t` [C, R] K-contiguous (row stride `align_up(R, 16)`), `scales_t` [C, ceil(R/128)] — the wgrad
  operand of an activation or output gradient `x` [tokens, features];
- `quantize_fp8_1x128_both(x)`: both from one read of `x`;
- `quantize_fp8_1x128_colwise_segments(x, sizes)`: the column-wise cast of an MoE buffer whose rows are
  per-expert segments (`sizes`: int32 tensor on x's device, never read by the host), blocks restarting at
  every segment: the contiguous-K operand of `k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous`;
- `quantize_fp8_1x128_colwise_segments_padded(x, sizes, pad=32)`: the same with every segment's columns
  of `q_t` padded with zero columns to a multiple of `pad`, plus the padded sizes (on the device): the
  contiguous-K GEMM then loads every expert's columns without shifting them (it takes any token counts
  either way, but groups that start inside a 16-byte chunk cost it a shift in shared memory), and with
  pad >= 32 the cast writes whole 32-byte sectors (its fast path).
- `quantize_fp8_1x128_both_segments_padded(x, sizes, pad=32)`: the row-wise cast and the padded segments
  cast from one read of `x`.

Every scale tensor is `[mn, kb]` in the TMA-aligned MN-major layout (strides `(1, align_up(mn, 4))`).
`x` of more than 2 dims is seen as `[R, C]` with `R` the product of the leading dims; outputs are 2-D.
These functions **copy** an `x` that is not contiguous into a contiguous one first (an extra kernel and
R x C elements of memory; the ops `torch.ops.wgrad.*` reject it instead), and take `sizes` as a list of ints
(copied to x's device) or a tensor of any integer dtype (cast to int32 on its device, no host
synchronisation). A size that does not fit in int32 is never wrapped into another one: see `_sizes_tensor`.
The numerics (floor, rounding, UE8M0, NaN/Inf) are defined in `wgrad.reference.
quantize_fp8_1x128_rowwise_reference`; the CUDA kernels match it bit for bit.

Invalid `sizes` on the GPU (a negative size, or a sum != R) cannot raise without a host
synchronisation: the kernel then sets every scale to NaN (so a GEMM that consumes them yields NaN) and
leaves `q_t` unwritten (padded: the padded sizes are then meaningless too). On the CPU the op raises.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import torch

from . import reference
from ._args import as_int, as_ints, check_int32
from .scales import align_up, empty_mn_major_scales, k_block_capacity, num_k_blocks

_LIB = "wgrad"
_ROWWISE = "quantize_fp8_1x128_rowwise"
_COLWISE = "quantize_fp8_1x128_colwise"
_BOTH = "quantize_fp8_1x128_both"
_SEGMENTS = "quantize_fp8_1x128_colwise_segments"
_PADDED = "quantize_fp8_1x128_colwise_segments_padded"
_BOTH_PADDED = "quantize_fp8_1x128_both_segments_padded"
_BLOCKWISE = "quantize_fp8_128x128"
_PADS = (16, 32, 64, 128)

Q_T_ROW_ALIGN = 16  # q_t rows are TMA-ready: row stride a multiple of 16 bytes
_MAX_ROWS = 2**31 - 1
_MAX_COLS = 65535 * 128  # one CTA per 128 columns (gridDim.y)
_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# ------------------------------------------------------------------ layouts -------------------------


def empty_q_t(rows: int, cols: int, device=None) -> torch.Tensor:
    """An uninitialised `[cols, rows]` float8_e4m3fn tensor with row stride `align_up(rows, 16)`."""
    ld = align_up(max(rows, 1), Q_T_ROW_ALIGN)
    return torch.empty((cols, ld), dtype=torch.float8_e4m3fn, device=device)[:, :rows]


def _q_t_holding(q_ref: torch.Tensor) -> torch.Tensor:
    """q_ref [C, R] (contiguous, CPU) in the q_t layout: row stride align_up(R, 16), padding zeros."""
    cols, rows = q_ref.shape
    ld = align_up(max(rows, 1), Q_T_ROW_ALIGN)
    q_t = torch.zeros((cols, ld), dtype=torch.uint8).view(torch.float8_e4m3fn)[:, :rows]
    q_t.view(torch.uint8).copy_(q_ref.view(torch.uint8))
    return q_t


def _mn_major_copy(s: torch.Tensor) -> torch.Tensor:
    out = empty_mn_major_scales(s.shape[0], s.shape[1], device=s.device)
    out.copy_(s)
    return out


# ------------------------------------------------------------------ CPU kernels ---------------------


@torch.library.register_kernel(f"{_LIB}::{_ROWWISE}", "cpu")
def _rowwise_cpu(x, ue8m0=False):
    torch.ops.wgrad._check_quantize_fp8_1x128(x)
    q, s = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0)
    return q, _mn_major_copy(s)


def _colwise_outputs_cpu(x, ue8m0):
    q_ref, s_ref = reference.quantize_fp8_1x128_colwise_reference(x, ue8m0)
    return _q_t_holding(q_ref), _mn_major_copy(s_ref)


@torch.library.register_kernel(f"{_LIB}::{_COLWISE}", "cpu")
def _colwise_cpu(x, ue8m0=False):
    torch.ops.wgrad._check_quantize_fp8_1x128(x)
    return _colwise_outputs_cpu(x, ue8m0)


@torch.library.register_kernel(f"{_LIB}::{_BOTH}", "cpu")
def _both_cpu(x, ue8m0=False):
    torch.ops.wgrad._check_quantize_fp8_1x128(x)
    q, s = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0)
    q_t, s_t = _colwise_outputs_cpu(x, ue8m0)
    return q, _mn_major_copy(s), q_t, s_t


@torch.library.register_kernel(f"{_LIB}::{_SEGMENTS}", "cpu")
def _segments_cpu(x, sizes, ue8m0=False):
    torch.ops.wgrad._check_quantize_fp8_1x128_segments(x, sizes)
    q_ref, s_ref = reference.quantize_fp8_1x128_colwise_segments_reference(x, sizes.tolist(), ue8m0)
    return _q_t_holding(q_ref), _mn_major_copy(s_ref)


def _padded_outputs_cpu(x, sizes, pad, ue8m0):
    q_ref, s_ref, padded = reference.quantize_fp8_1x128_colwise_segments_padded_reference(x, sizes.tolist(), pad,
                                                                                          ue8m0)
    return _q_t_holding(q_ref), _mn_major_copy(s_ref), torch.tensor(padded, dtype=torch.int32)


@torch.library.register_kernel(f"{_LIB}::{_PADDED}", "cpu")
def _padded_cpu(x, sizes, pad=32, ue8m0=False):
    torch.ops.wgrad._check_quantize_fp8_1x128_segments_padded(x, sizes, pad)
    return _padded_outputs_cpu(x, sizes, pad, ue8m0)


@torch.library.register_kernel(f"{_LIB}::{_BOTH_PADDED}", "cpu")
def _both_padded_cpu(x, sizes, pad=32, ue8m0=False):
    torch.ops.wgrad._check_quantize_fp8_1x128_both_segments_padded(x, sizes, pad)
    q, s = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0)
    return (q, _mn_major_copy(s), *_padded_outputs_cpu(x, sizes, pad, ue8m0))


@torch.library.register_kernel(f"{_LIB}::{_BLOCKWISE}", "cpu")
def _blockwise_cpu(w, ue8m0=False):
    torch.ops.wgrad._check_quantize_fp8_128x128(w)
    q, s = reference.quantize_fp8_128x128_reference(w, ue8m0)
    # (clone: for a single row or column the transposes are already contiguous views, and outputs never alias)
    return q, s, q.t().clone(memory_format=torch.contiguous_format), s.t().clone(memory_format=torch.contiguous_format)


# ------------------------------------------------------------------ fake kernels --------------------
# They mirror the checks of csrc/checks.cpp (the source of truth).


def _fail(op: str, msg: str):
    raise RuntimeError(f"{op}: {msg}")


def _check_x(op: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        _fail(op, f"x must be 2-D [R, C] (the Python layer flattens leading dims), got {x.dim()}-D {list(x.shape)}")
    if x.dtype not in _X_DTYPES:
        _fail(op, f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if not x.is_contiguous():
        _fail(op, f"x must be contiguous (row-major [R, C]), got strides {x.stride()} for shape {list(x.shape)}")
    if x.shape[0] > _MAX_ROWS:
        _fail(op, f"x must have at most 2^31 - 1 rows, got {x.shape[0]}")
    if x.shape[1] > _MAX_COLS:
        _fail(op, f"x must have at most {_MAX_COLS} columns (one CTA per 128), got {x.shape[1]}")


def _check_sizes(op: str, x: torch.Tensor, sizes: torch.Tensor) -> None:
    if sizes.dtype != torch.int32:
        _fail(op, f"sizes must be int32, got {sizes.dtype}")
    if sizes.dim() != 1:
        _fail(op, f"sizes must be 1-D [G], got {sizes.dim()}-D {list(sizes.shape)}")
    if sizes.shape[0] < 1:
        _fail(op, "sizes must name at least one segment, got an empty tensor")
    if not sizes.is_contiguous():
        _fail(op, f"sizes must be contiguous, got strides {sizes.stride()}")
    if sizes.device != x.device:
        _fail(op, f"sizes must be on {x.device} like x, got {sizes.device}")


def _rowwise_like(x):
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    return q, empty_mn_major_scales(rows, num_k_blocks(cols), device=x.device)


def _colwise_like(x, kb):
    rows, cols = x.shape
    return empty_q_t(rows, cols, device=x.device), empty_mn_major_scales(cols, kb, device=x.device)


@torch.library.register_fake(f"{_LIB}::{_ROWWISE}")
def _rowwise_fake(x, ue8m0=False):
    _check_x(_ROWWISE, x)
    return _rowwise_like(x)


@torch.library.register_fake(f"{_LIB}::{_COLWISE}")
def _colwise_fake(x, ue8m0=False):
    _check_x(_COLWISE, x)
    return _colwise_like(x, num_k_blocks(x.shape[0]))


@torch.library.register_fake(f"{_LIB}::{_BOTH}")
def _both_fake(x, ue8m0=False):
    _check_x(_BOTH, x)
    return (*_rowwise_like(x), *_colwise_like(x, num_k_blocks(x.shape[0])))


@torch.library.register_fake(f"{_LIB}::{_SEGMENTS}")
def _segments_fake(x, sizes, ue8m0=False):
    _check_x(_SEGMENTS, x)
    _check_sizes(_SEGMENTS, x, sizes)
    return _colwise_like(x, k_block_capacity(x.shape[0], sizes.shape[0]))


def _padded_like(op, x, sizes, pad):
    _check_x(op, x)
    _check_sizes(op, x, sizes)
    if pad not in _PADS:
        _fail(op, f"pad must be 16, 32, 64 or 128, got {pad}")
    k = reference.padded_segment_columns(x.shape[0], sizes.shape[0], pad)
    q_t = empty_q_t(k, x.shape[1], device=x.device)
    scales_t = empty_mn_major_scales(x.shape[1], k_block_capacity(k, sizes.shape[0]), device=x.device)
    return q_t, scales_t, torch.empty_like(sizes)


@torch.library.register_fake(f"{_LIB}::{_PADDED}")
def _padded_fake(x, sizes, pad=32, ue8m0=False):
    return _padded_like(_PADDED, x, sizes, pad)


@torch.library.register_fake(f"{_LIB}::{_BOTH_PADDED}")
def _both_padded_fake(x, sizes, pad=32, ue8m0=False):
    return (*_rowwise_like(x), *_padded_like(_BOTH_PADDED, x, sizes, pad))


@torch.library.register_fake(f"{_LIB}::{_BLOCKWISE}")
def _blockwise_fake(w, ue8m0=False):
    op = _BLOCKWISE
    if w.dim() != 2:
        _fail(op, f"w must be 2-D [N, K], got {w.dim()}-D {list(w.shape)}")
    if w.dtype not in _X_DTYPES:
        _fail(op, f"w must be bfloat16, float16 or float32, got {w.dtype}")
    if not w.is_contiguous():
        _fail(op, f"w must be contiguous (row-major [N, K]), got strides {w.stride()} for shape {list(w.shape)}")
    rows, cols = w.shape
    if num_k_blocks(rows) > 65535:
        _fail(op, f"w must have at most {65535 * 128} rows, got {rows}")
    nb, kb = num_k_blocks(rows), num_k_blocks(cols)
    fp8 = dict(dtype=torch.float8_e4m3fn, device=w.device)
    fp32 = dict(dtype=torch.float32, device=w.device)
    return (torch.empty((rows, cols), **fp8), torch.empty((nb, kb), **fp32),
            torch.empty((cols, rows), **fp8), torch.empty((kb, nb), **fp32))


# ------------------------------------------------------------------ user-facing functions -----------


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2:
        raise ValueError(f"x must have at least 2 dims [..., C], got shape {tuple(x.shape)}")
    if x.dtype not in _X_DTYPES:
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() == 2 and x.is_contiguous():  # the common case, without two more calls into torch per cast
        return x
    # A copy only when x is not contiguous. (Rows counted, not -1: C may be 0.)
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).contiguous()


_WIDE_UNSIGNED = tuple(getattr(torch, name) for name in ("uint32", "uint64") if hasattr(torch, name))


def _sizes_tensor(sizes: Union[torch.Tensor, Sequence[int]], device) -> torch.Tensor:
    """Segment sizes as the ops take them: int32, contiguous; a Python list is copied to `device`.

    Every size must be an integer (a float or a bool raises ValueError). A size outside int32 is never
    wrapped into another size (an int64 2^32 + 100 cast to int32 would be 100):
    - a list, or a CPU tensor outside torch.compile: ValueError naming the size;
    - a CUDA (or meta) tensor, or any tensor while torch.compile traces: the values cannot be read without
      a host synchronisation, which would stall every call and break CUDA graph capture. The size becomes
      -1 on the device instead, an invalid size, which the ops answer like any other invalid sizes (the
      module doc: NaN scales on the GPU). This costs two small kernels beside the cast, for int64 sizes
      only; int32 sizes (the recommended form) pass through untouched.
    """
    if not isinstance(sizes, torch.Tensor):
        values = as_ints(sizes, "sizes")
        for g, s in enumerate(values):
            check_int32(s, f"sizes[{g}]")
        return torch.tensor(values, dtype=torch.int32, device=device)
    if sizes.dtype == torch.int32:
        return sizes.contiguous()
    if sizes.dtype.is_floating_point or sizes.dtype.is_complex or sizes.dtype == torch.bool:
        raise ValueError(f"sizes must hold integers (int32 on x's device), got {sizes.dtype}")
    if sizes.dtype.itemsize < 4:  # int8, uint8, int16, uint16: every value fits
        return sizes.to(torch.int32).contiguous()
    if sizes.dtype in _WIDE_UNSIGNED:  # few ops take them; their values >= 2^63 turn negative (invalid)
        sizes = sizes.to(torch.int64)
    sizes32 = sizes.to(torch.int32)
    wrapped = sizes32 != sizes  # compared in int64: true where the cast changed the value
    if sizes.device.type == "cpu" and not torch.compiler.is_compiling():
        flat = wrapped.reshape(-1)
        if bool(flat.any()):
            g = int(flat.nonzero()[0])
            check_int32(int(sizes.reshape(-1)[g]), f"sizes[{g}]" if sizes.dim() == 1 else "sizes")
        return sizes32.contiguous()
    return sizes32.masked_fill_(wrapped, -1).contiguous()


def quantize_fp8_1x128_rowwise(x: torch.Tensor, ue8m0: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """`x` [..., C] -> `q` [R, C] float8_e4m3fn and `scales` [R, ceil(C/128)] float32 (MN-major), one
    scale per 128 consecutive elements of a row. `ue8m0`: power-of-two scales, rounded up."""
    return torch.ops.wgrad.quantize_fp8_1x128_rowwise(_as_2d(x), ue8m0)


def quantize_fp8_1x128_colwise(x: torch.Tensor, ue8m0: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """`x` [..., C] seen as [R, C] -> `q_t` [C, R] float8_e4m3fn (row stride `align_up(R, 16)`, K-contiguous)
    and `scales_t` [C, ceil(R/128)] float32 (MN-major), one scale per 128 consecutive rows of a column."""
    return torch.ops.wgrad.quantize_fp8_1x128_colwise(_as_2d(x), ue8m0)


def quantize_fp8_1x128_both(x: torch.Tensor, ue8m0: bool = False):
    """Row-wise and column-wise outputs from one read of `x`: `(q, scales, q_t, scales_t)`."""
    return torch.ops.wgrad.quantize_fp8_1x128_both(_as_2d(x), ue8m0)


def quantize_fp8_1x128_colwise_segments(x: torch.Tensor, sizes: Union[torch.Tensor, Sequence[int]],
                                        ue8m0: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Column-wise quantization of `x` [..., C] (seen as [R, C]) over row segments: segment g is the rows
    `[sum(sizes[:g]), sum(sizes[:g+1]))` (one expert's tokens), 128-row blocks restart at every segment.
    Returns `q_t` [C, R] and `scales_t` [C, ceil(R/128) + G - 1]: segment g's j-th block is scale column
    `sum_{h<g} ceil(sizes[h]/128) + j`, unused trailing columns are 0.

    `sizes` should be an int32 tensor on x's device: it is only read by the kernels (no host
    synchronisation; capturable in a CUDA graph). Other integer tensors are converted on their device;
    a Python list is copied to x's device. Invalid sizes on the GPU give NaN scales (see the module doc)."""
    x2 = _as_2d(x)
    return torch.ops.wgrad.quantize_fp8_1x128_colwise_segments(x2, _sizes_tensor(sizes, x2.device), ue8m0)


def quantize_fp8_1x128_colwise_segments_padded(x: torch.Tensor, sizes: Union[torch.Tensor, Sequence[int]],
                                               pad: int = 32, ue8m0: bool = False):
    """`quantize_fp8_1x128_colwise_segments` with every segment's columns of `q_t` padded with zero
    columns to a multiple of `pad` (16, 32, 64 or 128). Returns `(q_t, scales_t, padded_sizes)`:
    `q_t` [C, K] with K = floor((R + G * (pad - 1)) / pad) * pad (segment g starts at column
    `sum(padded_sizes[:g])`; all other columns are 0), `scales_t` [C, ceil(K/128) + G - 1] (segment g's
    blocks where the unpadded cast puts them, 0 after) and `padded_sizes` int32 [G] on x's device
    (`align_up(sizes[g], pad)`, summing to at most K), computed on the device: no host synchronisation.
    Feed `(q_t, scales_t)` of both operands and `padded_sizes` to
    `k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous`: zero columns add nothing, the GEMM does not read
    the columns past the padded sizes' sum, and every expert starts on a 16-byte chunk, which the GEMM loads
    without shifting. pad >= 32 keeps every block on whole
    32-byte sectors of `q_t` (the fast store path; docs/contract.md). `sizes` as in
    `quantize_fp8_1x128_colwise_segments`."""
    x2 = _as_2d(x)
    pad = as_int(pad, "pad", "an integer (16, 32, 64 or 128)")
    return torch.ops.wgrad.quantize_fp8_1x128_colwise_segments_padded(x2, _sizes_tensor(sizes, x2.device), pad,
                                                                      ue8m0)


def quantize_fp8_1x128_both_segments_padded(x: torch.Tensor, sizes: Union[torch.Tensor, Sequence[int]],
                                            pad: int = 32, ue8m0: bool = False):
    """`quantize_fp8_1x128_rowwise(x)` and `quantize_fp8_1x128_colwise_segments_padded(x, sizes, pad)` from one
    read of `x` (one kernel where the rows are 16-byte aligned and pad is 32, 64 or 128): `(q, scales, q_t,
    scales_t, padded_sizes)`, the same bits as the two casts. An MoE layer's activation or output gradient
    takes both: row-wise for the expert GEMM, column-wise per expert for the weight gradient. Invalid sizes on
    the GPU: the column-wise outputs as the padded cast's (NaN scales); the row-wise outputs do not depend on
    the sizes. `sizes` as in `quantize_fp8_1x128_colwise_segments`."""
    x2 = _as_2d(x)
    pad = as_int(pad, "pad", "an integer (16, 32, 64 or 128)")
    return torch.ops.wgrad.quantize_fp8_1x128_both_segments_padded(x2, _sizes_tensor(sizes, x2.device), pad, ue8m0)


def quantize_fp8_128x128(w: torch.Tensor, ue8m0: bool = False):
    """A weight `w` [N, K] (bf16 / fp16 / fp32) in 128 x 128 blocks, both orientations from one read:
    `(q, scales, q_t, scales_t)` with `q` [N, K] and `q_t` [K, N] float8_e4m3fn (contiguous; the same codes,
    transposed), `scales` [ceil(N/128), ceil(K/128)] and `scales_t` (its transpose) float32, contiguous. These
    are the layouts `torch._scaled_mm` takes for a 128x128-scaled operand: `q.t()` with `scales.t()` in
    `x @ W^T`, `q_t.t()` with `scales_t.t()` in `dY @ W`. Numerics as the 1x128 casts (see `wgrad.reference.
    quantize_fp8_128x128_reference`), an all-zero block gives zeros and a finite scale. A non-contiguous `w`
    is copied first."""
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    return torch.ops.wgrad.quantize_fp8_128x128(w.contiguous(), ue8m0)


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's familiar name for the row-wise cast: `x` [m, n] -> (`q` [m, n] float8_e4m3fn,
    `scales` [m, ceil(n/128)] float32). Same bytes and scale values as DeepGEMM's PyTorch helper
    (`q = x * (1 / scale)` with `scale = max(amax, 1e-4) / 448`, see `wgrad.reference`); unlike it, `n`
    need not be a multiple of 128 and the scales come in the TMA-aligned MN-major layout."""
    return quantize_fp8_1x128_rowwise(x, use_ue8m0)


__all__ = [
    "empty_q_t",
    "per_token_cast_to_fp8",
    "quantize_fp8_1x128_both",
    "quantize_fp8_1x128_colwise",
    "quantize_fp8_1x128_colwise_segments",
    "quantize_fp8_1x128_colwise_segments_padded",
    "quantize_fp8_1x128_rowwise",
    "quantize_fp8_128x128",
]
