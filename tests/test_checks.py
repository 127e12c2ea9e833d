"""Every bad input of the weight-gradient GEMM ops (fp32 and bf16 forms) is rejected with a RuntimeError that names the argument and the
expected / actual value, and `out` is left bitwise as it was.

Each case runs on three backends:
- cpu:  the C++ checks (csrc/checks.cpp, the source of truth) in front of the reference math;
- meta: the Python fake kernels (python/wgrad/_ops.py), which must mirror the C++ checks: the same
        inputs raise, with a message matching the same pattern;
- cuda: the C++ checks in front of the SM90 kernels (skipped without an SM90 GPU).
Cases that need the values of the `ks` tensor (negative sizes, sum(ks) > K_total) are checked on the
host only where the data can be read without a synchronisation: on the CPU. On meta tensors there is no
data; on CUDA the kernel validates the sizes and leaves out untouched when they are invalid, without an
error (raising one would need a host synchronisation; see docs/contract.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

import pytest
import torch

import wgrad
from helpers import FP8, bits, cuda_param

DENSE = "wgrad_gemm_fp8_fp8_fp32_nt"
PACKED = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt"
CONTIG = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous"
DENSE_BF16 = "wgrad_gemm_fp8_fp8_bf16_nt"
CONTIG_BF16 = "k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous"

M, N = 33, 24  # M not a multiple of 4 (scale ld = 36), N a multiple of 4 (out rows 16-byte aligned)


# ------------------------------------------------------------------ builders ------------------------


def fp8(rows, cols, dev):
    return torch.zeros(rows, cols, device=dev).to(FP8)


def fp8_flat(numel, dev):
    return torch.zeros(numel, device=dev).to(FP8)


def at_offset(shape, dtype, offset, dev):
    """A contiguous tensor of `shape` whose storage offset is `offset` elements (misaligned base)."""
    numel = 1
    for s in shape:
        numel *= s
    buf = torch.zeros(numel + offset, device=dev).to(dtype)
    return buf[offset : offset + numel].view(shape)


def scales(mn, kb, dev):
    s = wgrad.empty_mn_major_scales(mn, kb, device=dev)
    return s.fill_(1.0)


def scales_strided(mn, kb, ld, dev, offset=0):
    """[mn, kb] float32 with strides (1, ld) starting `offset` elements into its buffer."""
    buf = torch.ones(offset + kb * ld + mn, device=dev)
    return buf.as_strided((mn, kb), (1, ld), offset)


def out_strided(shape, strides, dev):
    numel = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    return torch.randn(numel, device=dev).as_strided(shape, strides)


def out_rand(*shape, dev):
    return torch.randn(*shape, device=dev)


# Good inputs of every op; a case replaces some of them.
K_DENSE = 144  # two scale blocks, the second partial
KS_PACKED = [144, 0, 48]  # blocks per group 2 + 0 + 1 = 3, while ceil(192 / 128) = 2
KS_CONTIG = [96, 0, 64]  # K_total = 160; capacity ceil(160/128) + 3 - 1 = 4


def good_dense(dev):
    return dict(a=fp8(M, K_DENSE, dev), sa=scales(M, 2, dev), b=fp8(N, K_DENSE, dev), sb=scales(N, 2, dev),
                out=out_rand(M, N, dev=dev))


def good_packed(dev):
    k_total = sum(KS_PACKED)
    return dict(a=fp8_flat(M * k_total, dev), sa=scales(M, 3, dev), b=fp8_flat(N * k_total, dev),
                sb=scales(N, 3, dev), out=out_rand(3, M, N, dev=dev), ks=list(KS_PACKED))


def good_contig(dev):
    return dict(a=fp8(M, 160, dev), sa=scales(M, 4, dev), b=fp8(N, 160, dev), sb=scales(N, 4, dev),
                out=out_rand(3, M, N, dev=dev), ks=torch.tensor(KS_CONTIG, dtype=torch.int32, device=dev))


def with_bf16_out(good):
    """The bf16 forms take the fp32 forms' operands and a bf16 out (N = 24: rows of 48 bytes, 16-byte aligned)."""
    def make(dev):
        args = good(dev)
        args["out"] = args["out"].bfloat16()
        return args
    return make


def out_strided_bf16(shape, strides, dev):
    numel = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    return torch.randn(numel, device=dev).bfloat16().as_strided(shape, strides)


GOOD = {DENSE: good_dense, PACKED: good_packed, CONTIG: good_contig, DENSE_BF16: with_bf16_out(good_dense),
        CONTIG_BF16: with_bf16_out(good_contig)}
ARG_ORDER = {
    DENSE: ("a", "sa", "b", "sb", "out"),
    PACKED: ("a", "sa", "b", "sb", "out", "ks"),
    CONTIG: ("a", "sa", "b", "sb", "out", "ks"),
    DENSE_BF16: ("a", "sa", "b", "sb", "out"),
    CONTIG_BF16: ("a", "sa", "b", "sb", "out", "ks"),
}


@dataclass(frozen=True)
class Case:
    name: str
    # (device, good args) -> the arguments to replace
    change: Callable[[str, Dict], Dict]
    match: str  # regex that the message must contain (C++ and fake alike)
    needs_data: bool = False  # depends on the values of the ks tensor: host-checked on the CPU only


DENSE_CASES = [
    Case("a_bf16", lambda d, g: dict(a=g["a"].to(torch.bfloat16)), r"a must be float8_e4m3fn, got"),
    Case("a_e5m2", lambda d, g: dict(a=g["a"].to(torch.float8_e5m2)), r"a must be float8_e4m3fn, got"),
    Case("b_float32", lambda d, g: dict(b=g["b"].float()), r"b must be float8_e4m3fn, got"),
    Case("sa_bf16", lambda d, g: dict(sa=torch.ones(M, 2, dtype=torch.bfloat16, device=d)),
         r"sa must be float32, got"),
    Case("sb_float64", lambda d, g: dict(sb=torch.ones(N, 2, dtype=torch.float64, device=d)),
         r"sb must be float32, got"),
    Case("out_bf16", lambda d, g: dict(out=out_rand(M, N, dev=d).bfloat16()), r"out must be float32, got"),
    Case("out_float64", lambda d, g: dict(out=out_rand(M, N, dev=d).double()), r"out must be float32, got"),
    Case("a_3d", lambda d, g: dict(a=g["a"][None]), r"a must be 2-D \[M, K\], got 3-D"),
    Case("b_1d", lambda d, g: dict(b=g["b"].reshape(-1)), r"b must be 2-D \[N, K\], got 1-D"),
    Case("out_3d", lambda d, g: dict(out=g["out"][None]), r"out must be 2-D \[M, N\], got 3-D"),
    Case("k_mismatch", lambda d, g: dict(b=fp8(N, 128, d)), r"b must have K = 144 columns like a, got 128"),
    Case("k_not_multiple_of_16", lambda d, g: dict(a=fp8(M, 136, d), b=fp8(N, 136, d)),
         r"K must be a multiple of 16.*contiguous takes any K as one group\), got 136"),
    Case("sa_too_few_blocks", lambda d, g: dict(sa=scales(M, 1, d)), r"sa must have shape \[33, 2\].*got"),
    Case("sa_too_many_blocks", lambda d, g: dict(sa=scales(M, 3, d)), r"sa must have shape \[33, 2\].*got"),
    Case("sa_rows_not_m", lambda d, g: dict(sa=scales(M + 1, 2, d)), r"sa must have shape \[33, 2\].*got"),
    Case("sb_too_few_blocks", lambda d, g: dict(sb=scales(N, 1, d)), r"sb must have shape \[24, 2\].*got"),
    Case("sb_rows_not_n", lambda d, g: dict(sb=scales(N - 1, 2, d)), r"sb must have shape \[24, 2\].*got"),
    Case("sa_1d", lambda d, g: dict(sa=torch.ones(2 * M, device=d)), r"sa must (be 2-D|have shape) \[33, 2\]"),
    Case("out_n_mismatch", lambda d, g: dict(out=out_rand(M, N + 1, dev=d)), r"out must end in \[33, 24\], got"),
    Case("out_m_mismatch", lambda d, g: dict(out=out_rand(M - 1, N, dev=d)), r"out must end in \[33, 24\], got"),
    Case("out_transposed_shape", lambda d, g: dict(out=out_rand(N, M, dev=d)), r"out must end in \[33, 24\], got"),
    Case("a_not_k_contiguous", lambda d, g: dict(a=fp8(K_DENSE, M, d).t()), r"a must be K-contiguous"),
    Case("b_not_k_contiguous", lambda d, g: dict(b=fp8(K_DENSE, N, d).t()), r"b must be K-contiguous"),
    Case("a_row_stride_not_16", lambda d, g: dict(a=fp8(M, K_DENSE + 8, d)[:, :K_DENSE]),
         r"a row stride must be a multiple of 16.*got 152"),
    Case("b_row_stride_not_16", lambda d, g: dict(b=fp8(N, K_DENSE + 4, d)[:, :K_DENSE]),
         r"b row stride must be a multiple of 16.*got 148"),
    Case("a_row_stride_below_k", lambda d, g: dict(a=fp8_flat(M * K_DENSE, d).as_strided((M, K_DENSE), (128, 1))),
         r"a row stride must be .*>= K.*got 128"),
    Case("a_misaligned", lambda d, g: dict(a=at_offset((M, K_DENSE), FP8, 8, d)),
         r"a data pointer must be 16-byte aligned.*storage offset 8"),
    Case("b_misaligned", lambda d, g: dict(b=at_offset((N, K_DENSE), FP8, 1, d)),
         r"b data pointer must be 16-byte aligned.*storage offset 1"),
    Case("sa_k_major", lambda d, g: dict(sa=torch.ones(M, 2, device=d)), r"sa must be MN-major"),
    Case("sb_k_major", lambda d, g: dict(sb=torch.ones(N, 2, device=d)), r"sb must be MN-major"),
    Case("sa_ld_not_multiple_of_4", lambda d, g: dict(sa=scales_strided(M, 2, M, d)),
         r"sa stride\(1\) must be a multiple of 4 and >= 33.*got 33"),
    Case("sa_ld_below_m", lambda d, g: dict(sa=scales_strided(M, 2, 32, d)),
         r"sa stride\(1\) must be a multiple of 4 and >= 33.*got 32"),
    Case("sb_ld_not_multiple_of_4", lambda d, g: dict(sb=scales_strided(N, 2, 26, d)),
         r"sb stride\(1\) must be a multiple of 4 and >= 24.*got 26"),
    Case("sa_misaligned", lambda d, g: dict(sa=scales_strided(M, 2, 36, d, offset=2)),
         r"sa data pointer must be 16-byte aligned.*storage offset 2"),
    Case("sb_misaligned", lambda d, g: dict(sb=scales_strided(N, 2, 24, d, offset=1)),
         r"sb data pointer must be 16-byte aligned.*storage offset 1"),
    Case("out_column_major", lambda d, g: dict(out=out_rand(N, M, dev=d).t()), r"out must have stride\(-1\) == 1"),
    Case("out_row_stride_not_multiple_of_4", lambda d, g: dict(out=out_strided((M, N), (26, 1), d)),
         r"out stride\(0\) must be a multiple of 4.*got 26"),
    Case("out_row_stride_below_n", lambda d, g: dict(out=out_strided((M, N), (20, 1), d)),
         r"out row stride must be >= N = 24, got 20"),
    Case("out_misaligned", lambda d, g: dict(out=at_offset((M, N), torch.float32, 1, d)),
         r"out data pointer must be 16-byte aligned.*storage offset 1"),
]

PACKED_CASES = [
    Case("ks_empty", lambda d, g: dict(ks=[]), r"ks must name at least one group"),
    Case("out_2d", lambda d, g: dict(out=out_rand(M, N, dev=d)), r"out must be 3-D \[G, M, N\], got 2-D"),
    Case("group_count_vs_out", lambda d, g: dict(ks=KS_PACKED + [0]),
         r"out.shape\[0\] must equal the number of groups 4, got 3"),
    Case("ks_negative", lambda d, g: dict(ks=[144, -16, 64]), r"ks\[1\] must be >= 0, got -16"),
    Case("ks_not_multiple_of_16", lambda d, g: dict(ks=[136, 8, 48]), r"ks\[0\] must be a multiple of 16.*got 136"),
    Case("a_numel_vs_sum", lambda d, g: dict(a=fp8_flat(M * 176, d)), r"a must hold 33 \* sum\(ks\) = 6336 elements, got 5808"),
    Case("b_numel_vs_sum", lambda d, g: dict(b=fp8_flat(N * 208, d)), r"b must hold 24 \* sum\(ks\) = 4608 elements, got 4992"),
    Case("sum_ks_vs_operands", lambda d, g: dict(ks=[144, 16, 48]), r"a must hold 33 \* sum\(ks\) = 6864 elements, got 6336"),
    Case("a_bf16", lambda d, g: dict(a=g["a"].to(torch.bfloat16)), r"a must be float8_e4m3fn, got"),
    Case("b_e5m2", lambda d, g: dict(b=g["b"].to(torch.float8_e5m2)), r"b must be float8_e4m3fn, got"),
    Case("a_not_contiguous", lambda d, g: dict(a=fp8_flat(2 * M * 192, d)[::2]), r"a must be contiguous"),
    Case("b_not_contiguous", lambda d, g: dict(b=fp8(192, N, d).t()), r"b must be contiguous"),
    Case("a_misaligned", lambda d, g: dict(a=at_offset((M * 192,), FP8, 4, d)),
         r"a data pointer must be 16-byte aligned.*storage offset 4"),
    Case("b_misaligned", lambda d, g: dict(b=at_offset((N * 192,), FP8, 15, d)),
         r"b data pointer must be 16-byte aligned.*storage offset 15"),
    Case("sa_blocks_of_total_not_per_group", lambda d, g: dict(sa=scales(M, 2, d)),
         r"sa must have shape \[33, 3\].*got"),
    Case("sb_wrong_rows", lambda d, g: dict(sb=scales(N + 4, 3, d)), r"sb must have shape \[24, 3\].*got"),
    Case("sa_k_major", lambda d, g: dict(sa=torch.ones(M, 3, device=d)), r"sa must be MN-major"),
    Case("sb_ld_not_multiple_of_4", lambda d, g: dict(sb=scales_strided(N, 3, 30, d)),
         r"sb stride\(1\) must be a multiple of 4 and >= 24.*got 30"),
    Case("sb_float64", lambda d, g: dict(sb=torch.ones(N, 3, dtype=torch.float64, device=d)), r"sb must be float32, got"),
    Case("out_bf16", lambda d, g: dict(out=out_rand(3, M, N, dev=d).bfloat16()), r"out must be float32, got"),
    # In the grouped layouts out names M and N: a mismatch is reported on the operand that disagrees.
    Case("out_n_vs_b", lambda d, g: dict(out=out_rand(3, M, N + 4, dev=d)),
         r"b must hold 28 \* sum\(ks\) = 5376 elements, got 4608"),
    Case("out_group_stride_not_multiple_of_4", lambda d, g: dict(out=out_strided((3, M, N), (M * N + 2, N, 1), d)),
         r"out stride\(0\) must be a multiple of 4.*got 794"),
    Case("out_row_stride_not_multiple_of_4", lambda d, g: dict(out=out_strided((3, M, N), (M * 28, 26, 1), d)),
         r"out stride\(1\) must be a multiple of 4.*got 26"),
    Case("out_not_n_contiguous", lambda d, g: dict(out=out_rand(3, N, M, dev=d).transpose(1, 2)),
         r"out must have stride\(-1\) == 1"),
    Case("out_misaligned", lambda d, g: dict(out=at_offset((3, M, N), torch.float32, 2, d)),
         r"out data pointer must be 16-byte aligned.*storage offset 2"),
]


def _ks(values, d, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=d)


CONTIG_CASES = [
    Case("ks_int64", lambda d, g: dict(ks=_ks(KS_CONTIG, d, torch.int64)), r"ks must be int32, got"),
    Case("ks_float", lambda d, g: dict(ks=_ks(KS_CONTIG, d, torch.float32)), r"ks must be int32, got"),
    Case("ks_2d", lambda d, g: dict(ks=_ks([KS_CONTIG], d)), r"ks must be 1-D \[G\], got 2-D"),
    Case("ks_not_contiguous", lambda d, g: dict(ks=_ks([96, 7, 0, 7, 64, 7], d)[::2]), r"ks must be contiguous"),
    Case("ks_empty", lambda d, g: dict(ks=_ks([], d)), r"ks must name at least one group"),
    Case("group_count_vs_out", lambda d, g: dict(ks=_ks(KS_CONTIG + [0], d)),
         r"out.shape\[0\] must equal the number of groups 4, got 3"),
    Case("out_2d", lambda d, g: dict(out=out_rand(M, N, dev=d)), r"out must be 3-D \[G, M, N\], got 2-D"),
    Case("a_bf16", lambda d, g: dict(a=g["a"].to(torch.bfloat16)), r"a must be float8_e4m3fn, got"),
    Case("b_e5m2", lambda d, g: dict(b=g["b"].to(torch.float8_e5m2)), r"b must be float8_e4m3fn, got"),
    Case("a_1d", lambda d, g: dict(a=g["a"].reshape(-1)), r"a must be 2-D \[M, K_total\], got 1-D"),
    Case("b_3d", lambda d, g: dict(b=g["b"][None]), r"b must be 2-D \[N, K_total\], got 3-D"),
    Case("k_total_mismatch", lambda d, g: dict(b=fp8(N, 176, d)), r"b must have K_total = 160 columns like a, got 176"),
    Case("a_rows_vs_out", lambda d, g: dict(a=fp8(M + 1, 160, d)), r"a must have shape \[33, 160\], got"),
    Case("b_rows_vs_out", lambda d, g: dict(b=fp8(N + 1, 160, d)), r"b must have shape \[24, 160\], got"),
    Case("a_not_k_contiguous", lambda d, g: dict(a=fp8(160, M, d).t()), r"a must be K-contiguous"),
    Case("a_row_stride_not_16", lambda d, g: dict(a=fp8(M, 168, d)[:, :160]),
         r"a row stride must be a multiple of 16.*got 168"),
    Case("b_misaligned", lambda d, g: dict(b=at_offset((N, 160), FP8, 3, d)),
         r"b data pointer must be 16-byte aligned.*storage offset 3"),
    Case("sa_capacity", lambda d, g: dict(sa=scales(M, 3, d)), r"sa must be \[33, >= 4\].*got"),
    Case("sb_capacity_of_dense", lambda d, g: dict(sb=scales(N, 2, d)), r"sb must be \[24, >= 4\].*got"),
    Case("sb_1d", lambda d, g: dict(sb=torch.ones(4 * N, device=d)), r"sb must be \[24, >= 4\].*got"),
    Case("sa_rows_not_m", lambda d, g: dict(sa=scales(M + 1, 4, d)), r"sa must have shape \[33, 4\].*got"),
    Case("sa_k_major", lambda d, g: dict(sa=torch.ones(M, 4, device=d)), r"sa must be MN-major"),
    Case("sa_ld_below_m", lambda d, g: dict(sa=scales_strided(M, 4, 32, d)),
         r"sa stride\(1\) must be a multiple of 4 and >= 33.*got 32"),
    Case("sb_float64", lambda d, g: dict(sb=torch.ones(N, 4, dtype=torch.float64, device=d)), r"sb must be float32, got"),
    Case("out_float64", lambda d, g: dict(out=out_rand(3, M, N, dev=d).double()), r"out must be float32, got"),
    Case("out_m_vs_a", lambda d, g: dict(out=out_rand(3, M + 1, N, dev=d)), r"a must have shape \[34, 160\], got \[33, 160\]"),
    Case("out_group_stride_not_multiple_of_4", lambda d, g: dict(out=out_strided((3, M, N), (M * N + 1, N, 1), d)),
         r"out stride\(0\) must be a multiple of 4.*got 793"),
    Case("out_misaligned", lambda d, g: dict(out=at_offset((3, M, N), torch.float32, 1, d)),
         r"out data pointer must be 16-byte aligned.*storage offset 1"),
    Case("ks_negative", lambda d, g: dict(ks=_ks([96, -4, 68], d)), r"ks\[1\] must be >= 0, got -4", needs_data=True),
    Case("ks_sum_above_k_total", lambda d, g: dict(ks=_ks([96, 16, 64], d)),
         r"sum\(ks\) must be at most K_total = 160, got 176", needs_data=True),
]

# The bf16 forms: the fp32 forms' operand cases (those that leave out as it is) and their own out rules.
DENSE_BF16_CASES = [c for c in DENSE_CASES if not c.name.startswith("out")] + [
    Case("out_float32", lambda d, g: dict(out=out_rand(M, N, dev=d)), r"out must be bfloat16, got"),
    Case("out_3d", lambda d, g: dict(out=g["out"][None]), r"out must be 2-D \[M, N\], got 3-D"),
    Case("out_n_mismatch", lambda d, g: dict(out=out_rand(M, N + 8, dev=d).bfloat16()),
         r"out must end in \[33, 24\], got"),
    Case("out_column_major", lambda d, g: dict(out=out_rand(N, M, dev=d).bfloat16().t()),
         r"out must have stride\(-1\) == 1"),
    Case("out_row_stride_not_multiple_of_8", lambda d, g: dict(out=out_strided_bf16((M, N), (28, 1), d)),
         r"out stride\(0\) must be a multiple of 8.*got 28"),
    Case("out_misaligned", lambda d, g: dict(out=at_offset((M, N), torch.bfloat16, 4, d)),
         r"out data pointer must be 16-byte aligned.*storage offset 4"),
]
CONTIG_BF16_CASES = [c for c in CONTIG_CASES if not c.name.startswith("out")] + [
    Case("out_float32", lambda d, g: dict(out=out_rand(3, M, N, dev=d)), r"out must be bfloat16, got"),
    Case("out_2d", lambda d, g: dict(out=g["out"][0]), r"out must be 3-D \[G, M, N\], got 2-D"),
    Case("out_group_stride_not_multiple_of_8", lambda d, g: dict(out=out_strided_bf16((3, M, N), (M * N + 4, N, 1), d)),
         r"out stride\(0\) must be a multiple of 8.*got 796"),
    Case("out_misaligned", lambda d, g: dict(out=at_offset((3, M, N), torch.bfloat16, 2, d)),
         r"out data pointer must be 16-byte aligned.*storage offset 2"),
]

CASES = {DENSE: DENSE_CASES, PACKED: PACKED_CASES, CONTIG: CONTIG_CASES, DENSE_BF16: DENSE_BF16_CASES,
         CONTIG_BF16: CONTIG_BF16_CASES}
SHORT = {DENSE: "dense", PACKED: "packed", CONTIG: "contig", DENSE_BF16: "dense_bf16", CONTIG_BF16: "contig_bf16"}


def _params():
    for op, cases in CASES.items():
        for case in cases:
            ident = f"{SHORT[op]}-{case.name}"
            yield pytest.param(op, case, "cpu", id=f"{ident}-cpu")
            if not case.needs_data:
                yield pytest.param(op, case, "meta", id=f"{ident}-meta")
                yield cuda_param(op, case, "cuda", id=f"{ident}-cuda")


def call(op, args):
    return getattr(torch.ops.wgrad, op)(*(args[name] for name in ARG_ORDER[op]))


@pytest.mark.parametrize("op, case, device", list(_params()))
def test_bad_input_rejected_and_out_untouched(op, case, device):
    args = GOOD[op](device)
    args.update(case.change(device, args))
    out = args["out"]
    before = None if device == "meta" else bits(out)
    with pytest.raises(RuntimeError, match=case.match):
        call(op, args)
    if before is not None:
        assert torch.equal(bits(out), before), "a rejected call wrote to out"


@pytest.mark.parametrize("device", ["cpu", "meta", cuda_param("cuda", id="cuda")])
@pytest.mark.parametrize("op", list(CASES))
def test_good_inputs_accepted(op, device):
    """The inputs every case starts from are valid, so each case fails for the one reason it names."""
    call(op, GOOD[op](device))


# Arguments a device mismatch can be put on, per op.
TENSOR_ARGS = {DENSE: ("a", "sa", "b", "sb"), PACKED: ("a", "sa", "b", "sb"), CONTIG: ("a", "sa", "b", "sb", "ks"),
               DENSE_BF16: ("a", "sa", "b", "sb"), CONTIG_BF16: ("a", "sa", "b", "sb", "ks")}


def _device_params():
    for op, names in TENSOR_ARGS.items():
        for name in names:
            # meta: out on meta and one argument on the CPU reaches the fake kernel (Meta wins dispatch).
            yield pytest.param(op, name, "meta", "cpu", id=f"{SHORT[op]}-{name}-cpu-vs-meta-out")
            yield pytest.param(op, name, "cpu", "meta", id=f"{SHORT[op]}-{name}-meta-vs-cpu-out")
            yield cuda_param(op, name, "cuda", "cpu", id=f"{SHORT[op]}-{name}-cpu-vs-cuda-out")


@pytest.mark.parametrize("op, name, out_device, arg_device", list(_device_params()))
def test_device_mismatch_rejected(op, name, out_device, arg_device):
    args = GOOD[op](out_device)
    args[name] = GOOD[op](arg_device)[name]
    out = args["out"]
    before = None if out_device == "meta" else bits(out)
    with pytest.raises(RuntimeError, match=rf"{name} must be on {out_device}(:\d+)? like out, got {arg_device}"):
        call(op, args)
    if before is not None:
        assert torch.equal(bits(out), before)


@pytest.mark.parametrize("op", [CONTIG, CONTIG_BF16])
@pytest.mark.parametrize("case", [cuda_param(c, id=c.name) for c in CONTIG_CASES if c.needs_data])
def test_cuda_invalid_device_sizes_leave_out_untouched(case, op):
    """Sizes that only the kernel can read: no error, no host synchronisation, out bitwise as it was."""
    args = GOOD[op]("cuda")
    args.update(case.change("cuda", args))
    out = args["out"]
    before = bits(out)
    call(op, args)
    torch.cuda.synchronize()
    assert torch.equal(bits(out), before)


# ------------------------------------------------------------------ the Python entry points ---------
# Arguments the Python functions (wgrad.*) read themselves before calling an op: a value that is not what
# the op takes raises ValueError naming the argument, the expected and the actual value, and nothing is
# written. Before, `int()` truncated float sizes and pad, an int64 size outside int32 wrapped into
# another size, a negative K counted no blocks, and a tensor of the wrong rank failed on a scale shape
# or with an IndexError.

X_SEG = torch.randn(300, 256, dtype=torch.bfloat16)  # R = 300 rows in segments, C = 256
SEG = wgrad.quantize_fp8_1x128_colwise_segments
PADDED = wgrad.quantize_fp8_1x128_colwise_segments_padded


def _packed_api_args():
    args = good_packed("cpu")
    return (args["a"], args["sa"]), (args["b"], args["sb"]), args["out"]


@pytest.mark.parametrize("bad, shown", [(128.9, r"128\.9 \(float\)"), (144.0, r"144\.0 \(float\)"),
                                        (True, r"True \(bool\)"), ("144", r"'144' \(str\)"),
                                        (torch.tensor(144.0), r"tensor\(144\.\) \(Tensor\)")])
def test_packed_api_rejects_non_integer_batch_sizes(bad, shown):
    lhs, rhs, out = _packed_api_args()
    before = bits(out)
    with pytest.raises(ValueError, match=rf"batch_sizes\[0\] must be an integer, got {shown}"):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, [bad] + KS_PACKED[1:], c=torch.zeros_like(out))
    assert torch.equal(bits(out), before)


def test_packed_api_takes_integer_scalars_as_they_are():
    lhs, rhs, out = _packed_api_args()
    expected = out.clone()
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, expected, KS_PACKED)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, [torch.tensor(k) for k in KS_PACKED])
    assert torch.equal(bits(out), bits(expected))


@pytest.mark.parametrize("cast", [SEG, PADDED], ids=["segments", "padded"])
@pytest.mark.parametrize("sizes, match", [
    ([128.9, 171.1], r"sizes\[0\] must be an integer, got 128\.9 \(float\)"),
    ([100, True, 199], r"sizes\[1\] must be an integer, got True \(bool\)"),
    ([2**32 + 100, 300 - 2**32 - 100], r"sizes\[0\] must fit in int32 \(-2\^31 \.\. 2\^31 - 1\), got 4294967396"),
    (torch.tensor([100, 2**32 + 200]), r"sizes\[1\] must fit in int32 \(-2\^31 \.\. 2\^31 - 1\), got 4294967496"),
    (torch.tensor([-2**31 - 1, 300]), r"sizes\[0\] must fit in int32 \(-2\^31 \.\. 2\^31 - 1\), got -2147483649"),
    (torch.tensor([100.0, 200.0]), r"sizes must hold integers \(int32 on x's device\), got torch\.float32"),
], ids=["float", "bool", "list-over-int32", "int64-over-int32", "int64-under-int32", "float-tensor"])
def test_segment_casts_reject_sizes_that_are_not_int32_integers(cast, sizes, match):
    with pytest.raises(ValueError, match=match):
        cast(X_SEG, sizes)


def test_segment_sizes_of_any_integer_dtype_in_range_are_taken():
    expected = SEG(X_SEG, torch.tensor([100, 200], dtype=torch.int32))
    for sizes in ([100, 200], torch.tensor([100, 200]), torch.tensor([100, 200], dtype=torch.int16),
                  [torch.tensor(100), 200]):
        for got, want in zip(SEG(X_SEG, sizes), expected):
            assert torch.equal(bits(got), bits(want))


def test_sizes_outside_int32_become_invalid_where_they_cannot_be_read(monkeypatch):
    # On a CUDA tensor (or while torch.compile traces) reading the sizes would synchronise: a size outside
    # int32 becomes -1 on the device, an invalid size, never a wrapped valid one (2^32 + 100 is not 100).
    from wgrad.quant import _sizes_tensor

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    sizes = torch.tensor([2**32 + 100, 100, -2**31, 2**31 - 1, 2**31, -2**31 - 1, 2**63 - 1])
    got = _sizes_tensor(sizes, "cpu")
    assert got.dtype == torch.int32 and got.tolist() == [-1, 100, -2**31, 2**31 - 1, -1, -1, -1]


def test_cuda_int64_sizes_outside_int32_give_nan_scales(sm90):
    x = X_SEG.to(sm90)
    q_t, scales_t = SEG(x, torch.tensor([2**32 + 100, 300 - 100], device=sm90))  # would wrap to [100, 200]
    assert torch.isnan(scales_t).all(), "an out-of-range size is invalid, like a negative one"


@pytest.mark.parametrize("pad, shown", [(32.5, r"32\.5 \(float\)"), (32.0, r"32\.0 \(float\)"),
                                        (True, r"True \(bool\)"), ("32", r"'32' \(str\)")])
def test_padded_cast_rejects_a_non_integer_pad(pad, shown):
    with pytest.raises(ValueError, match=rf"pad must be an integer \(16, 32, 64 or 128\), got {shown}"):
        PADDED(X_SEG, [100, 200], pad=pad)


@pytest.mark.parametrize("sizes, k_total, match", [
    (torch.tensor([16.0, 32.0]), 48, r"group_sizes must hold integers \(an int32 tensor\), got torch\.float32"),
    (torch.tensor([True, False]), 1, r"group_sizes must hold integers \(an int32 tensor\), got torch\.bool"),
    ([16, 32.5], 48, r"group_sizes\[1\] must be an integer, got 32\.5 \(float\)"),
    (torch.tensor([16, 32], dtype=torch.int32), 48.0, r"k_total must be an integer, got 48\.0 \(float\)"),
])
def test_check_group_sizes_rejects_non_integers(sizes, k_total, match):
    with pytest.raises(ValueError, match=match):
        wgrad.check_group_sizes(sizes, k_total)


def test_check_group_sizes_takes_a_list_of_ints():
    wgrad.check_group_sizes([16, 0, 32], 48)
    with pytest.raises(ValueError, match=r"group_sizes\[1\] must be >= 0, got -16"):
        wgrad.check_group_sizes([16, -16, 48], 48)


@pytest.mark.parametrize("call, match", [
    (lambda: wgrad.num_k_blocks(-1), r"k must be >= 0, got -1"),
    (lambda: wgrad.k_block_capacity(-128, 2), r"k_total must be >= 0, got -128"),
    (lambda: wgrad.k_block_capacity(256, -1), r"groups must be >= 0, got -1"),
])
def test_block_counts_reject_negative_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_block_counts_of_valid_arguments():
    assert [wgrad.num_k_blocks(k) for k in (0, 1, 128, 129)] == [0, 1, 1, 2]
    assert wgrad.k_block_capacity(0, 0) == 0 and wgrad.k_block_capacity(0, 3) == 2
    assert wgrad.k_block_capacity(160, 3) == 4


def _dense_api_call(a=None, b=None):
    args = good_dense("cpu")
    out = args["out"]
    before = bits(out)
    a = args["a"] if a is None else a
    b = args["b"] if b is None else b
    return lambda: wgrad.wgrad_gemm_fp8_fp8_fp32_nt((a, args["sa"]), (b, args["sb"]), out), out, before


@pytest.mark.parametrize("which, bad, match", [
    ("a", fp8(2 * M, K_DENSE, "cpu").view(2, M, K_DENSE), r"a must be 2-D \[M, K\], got 3-D shape \[2, 33, 144\]"),
    ("a", fp8(1, 1, "cpu").reshape(()), r"a must be 2-D \[M, K\], got 0-D shape \[\]"),
    ("b", fp8_flat(N * K_DENSE, "cpu"), r"b must be 2-D \[N, K\], got 1-D shape \[3456\]"),
    ("b", fp8(1, 1, "cpu").reshape(()), r"b must be 2-D \[N, K\], got 0-D shape \[\]"),
])
def test_dense_api_names_the_rank_of_a_and_b(which, bad, match):
    run, out, before = _dense_api_call(**{which: bad})
    with pytest.raises(ValueError, match=match):
        run()
    assert torch.equal(bits(out), before)


@pytest.mark.parametrize("which, bad, match", [
    ("a", fp8(M, 160, "cpu").unsqueeze(0), r"a must be 2-D \[M, K_total\], got 3-D shape \[1, 33, 160\]"),
    ("b", fp8(1, 1, "cpu").reshape(()), r"b must be 2-D \[N, K_total\], got 0-D shape \[\]"),
])
def test_contiguous_api_names_the_rank_of_a_and_b(which, bad, match):
    args = good_contig("cpu")
    args[which] = bad
    out = args["out"]
    before = bits(out)
    with pytest.raises(ValueError, match=match):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((args["a"], args["sa"]), (args["b"], args["sb"]),
                                                               out, args["ks"])
    assert torch.equal(bits(out), before)


@pytest.mark.parametrize("out_shape, shown", [((5,), r"1-D shape \[5\]"), ((), r"0-D shape \[\]"),
                                              ((M, N), r"2-D shape \[33, 24\]")])
def test_packed_api_names_the_rank_of_out(out_shape, shown):
    lhs, rhs, _ = _packed_api_args()
    out = torch.randn(out_shape)
    before = bits(out)
    with pytest.raises(ValueError, match=rf"out must be 3-D \[G, M, N\], got {shown}"):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, KS_PACKED)
    assert torch.equal(bits(out), before)
def _in_out_storage(op, name, device, overlap):
    """The good inputs of `op` with `name` moved into out's storage: 16 bytes into out's span (overlap), or
    past its end (apart: one storage, no shared byte). The values are the good ones."""
    args = GOOD[op](device)
    out, t = args["out"], args[name]

    def span(x):
        return (sum((s - 1) * st for s, st in zip(x.shape, x.stride())) + 1) * x.element_size()

    out_bytes = (span(out) + 15) // 16 * 16
    buf = torch.zeros(out_bytes + span(t) + 32, dtype=torch.uint8, device=device)
    args["out"] = buf.view(out.dtype).as_strided(out.shape, out.stride(), 0)
    args[name] = buf.view(t.dtype).as_strided(t.shape, t.stride(), (16 if overlap else out_bytes) // t.element_size())
    if device != "meta":
        args["out"].copy_(out)
        args[name].copy_(t)
    return args


def _overlap_params():
    for op, names in TENSOR_ARGS.items():
        for name in names:
            for device in ("cpu", "meta"):
                yield pytest.param(op, name, device, id=f"{SHORT[op]}-{name}-{device}")
            yield cuda_param(op, name, "cuda", id=f"{SHORT[op]}-{name}-cuda")


@pytest.mark.parametrize("op, name, device", list(_overlap_params()))
def test_out_overlapping_an_input_rejected(op, name, device):
    """The kernels write out while they read every other tensor argument: out sharing memory with one of
    them is rejected (C++ checks and fake kernels alike), out untouched; the same storage without a shared
    byte is accepted."""
    args = _in_out_storage(op, name, device, overlap=True)
    out = args["out"]
    before = None if device == "meta" else bits(out)
    with pytest.raises(RuntimeError, match=rf"{op}: out must not overlap {name} in memory"):
        call(op, args)
    if before is not None:
        assert torch.equal(bits(out), before), "a rejected call wrote to out"
    call(op, _in_out_storage(op, name, device, overlap=False))
