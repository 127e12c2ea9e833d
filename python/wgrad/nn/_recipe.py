"""The pieces of the FP8 recipe the layers share: the device check, the cached weight casts, the FP8 GEMMs with
bf16 (or fp16 / fp32) output for fprop and dgrad, and the weight-gradient accumulation into fp32.

Recipe (DeepSeek-V3): activations and output gradients in 1x128 blocks along the reduced dimension, weights
in 128x128 blocks. Dense fprop `y = x W^T` and dgrad `dX = dY W` run on cuBLAS through `torch._scaled_mm` (on
wgrad's m-grouped kernel with one group where cuBLAS would need padded copies, see `fp8_mm`), the experts' on
wgrad's m-grouped kernel; wgrad `dW = dY^T x` runs on wgrad's own kernels and accumulates in fp32 (into
`main_grad`, or written in bf16 for a bf16 weight's fresh gradient).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

from .. import reference
from ..quant import quantize_fp8_128x128

FP8 = torch.float8_e4m3fn
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# TMA rows and FP8 GEMM operands are 16-byte aligned: feature counts are multiples of 16.
FEATURE_MULTIPLE = 16
# cuBLAS's blockwise FP8 GEMM (1x128 x 128x128) on SM90 reads the 128x128 scales with a row stride of the
# K-block count rounded up to 4, while torch 2.11 checks for (and passes) the unrounded count: where
# ceil(K/128) % 4 != 0, every weight block-row after the first reads the wrong scales. fp8_mm therefore pads K
# with zeros to a multiple of 4 * 128 = 512 (block count == rounded count: both readings agree) and the rows M
# of the 1x128 operand to a multiple of 128 (the 1x128 scales' leading dimension). Zero rows and columns add
# nothing to the product.
K_PAD = 512
M_PAD = 128

_SM90: Dict[int, Optional[str]] = {}


def check_device(op: str, t: torch.Tensor) -> None:
    """CPU (the reference paths) or an SM90 GPU; any other GPU gets a clear error."""
    if t.device.type == "cpu":
        return
    if t.device.type != "cuda":
        raise RuntimeError(f"{op}: runs on the CPU or on an SM90 GPU, got a tensor on {t.device}")
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if index not in _SM90:
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        _SM90[index] = None if (major, minor) == (9, 0) else (
            f"{op}: needs an SM90 GPU (H100/H200/H800, compute capability 9.0); cuda:{index} is {name} with "
            f"compute capability {major}.{minor}")
    if _SM90[index] is not None:
        raise RuntimeError(_SM90[index])


def check_features(op: str, name: str, value: int) -> None:
    if value <= 0 or value % FEATURE_MULTIPLE != 0:
        raise ValueError(f"{op}: {name} must be a positive multiple of {FEATURE_MULTIPLE} (16-byte FP8 rows), "
                         f"got {value}")


def _uncached() -> bool:
    # While torch.compile traces or a CUDA graph captures, the cast is part of the graph: a cached result
    # would be a constant of the trace, or a tensor of the graph's private pool that replays overwrite.
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_WEIGHT_CACHE: "WeakIdKeyDictionary" = WeakIdKeyDictionary()
# Optimizer steps taken in this process. The version counter alone misses updates: the foreach and fused
# optimizers' CUDA kernels and writes through `.data` (Megatron copies its fp32 main params into the model's
# this way) change a weight without bumping `weight._version`. Every `torch.optim.Optimizer` runs the global
# post-step hooks, so a step invalidates every cached cast.
_OPTIMIZER_STEPS = [0]


def _count_optimizer_step(*_args, **_kwargs) -> None:
    _OPTIMIZER_STEPS[0] += 1


register_optimizer_step_post_hook(_count_optimizer_step)


def clear_weight_cache() -> None:
    """Forgets every cached weight cast: call it after changing weights in a way neither an optimizer step nor
    an in-place op on the weight itself does (the next forward casts again)."""
    _WEIGHT_CACHE.clear()


def _round_up(d: int, multiple: int) -> int:
    return -(-d // multiple) * multiple


def weight_operands(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`quantize_fp8_128x128(weight)` as fp8_mm takes it, uncached: on CUDA, `q` and `q_t` with their columns
    padded with zeros to a multiple of K_PAD and the scales' columns with ones to match (the padding fp8_mm
    gives cuBLAS, done once per cast rather than at every GEMM)."""
    q, s, q_t, s_t = quantize_fp8_128x128(weight.detach())
    if q.is_cuda:
        q, s = _padded_weight(q, s)
        q_t, s_t = _padded_weight(q_t, s_t)
    return q, s, q_t, s_t


def grouped_weight_operands(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 128x128 cast of expert weights [G, out, in], uncached, as the m-grouped GEMM takes it: `q` [G, out,
    in] and `s` [G, ceil(out/128), ceil(in/128)] for fprop, `q_t` [G, in, out] and `s_t` [G, ceil(in/128),
    ceil(out/128)] for dgrad. With out a multiple of 128 the experts are one [G * out, in] matrix (one launch;
    the transposed operands are strided views of its q_t and scales_t); otherwise one cast per expert."""
    w = weight.detach()
    groups, out_f, in_f = w.shape
    if out_f % 128 == 0:
        q, s, q_t, s_t = quantize_fp8_128x128(w.reshape(groups * out_f, in_f))
        ob, ib = out_f // 128, s.shape[1]
        return (q.view(groups, out_f, in_f), s.view(groups, ob, ib),
                q_t.view(in_f, groups, out_f).permute(1, 0, 2), s_t.view(ib, groups, ob).permute(1, 0, 2))
    parts = [quantize_fp8_128x128(w[g]) for g in range(groups)]
    return tuple(torch.stack([p[i] for p in parts]) for i in range(4))


def _cached(weight: torch.Tensor, make):
    """make(weight), cached: the micro-batches of one optimizer step cast the weight once. The cast is
    recomputed after any optimizer step, any in-place op on the weight (`copy_`, `load_state_dict`:
    `weight._version`), a new storage (`weight.data = ...`) and `clear_weight_cache()`, so a stale cast is
    never served."""
    if _uncached():
        return make(weight)
    key = (_OPTIMIZER_STEPS[0], weight._version, weight.data_ptr(), weight.dtype, weight.device, tuple(weight.shape))
    hit = _WEIGHT_CACHE.get(weight)
    if hit is not None and hit[0] == key:
        return hit[1]
    value = make(weight)
    _WEIGHT_CACHE[weight] = (key, value)
    return value


def quantized_weight(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weight_operands(weight)` of a dense layer's weight, cached (see `_cached`)."""
    return _cached(weight, weight_operands)


def quantized_grouped_weight(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`grouped_weight_operands(weight)` of expert weights, cached (see `_cached`)."""
    return _cached(weight, grouped_weight_operands)


def m_grouped_mm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, sizes: torch.Tensor,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """Rows of group g of `a` [T, K] (1x128 scales `sa`) times `b[g]`^T ([G, N, K], 128x128 scales `sb`):
    [T, N], through wgrad's m-grouped kernel (bf16; on the CPU its reference, the float64 product rounded to
    bf16), in `out_dtype`. No host synchronisation: the sizes stay on the device."""
    out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)
    torch.ops.wgrad.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, sizes)
    return out if out_dtype == torch.bfloat16 else out.to(out_dtype)


def _padded(t: torch.Tensor, rows: int, cols: int, fill: float = 0.0) -> torch.Tensor:
    """t [r, c] inside a [rows, cols] tensor of `fill`, row-major (the same tensor when nothing is added)."""
    if tuple(t.shape) == (rows, cols):
        return t
    out = (torch.zeros((rows, cols), dtype=t.dtype, device=t.device) if fill == 0.0 else
           torch.full((rows, cols), fill, dtype=t.dtype, device=t.device))
    out[:t.shape[0], :t.shape[1]].copy_(t)
    return out


def _padded_weight(q: torch.Tensor, s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The 128x128 operand [N, K] and its scales [ceil(N/128), ceil(K/128)] with K padded to K_PAD: zero
    codes, unit scales."""
    cols = _round_up(q.shape[1], K_PAD)
    return _padded(q, q.shape[0], cols), _padded(s, s.shape[0], cols // 128, 1.0).contiguous()


def _scales_padded(s: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """1x128 scales [M, kb] as [rows, blocks] with strides exactly (1, rows), as cuBLAS takes them (the casts
    write (1, align_up(M, 4)): the same memory when M == rows, M % 4 == 0 and kb == blocks). Added entries
    hold 1."""
    m, kb = s.shape
    if rows == m and blocks == kb and s.stride(0) == 1 and (s.stride(1) == m or kb == 1):
        return s
    out = torch.ones((blocks, rows), dtype=torch.float32, device=s.device).t()
    out[:m, :kb].copy_(s)
    return out


def dense_mm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """`(a * sa) @ (b * sb)^T` in bf16 on wgrad's m-grouped kernel with one group of all M rows: any M and K,
    no copies (`b` and `sb` may come with K padded for cuBLAS: their first K columns are the operand)."""
    m, k = a.shape
    sizes = torch.full((1,), m, dtype=torch.int32, device=a.device)
    return m_grouped_mm(a, sa, b[:, :k].unsqueeze(0), sb[:, :-(-k // 128)].unsqueeze(0), sizes, torch.bfloat16)


def fp8_mm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
           out_dtype: torch.dtype) -> torch.Tensor:
    """`(a * sa) @ (b * sb)^T` with `a` [M, K] e4m3 in 1x128 blocks along K (scales `sa` [M, ceil(K/128)]) and
    `b` [N, K] e4m3 contiguous in 128x128 blocks (`sb` [ceil(N/128), ceil(K/128)] contiguous; on CUDA `b` and
    `sb` may come with K already padded, as `weight_operands` gives them), [M, N] in `out_dtype`. On CUDA:
    cuBLAS through `torch._scaled_mm`, except where it would need a padded copy of `a` (M not a multiple of
    M_PAD or K not of K_PAD) and the output is bf16: there wgrad's m-grouped kernel with one group
    (`dense_mm`), which takes any M and K as they are (side by side on an H100 it matches cuBLAS within 1-4 %
    on unpadded shapes, and runs 7168 -> 2112's dgrad, K = 2112, 1.33x faster than cuBLAS on the padded
    copy). Other output dtypes always take cuBLAS, with M and K padded (see K_PAD). On the CPU: the
    float64 product of the dequantized operands, rounded once to `out_dtype` (the reference of the recipe)."""
    m, k = a.shape
    if m == 0:
        return torch.empty((0, b.shape[0]), dtype=out_dtype, device=a.device)
    if a.is_cuda:
        rows, cols = _round_up(m, M_PAD), _round_up(k, K_PAD)
        if out_dtype == torch.bfloat16 and (rows != m or cols != k):
            return dense_mm(a, sa, b, sb)
        if b.shape[1] != cols:
            b, sb = _padded_weight(b, sb)
        y = torch._scaled_mm(_padded(a, rows, cols), b.t(), scale_a=_scales_padded(sa, rows, cols // 128),
                             scale_b=sb.t(), out_dtype=out_dtype)
        return y if rows == m else y[:m]
    product = reference.dequantize_1x128(a, sa) @ reference.dequantize_128x128(b, sb).t()
    return product.to(out_dtype)


def check_main_grad(op: str, weight: torch.Tensor, main_grad: torch.Tensor) -> None:
    """Megatron's fp32 gradient-accumulation buffer: `weight.main_grad`, fp32, the weight's shape and device."""
    if main_grad.dtype != torch.float32:
        raise ValueError(f"{op}: weight.main_grad must be float32, got {main_grad.dtype}")
    if tuple(main_grad.shape) != tuple(weight.shape):
        raise ValueError(f"{op}: weight.main_grad must have the weight's shape {list(weight.shape)}, "
                         f"got {list(main_grad.shape)}")
    if main_grad.device != weight.device:
        raise ValueError(f"{op}: weight.main_grad must be on {weight.device} like the weight, got {main_grad.device}")


def _dy_t_x(dy_t: torch.Tensor, s_dy: torch.Tensor, x_t: torch.Tensor, s_x: torch.Tensor, out: torch.Tensor,
            dense_op, contiguous_op) -> None:
    """`dy^T x` into `out` [N_out, N_in] by one of the weight-gradient op pairs (K = T tokens): T a multiple of 16
    the dense op; any other T the contiguous-K op with one group of T tokens."""
    tokens = dy_t.shape[1]
    if tokens % 16 == 0:
        dense_op(dy_t, s_dy, x_t, s_x, out)
    else:
        sizes = torch.full((1,), tokens, dtype=torch.int32, device=dy_t.device)
        contiguous_op(dy_t, s_dy, x_t, s_x, out.unsqueeze(0), sizes)


def accumulate_wgrad(dy_t: torch.Tensor, s_dy: torch.Tensor, x_t: torch.Tensor, s_x: torch.Tensor,
                     out: torch.Tensor) -> None:
    """`out += dy^T x` in fp32 from the column-wise casts of dy [T, N_out] and x [T, N_in]."""
    if dy_t.shape[1] > 0:
        _dy_t_x(dy_t, s_dy, x_t, s_x, out, torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt,
                torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous)


def wgrad(dy_t: torch.Tensor, s_dy: torch.Tensor, x_t: torch.Tensor, s_x: torch.Tensor,
          dtype: torch.dtype) -> torch.Tensor:
    """A fresh `dy^T x` [N_out, N_in] in `dtype` (the weight's: autograd's gradient) from the column-wise casts.
    bf16: written in bf16 by the kernel, rounded once from its fp32 accumulation (the bits of the fp32 result
    cast, without an fp32 buffer to fill, add into and cast; T == 0 writes zeros); any other dtype: accumulated
    into fp32 zeros (`accumulate_wgrad`), returned as they are (autograd casts them to the weight's dtype)."""
    shape = (dy_t.shape[0], x_t.shape[0])
    if dtype != torch.bfloat16:
        dw = torch.zeros(shape, dtype=torch.float32, device=dy_t.device)
        accumulate_wgrad(dy_t, s_dy, x_t, s_x, dw)
        return dw
    dw = torch.empty(shape, dtype=torch.bfloat16, device=dy_t.device)
    _dy_t_x(dy_t, s_dy, x_t, s_x, dw, torch.ops.wgrad.wgrad_gemm_fp8_fp8_bf16_nt,
            torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous)
    return dw


def mark_added_to_main_grad(weight: torch.Tensor) -> None:
    """Megatron's protocol: the gradient went into `main_grad`, `.grad` stays None. (Under torch.compile the
    flag is not set: a traced backward cannot set attributes of a parameter.)"""
    if not torch.compiler.is_compiling():
        weight.grad_added_to_main_grad = True
