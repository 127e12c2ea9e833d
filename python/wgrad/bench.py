"""`python -m wgrad bench`: our FP8 weight-gradient GEMMs against the baselines a user would reach for.

Every implementation sits behind one small interface (`Impl`): a name, `setup(problem)` that returns the
ways it can be called (`Candidate`s: a closure doing `out += a @ b^T` and the buffer it accumulates
into), the FLOPs and the bytes of one call. Each candidate is checked against the float64 reference
(`wgrad.reference`, computed on the same device at the full shape) before anything is timed; the first
correct one is timed (for the bf16 baseline: the fastest correct one). Timing: CUDA events around
single calls, median of `--reps` after warm-up, L2 flushed before every call by zeroing a 256 MiB
buffer outside the timed region.

Baselines:
- `cublas`: `torch._scaled_mm` with 1x128 scales on both operands and fp32 output, then `out.add_(...)`
  (what a user must do to accumulate into fp32 `main_grad`). torch checks the scale layouts
  (aten/src/ATen/native/cuda/ScaledBlas.cpp, `is_blockwise_1x128_scaling`, torch >= 2.9): for
  `_scaled_mm(a [M, K], b.t() [K, N], ...)` scale_a is `[M, K/128]` with strides `(1, M)` and scale_b
  is `[K/128, N]` contiguous (its transpose is the 1x128 scale of `b [N, K]`, "outer-dim-major").
  `torch.nn.functional.scaled_mm` (`_scaled_mm_v2`, torch >= 2.10) takes scale_b as `[N, K/128]`
  with strides `(1, N)` and explicit `ScalingType.BlockWise1x128` recipes; it is tried second.
- `bf16`: the dequantized operands in bf16, product accumulated into fp32 by cuBLAS.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from . import api, reference
from .scales import empty_mn_major_scales, k_block_capacity, num_k_blocks

DenseShape = Tuple[int, int, int]  # (M, N, K)
GroupedShape = Tuple[int, int, int, int]  # (G, M, N, K per group)

# ------------------------------------------------------------------ shapes and anchors --------------

# DESIGN.md section 7: DeepSeek-V3 weight-gradient shapes (M out features, N in features, K tokens).
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

# TFLOPS measured on one H200 with torch 2.11, median time, L2 flushed. Source: DESIGN.md section 7
# ("Measured anchors"): DeepGEMM's wgrad kernel (seed PR), CUTLASS 4.2 groupwise (1,1,128) beta=1 at its
# best config, cuBLAS 1x128 with fp32 out + `add_`, bf16 `addmm` into fp32.
DENSE_ANCHORS_TFLOPS: Dict[DenseShape, Dict[str, float]] = {
    (7168, 2112, 4096): {"deepgemm": 918, "cutlass": 738, "cublas": 656, "bf16": 683},
    (1536, 24576, 4096): {"deepgemm": 991, "cutlass": 846, "cublas": 688, "bf16": 688},
    (512, 32768, 4096): {"deepgemm": 873, "cutlass": 785, "cublas": 695, "bf16": 697},
    (16384, 7168, 4096): {"deepgemm": 1013, "cutlass": 859, "cublas": 696, "bf16": 662},
    (7168, 4096, 4096): {"deepgemm": 957, "cutlass": 823, "cublas": 702, "bf16": 663},
    (2048, 7168, 4096): {"deepgemm": 903, "cutlass": 803, "cublas": 690, "bf16": 732},
    (7168, 2112, 8192): {"deepgemm": 1022, "cutlass": 835, "cublas": 777, "bf16": 702},
    (1536, 24576, 8192): {"deepgemm": 1072, "cutlass": 918, "cublas": 789, "bf16": 701},
    (512, 32768, 8192): {"deepgemm": 987, "cutlass": 869, "cublas": 772, "bf16": 719},
    (16384, 7168, 8192): {"deepgemm": 1063, "cutlass": 853, "cublas": 780, "bf16": 655},
    (7168, 4096, 8192): {"deepgemm": 1044, "cutlass": 892, "cublas": 804, "bf16": 674},
    (2048, 7168, 8192): {"deepgemm": 1016, "cutlass": 887, "cublas": 825, "bf16": 709},
}

# Same source: DeepGEMM's k-grouped wgrad (TFLOPS over all groups) on the grouped seed shapes.
GROUPED_ANCHORS_TFLOPS: Dict[GroupedShape, Dict[str, float]] = {
    (4, 7168, 4096, 4096): {"deepgemm": 975},
    (4, 2048, 7168, 4096): {"deepgemm": 949},
    (4, 7168, 4096, 8192): {"deepgemm": 969},
    (4, 2048, 7168, 8192): {"deepgemm": 1033},
    (8, 7168, 4096, 4096): {"deepgemm": 980},
    (8, 2048, 7168, 4096): {"deepgemm": 951},
}

ANCHOR_NAMES = {"deepgemm": "DeepGEMM", "cutlass": "CUTLASS", "cublas": "cuBLAS", "bf16": "bf16"}

# The skewed MoE case of issue 4: 8 experts sharing one (M, N), token counts from a Zipf-like split.
SKEW_GROUPS = 8
SKEW_M, SKEW_N = 7168, 4096
SKEW_TOTAL_TOKENS = 32768
SKEW_EXPONENT = 1.0

# Accuracy bars, as relative Frobenius error of the accumulated product vs the float64 reference.
# FP8 impls: the issue-3 bar (both FP8 anchors of DESIGN section 7 reach ~1.3e-4 on this data).
FP8_REL_ERR_MAX = 2e-4
# bf16 rounds the dequantized operands to 8 mantissa bits (~2e-3 expected): a sanity bound only.
BF16_REL_ERR_MAX = 1e-2

DEFAULT_REPS = 30
DEFAULT_WARMUP = 5
WARMUP_SECONDS = 0.1  # GPU only: minimum busy time before timing (time_calls)
# Five times the 50 MB L2 of an H100/H200; zeroed before every timed call.
L2_FLUSH_BYTES = 256 * 1024 * 1024
# Initial out = this fraction of the reference's RMS times N(0, 1): an impl that overwrites out instead
# of accumulating shows an error of this size, while fp32 rounding of the add stays far below 2e-4.
OUT_INIT_FRACTION = 0.1

BYTES_NOTE = ("GB/s counts a + b + their scales read once and out read and written once "
              "(fp32, 8 bytes per element); bf16 counts its bf16 operands instead of fp8 + scales")

# ------------------------------------------------------------------ small pure helpers --------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def geomean(values: Iterable[float]) -> Optional[float]:
    vals = [float(v) for v in values]
    if not vals or any(not (v > 0) or math.isinf(v) for v in vals):
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


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


def first_line(exc: BaseException, limit: int = 160) -> str:
    """A short one-line reason for an exception (torch's dispatcher errors run to pages)."""
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}".strip()
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


# Messages of the CUDA errors that poison the context: every later call fails the same way. (A plain
# "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED" from torch's cuBLAS wrapper is not one of them.)
_STICKY_CUDA_ERRORS = ("illegal memory access", "illegal instruction", "misaligned address",
                       "unspecified launch failure", "device-side assert", "launch timed out",
                       "hardware stack error", "uncorrectable ECC")


def is_cuda_fault(exc: BaseException) -> bool:
    """A sticky CUDA error (illegal address, launch failure): the context is lost for every later call."""
    msg = str(exc)
    return any(s in msg for s in _STICKY_CUDA_ERRORS)


def format_shape(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def _parse_ints(text: str, count: int, what: str) -> Tuple[int, ...]:
    parts = [p for p in text.replace("x", ",").replace("X", ",").split(",")]
    if len(parts) != count:
        raise argparse.ArgumentTypeError(f"{what} needs {count} integers separated by ',' or 'x', got {text!r}")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} needs integers, got {text!r}") from None


def parse_dense_shape(text: str) -> DenseShape:
    """'M,N,K' (or 'MxNxK'): M, N >= 1; K >= 16 and a multiple of 16 (the op's contract)."""
    m, n, k = _parse_ints(text, 3, "--shape M,N,K")
    if m < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"M and N must be >= 1, got {text!r}")
    if k < 16 or k % 16 != 0:
        raise argparse.ArgumentTypeError(f"K must be a positive multiple of 16, got {k}")
    return (m, n, k)


def parse_grouped_shape(text: str) -> GroupedShape:
    """'G,M,N,K' with K the token count of every group (a multiple of 16 for the packed layout)."""
    g, m, n, k = _parse_ints(text, 4, "--grouped-shape G,M,N,K")
    if g < 1 or m < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"G, M and N must be >= 1, got {text!r}")
    if k < 16 or k % 16 != 0:
        raise argparse.ArgumentTypeError(f"K must be a positive multiple of 16, got {k}")
    return (g, m, n, k)


def parse_impls(text: str) -> List[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in IMPL_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown implementation(s) {unknown or text!r}; choose from {', '.join(IMPL_NAMES)}")
    return list(dict.fromkeys(names))


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


# ------------------------------------------------------------------ device ---------------------------


def sm90_problem() -> Optional[str]:
    """None when the current device is an SM90 GPU, else a one-line explanation."""
    try:
        if not torch.cuda.is_available():
            return "wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            name = torch.cuda.get_device_name()
            return f"wgrad bench: needs an SM90 GPU (H100/H200/H800); found: {name} (sm_{major}{minor})"
    except Exception as exc:  # a broken driver is also "no usable GPU"
        return f"wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none ({first_line(exc, 100)})"
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], None], reps: int, warmup: int, flush: Optional[torch.Tensor],
               device: torch.device) -> List[float]:
    """Milliseconds of `reps` single calls of `fn`, each preceded (outside the timed region) by zeroing
    `flush`. CUDA events on a GPU; wall clock on a CPU (used only by the CPU tests)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        # An idle GPU drops its clocks within milliseconds, and the accuracy check before the timing
        # leaves it idle: keep calling until it has been busy for a while (measured: without this the
        # first implementation timed on a shape lost up to 20 %).
        _sync(device)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < WARMUP_SECONDS:
            for _ in range(4):
                fn()
            _sync(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            if flush is not None:
                flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


# ------------------------------------------------------------------ problems -------------------------


def random_scales(mn: int, kb: int, device, generator: torch.Generator) -> torch.Tensor:
    """1x128 scales 2**U(-8, 2) (a range of 2**10) in the MN-major layout of DESIGN section 2."""
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


# ------------------------------------------------------------------ accuracy -------------------------


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


# ------------------------------------------------------------------ implementations ------------------


@dataclass
class Candidate:
    """One way of calling an implementation. `build()` makes the operands it needs (untimed) and returns
    `(run, out)`: `run()` does `out += product` once."""
    form: str
    build: Callable[[], Tuple[Callable[[], None], torch.Tensor]]


@dataclass(frozen=True)
class Impl:
    """An implementation of one benchmark row. `setup(problem)` -> candidates tried in order."""
    name: str
    family: str  # the --impl name that selects it
    summary: str
    setup: Callable[[object], List[Candidate]]
    flops: Callable[[object], int]
    bytes_moved: Callable[[object], int]
    max_rel_err: float = FP8_REL_ERR_MAX
    required: bool = False  # an exception is a FAIL (ours), not "n/a" (a baseline torch lacks)
    pick_fastest: bool = False  # time every correct candidate briefly and keep the fastest
    anchor: Optional[str] = None  # key into the anchors dict of DESIGN section 7


def cublas_scales_1x128(sa: torch.Tensor, sb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Our [mn, kb] scales (any layout) as `torch._scaled_mm(a, b.t(), scale_a, scale_b)` takes them for
    1x128 x 1x128: scale_a [M, kb] with strides (1, M) (exactly M, not our 4-aligned ld) and scale_b
    [kb, N] contiguous. `scale_b.t()` ([N, kb], strides (1, N)) is the form of
    `torch.nn.functional.scaled_mm`."""
    m, kb = sa.shape
    if kb == 1:
        # One block is also torch's row-wise recipe, whose check wants scale_a contiguous; both agree then.
        scale_a = torch.empty((m, 1), dtype=torch.float32, device=sa.device)
    else:
        scale_a = torch.empty((kb, m), dtype=torch.float32, device=sa.device).t()
    scale_a.copy_(sa)
    scale_b = sb.t().contiguous()
    return scale_a, scale_b


def _blockwise_1x128_recipe():
    scaling = getattr(torch.nn.functional, "ScalingType", None)
    for name in ("BlockWise1x128", "Blockwise_1x128", "Blockwise1x128"):
        if scaling is not None and hasattr(scaling, name):
            return getattr(scaling, name)
    raise RuntimeError("torch.nn.functional has no ScalingType with a 1x128 block-wise recipe")


def cublas_product_fns(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor
                       ) -> List[Tuple[str, Callable[[], Callable[[], torch.Tensor]]]]:
    """The known ways torch exposes cuBLAS's 1x128 x 1x128 FP8 GEMM with fp32 output, in the order tried.
    Each entry is (form, make) where make() prepares the scales and returns a closure -> fp32 [M, N]."""

    def v1():
        scale_a, scale_b = cublas_scales_1x128(sa, sb)
        bt = b.t()
        return lambda: torch._scaled_mm(a, bt, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32)

    def v2():
        scaled_mm = getattr(torch.nn.functional, "scaled_mm", None)
        if scaled_mm is None:
            raise RuntimeError("torch.nn.functional.scaled_mm does not exist in this torch")
        recipe = _blockwise_1x128_recipe()
        scale_a, scale_b = cublas_scales_1x128(sa, sb)
        scale_b_nk = scale_b.t()
        bt = b.t()
        return lambda: scaled_mm(a, bt, scale_a=scale_a, scale_recipe_a=recipe, scale_b=scale_b_nk,
                                 scale_recipe_b=recipe, output_dtype=torch.float32)

    return [("torch._scaled_mm(1x128, 1x128, out_dtype=fp32) + out.add_", v1),
            ("F.scaled_mm(BlockWise1x128 x2, output_dtype=fp32) + out.add_", v2)]


def _accumulating(product: Callable[[], torch.Tensor], out: torch.Tensor) -> Callable[[], None]:
    def run():
        out.add_(product())
    return run


def _dense_ours(p: DenseProblem) -> List[Candidate]:
    def build():
        out = p.out_init.clone()
        lhs, rhs = (p.a, p.sa), (p.b, p.sb)
        return (lambda: api.wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out)), out
    return [Candidate("wgrad.wgrad_gemm_fp8_fp8_fp32_nt", build)]


def _dense_cublas(p: DenseProblem) -> List[Candidate]:
    def wrap(make):
        def build():
            out = p.out_init.clone()
            return _accumulating(make(), out), out
        return build
    return [Candidate(form, wrap(make)) for form, make in cublas_product_fns(p.a, p.sa, p.b, p.sb)]


def _dense_bf16(p: DenseProblem) -> List[Candidate]:
    cache: Dict[str, torch.Tensor] = {}

    def operands():
        if not cache:
            cache["a"] = reference.dequantize_1x128(p.a, p.sa).to(torch.bfloat16)
            cache["bt"] = reference.dequantize_1x128(p.b, p.sb).to(torch.bfloat16).t()
        return cache["a"], cache["bt"]

    def addmm_into():
        a16, bt16 = operands()
        out = p.out_init.clone()
        # cuBLAS with beta = 1 reads and writes out itself: one kernel, nothing allocated.
        return (lambda: torch.addmm(out, a16, bt16, out_dtype=torch.float32, out=out)), out

    def mm_fp32_add():
        a16, bt16 = operands()
        out = p.out_init.clone()
        return _accumulating(lambda: torch.mm(a16, bt16, out_dtype=torch.float32), out), out

    def mm_bf16_add():
        a16, bt16 = operands()
        out = p.out_init.clone()
        return _accumulating(lambda: torch.mm(a16, bt16), out), out

    return [Candidate("torch.addmm(out, a16, b16.t(), out_dtype=fp32, out=out)", addmm_into),
            Candidate("out.add_(torch.mm(a16, b16.t(), out_dtype=fp32))", mm_fp32_add),
            Candidate("out.add_(torch.mm(a16, b16.t()))  [bf16 product]", mm_bf16_add)]


def _dense_flops(p: DenseProblem) -> int:
    return dense_flops(p.m, p.n, p.k)


DENSE_IMPLS: Tuple[Impl, ...] = (
    Impl("ours", "ours", "wgrad.wgrad_gemm_fp8_fp8_fp32_nt: out += (a*sa) @ (b*sb)^T in one call",
         _dense_ours, _dense_flops, lambda p: fp8_bytes(p.m, p.n, p.k), required=True, anchor="deepgemm"),
    Impl("cublas", "cublas", "cuBLAS 1x128 x 1x128 via torch._scaled_mm, fp32 out, then out.add_",
         _dense_cublas, _dense_flops, lambda p: fp8_bytes(p.m, p.n, p.k), anchor="cublas"),
    Impl("bf16", "bf16", "cuBLAS bf16 GEMM of the dequantized operands accumulated into fp32 out",
         _dense_bf16, _dense_flops, lambda p: bf16_bytes(p.m, p.n, p.k), max_rel_err=BF16_REL_ERR_MAX,
         pick_fastest=True, anchor="bf16"),
)

IMPL_NAMES: Tuple[str, ...] = tuple(impl.name for impl in DENSE_IMPLS)


def _grouped_packed(p: GroupedProblem) -> List[Candidate]:
    def build():
        out = p.out_init.clone()
        lhs, rhs, ks = (p.a_packed, p.sa_packed), (p.b_packed, p.sb_packed), list(p.ks)
        return (lambda: api.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, ks)), out
    return [Candidate("wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt (host sizes)", build)]


def _grouped_contig(p: GroupedProblem) -> List[Candidate]:
    def build():
        out = p.out_init.clone()
        lhs, rhs = (p.a_contig, p.sa_contig), (p.b_contig, p.sb_contig)
        return (lambda: api.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(lhs, rhs, out, p.sizes)), out
    return [Candidate("wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous (int32 device sizes)", build)]


def _grouped_dense_loop(p: GroupedProblem) -> List[Candidate]:
    def build():
        out = p.out_init.clone()
        calls = [((a, sa), (b, sb), out[g]) for g, (a, sa, b, sb) in
                 enumerate(p.group_operands(g) for g in range(p.groups)) if p.ks[g] > 0]

        def run():
            for lhs, rhs, o in calls:
                api.wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, o)
        return run, out
    return [Candidate("for g: wgrad.wgrad_gemm_fp8_fp8_fp32_nt(group g)", build)]


def _grouped_cublas_loop(p: GroupedProblem) -> List[Candidate]:
    per_group = [(g, cublas_product_fns(*p.group_operands(g))) for g in range(p.groups) if p.ks[g] > 0]
    forms = [form for form, _ in per_group[0][1]] if per_group else []

    def make_build(i):
        def build():
            out = p.out_init.clone()
            calls = [(out[g], fns[i][1]()) for g, fns in per_group]

            def run():
                for o, product in calls:
                    o.add_(product())
            return run, out
        return build
    return [Candidate(f"for g: {form}", make_build(i)) for i, form in enumerate(forms)]


def _grouped_flops(p: GroupedProblem) -> int:
    return sum(dense_flops(p.m, p.n, k) for k in p.ks)


def _grouped_bytes(p: GroupedProblem) -> int:
    return grouped_bytes(p.m, p.n, p.ks)


GROUPED_IMPLS: Tuple[Impl, ...] = (
    Impl("ours-packed", "ours", "one launch, packed layout, sizes as a host list", _grouped_packed,
         _grouped_flops, _grouped_bytes, required=True, anchor="deepgemm"),
    Impl("ours-contig", "ours", "one launch, contiguous-K layout, sizes as an int32 CUDA tensor",
         _grouped_contig, _grouped_flops, _grouped_bytes, required=True, anchor="deepgemm"),
    Impl("ours-dense-loop", "ours", "a Python loop of our dense kernel, one launch per group",
         _grouped_dense_loop, _grouped_flops, _grouped_bytes, required=True),
    Impl("cublas-loop", "cublas", "a Python loop of torch._scaled_mm 1x128 + out[g].add_ per group",
         _grouped_cublas_loop, _grouped_flops, _grouped_bytes),
)

# The dense reference row of a grouped shape: our dense kernel on one group's (M, N, K).
GROUP_DENSE_IMPL = "ours-dense"


# ------------------------------------------------------------------ the runner -----------------------


@dataclass
class Selection:
    status: str  # "ok" | "FAIL" | "n/a"
    message: str = ""
    rel_err: Optional[float] = None
    form: str = ""
    run: Optional[Callable[[], None]] = None
    tried: List[str] = field(default_factory=list)


def select_candidate(candidates: Sequence[Candidate], check: Callable[[torch.Tensor, torch.Tensor], float],
                     max_rel_err: float, required: bool, device: torch.device,
                     time_fn: Optional[Callable[[Callable[[], None]], float]] = None) -> Selection:
    """Runs every candidate once (in order, stopping at the first correct one unless `time_fn` is given,
    then all are tried and the fastest correct one wins). `check(out_after, out_before)` returns the
    relative error. No correct candidate: FAIL if one ran and was wrong, or if `required`; else n/a."""
    tried: List[str] = []
    passing: List[Tuple[str, Callable[[], None], float]] = []
    wrong: List[Tuple[str, float]] = []
    errors: List[str] = []
    for cand in candidates:
        try:
            run, out = cand.build()
            before = out.clone()
            run()
            _sync(device)
            err = check(out, before)
        except Exception as exc:
            if is_cuda_fault(exc):
                raise
            errors.append(first_line(exc))
            tried.append(f"{cand.form}: error: {first_line(exc)}")
            continue
        if err <= max_rel_err:  # False for NaN
            tried.append(f"{cand.form}: ok, rel. err {err:.2e}")
            passing.append((cand.form, run, err))
            if time_fn is None:
                break
        else:
            tried.append(f"{cand.form}: wrong, rel. err {err:.2e} > {max_rel_err:.0e}")
            wrong.append((cand.form, err))
    if passing:
        if time_fn is not None and len(passing) > 1:
            speeds = [(time_fn(run), i) for i, (_, run, _) in enumerate(passing)]
            best = passing[min(speeds)[1]]
            tried += [f"{passing[i][0]}: {ms:.3f} ms (quick median)" for ms, i in speeds]
            tried.append(f"fastest: {best[0]}")
        else:
            best = passing[0]
        return Selection("ok", "", best[2], best[0], best[1], tried)
    if wrong:
        form, err = min(wrong, key=lambda fe: fe[1] if fe[1] == fe[1] else math.inf)
        return Selection("FAIL", f"rel. err {err:.2e} > {max_rel_err:.0e} ({form})", err, form, None, tried)
    reason = errors[0] if errors else "no way to call it"  # every form's reason is in `tried`
    return Selection("FAIL" if required else "n/a", reason, None, "", None, tried)


ProgressFn = Callable[[str], None]


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _silent(msg: str) -> None:
    pass


def _new_row(kind: str, label: str, dims: Sequence[int], impl: Impl, reps: int) -> dict:
    return {"kind": kind, "shape": label, "dims": list(dims), "impl": impl.name, "form": "", "status": "",
            "message": "", "rel_err": None, "max_rel_err": impl.max_rel_err, "ms": None, "ms_min": None,
            "ms_max": None, "reps": reps, "flops": None, "bytes": None, "tflops": None, "gbps": None,
            "anchor": None, "anchor_tflops": None, "vs_anchor": None}


def _unbuilt_rows(kind: str, label: str, dims: Sequence[int], impls: Sequence[Impl], reps: int,
                  exc: BaseException, progress: ProgressFn) -> List[dict]:
    """Rows for a shape whose operands or reference could not be made (e.g. out of memory)."""
    rows = []
    for impl in impls:
        row = _new_row(kind, label, dims, impl, reps)
        row.update(status="FAIL" if impl.required else "n/a",
                   message=f"could not make the operands/reference: {first_line(exc)}")
        progress(_progress_line(row))
        rows.append(row)
    return rows


def _measure(impl: Impl, problem, check, label: str, dims: Sequence[int], kind: str, reps: int, warmup: int,
             flush: Optional[torch.Tensor], progress: ProgressFn, anchors: Optional[Dict[str, float]]) -> dict:
    """Validates `impl` on `problem` (first correct candidate), then times it: one result row."""
    device = problem.device
    row = _new_row(kind, label, dims, impl, reps)
    row.update(flops=impl.flops(problem), bytes=impl.bytes_moved(problem))
    if impl.anchor and anchors and impl.anchor in anchors:
        row["anchor"] = ANCHOR_NAMES[impl.anchor]
        row["anchor_tflops"] = float(anchors[impl.anchor])
    try:
        quick = None
        if impl.pick_fastest:
            quick = lambda fn: statistics.median(time_calls(fn, 5, 2, flush, device))  # noqa: E731
        sel = select_candidate(impl.setup(problem), check, impl.max_rel_err, impl.required, device, quick)
        row.update(status=sel.status, message=sel.message, rel_err=sel.rel_err, form=sel.form, tried=sel.tried)
        if sel.run is not None:
            times = time_calls(sel.run, reps, warmup, flush, device)
            ms = statistics.median(times)
            row.update(ms=ms, ms_min=min(times), ms_max=max(times), tflops=tflops(row["flops"], ms),
                       gbps=gbps(row["bytes"], ms))
            if row["anchor_tflops"]:
                row["vs_anchor"] = row["tflops"] / row["anchor_tflops"]
    except Exception as exc:
        if is_cuda_fault(exc):
            raise
        row.update(status="FAIL" if impl.required else "n/a", message=first_line(exc))
    progress(_progress_line(row))
    return row


def _measure_all(impls: Sequence[Impl], problem, check_of: Callable[[Impl], Callable], label: str,
                 dims: Sequence[int], kind: str, reps: int, warmup: int, flush: Optional[torch.Tensor],
                 progress: ProgressFn, anchors: Optional[Dict[str, float]], sink: List[dict],
                 **extra) -> List[dict]:
    """`_measure` of every impl on one shape. A sticky CUDA fault is recorded as a FAIL row and, with
    the rows of this shape so far, put into `sink` before it propagates."""
    out: List[dict] = []
    for impl in impls:
        try:
            row = _measure(impl, problem, check_of(impl), label, dims, kind, reps, warmup, flush, progress,
                           anchors)
        except Exception as exc:
            row = _new_row(kind, label, dims, impl, reps)
            row.update(status="FAIL", message=f"CUDA fault: {first_line(exc)}", **extra)
            progress(_progress_line(row))
            sink.extend(out + [row])
            raise
        row.update(extra)
        out.append(row)
    return out


def _progress_line(row: dict) -> str:
    head = f"  {row['shape']:<24} {row['impl']:<16}"
    if row["ms"] is not None:
        return (f"{head} {row['ms']:8.3f} ms {row['tflops']:7.1f} TFLOPS  rel.err {row['rel_err']:.2e}"
                f"  [{row['form']}]")
    return f"{head} {row['status']}: {row['message']}"


def fill_ratios(rows: List[dict], baseline: str, key: str, dense_ref: Optional[str] = None) -> None:
    """Adds `key` = this row's TFLOPS / the `baseline` row's TFLOPS on the same shape (a speed-up, also
    right when the two rows do different amounts of work) and, when `dense_ref` is given, `vs_dense` =
    TFLOPS / that row's TFLOPS for our rows (the grouped-vs-dense efficiency)."""
    by_shape: Dict[str, Dict[str, dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], {})[r["impl"]] = r
    for impls in by_shape.values():
        base = impls.get(baseline)
        dense = impls.get(dense_ref) if dense_ref else None
        for r in impls.values():
            if r["tflops"] is None:
                continue
            if base is not None and base["tflops"] and r is not base:
                r[key] = r["tflops"] / base["tflops"]
            if dense is not None and dense["tflops"] and r is not dense and r["impl"].startswith("ours"):
                r["vs_dense"] = r["tflops"] / dense["tflops"]


def _flush_buffer(device: torch.device, flush_bytes: int) -> Optional[torch.Tensor]:
    return torch.empty(flush_bytes, dtype=torch.uint8, device=device) if flush_bytes > 0 else None


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_dense(shapes: Sequence[DenseShape] = DENSE_SEED_SHAPES, impls: Sequence[str] = IMPL_NAMES,
              reps: int = DEFAULT_REPS, warmup: int = DEFAULT_WARMUP, *, seed: int = 0,
              progress: Optional[ProgressFn] = None, device="cuda", flush_bytes: int = L2_FLUSH_BYTES,
              rows: Optional[List[dict]] = None) -> List[dict]:
    """Validates then times each implementation on each (M, N, K); one dict per (shape, impl), appended
    to `rows` (if given) as each shape completes, so that they survive a CUDA fault that stops the run."""
    device = torch.device(device)
    progress = progress or _silent
    chosen = [impl for impl in DENSE_IMPLS if impl.name in impls]
    flush = _flush_buffer(device, flush_bytes)
    rows = [] if rows is None else rows
    for i, (m, n, k) in enumerate(shapes):
        label = format_shape((m, n, k))
        progress(f"[dense {i + 1}/{len(shapes)}] {label}: making operands and the float64 reference")
        try:
            problem = make_dense_problem(m, n, k, device, seed + i)
        except Exception as exc:
            if is_cuda_fault(exc):
                raise
            rows.extend(_unbuilt_rows("dense", label, (m, n, k), chosen, reps, exc, progress))
            _free(device)
            continue
        check = lambda after, before, p=problem: relative_error(after, before, p.ref)  # noqa: E731
        anchors = DENSE_ANCHORS_TFLOPS.get((m, n, k))
        shape_rows = _measure_all(chosen, problem, lambda impl: check, label, (m, n, k), "dense", reps, warmup,
                                  flush, progress, anchors, rows)
        fill_ratios(shape_rows, "cublas", "vs_cublas")
        rows.extend(shape_rows)
        del problem, check
        _free(device)
    return rows


def skewed_sizes(multiple: int = 16) -> List[int]:
    return zipf_split(SKEW_TOTAL_TOKENS, SKEW_GROUPS, SKEW_EXPONENT, multiple)


def _group_dense_impl() -> Impl:
    """Our dense kernel on group 0 alone: the per-group throughput the grouped kernels are held to."""
    def setup(p: GroupedProblem) -> List[Candidate]:
        def build():
            a, sa, b, sb = p.group_operands(0)
            out = p.out_init[0].clone()
            return (lambda: api.wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out)), out
        return [Candidate("wgrad.wgrad_gemm_fp8_fp8_fp32_nt (group 0 alone)", build)]
    return Impl(GROUP_DENSE_IMPL, "ours", "our dense kernel on one group's M x N x K", setup,
                lambda p: dense_flops(p.m, p.n, p.ks[0]), lambda p: fp8_bytes(p.m, p.n, p.ks[0]),
                required=True)


def run_grouped(shapes: Sequence[GroupedShape] = GROUPED_SEED_SHAPES, impls: Sequence[str] = IMPL_NAMES,
                reps: int = DEFAULT_REPS, warmup: int = DEFAULT_WARMUP, *, skewed: bool = True, seed: int = 0,
                progress: Optional[ProgressFn] = None, device="cuda", flush_bytes: int = L2_FLUSH_BYTES,
                rows: Optional[List[dict]] = None) -> List[dict]:
    """Both grouped layouts, our dense kernel on one group's shape, a per-group loop of our dense
    kernel and of cuBLAS, on each (G, M, N, K); then (if `skewed`) the Zipf-split MoE case. Rows are
    appended to `rows` (if given) as in `run_dense`."""
    device = torch.device(device)
    progress = progress or _silent
    flush = _flush_buffer(device, flush_bytes)
    cases: List[Tuple[str, str, List[int], int, int, List[int]]] = []
    for g, m, n, k in shapes:
        cases.append(("grouped", format_shape((g, m, n, k)), [g, m, n, k], m, n, [k] * g))
    if skewed:
        ks = skewed_sizes()
        cases.append(("skewed", f"skew {len(ks)}x{SKEW_M}x{SKEW_N} sumK={sum(ks)}",
                      [len(ks), SKEW_M, SKEW_N, sum(ks)], SKEW_M, SKEW_N, ks))
        # The same split in exact token counts: groups start inside 16-byte chunks, which only the
        # contiguous-K op takes (shifted loads).
        ks = skewed_sizes(1)
        cases.append(("skewed-any", f"skew {len(ks)}x{SKEW_M}x{SKEW_N} sumK={sum(ks)} any sizes",
                      [len(ks), SKEW_M, SKEW_N, sum(ks)], SKEW_M, SKEW_N, ks))
    rows = [] if rows is None else rows
    for i, (kind, label, dims, m, n, ks) in enumerate(cases):
        progress(f"[grouped {i + 1}/{len(cases)}] {label} (K per group {ks}): making operands and references")
        chosen = [impl for impl in GROUPED_IMPLS if impl.family in impls]
        if kind == "skewed-any":
            chosen = [impl for impl in chosen if impl.name == "ours-contig"]
            if not chosen:
                continue
        if kind == "grouped" and "ours" in impls:
            chosen.insert(2, _group_dense_impl())
        try:
            problem = make_grouped_problem(m, n, ks, device, seed + 1000 + i)
        except Exception as exc:
            if is_cuda_fault(exc):
                raise
            rows.extend(_unbuilt_rows(kind, label, dims, chosen, reps, exc, progress))
            _free(device)
            continue
        check = lambda after, before, p=problem: grouped_relative_error(after, before, p.refs)  # noqa: E731
        check0 = lambda after, before, p=problem: relative_error(after, before, p.refs[0])  # noqa: E731
        anchors = GROUPED_ANCHORS_TFLOPS.get(tuple(dims)) if kind == "grouped" else None
        checks = lambda impl: check0 if impl.name == GROUP_DENSE_IMPL else check  # noqa: E731
        case_rows = _measure_all(chosen, problem, checks, label, dims, kind, reps, warmup, flush, progress,
                                 anchors, rows, group_sizes=list(ks))
        fill_ratios(case_rows, "cublas-loop", "vs_cublas", dense_ref=GROUP_DENSE_IMPL if kind == "grouped"
                    else None)
        if kind == "skewed":
            fill_ratios(case_rows, "ours-dense-loop", "vs_dense_loop")
        rows.extend(case_rows)
        del problem, check, check0
        _free(device)
    return rows


# ------------------------------------------------------------------ tables ---------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """A plain-text table: columns as wide as their widest cell, numbers right-aligned."""
    widths = [len(h) for h in headers]
    for r in rows:
        for j, cell in enumerate(r):
            widths[j] = max(widths[j], len(cell))

    def line(cells):
        out = [c.rjust(w) if right[j] else c.ljust(w) for j, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def _num(value: Optional[float], fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _ratio(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.2f}x"


def _check_cell(row: dict, width: int = 60) -> str:
    if row["status"] == "ok":
        return "ok"
    text = f"{row['status']}: {row['message']}" if row["message"] else row["status"]
    return text if len(text) <= width else text[: width - 3] + "..."


def _anchor_cell(row: dict) -> str:
    if row.get("anchor_tflops") is None:
        return ""
    return f"{row['anchor_tflops']:.0f} {row['anchor']}"


def dense_table(rows: Sequence[dict]) -> str:
    headers = ["shape MxNxK", "impl", "ms", "TFLOPS", "GB/s", "vs cuBLAS", "anchor s7", "vs anchor",
               "rel.err", "check"]
    right = [False, False, True, True, True, True, True, True, True, False]
    body = [[r["shape"], r["impl"], _num(r["ms"], ".3f"), _num(r["tflops"], ".1f"), _num(r["gbps"], ".0f"),
             _ratio(r.get("vs_cublas")), _anchor_cell(r), _ratio(r.get("vs_anchor")), _num(r["rel_err"], ".2e"),
             _check_cell(r)] for r in rows]
    return format_table(headers, body, right)


def grouped_table(rows: Sequence[dict]) -> str:
    headers = ["shape GxMxNxK", "impl", "ms", "TFLOPS", "GB/s", "vs cuBLAS loop", "vs dense", "vs dense loop",
               "anchor s7", "vs anchor", "rel.err", "check"]
    right = [False, False, True, True, True, True, True, True, True, True, True, False]
    body = [[r["shape"], r["impl"], _num(r["ms"], ".3f"), _num(r["tflops"], ".1f"), _num(r["gbps"], ".0f"),
             _ratio(r.get("vs_cublas")), _ratio(r.get("vs_dense")), _ratio(r.get("vs_dense_loop")),
             _anchor_cell(r), _ratio(r.get("vs_anchor")), _num(r["rel_err"], ".2e"), _check_cell(r)]
            for r in rows]
    return format_table(headers, body, right)


def summarize(rows: Sequence[dict], kinds: Sequence[str] = ("dense", "grouped")) -> Dict[str, dict]:
    """Geometric means per impl over the shapes (of `kinds`) where it was timed, with the geomean of its
    DESIGN section 7 anchor over exactly those shapes (None where a shape has no anchor)."""
    out: Dict[str, dict] = {}
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["kind"] in kinds))
    for name in impls:
        timed = [r for r in rows if r["impl"] == name and r["kind"] in kinds and r["tflops"] is not None]
        anchors = [r["anchor_tflops"] for r in timed]
        anchor_gm = geomean(anchors) if timed and all(a is not None for a in anchors) else None
        out[name] = {
            "shapes": len(timed),
            "tflops": geomean(r["tflops"] for r in timed),
            "anchor": timed[0]["anchor"] if timed and anchor_gm is not None else None,
            "anchor_tflops": anchor_gm,
            "vs_cublas": geomean(r["vs_cublas"] for r in timed if r.get("vs_cublas") is not None)
            if any(r.get("vs_cublas") is not None for r in timed) else None,
        }
        if out[name]["tflops"] is not None and anchor_gm:
            out[name]["vs_anchor"] = out[name]["tflops"] / anchor_gm
    return out


def summary_lines(summary: Dict[str, dict], title: str) -> List[str]:
    lines = [f"{title}:"]
    for name, s in summary.items():
        if s["tflops"] is None:
            lines.append(f"  {name:<16} not timed on any shape")
            continue
        text = f"  {name:<16} {s['tflops']:7.1f} TFLOPS over {s['shapes']} shape(s)"
        if s.get("anchor_tflops"):
            text += f"; {s['anchor']} (DESIGN s7) {s['anchor_tflops']:.1f} -> {s['vs_anchor']:.2f}x"
        if s.get("vs_cublas") is not None:
            text += f"; vs cuBLAS {s['vs_cublas']:.2f}x"
        lines.append(text)
    return lines


def _impl_summaries() -> Dict[str, str]:
    impls = list(DENSE_IMPLS) + list(GROUPED_IMPLS) + [_group_dense_impl()]
    return {impl.name: impl.summary for impl in impls}


def legend(rows: Sequence[dict]) -> List[str]:
    """What each row name means and the exact call each one timed."""
    forms: Dict[str, List[str]] = {}
    for r in rows:
        fs = forms.setdefault(r["impl"], [])
        if r["form"] and r["form"] not in fs:
            fs.append(r["form"])
    summaries = _impl_summaries()
    lines = ["legend:"]
    for name, fs in forms.items():
        lines.append(f"  {name:<16} {summaries.get(name, '')}")
        lines += [f"  {'':<16}   timed: {f}" for f in fs]
    lines.append(f"  {BYTES_NOTE}.")
    lines.append("  TFLOPS = 2*M*N*K / median time; 'vs cuBLAS' = this TFLOPS / cuBLAS's; 'anchor s7' = the "
                 "DESIGN.md section 7 figure of this row's counterpart (ours: DeepGEMM).")
    return lines


def problem_lines(rows: Sequence[dict]) -> List[str]:
    """Every row that is not ok, with its full reason and what was tried (the table truncates)."""
    lines = []
    for r in rows:
        if r["status"] == "ok":
            continue
        lines.append(f"  {r['shape']} {r['impl']}: {r['status']}: {r['message']}")
        lines += [f"      tried {t}" for t in r.get("tried", [])]
    return ["not ok:"] + lines if lines else []


def generic_table(rows: Sequence[dict]) -> str:
    """A table of arbitrary dict rows (the quantization bench's), columns in first-seen key order."""
    keys: List[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)

    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    body = [[cell(r.get(k)) for k in keys] for r in rows]
    right = [all(isinstance(r.get(k), (int, float)) or r.get(k) is None for r in rows) for k in keys]
    return format_table(keys, body, right)


# ------------------------------------------------------------------ quantization bench --------------


def run_quant(reps: int, warmup: int, progress: ProgressFn) -> Tuple[Optional[List[dict]], str]:
    """Calls `wgrad.bench_quant.run_quant_bench` (another module) with the arguments it accepts.
    Returns (rows, "") or (None, why it could not run)."""
    try:
        from . import bench_quant
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.endswith("bench_quant"):
            return None, "wgrad.bench_quant is not available in this build (the quantization bench is not written yet)"
        return None, f"wgrad.bench_quant could not be imported: {first_line(exc)}"
    except Exception as exc:
        return None, f"wgrad.bench_quant could not be imported: {first_line(exc)}"
    fn = getattr(bench_quant, "run_quant_bench", None)
    if fn is None:
        return None, "wgrad.bench_quant has no run_quant_bench()"
    offered = {"reps": reps, "warmup": warmup, "progress": progress}
    try:
        params = inspect.signature(fn).parameters
        takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
        kwargs = {k: v for k, v in offered.items() if takes_all or k in params}
        rows = fn(**kwargs)
    except Exception as exc:
        if is_cuda_fault(exc):
            raise
        return None, f"run_quant_bench failed: {first_line(exc)}"
    return [dict(r) for r in (rows or [])], ""


def json_safe(value):
    """NaN and Inf (a broken kernel's error) as None, tuples as lists, anything odd as its str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def quant_row_failed(row: dict) -> bool:
    """A row of the quantization bench whose check failed: `valid` False (what wgrad.bench_quant
    reports), or a `status`/`check` of FAIL, or `passed`/`ok` False."""
    status = str(row.get("status", row.get("check", "ok"))).upper()
    return (status.startswith("FAIL") or row.get("valid") is False or row.get("passed") is False
            or row.get("ok") is False)


# ------------------------------------------------------------------ CLI ------------------------------

DESCRIPTION = """\
Validate, then time, wgrad's FP8 1x128-scaled weight-gradient GEMMs (out += a @ b^T, fp32 out) against
cuBLAS (torch._scaled_mm with 1x128 scales + out.add_) and a bf16 GEMM into fp32, on an SM90 GPU.
Default: the 12 dense DeepSeek-V3 seed shapes of DESIGN.md section 7."""

EPILOG = """\
Every implementation is checked against the float64 reference (full shape, on the GPU) before it is
timed: relative Frobenius error <= 2e-4 for FP8, <= 1e-2 for bf16; a failed check prints FAIL and the
exit status is 1. Timing: median of --reps CUDA-event timings of single calls after --warmup calls,
L2 flushed (256 MiB zeroed) before each call. Exit status 2: no SM90 GPU, or bad arguments.

examples:
  python -m wgrad bench
  python -m wgrad bench --shape 4096,4096,8192 --impl ours,cublas --json bench.json
  python -m wgrad bench --grouped
  python -m wgrad bench --grouped-shape 16,2048,7168,1024 --reps 50
  python -m wgrad bench --quant"""


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--shape", metavar="M,N,K", type=parse_dense_shape, action="append", default=None,
                        help="a dense shape (repeatable); replaces the 12 seed shapes")
    parser.add_argument("--dense", action="store_true",
                        help="also run the dense seed shapes when --grouped/--grouped-shape/--quant is given")
    parser.add_argument("--grouped", action="store_true",
                        help="the 6 k-grouped seed shapes in both layouts, plus the skewed 8-expert case")
    parser.add_argument("--grouped-shape", metavar="G,M,N,K", type=parse_grouped_shape, action="append",
                        default=None, help="a k-grouped shape, K tokens per group (repeatable)")
    parser.add_argument("--quant", action="store_true", help="the quantization kernels' bench (wgrad.bench_quant)")
    parser.add_argument("--impl", metavar="NAMES", type=parse_impls, default=list(IMPL_NAMES),
                        help=f"comma-separated subset of {','.join(IMPL_NAMES)} (default: all)")
    parser.add_argument("--reps", metavar="N", type=positive_int, default=DEFAULT_REPS,
                        help=f"timed calls per row; the median is reported (default {DEFAULT_REPS})")
    parser.add_argument("--warmup", metavar="N", type=non_negative_int, default=DEFAULT_WARMUP,
                        help=f"untimed calls before timing (default {DEFAULT_WARMUP})")
    parser.add_argument("--seed", metavar="N", type=int, default=0, help="seed of the random operands (default 0)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="write every row, the geometric means, the device and torch version as JSON")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wgrad bench", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_arguments(parser)


@dataclass
class Plan:
    dense: List[DenseShape]
    grouped: List[GroupedShape]
    skewed: bool
    quant: bool


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Which benchmarks a command line asks for: dense seeds unless only grouped/quant was asked for."""
    grouped_asked = args.grouped or bool(args.grouped_shape)
    dense: List[DenseShape] = list(args.shape or [])
    if not dense and (args.dense or not (grouped_asked or args.quant)):
        dense = list(DENSE_SEED_SHAPES)
    grouped: List[GroupedShape] = list(args.grouped_shape or [])
    if args.grouped and not args.grouped_shape:
        grouped = list(GROUPED_SEED_SHAPES)
    return Plan(dense, grouped, skewed=args.grouped, quant=args.quant)


def _environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": None, "sm_count": None}
    try:
        from . import __version__ as wgrad_version
        env["wgrad"] = wgrad_version
    except ImportError:
        env["wgrad"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["device"] = props.name
        env["sm_count"] = props.multi_processor_count
    return env


def run_cli(args: argparse.Namespace) -> int:
    problem = sm90_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    plan = plan_from_args(args)
    env = _environment()
    progress = stderr_progress
    progress(f"wgrad bench on {env['device']} ({env['sm_count']} SMs), torch {env['torch']}, "
             f"{args.reps} reps after {args.warmup} warm-up, L2 flushed")
    dense_rows: List[dict] = []
    grouped_rows: List[dict] = []
    quant_rows: Optional[List[dict]] = None
    quant_missing = ""
    fault = ""
    try:
        if plan.dense:
            run_dense(plan.dense, args.impl, args.reps, args.warmup, seed=args.seed, progress=progress,
                      rows=dense_rows)
        if plan.grouped or plan.skewed:
            run_grouped(plan.grouped, args.impl, args.reps, args.warmup, skewed=plan.skewed, seed=args.seed,
                        progress=progress, rows=grouped_rows)
        if plan.quant:
            quant_rows, quant_missing = run_quant(args.reps, args.warmup, progress)
    except Exception as exc:
        # A sticky CUDA error (nothing after it can run on this context) or a bug of this script: report
        # what was measured before it, and fail.
        if is_cuda_fault(exc):
            fault = f"CUDA fault, run stopped: {first_line(exc, 300)}"
        else:
            traceback.print_exc()
            fault = f"benchmark error, run stopped: {first_line(exc, 300)}"
        progress(fault)

    report: List[str] = []
    if dense_rows:
        report += ["", "dense (out += a @ b^T, fp32 out)", dense_table(dense_rows), ""]
        report += summary_lines(summarize(dense_rows, ("dense",)), "geometric means, dense")
    if grouped_rows:
        report += ["", "k-grouped (MoE): TFLOPS over all groups", grouped_table(grouped_rows), ""]
        skew = [r for r in grouped_rows if r["kind"] == "skewed"]
        if skew:
            report.append(f"skewed case: K per expert {skew[0]['group_sizes']} (Zipf-like split of "
                          f"{sum(skew[0]['group_sizes'])} tokens, multiples of 16)")
        skew_any = [r for r in grouped_rows if r["kind"] == "skewed-any"]
        if skew_any:
            report.append(f"skewed case, any sizes: K per expert {skew_any[0]['group_sizes']} (the same split in "
                          f"exact token counts: contiguous-K only)")
        report += summary_lines(summarize(grouped_rows, ("grouped",)), "geometric means, grouped seed shapes")
    if dense_rows or grouped_rows:
        report += [""] + legend(dense_rows + grouped_rows)
        problems = problem_lines(dense_rows + grouped_rows)
        if problems:
            report += [""] + problems
    if plan.quant:
        if quant_rows is not None:
            report += ["", "quantization", generic_table(quant_rows) if quant_rows else "(no rows)"]
        else:
            report += ["", f"quantization: not run: {quant_missing}"]
    print("\n".join(report).lstrip("\n"))

    failed = [r for r in dense_rows + grouped_rows if r["status"] == "FAIL"]
    failed_quant = [r for r in (quant_rows or []) if quant_row_failed(r)]
    if args.json:
        doc = dict(env, reps=args.reps, warmup=args.warmup, l2_flush_bytes=L2_FLUSH_BYTES, bytes_note=BYTES_NOTE,
                   fp8_max_rel_err=FP8_REL_ERR_MAX, bf16_max_rel_err=BF16_REL_ERR_MAX,
                   dense=dense_rows, grouped=grouped_rows,
                   geomean={"dense": summarize(dense_rows, ("dense",)),
                            "grouped": summarize(grouped_rows, ("grouped",))},
                   quant=quant_rows, quant_unavailable=quant_missing or None, stopped_by=fault or None,
                   failed=len(failed) + len(failed_quant))
        with open(args.json, "w") as f:
            json.dump(json_safe(doc), f, indent=2, allow_nan=False)
        progress(f"wrote {args.json}")
    for r in failed:
        print(f"FAIL: {r['shape']} {r['impl']}: {r['message']}", file=sys.stderr)
    if failed or failed_quant or fault or (plan.quant and quant_rows is None):
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m wgrad.bench [options]` (the same as `python -m wgrad bench [options]`)."""
    return run_cli(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
