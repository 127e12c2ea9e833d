"""wgrad: FP8 weight-gradient GEMMs with 1x128 scaling for NVIDIA Hopper (SM90), the m-grouped expert GEMM, the
casts that feed them and the FP8 layers built on them."""

import torch  # noqa: F401  (loads libtorch, whose stable C shim _C calls)

from . import _C  # noqa: F401  (loads the library: op schemas and CUDA kernels)
from ._version import __version__  # noqa: F401  (written by setup.py at build time)
from . import _ops  # noqa: F401  (CPU and fake kernels of the GEMM ops)
from . import quant  # noqa: F401  (CPU and fake kernels of the quantization ops)
from . import _plans  # noqa: F401  (CPU and fake kernels of the private plan op of the segments casts)
from . import nn  # noqa: F401  (FP8 layers)
from .api import (
    check_group_sizes,
    k_grouped_wgrad_gemm_fp8_fp8_fp32_nt,
    k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous,
    k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous,
    m_grouped_gemm_fp8_fp8_bf16_nt_contiguous,
    wgrad_gemm_fp8_fp8_bf16_nt,
    wgrad_gemm_fp8_fp8_fp32_nt,
)
from .quant import (
    per_token_cast_to_fp8,
    quantize_fp8_1x128_both,
    quantize_fp8_1x128_both_segments_padded,
    quantize_fp8_1x128_colwise,
    quantize_fp8_1x128_colwise_segments,
    quantize_fp8_1x128_colwise_segments_padded,
    quantize_fp8_1x128_rowwise,
    quantize_fp8_128x128,
)
from .scales import (
    align_up,
    empty_mn_major_scales,
    k_block_capacity,
    num_k_blocks,
    to_mn_major_scales,
)

__all__ = [
    "check_group_sizes",
    "wgrad_gemm_fp8_fp8_fp32_nt",
    "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
    "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous",
    "wgrad_gemm_fp8_fp8_bf16_nt",
    "k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
    "per_token_cast_to_fp8",
    "quantize_fp8_1x128_both",
    "quantize_fp8_1x128_both_segments_padded",
    "quantize_fp8_1x128_colwise",
    "quantize_fp8_1x128_colwise_segments",
    "quantize_fp8_1x128_colwise_segments_padded",
    "quantize_fp8_1x128_rowwise",
    "quantize_fp8_128x128",
    "align_up",
    "empty_mn_major_scales",
    "k_block_capacity",
    "num_k_blocks",
    "to_mn_major_scales",
]
