"""FP8 linear layers as functions: `fp8_linear(x, weight, bias)` and `fp8_grouped_linear(x, weight,
group_sizes, bias)`, each a custom autograd function over `torch.ops.wgrad.*` (and cuBLAS for fprop/dgrad).

Dense (`fp8_linear`), per call with T tokens:
- forward: x is cast ONCE into both layouts (`quantize_fp8_1x128_both`): row-wise for fprop, column-wise
  (K-contiguous along the tokens) saved for wgrad; the weight's 128x128 cast is cached per weight version.
  `y = x W^T` by `torch._scaled_mm` (1x128 x 128x128), in x's dtype (bf16 shapes that cuBLAS would need
  padded: wgrad's m-grouped kernel with one group, `_recipe.fp8_mm`). Saved: the FP8 column-wise copy of x
  and its scales (about half the bytes of bf16 x), not x itself.
- backward: dY cast once into both layouts; `dX = dY W` like fprop; `dW = dY^T x` by wgrad's
  kernel, accumulated in fp32 into `weight.main_grad` when the weight has one (Megatron: then
  `weight.grad_added_to_main_grad = True` and the weight's gradient is None), else returned as the weight's
  gradient like `nn.Linear`'s (a bf16 weight's written in bf16 by the kernel, rounded once from its fp32
  accumulation). Only the GEMMs whose inputs need a gradient run.

Grouped (`fp8_grouped_linear`, MoE experts): x [T, in] holds the tokens grouped by expert, `group_sizes` [G]
their counts on x's device (any counts, 0 included). fprop and dgrad run in FP8 on wgrad's m-grouped kernel
(x and dY row-wise in 1x128 blocks, the experts' weights in 128x128 blocks, cast once per weight version;
bf16 out); wgrad through the padded segments cast and the contiguous-K k-grouped kernel, accumulated in
fp32 into `weight.main_grad` [G, out, in], where an expert with no tokens leaves its gradient untouched (or
returned: a bf16 weight's written in bf16 by the kernel, zeros for an expert with no tokens). x and dY are
each cast once into both layouts (`quantize_fp8_1x128_both_segments_padded`: row-wise and, per expert,
column-wise). No host synchronisation anywhere: sizes on the GPU are validated on the GPU (the kernels, and
`torch._assert_async`: a device-side assertion, as PyTorch's own index checks), and the whole forward and
backward can be captured in a CUDA graph.

On the CPU every step runs the reference math (float64 products of the dequantized operands), so the
autograd logic is testable without a GPU.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from ..quant import (
    quantize_fp8_1x128_both,
    quantize_fp8_1x128_both_segments_padded,
    quantize_fp8_1x128_colwise,
    quantize_fp8_1x128_colwise_segments_padded,
    quantize_fp8_1x128_rowwise,
)
from . import _recipe
from ._recipe import FLOAT_DTYPES
from .tensor_parallel import fp8_linear_dtensor, has_dtensor

# Token padding of the grouped wgrad's casts: every expert starts on a 32-byte sector of the FP8 copy (the
# cast's fast store path) and on a 16-byte chunk (the GEMM's unshifted loads).
GROUPED_PAD = 32


def _remember_weight(ctx, x: torch.Tensor, weight: torch.Tensor, main_grad: Optional[torch.Tensor]) -> None:
    """What backward needs of the weight beyond saved tensors. main_grad is kept as an attribute, not saved:
    other micro-batches' backward passes accumulate into it in between (a saved tensor's version check
    would refuse it), and the weight only to mark it for Megatron."""
    ctx.x_dtype = x.dtype
    ctx.weight = weight if main_grad is not None else None
    ctx.weight_shape = tuple(weight.shape)
    ctx.weight_dtype = weight.dtype
    ctx.main_grad = main_grad


# ------------------------------------------------------------------ dense -------------------------------


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, main_grad):
        w_q, w_s, w_q_t, w_s_t = _recipe.quantized_weight(weight)
        need_wgrad = ctx.needs_input_grad[1]
        if need_wgrad:
            x_q, x_s, x_q_t, x_s_t = quantize_fp8_1x128_both(x)
        else:
            (x_q, x_s), x_q_t, x_s_t = quantize_fp8_1x128_rowwise(x), None, None
        y = _recipe.fp8_mm(x_q, x_s, w_q, w_s, x.dtype)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(x_q_t, x_s_t, w_q_t, w_s_t)
        _remember_weight(ctx, x, weight, main_grad)
        return y

    @staticmethod
    def backward(ctx, dy):
        x_q_t, x_s_t, w_q_t, w_s_t = ctx.saved_tensors
        need_dgrad, need_wgrad, need_bgrad = ctx.needs_input_grad[:3]
        if need_dgrad and need_wgrad:
            dy_q, dy_s, dy_q_t, dy_s_t = quantize_fp8_1x128_both(dy)
        elif need_dgrad:
            dy_q, dy_s = quantize_fp8_1x128_rowwise(dy)
        elif need_wgrad:
            dy_q_t, dy_s_t = quantize_fp8_1x128_colwise(dy)
        dx = _recipe.fp8_mm(dy_q, dy_s, w_q_t, w_s_t, ctx.x_dtype) if need_dgrad else None
        dw = None
        if need_wgrad:
            if ctx.main_grad is not None:
                _recipe.accumulate_wgrad(dy_q_t, dy_s_t, x_q_t, x_s_t, ctx.main_grad)
                _recipe.mark_added_to_main_grad(ctx.weight)
            else:
                dw = _recipe.wgrad(dy_q_t, dy_s_t, x_q_t, x_s_t, ctx.weight_dtype)
        db = dy.sum(0) if need_bgrad else None
        return dx, dw, db, None


def _check_float(op: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: {name} must be bfloat16, float16 or float32, got {t.dtype}")


def _main_grad_of(op: str, weight: torch.Tensor) -> Optional[torch.Tensor]:
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is not None:
        _recipe.check_main_grad(op, weight, main_grad)
    return main_grad


def _autocast_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype torch.autocast casts x to for a linear layer on x's device, or None: outside autocast, and
    for an x autocast leaves as it is (not one of the float dtypes: float64, integers), which the layers'
    checks then take as they would without autocast."""
    device_type = x.device.type
    if x.dtype in FLOAT_DTYPES and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`x @ weight^T + bias` with FP8 GEMMs (DeepSeek-V3 recipe, see the module doc). `x` [..., in] (any
    leading dims, any token count), `weight` [out, in], `bias` [out] or None; in and out multiples of 16.
    The output has x's dtype and shape [..., out]; under `torch.autocast`, as `nn.Linear` there, the autocast
    dtype (x is cast to it; the weight's FP8 cast reads it in its own dtype). DTensor arguments (tensor
    parallelism on a 1-D mesh) run the recipe on their local shards and give a DTensor: see
    `wgrad.nn.tensor_parallel`."""
    if has_dtensor(x, weight, bias):
        return fp8_linear_dtensor(x, weight, bias, fp8_linear)
    amp = _autocast_dtype(x)
    if amp is not None:
        # The layer's own ops (casts, cuBLAS, the CPU reference math) outside autocast's reach.
        with torch.autocast(x.device.type, enabled=False):
            return fp8_linear(x.to(amp), weight, bias)
    op = "fp8_linear"
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D [out_features, in_features], got shape {tuple(weight.shape)}")
    out_features, in_features = weight.shape
    _recipe.check_features(op, "in_features (weight.shape[1])", in_features)
    _recipe.check_features(op, "out_features (weight.shape[0])", out_features)
    if x.dim() < 1 or x.shape[-1] != in_features:
        raise ValueError(f"{op}: x must have in_features = {in_features} in its last dim, got shape {tuple(x.shape)}")
    _check_float(op, "x", x)
    _check_float(op, "weight", weight)
    if bias is not None and tuple(bias.shape) != (out_features,):
        raise ValueError(f"{op}: bias must have shape [{out_features}], got {tuple(bias.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{op}: {name} must be on {x.device} like x, got {t.device}")
    _recipe.check_device(op, x)
    lead = x.shape[:-1]
    # (A 2-D x as it is: reshaping it to its own shape would add a view, and a node to the autograd graph.)
    x2 = x if x.dim() == 2 else x.reshape(math.prod(lead), in_features)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                    (bias is not None and bias.requires_grad)):
        y = _Fp8Linear.apply(x2, weight, bias, _main_grad_of(op, weight))
    else:  # inference: fprop alone, no column-wise copy of x for a backward that will not run
        w_q, w_s, _, _ = _recipe.quantized_weight(weight)
        x_q, x_s = quantize_fp8_1x128_rowwise(x2)
        y = _recipe.fp8_mm(x_q, x_s, w_q, w_s, x.dtype)
        if bias is not None:
            y = y + bias.to(y.dtype)
    # A 2-D x gets y itself, not a view of it (FSDP2 warns about module outputs that are views: an in-place
    # op on one would skip its backward hooks).
    return y if x.dim() == 2 else y.reshape(*lead, out_features)


# ------------------------------------------------------------------ grouped (MoE) -----------------------


class _Fp8GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, sizes, main_grad):
        w_q, w_s, _, _ = _recipe.quantized_grouped_weight(weight)
        if ctx.needs_input_grad[1]:
            # Both layouts from one read of x: row-wise for the expert GEMM, per expert column-wise for wgrad.
            x_q, x_s, x_q_t, x_s_t, padded = quantize_fp8_1x128_both_segments_padded(x, sizes, pad=GROUPED_PAD)
        else:
            (x_q, x_s), x_q_t, x_s_t, padded = quantize_fp8_1x128_rowwise(x), None, None, None
        y = _recipe.m_grouped_mm(x_q, x_s, w_q, w_s, sizes, x.dtype)
        if bias is not None:
            expert = torch.repeat_interleave(torch.arange(weight.shape[0], device=x.device), sizes,
                                             output_size=x.shape[0])
            y = y + bias.to(y.dtype)[expert]
        # The weight is saved for dgrad, whose transposed cast comes from the cache (cast once per version).
        ctx.save_for_backward(x_q_t, x_s_t, padded, weight if ctx.needs_input_grad[0] else None, sizes)
        _remember_weight(ctx, x, weight, main_grad)
        return y

    @staticmethod
    def backward(ctx, dy):
        x_q_t, x_s_t, padded, weight, sizes = ctx.saved_tensors
        need_dgrad, need_wgrad, need_bgrad = ctx.needs_input_grad[:3]
        dy = dy.contiguous()
        dx = None
        if need_dgrad and need_wgrad:
            dy_q, dy_s, dy_q_t, dy_s_t, _ = quantize_fp8_1x128_both_segments_padded(dy, sizes, pad=GROUPED_PAD)
        elif need_dgrad:
            dy_q, dy_s = quantize_fp8_1x128_rowwise(dy)
        elif need_wgrad:
            dy_q_t, dy_s_t, _ = quantize_fp8_1x128_colwise_segments_padded(dy, sizes, pad=GROUPED_PAD)
        if need_dgrad:
            _, _, w_q_t, w_s_t = _recipe.quantized_grouped_weight(weight)
            dx = _recipe.m_grouped_mm(dy_q, dy_s, w_q_t, w_s_t, sizes, ctx.x_dtype)
        dw = None
        if need_wgrad:
            if ctx.main_grad is not None:
                torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(dy_q_t, dy_s_t, x_q_t, x_s_t,
                                                                                 ctx.main_grad, padded)
                _recipe.mark_added_to_main_grad(ctx.weight)
            elif ctx.weight_dtype == torch.bfloat16:
                # Written in bf16 by the kernel (an expert with no tokens gets zeros): no fp32 buffer to fill,
                # add into and cast.
                dw = torch.empty(ctx.weight_shape, dtype=torch.bfloat16, device=dy.device)
                torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(dy_q_t, dy_s_t, x_q_t, x_s_t, dw,
                                                                                 padded)
            else:
                dw = torch.zeros(ctx.weight_shape, dtype=torch.float32, device=dy.device)
                torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(dy_q_t, dy_s_t, x_q_t, x_s_t, dw,
                                                                                 padded)
        db = None
        if need_bgrad:
            groups = ctx.weight_shape[0]
            expert = torch.repeat_interleave(torch.arange(groups, device=dy.device), sizes, output_size=dy.shape[0])
            db = torch.zeros((groups, dy.shape[1]), dtype=torch.float32, device=dy.device)
            db.index_add_(0, expert, dy.float())
        return dx, dw, db, None, None


def _group_sizes(op: str, group_sizes: Union[torch.Tensor, Sequence[int]], groups: int,
                 x: torch.Tensor) -> torch.Tensor:
    """int32 [G] sizes on x's device. Host sizes (a list or a CPU tensor) are checked here; sizes on the GPU
    are checked on the GPU, without a synchronisation (a device-side assertion when they are negative or do
    not sum to T)."""
    tokens = x.shape[0]
    if not isinstance(group_sizes, torch.Tensor):
        values = list(group_sizes)
        for g, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{op}: group_sizes[{g}] must be an int, got {v!r}")
        group_sizes = torch.tensor(values, dtype=torch.int64)
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
        raise ValueError(f"{op}: group_sizes must hold integers, got {group_sizes.dtype}")
    if tuple(group_sizes.shape) != (groups,):
        raise ValueError(f"{op}: group_sizes must have shape [{groups}] (one count per expert), "
                         f"got {tuple(group_sizes.shape)}")
    if group_sizes.device.type == "cpu" and not torch.compiler.is_compiling():
        values = group_sizes.tolist()
        for g, v in enumerate(values):
            if v < 0:
                raise ValueError(f"{op}: group_sizes[{g}] must be >= 0, got {v}")
        if sum(values) != tokens:
            raise ValueError(f"{op}: group_sizes must sum to the tokens of x, T = {tokens}, got {sum(values)}")
        return group_sizes.to(device=x.device, dtype=torch.int32)
    if group_sizes.device != x.device and group_sizes.device.type != "cpu":
        raise ValueError(f"{op}: group_sizes must be on {x.device} like x (or on the CPU), got {group_sizes.device}")
    if group_sizes.dtype == torch.int32 and group_sizes.device == x.device:
        # The kernels' own dtype, checked as it is: torch sums integers in int64, so no count wraps. Two
        # conversion kernels fewer per call than through int64.
        sizes = group_sizes
    else:
        sizes = group_sizes.to(device=x.device, dtype=torch.int64)  # checked before any narrowing to int32
    torch._assert_async((sizes.min() >= 0) & (sizes.sum() == tokens),
                        f"{op}: group_sizes must be >= 0 and sum to the tokens of x, T = {tokens}")
    return sizes.to(torch.int32).contiguous()


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor,
                       group_sizes: Union[torch.Tensor, Sequence[int]],
                       bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Expert g's rows of `x` [T, in] times `weight[g]^T` (+ `bias[g]`): [T, out] in x's dtype. `weight`
    [G, out, in], `bias` [G, out] or None, `group_sizes` [G] integer counts (any, 0 included) that sum to T,
    best as a tensor on x's device (no host synchronisation). in and out multiples of 16; on the GPU x is
    bfloat16 (under `torch.autocast` with bfloat16, any float x: it is cast to it, as `nn.Linear` there)."""
    op = "fp8_grouped_linear"
    if has_dtensor(x, weight, bias):
        raise ValueError(f"{op}: DTensor arguments are not supported: split the experts over ranks with "
                         f"wgrad.nn.expert_dispatch / expert_combine and give the layer plain tensors")
    amp = _autocast_dtype(x)
    if amp is not None:
        with torch.autocast(x.device.type, enabled=False):
            return fp8_grouped_linear(x.to(amp), weight, group_sizes, bias)
    if weight.dim() != 3:
        raise ValueError(f"{op}: weight must be 3-D [num_experts, out_features, in_features], "
                         f"got shape {tuple(weight.shape)}")
    groups, out_features, in_features = weight.shape
    _recipe.check_features(op, "in_features (weight.shape[2])", in_features)
    _recipe.check_features(op, "out_features (weight.shape[1])", out_features)
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"{op}: x must be 2-D [T, in_features = {in_features}], got shape {tuple(x.shape)}")
    _check_float(op, "x", x)
    _check_float(op, "weight", weight)
    if x.is_cuda and x.dtype != torch.bfloat16:
        raise ValueError(f"{op}: x must be bfloat16 on the GPU (the expert GEMM writes bf16; under torch.autocast, "
                         f"x is cast to its dtype, which must then be bfloat16), got {x.dtype}")
    if bias is not None and tuple(bias.shape) != (groups, out_features):
        raise ValueError(f"{op}: bias must have shape [{groups}, {out_features}], got {tuple(bias.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{op}: {name} must be on {x.device} like x, got {t.device}")
    _recipe.check_device(op, x)
    sizes = _group_sizes(op, group_sizes, groups, x)
    return _Fp8GroupedLinear.apply(x.contiguous(), weight, bias, sizes, _main_grad_of(op, weight))
