"""Registrations of the private op `_quantize_fp8_1x128_colwise_segments_with_plan`: the MoE segments casts on
an explicit plan (csrc/quant/plan.h: the kernel, the tile order, packed tiles, the dynamic tail) instead of
the automatic one, so that tests reach every path of the CUDA kernels. Every plan gives the public ops' bits.

Its CPU kernel and its fake kernel are one function: the plan string checked by the C++ parser, then the
public op (pad 0: the segments cast, whose padded_sizes output is a copy of `sizes`; else the padded cast),
whose CPU or fake kernel does the rest.
"""

from __future__ import annotations

import torch

_OP = "wgrad::_quantize_fp8_1x128_colwise_segments_with_plan"


def _with_plan(x, sizes, pad, ue8m0, plan):
    torch.ops.wgrad._check_quantize_fp8_1x128_segments_plan(plan)
    if pad == 0:
        q_t, scales_t = torch.ops.wgrad.quantize_fp8_1x128_colwise_segments(x, sizes, ue8m0)
        return q_t, scales_t, sizes.clone()
    return torch.ops.wgrad.quantize_fp8_1x128_colwise_segments_padded(x, sizes, pad, ue8m0)


torch.library.register_kernel(_OP, "cpu")(_with_plan)
torch.library.register_fake(_OP)(_with_plan)
