"""The dense op `wgrad_gemm_fp8_fp8_fp32_nt` and its Python API.

CPU: the reference-math kernel against an independent float64 evaluation of the contract's formula,
accumulation, K == 0, opcheck, the fake kernel, the API's scale-layout conversions and DeepGEMM's `c`.
GPU (SM90 only): the SM90 kernel against the float64 reference with a relative error <= 2e-4, out
poisoned around a strided window, accumulation, NaN propagation, bitwise determinism.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import wgrad
from helpers import (
    GPU_MARKS,
    assert_fp32_of,
    bits,
    blockwise_reference,
    make_dense,
    new_out,
    poisoned_out,
    poisoned_window_mask,
    rand_fp8,
    rand_scales,
    record_calls,
    rel_frobenius,
)
from wgrad import reference

OP = torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt

# Accuracy bar of the SM90 kernel against the float64 product of the dequantized operands:
# Hopper's FP8 tensor cores do not accumulate in full fp32 within a 128-wide K block; the two published
# FP8 anchors reach ~1.3e-4 on random normal data.
GPU_REL_TOL = 2e-4

CPU_MN = [1, 7, 33, 129, 1000]
CPU_K = [0, 16, 112, 128, 1008]

# ------------------------------------------------------------------ CPU -----------------------------


@pytest.mark.parametrize("k", CPU_K)
@pytest.mark.parametrize("m, n", list(itertools.product(CPU_MN, CPU_MN)))
def test_cpu_matches_blockwise_reference(m, n, k):
    op = make_dense(m, n, k, seed=m * 7919 + n * 31 + k)
    out = new_out(m, n, randn=True)
    expected = out.double() + blockwise_reference(*op.args())
    OP(*op.args(), out)
    assert_fp32_of(out, expected)


@pytest.mark.parametrize("m, n, k", [(1, 1, 16), (33, 129, 1008), (7, 1000, 112), (129, 7, 144)])
def test_reference_forms_agree(m, n, k):
    """wgrad.reference (dequantize, then one product) equals the contract's block-by-block formula."""
    op = make_dense(m, n, k, seed=k)
    ref = reference.wgrad_gemm_reference(*op.args())
    # Both are float64 sums of the same exact fp8 x fp32 terms in different orders.
    torch.testing.assert_close(ref, blockwise_reference(*op.args()), rtol=1e-12, atol=1e-12 * ref.abs().max().item())


def test_cpu_accumulate_twice_gives_twice():
    op = make_dense(129, 33, 1008, seed=3)
    out = new_out(129, 33)
    OP(*op.args(), out)
    once = out.clone()
    OP(*op.args(), out)
    # fp32(x + P) with x = fp32(P) is the float32 nearest to 2P (up to a tie): at most one ulp from 2x.
    torch.testing.assert_close(out, 2 * once, rtol=2.0**-23, atol=0)
    assert once.abs().max() > 0


def test_cpu_k_zero_leaves_out_bitwise_untouched():
    op = make_dense(33, 24, 0)
    out = torch.randn(33, 24)
    out[0, 0], out[1, 1], out[2, 2] = float("nan"), -0.0, float("inf")
    before = bits(out)
    OP(*op.args(), out)
    assert torch.equal(bits(out), before)


def test_cpu_inputs_are_not_mutated():
    """What opcheck's test_schema would check (it cannot compare float8 tensors on the CPU): only out,
    the one mutable argument, changes."""
    op = make_dense(33, 24, 272, seed=5)
    before = [bits(t) for t in op.args()]
    out = torch.zeros(33, 24)
    OP(*op.args(), out)
    assert all(torch.equal(bits(t), b) for t, b in zip(op.args(), before))
    assert out.abs().sum() > 0


# opcheck's test_schema compares the float8 inputs with allclose, which has no CPU float8 kernel; the
# "no mutation of inputs" part of it is test_cpu_inputs_are_not_mutated. Shapes have M, N multiples of 4
# and K of 16 because aot_dispatch clones the inputs densely (it drops the padding of a strided layout).
OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("m, n, k", [(36, 24, 144), (4, 8, 0), (128, 4, 1008)])
def test_opcheck(m, n, k):
    op = make_dense(m, n, k, seed=1)
    torch.library.opcheck(OP, (*op.args(), torch.zeros(m, n)), test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("m, n, k", [(33, 24, 144), (1, 1, 16), (4097, 129, 8208), (8, 8, 0)])
def test_fake_kernel_on_meta(m, n, k):
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="meta")
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta")
    sa = wgrad.empty_mn_major_scales(m, wgrad.num_k_blocks(k), device="meta")
    sb = wgrad.empty_mn_major_scales(n, wgrad.num_k_blocks(k), device="meta")
    out = new_out(m, n, device="meta")
    assert OP(a, sa, b, sb, out) is None
    assert out.device.type == "meta" and out.shape == (m, n)


def test_fake_kernel_under_torch_compile():
    """The op traces into one graph (fake kernel, functionalised mutation of out) and runs correctly."""
    op = make_dense(36, 24, 272, seed=9)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(a, sa, b, sb, out):
        OP(a, sa, b, sb, out)
        return out * 2

    out = torch.zeros(36, 24)
    doubled = step(*op.args(), out)
    ref = blockwise_reference(*op.args())
    assert_fp32_of(out, ref)
    assert_fp32_of(doubled, 2 * out.double())


def test_python_function_with_c_under_torch_compile():
    """wgrad_gemm_fp8_fp8_fp32_nt's c (DeepGEMM's d = c + a @ b^T) in one compiled graph: a distinct c, and
    c given as out itself; a rejected call raises while traced and leaves out untouched."""
    op = make_dense(36, 24, 272, seed=11)
    a, sa, b, sb = op.args()

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(a, sa, b, sb, out, c):
        wgrad.wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out, c)
        return out

    c = torch.randn(36, 24, generator=torch.Generator().manual_seed(3))
    ref = blockwise_reference(a, sa, b, sb)
    out = torch.zeros(36, 24)
    step(a, sa, b, sb, out, c)
    assert_fp32_of(out, c.double() + ref)
    out = c.clone()
    step(a, sa, b, sb, out, out)
    assert_fp32_of(out, c.double() + ref)
    bad = torch.zeros(36, 136, dtype=torch.uint8).view(torch.float8_e4m3fn)  # K = 136: not a multiple of 16
    sbad = wgrad.empty_mn_major_scales(36, 2)
    out = torch.full((36, 24), 7.0)
    with pytest.raises(Exception, match="K must be a multiple of 16"):
        step(bad, sbad, bad[:24], sbad[:24], out, c)
    assert bool((out == 7.0).all()), "a rejected call leaves out untouched"


# ---- Python API ------------------------------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch):
    """Records the arguments of every call the API makes of the op that runs (and still runs it): the op as
    the entry point hands it its arguments as they are (wgrad.api._DENSE_FP32), and through torch.ops after
    converting them."""
    calls = record_calls(monkeypatch, wgrad.api, "_DENSE_FP32")
    return record_calls(monkeypatch, torch.ops.wgrad, "wgrad_gemm_fp8_fp8_fp32_nt", calls)


def _api_case(m=33, n=24, k=272):
    op = make_dense(m, n, k, seed=11)
    return op, blockwise_reference(*op.args())


def test_api_mn_major_scales_pass_through_without_copy(spy):
    op, ref = _api_case()
    out = torch.zeros(33, 24)
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb), out)
    (_, sa, _, sb, _), = spy
    assert (sa.data_ptr(), sa.stride()) == (op.sa.data_ptr(), op.sa.stride())
    assert (sb.data_ptr(), sb.stride()) == (op.sb.data_ptr(), op.sb.stride())
    assert_fp32_of(out, ref)


def test_api_kb_by_mn_view_passes_through_without_copy(spy):
    op, ref = _api_case()
    sa_t, sb_t = op.sa.t(), op.sb.t()  # [kb, mn] with 16-byte aligned rows
    out = torch.zeros(33, 24)
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, sa_t), (op.b, sb_t), out)
    (_, sa, _, sb, _), = spy
    assert sa.data_ptr() == op.sa.data_ptr() and sa.shape == (33, 3) and sa.stride() == (1, 36)
    assert sb.data_ptr() == op.sb.data_ptr() and sb.shape == (24, 3)
    assert_fp32_of(out, ref)


@pytest.mark.parametrize("layout", ["k_major", "kb_mn_unaligned_rows"])
def test_api_other_scale_layouts_are_copied_and_correct(spy, layout):
    op, ref = _api_case()
    if layout == "k_major":  # row-major [mn, kb]
        sa_in, sb_in = op.sa.contiguous(), op.sb.contiguous()
    else:  # dense [kb, mn]: rows of 33 floats are not 16-byte aligned
        sa_in, sb_in = op.sa.t().contiguous(), op.sb.t().contiguous()
    out = torch.zeros(33, 24)
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, sa_in), (op.b, sb_in), out)
    (_, sa, _, _, _), = spy
    assert sa.data_ptr() != sa_in.data_ptr() and sa.stride() == (1, 36)
    assert_fp32_of(out, ref)


def test_api_dense_kb_by_mn_with_aligned_rows_is_not_copied(spy):
    op, ref = _api_case(m=32)
    sa_in = op.sa.t().contiguous()  # [kb, 32]: already the MN-major layout with ld = 32
    out = torch.zeros(32, 24)
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, sa_in), (op.b, op.sb), out)
    (_, sa, _, _, _), = spy
    assert sa.data_ptr() == sa_in.data_ptr()
    assert_fp32_of(out, ref)


@pytest.mark.parametrize("bad, match", [
    (lambda s: s[:, :2], r"sa must have shape \[33, 3\] or \[3, 33\]"),
    (lambda s: s.double(), r"sa must be float32"),
    (lambda s: s.reshape(-1), r"sa must be 2-D"),
    (lambda s: s[0, 0], r"sa must be 2-D"),
])
def test_api_rejects_scales_it_cannot_convert(bad, match):
    op, _ = _api_case()
    out = torch.zeros(33, 24)
    before = bits(out)
    with pytest.raises(ValueError, match=match):
        wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, bad(op.sa)), (op.b, op.sb), out)
    assert torch.equal(bits(out), before)


@pytest.mark.parametrize("entry", ["dense_bf16", "contiguous_fp32", "contiguous_bf16"])
def test_api_hands_mn_major_arguments_to_the_op_as_they_are(monkeypatch, entry):
    """With the scales MN-major (what the casts write) the entry points call their op once on the very
    objects given (no conversion in Python, every check in the op), and give the op's result."""
    name = {"dense_bf16": "_DENSE_BF16", "contiguous_fp32": "_CONTIG_FP32", "contiguous_bf16": "_CONTIG_BF16"}[entry]
    calls = record_calls(monkeypatch, wgrad.api, name)
    op, ref = _api_case()  # K = 272: one group of 272 tokens has the scale columns of the dense call
    lhs, rhs, sizes = (op.a, op.sa), (op.b, op.sb), torch.tensor([272], dtype=torch.int32)
    if entry == "dense_bf16":
        out = torch.empty(33, 24, dtype=torch.bfloat16)
        assert wgrad.wgrad_gemm_fp8_fp8_bf16_nt(lhs, rhs, out) is out
    elif entry == "contiguous_fp32":
        out = torch.zeros(1, 33, 24)
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(lhs, rhs, out, sizes)
    else:
        out = torch.empty(1, 33, 24, dtype=torch.bfloat16)
        assert wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, sizes, out) is out
    (args,) = calls
    assert args[0] is op.a and args[1] is op.sa and args[2] is op.b and args[3] is op.sb and args[4] is out
    got = out.float().reshape(ref.shape).double()
    assert torch.allclose(got, ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


def test_api_c_argument_deepgemm_style():
    """d = c + a @ b^T: a separate c is copied into out first; c aliasing out (or None) accumulates."""
    op, ref = _api_case()
    c = torch.randn(33, 24)
    out = torch.full((33, 24), float("nan"))
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb), out, c=c)
    assert_fp32_of(out, c.double() + ref)

    acc = c.clone()
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb), acc, c=acc)
    assert torch.equal(acc, out)
    acc2 = c.clone()
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb), acc2)
    assert torch.equal(acc2, out)


def test_api_rejected_call_with_c_leaves_out_untouched():
    """A call the op rejects must not have copied c into out first."""
    op, _ = _api_case()
    out = torch.randn(33, 24)
    before = bits(out)
    bad_b = op.b.t().contiguous().t()  # not K-contiguous: the API passes it on, the op rejects it
    with pytest.raises(RuntimeError, match="b must be K-contiguous"):
        wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (bad_b, op.sb), out, c=torch.zeros(33, 24))
    assert torch.equal(bits(out), before)


# ------------------------------------------------------------------ GPU (SM90) ----------------------

GPU_MN = [1, 8, 33, 100, 127, 129, 255, 1000, 4097]
GPU_K = [16, 112, 128, 144, 1008, 4096, 8208]

# The benchmark's dense seed shapes (M, N, K; wgrad.bench.shapes).
SEED_SHAPES = [
    (m, n, k)
    for k in (4096, 8192)
    for m, n in ((7168, 2112), (1536, 24576), (512, 32768), (16384, 7168), (7168, 4096), (2048, 7168))
]


# The relative Frobenius bar is a statement about a whole matrix: on a handful of outputs one
# cancelling sum dominates it (seen: 6.3e-4 at 1 x 8 x 144, where the FP8 tensor cores' narrower-than-fp32
# accumulation between promotions is the whole error). Below this many outputs every element is held
# to the accumulation-error bound instead: |out - ref| <= GPU_ABS_REL_TOL * sum_k |a_k sa| |b_k sb|,
# which any wrong block, scale or index breaks by orders of magnitude.
FROBENIUS_MIN_OUTPUTS = 1024
GPU_ABS_REL_TOL = 1e-3  # ~8 units of the tensor cores' 2^-13 accumulation step; a missing 16-column block is ~1e-1


def _gpu_check_accuracy(m, n, k, seed):
    op = make_dense(m, n, k, device="cuda", seed=seed)
    out = new_out(m, n, device="cuda")
    OP(*op.args(), out)
    ref = reference.wgrad_gemm_reference(*op.args())
    if m * n >= FROBENIUS_MIN_OUTPUTS or k == 0:
        err = rel_frobenius(out, ref)
        assert err <= GPU_REL_TOL, f"rel. Frobenius error {err:.3e} at M={m} N={n} K={k}"
    else:
        a, sa, b, sb = op.args()
        magnitude = reference.wgrad_gemm_reference(a.float().abs().to(a.dtype), sa.abs(), b.float().abs().to(b.dtype), sb.abs())
        worst = ((out.double() - ref).abs() / magnitude.clamp_min(1e-300)).max().item()
        assert worst <= GPU_ABS_REL_TOL, f"elementwise error / magnitude {worst:.3e} at M={m} N={n} K={k}"


@pytest.mark.parametrize("k", GPU_K)
@pytest.mark.parametrize("m, n", [pytest.param(m, n, marks=GPU_MARKS) for m, n in itertools.product(GPU_MN, GPU_MN)])
def test_gpu_accuracy_awkward_shapes(m, n, k):
    _gpu_check_accuracy(m, n, k, seed=m * 7919 + n * 31 + k)


@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS) for s in SEED_SHAPES])
def test_gpu_accuracy_seed_shapes(m, n, k):
    _gpu_check_accuracy(m, n, k, seed=k)


@pytest.mark.parametrize("block_n", [128, 144, 160])
@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS)
                                     for s in [(129, 4097, 1008), (255, 1000, 144), (33, 331, 8208)]])
def test_gpu_every_tile_width(monkeypatch, block_n, m, n, k):
    """WGRAD_BLOCK_N (a knob of the release build, csrc/common/knobs.h) reaches every kernel instance,
    whatever the heuristic would pick: each must be right on partial tiles and a ragged right edge
    (N % 4 != 0)."""
    monkeypatch.setenv("WGRAD_BLOCK_N", str(block_n))
    _gpu_check_accuracy(m, n, k, seed=block_n + m)


@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS) for s in [(129, 4097, 1008), (7168, 2112, 4096)]])
def test_gpu_measurement_knob_has_no_effect_in_a_release_build(monkeypatch, m, n, k):
    """WGRAD_DIAG (every bit set: no promotion, no epilogue, ...) is read only by a measurement build
    (WGRAD_DIAG_VARIANTS=1, csrc/common/knobs.h): the extension under test must ignore it. (Run on a
    measurement build, this test fails, as it should: such a build is not for shipping.)"""
    monkeypatch.setenv("WGRAD_DIAG", "127")
    _gpu_check_accuracy(m, n, k, seed=m + k)


@pytest.mark.parametrize("m, n", [pytest.param(m, n, marks=GPU_MARKS) for m, n in [(1, 1), (33, 129), (4097, 255)]])
def test_gpu_k_zero_leaves_out_bitwise_untouched(m, n):
    op = make_dense(m, n, 0, device="cuda")
    out = new_out(m, n, device="cuda", randn=True)
    out[0, 0] = float("nan")
    before = bits(out)
    OP(*op.args(), out)
    torch.cuda.synchronize()
    assert torch.equal(bits(out), before)


@pytest.mark.parametrize("m, n, k", [
    pytest.param(*s, marks=GPU_MARKS) for s in [(1, 1, 16), (33, 100, 144), (129, 255, 1008), (1000, 4097, 4096)]
])
def test_gpu_poisoned_out_window(m, n, k):
    """out is a window of a NaN-filled buffer (row stride > N); a and b rows are padded with NaN bytes;
    scale padding holds NaN. Only the window changes, and it holds the right values."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = rand_fp8(m, k, device="cuda", gen=gen, row_stride=k + 32)
    b = rand_fp8(n, k, device="cuda", gen=gen, row_stride=k + 16)
    sa = rand_scales(m, wgrad.num_k_blocks(k), device="cuda", gen=gen)
    sb = rand_scales(n, wgrad.num_k_blocks(k), device="cuda", gen=gen)
    buf, out = poisoned_out((m, n), device="cuda")
    assert out.stride(0) > n and out.stride(0) % 4 == 0
    before = bits(buf)
    OP(a, sa, b, sb, out)
    window = poisoned_window_mask(buf, out)
    assert torch.equal(bits(buf)[~window], before[~window]), "wrote outside the out window"
    assert rel_frobenius(out, reference.wgrad_gemm_reference(a, sa, b, sb)) <= GPU_REL_TOL


@pytest.mark.parametrize("m, n", [pytest.param(m, n, marks=GPU_MARKS) for m, n in [(129, 255), (1000, 4097)]])
def test_gpu_same_addresses_in_other_shapes(m, n):
    """Views of the same buffers with another K, row stride or width start at the same addresses: each call,
    first or repeated, must read and write with descriptors of its own shapes (nothing may be reused by
    address alone, decision 0043)."""
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    k_max, pad = 1008, 48
    a_buf = torch.randn(m * (k_max + pad), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    b_buf = torch.randn(n * (k_max + pad), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    sa_all = rand_scales(m, wgrad.num_k_blocks(k_max), device="cuda", gen=gen)
    sb_all = rand_scales(n, wgrad.num_k_blocks(k_max), device="cuda", gen=gen)
    n4 = wgrad.align_up(n, 4)  # out rows are 16-byte aligned
    out_buf = torch.empty(m * (n4 + 8), device="cuda")

    def call(k, a_ld, b_ld, width, out_ld):
        a = a_buf[: m * a_ld].view(m, a_ld)[:, :k]
        b = b_buf[: n * b_ld].view(n, b_ld)[:, :k]
        kb = wgrad.num_k_blocks(k)
        out = out_buf[: m * out_ld].view(m, out_ld)[:, :width]
        out.fill_(0.0)
        OP(a, sa_all[:, :kb], b[:width], sb_all[:width, :kb], out)
        ref = reference.wgrad_gemm_reference(a, sa_all[:, :kb], b[:width], sb_all[:width, :kb])
        err = rel_frobenius(out, ref)
        assert err <= GPU_REL_TOL, f"K={k} a_ld={a_ld} b_ld={b_ld} width={width} out_ld={out_ld}: {err:.3e}"

    shapes = [(k_max, k_max + pad, k_max + pad, n, n4 + 8), (144, 144, 144, n, n4 + 8),
              (k_max, k_max, k_max + pad, n, n4), (144, k_max + pad, 144, n - 4, n4 + 8),
              (k_max, k_max + pad, k_max, n - 4, n4 - 4)]
    for _ in range(2):
        for shape in shapes:
            call(*shape)


@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS) for s in [(33, 129, 1008), (1000, 4097, 4096)]])
def test_gpu_accumulate_twice_gives_twice(m, n, k):
    op = make_dense(m, n, k, device="cuda", seed=2)
    out = new_out(m, n, device="cuda")
    OP(*op.args(), out)
    once = out.clone()
    OP(*op.args(), out)
    # One fp32 product added per element: 0 + P, then P + P == 2P exactly. A kernel that split K into
    # several fp32 partial sums would round each addition: a few ulp, still far below any real error.
    torch.testing.assert_close(out, 2 * once, rtol=4 * 2.0**-23, atol=1e-30)
    assert once.abs().max() > 0


@pytest.mark.parametrize("operand", [pytest.param(x, marks=GPU_MARKS) for x in ["a", "b"]])
def test_gpu_nan_reaches_only_its_row(operand):
    """A NaN in row r of a reaches only row r of out (column r for b): nothing leaks across tiles."""
    m, n, k, r = 300, 200, 1008, 130
    op = make_dense(m, n, k, device="cuda", seed=4)
    getattr(op, operand).view(torch.uint8)[r, 517] = 0x7F  # e4m3fn NaN
    out = new_out(m, n, device="cuda")
    OP(*op.args(), out)
    nan = torch.isnan(out)
    if operand == "a":
        assert nan[r].all() and nan.sum() == n
    else:
        assert nan[:, r].all() and nan.sum() == m
    ref = reference.wgrad_gemm_reference(*op.args())
    keep = ~torch.isnan(ref)
    assert rel_frobenius(out[keep], ref[keep]) <= GPU_REL_TOL


@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS) for s in [(129, 255, 8208), (7168, 2112, 4096)]])
def test_gpu_bitwise_deterministic(m, n, k):
    op = make_dense(m, n, k, device="cuda", seed=6)
    results = []
    for _ in range(3):
        out = new_out(m, n, device="cuda")
        OP(*op.args(), out)
        results.append(bits(out))
    assert all(torch.equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("layout", [pytest.param(x, marks=GPU_MARKS) for x in ["mn_major", "kb_mn_view", "k_major"]])
def test_gpu_api_scale_layouts(layout):
    op = make_dense(129, 255, 1008, device="cuda", seed=8)
    sa = {"mn_major": op.sa, "kb_mn_view": op.sa.t(), "k_major": op.sa.contiguous()}[layout]
    out = new_out(129, 255, device="cuda")
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((op.a, sa), (op.b, op.sb), out)
    assert rel_frobenius(out, reference.wgrad_gemm_reference(*op.args())) <= GPU_REL_TOL
