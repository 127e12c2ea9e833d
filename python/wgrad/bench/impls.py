"""The implementations the GEMM suites compare, each behind the `Impl` interface of `runner`.

- `ours`: wgrad's ops, through the Python API a user calls.
- `cublas`: `torch._scaled_mm` with 1x128 scales on both operands and fp32 output, then `out.add_(...)`
  (what a user must do to accumulate into fp32 `main_grad`). torch checks the scale layouts
  (aten/src/ATen/native/cuda/ScaledBlas.cpp, `is_blockwise_1x128_scaling`, torch >= 2.9): for
  `_scaled_mm(a [M, K], b.t() [K, N], ...)` scale_a is `[M, K/128]` with strides `(1, M)` and scale_b
  is `[K/128, N]` contiguous (its transpose is the 1x128 scale of `b [N, K]`, "outer-dim-major").
  `torch.nn.functional.scaled_mm` (`_scaled_mm_v2`, torch >= 2.10) takes scale_b as `[N, K/128]`
  with strides `(1, N)` and explicit `ScalingType.BlockWise1x128` recipes; it is tried second.
- `bf16`: the dequantized operands in bf16, product accumulated into fp32 by cuBLAS.
- `deepgemm`: DeepGEMM's weight-gradient GEMMs (commit 04278f6), a comparator measured in the same
  process, used only where `import deep_gemm` works (else its rows are n/a, with the import error). It
  takes each operand's scales as one contiguous `[K blocks, MN]` tensor (the transpose of ours); its
  k-grouped call is a host loop of its dense kernel over the packed layout (ours, the same bytes).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch

from .. import api, reference
from .problems import DenseProblem, GroupedProblem, bf16_bytes, dense_flops, fp8_bytes, grouped_bytes
from .runner import BF16_REL_ERR_MAX, Candidate, Impl


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


# ------------------------------------------------------------------ dense ---------------------------


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


# ------------------------------------------------------------------ DeepGEMM (comparator) ------------

# Row names of DeepGEMM's dense and k-grouped calls: the baselines of the "vs DeepGEMM" column.
DEEPGEMM = "deepgemm"
DEEPGEMM_GROUPED = "deepgemm-packed"
# DeepGEMM 04278f6's k-grouped GEMM takes only groups of a positive multiple of 128 tokens.
DEEPGEMM_K_MULTIPLE = 128
# It takes [K blocks, MN] scales as they are only when MN is TMA-aligned (other layouts it copies on every
# call, inside the timed interval).
DEEPGEMM_MN_MULTIPLE = 4


def deep_gemm_module():
    """DeepGEMM's Python module. Raises the import error when it is not importable (its rows are then
    n/a with that reason: DeepGEMM is a comparator, not a dependency)."""
    import deep_gemm

    return deep_gemm


def deepgemm_scales(s: torch.Tensor) -> torch.Tensor:
    """Our [mn, kb] MN-major scales as DeepGEMM takes them: [kb, mn] contiguous. A view when our
    leading dimension is exactly mn (mn a multiple of 4), else a copy (made at setup, never timed)."""
    return s.t().contiguous()


def _deepgemm_mn_check(m: int, n: int) -> None:
    if m % DEEPGEMM_MN_MULTIPLE or n % DEEPGEMM_MN_MULTIPLE:
        raise ValueError(f"DeepGEMM takes [K/128, MN] scales without a per-call copy only with M and N "
                         f"multiples of {DEEPGEMM_MN_MULTIPLE}, got M={m}, N={n}")


def _dense_deepgemm(p: DenseProblem) -> List[Candidate]:
    dg = deep_gemm_module()
    _deepgemm_mn_check(p.m, p.n)

    def build():
        out = p.out_init.clone()
        lhs, rhs = (p.a, deepgemm_scales(p.sa)), (p.b, deepgemm_scales(p.sb))
        return (lambda: dg.wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out)), out
    return [Candidate("deep_gemm.wgrad_gemm_fp8_fp8_fp32_nt, scales [K/128, MN] contiguous", build)]


def _dense_flops(p: DenseProblem) -> int:
    return dense_flops(p.m, p.n, p.k)


DENSE_IMPLS: Tuple[Impl, ...] = (
    Impl("ours", "ours", "wgrad.wgrad_gemm_fp8_fp8_fp32_nt: out += (a*sa) @ (b*sb)^T in one call",
         _dense_ours, _dense_flops, lambda p: fp8_bytes(p.m, p.n, p.k), required=True),
    Impl(DEEPGEMM, "deepgemm", "DeepGEMM 04278f6's wgrad_gemm_fp8_fp8_fp32_nt on the same operands (comparator)",
         _dense_deepgemm, _dense_flops, lambda p: fp8_bytes(p.m, p.n, p.k)),
    Impl("cublas", "cublas", "cuBLAS 1x128 x 1x128 via torch._scaled_mm, fp32 out, then out.add_",
         _dense_cublas, _dense_flops, lambda p: fp8_bytes(p.m, p.n, p.k)),
    Impl("bf16", "bf16", "cuBLAS bf16 GEMM of the dequantized operands accumulated into fp32 out",
         _dense_bf16, _dense_flops, lambda p: bf16_bytes(p.m, p.n, p.k), max_rel_err=BF16_REL_ERR_MAX,
         pick_fastest=True),
)

IMPL_NAMES: Tuple[str, ...] = tuple(impl.name for impl in DENSE_IMPLS)


# ------------------------------------------------------------------ k-grouped -----------------------


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


def _grouped_deepgemm(p: GroupedProblem) -> List[Candidate]:
    dg = deep_gemm_module()
    _deepgemm_mn_check(p.m, p.n)
    if any(k <= 0 or k % DEEPGEMM_K_MULTIPLE for k in p.ks):
        raise ValueError(f"DeepGEMM's k-grouped GEMM needs every K_g a positive multiple of "
                         f"{DEEPGEMM_K_MULTIPLE}, got {list(p.ks)}")

    def build():
        out = p.out_init.clone()
        lhs, rhs = (p.a_packed, deepgemm_scales(p.sa_packed)), (p.b_packed, deepgemm_scales(p.sb_packed))
        ks = list(p.ks)
        return (lambda: dg.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, ks)), out
    return [Candidate("deep_gemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt (host sizes), scales [sum K_g/128, MN] "
                      "contiguous", build)]


def _grouped_flops(p: GroupedProblem) -> int:
    return sum(dense_flops(p.m, p.n, k) for k in p.ks)


def _grouped_bytes(p: GroupedProblem) -> int:
    return grouped_bytes(p.m, p.n, p.ks)


GROUPED_IMPLS: Tuple[Impl, ...] = (
    Impl("ours-packed", "ours", "one launch, packed layout, sizes as a host list", _grouped_packed,
         _grouped_flops, _grouped_bytes, required=True),
    Impl("ours-contig", "ours", "one launch, contiguous-K layout, sizes as an int32 CUDA tensor",
         _grouped_contig, _grouped_flops, _grouped_bytes, required=True),
    Impl("ours-dense-loop", "ours", "a Python loop of our dense kernel, one launch per group",
         _grouped_dense_loop, _grouped_flops, _grouped_bytes, required=True),
    Impl(DEEPGEMM_GROUPED, "deepgemm", "DeepGEMM 04278f6's k_grouped_wgrad_gemm_fp8_fp8_fp32_nt, packed layout "
         "(its host loop: one launch per group; comparator)", _grouped_deepgemm, _grouped_flops, _grouped_bytes),
    Impl("cublas-loop", "cublas", "a Python loop of torch._scaled_mm 1x128 + out[g].add_ per group",
         _grouped_cublas_loop, _grouped_flops, _grouped_bytes),
)

# The dense reference row of a grouped shape: our dense kernel on one group's (M, N, K).
GROUP_DENSE_IMPL = "ours-dense"


def group_dense_impl() -> Impl:
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


def impl_summaries() -> Dict[str, str]:
    """Row name -> what it measures, for the legend."""
    impls = list(DENSE_IMPLS) + list(GROUPED_IMPLS) + [group_dense_impl()]
    return {impl.name: impl.summary for impl in impls}
