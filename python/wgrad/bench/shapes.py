"""The shapes the GEMM suites run: the seed shapes (the default), the short-K set and the skewed MoE split.

Shapes are DeepSeek-V3 weight gradients: M output features, N input features, K tokens (per group for
the k-grouped shapes)."""

from __future__ import annotations

from typing import List, Tuple

DenseShape = Tuple[int, int, int]  # (M, N, K)
GroupedShape = Tuple[int, int, int, int]  # (G, M, N, K per group)

DENSE_SEED_SHAPES: Tuple[DenseShape, ...] = (
    (7168, 2112, 4096),
    (1536, 24576, 4096),
    (512, 32768, 4096),
    (16384, 7168, 4096),
    (7168, 4096, 4096),
    (2048, 7168, 4096),
    (7168, 2112, 8192),
    (1536, 24576, 8192),
    (512, 32768, 8192),
    (16384, 7168, 8192),
    (7168, 4096, 8192),
    (2048, 7168, 8192),
)

GROUPED_SEED_SHAPES: Tuple[GroupedShape, ...] = (
    (4, 7168, 4096, 4096),
    (4, 2048, 7168, 4096),
    (4, 7168, 4096, 8192),
    (4, 2048, 7168, 8192),
    (8, 7168, 4096, 4096),
    (8, 2048, 7168, 4096),
)

# The short-K / many-groups set (--short-k): dense M = N = 4096 at K = 1024 and 2048, and DeepSeek-V3's
# expert weight gradients (4096 x 7168: gate and up fused; 7168 x 2048: down) with 16 experts of 1024
# tokens or 64 experts of 256. Few K blocks per tile: the prologue, the epilogue's read-modify-write of
# out and the per-group launch cost weigh most here.
SHORT_K_DENSE_SHAPES: Tuple[DenseShape, ...] = (
    (4096, 4096, 1024),
    (4096, 4096, 2048),
)

SHORT_K_GROUPED_SHAPES: Tuple[GroupedShape, ...] = (
    (16, 4096, 7168, 1024),
    (16, 7168, 2048, 1024),
    (64, 4096, 7168, 256),
    (64, 7168, 2048, 256),
)

# The skewed MoE case: 8 experts sharing one (M, N), token counts from a Zipf-like split.
SKEW_GROUPS = 8
SKEW_M, SKEW_N = 7168, 4096
SKEW_TOTAL_TOKENS = 32768
SKEW_EXPONENT = 1.0


def zipf_split(total: int, groups: int, exponent: float = SKEW_EXPONENT, multiple: int = 16) -> List[int]:
    """`total` tokens split over `groups` experts in proportion to 1 / (rank + 1) ** exponent, each a
    multiple of `multiple` (the packed layout needs K_g % 16 == 0); the largest expert absorbs the
    rounding so the sizes sum to `total` exactly. Sizes come out largest first."""
    if total % multiple != 0:
        raise ValueError(f"total {total} must be a multiple of {multiple}")
    weights = [1.0 / (r + 1) ** exponent for r in range(groups)]
    scale = total / sum(weights)
    sizes = [int(round(w * scale / multiple)) * multiple for w in weights]
    sizes[0] += total - sum(sizes)
    if sizes[0] < 0:
        raise ValueError(f"cannot split {total} tokens over {groups} experts in multiples of {multiple}")
    return sizes


def skewed_sizes(multiple: int = 16) -> List[int]:
    """The skewed case's token counts: SKEW_TOTAL_TOKENS over SKEW_GROUPS experts, multiples of `multiple`."""
    return zipf_split(SKEW_TOTAL_TOKENS, SKEW_GROUPS, SKEW_EXPONENT, multiple)
