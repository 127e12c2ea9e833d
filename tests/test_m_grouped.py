"""m_grouped_gemm_fp8_fp8_bf16_nt_contiguous: the expert GEMM of MoE fprop and dgrad (bf16 out, rows of a
grouped by expert, group sizes on the device).

CPU: the reference against an independent float64 computation block by block, the dgrad form (a
transposed, strided b), the argument checks on the CPU and on meta tensors (the fake kernel), opcheck.
GPU: the kernel against the float64 product on awkward shapes (empty groups, groups ending inside a
128-row tile, K and N not multiples of 128) into NaN-poisoned out, bitwise against itself (deterministic,
the strided dgrad form), invalid sizes leaving out untouched, and CUDA-graph replay with new sizes.
"""

from __future__ import annotations

import math

import pytest
import torch

import wgrad
from helpers import FP8, bits, capture_graph, generator, gpu, rand_fp8, rand_scales, rand_scale_values, rel_frobenius
from test_gemm import OPCHECK_UTILS

OP = torch.ops.wgrad.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous


def _operands(sizes, n, k, *, device="cpu", seed=0, row_stride=None):
    """a [T, K] with 1x128 scales (made on `device`: a moved copy would lose the padded layouts), b [G, N, K]
    with 128x128 block scales, group sizes int32 [G]."""
    g = generator(device, seed)
    t = sum(sizes)
    a = rand_fp8(t, k, device=device, gen=g, row_stride=row_stride)
    sa = rand_scales(t, math.ceil(k / 128), device=device, gen=g)
    gc = generator("cpu", seed)
    # b's rows padded to 16 elements (the TMA rule), the padding NaN like rand_fp8's.
    b = torch.full((len(sizes), n, -(-k // 16) * 16), float("nan")).to(FP8)
    b[:, :, :k] = torch.randn(len(sizes), n, k, generator=gc).to(FP8)
    b = b.to(device)[:, :, :k]
    sb = rand_scale_values((len(sizes), math.ceil(n / 128), math.ceil(k / 128)), gen=gc).to(device)
    ks = torch.tensor(sizes, dtype=torch.int32, device=device)
    return a, sa, b, sb, ks


def _float64_product(a, sa, b, sb, sizes):
    """Block by block, independently of wgrad.reference: every 1 x 128 piece of a row of a times every
    128 x 128 block of b[g], scaled by the two scales."""
    a, sa, b, sb = a.cpu().double(), sa.cpu().double(), b.cpu().double(), sb.cpu().double()
    t, k = a.shape
    n = b.shape[1]
    out = torch.zeros(t, n, dtype=torch.float64)
    start = 0
    for g, rows in enumerate(sizes):
        for kb in range(math.ceil(k / 128)):
            cols = slice(kb * 128, min(k, kb * 128 + 128))
            part = a[start:start + rows, cols] * sa[start:start + rows, kb:kb + 1]
            for nb in range(math.ceil(n / 128)):
                outs = slice(nb * 128, min(n, nb * 128 + 128))
                out[start:start + rows, outs] += (part @ b[g, outs, cols].t()) * sb[g, nb, kb]
        start += rows
    return out


CPU_CASES = [([3, 0, 5], 16, 16), ([130, 1], 144, 200), ([0, 0, 7], 130, 256)]


@pytest.mark.parametrize("sizes,n,k", CPU_CASES)
def test_cpu_is_the_float64_product_rounded_once(sizes, n, k):
    a, sa, b, sb, ks = _operands(sizes, n, k, seed=n + k)
    out = torch.full((sum(sizes), n), float("nan"), dtype=torch.bfloat16)
    OP(a, sa, b, sb, out, ks)
    assert torch.equal(bits(out), bits(_float64_product(a, sa, b, sb, sizes).to(torch.bfloat16)))


def _transposed_weights(b, sb):
    """The dgrad operands of weights [G, N, K] as the weight cast of the stacked [G * N, K] gives them:
    [G, K, N] views of q_t [K, G * N] and of scales_t (strides (N, G * N, 1))."""
    groups, n, k = b.shape
    q_t = b.reshape(groups * n, k).t().contiguous()           # [K, G * N]
    s_t = sb.reshape(groups * sb.shape[1], sb.shape[2]).t().contiguous()
    return (q_t.view(k, groups, n).permute(1, 0, 2), s_t.view(s_t.shape[0], groups, sb.shape[1]).permute(1, 0, 2))


def test_cpu_dgrad_form_takes_strided_transposed_weights():
    sizes, n, k = [100, 0, 156], 256, 384
    _, _, w, sw, ks = _operands(sizes, k, n, seed=3)  # weights [G, out = k, in = n]: dgrad reduces over out
    g = generator("cpu", 4)
    dy = rand_fp8(sum(sizes), k, gen=g)
    s_dy = rand_scales(sum(sizes), math.ceil(k / 128), gen=g)
    w_t, sw_t = _transposed_weights(w, sw)
    assert w_t.shape == (3, n, k) and not w_t.is_contiguous() and w_t.stride(2) == 1
    out = torch.empty(sum(sizes), n, dtype=torch.bfloat16)
    OP(dy, s_dy, w_t, sw_t, out, ks)
    want = torch.empty_like(out)
    OP(dy, s_dy, w_t.contiguous(), sw_t.contiguous(), want, ks)
    assert torch.equal(bits(out), bits(want))
    assert torch.equal(bits(out), bits(_float64_product(dy, s_dy, w_t, sw_t, sizes).to(torch.bfloat16)))


def test_cpu_inputs_are_not_mutated():
    """What opcheck's test_schema would check (it cannot compare float8 tensors on the CPU)."""
    args = _operands([5, 0, 27], 32, 160, seed=9)
    before = [bits(t) for t in args]
    out = torch.zeros(32, 32, dtype=torch.bfloat16)
    OP(*args[:4], out, args[4])
    assert all(torch.equal(bits(t), b) for t, b in zip(args, before)) and out.abs().sum() > 0


def test_cpu_opcheck():
    # K a multiple of 16 and T of 4: aot_dispatch clones the inputs densely (see test_gemm.OPCHECK_UTILS).
    a, sa, b, sb, ks = _operands([5, 0, 27], 32, 160, seed=9)
    out = torch.zeros(32, 32, dtype=torch.bfloat16)
    torch.library.opcheck(OP, (a, sa, b, sb, out, ks), test_utils=OPCHECK_UTILS)


def _bad_cases():
    """(name, make(args) -> args, message pattern): each changes one argument of a valid call."""
    def swap(i, value):
        return lambda args: args[:i] + (value(args),) + args[i + 1:]
    return [
        ("sizes dtype", swap(5, lambda x: x[5].long()), "group_sizes must be int32"),
        ("sizes sum", swap(5, lambda x: torch.tensor([1, 2], dtype=torch.int32, device=x[5].device)), None),
        ("b rank", swap(2, lambda x: x[2][0]), "b must be 3-D"),
        ("b groups", swap(2, lambda x: x[2][:1]), "b.shape\\[0\\] must equal the number of groups 2"),
        ("b K", swap(2, lambda x: x[2][:, :, :16]), "b must have K = 256 columns like a"),
        ("b dtype", swap(2, lambda x: x[2].to(torch.bfloat16)), "b must be float8_e4m3fn"),
        ("b strides", swap(2, lambda x: x[2].repeat_interleave(2, dim=2)[:, :, ::2]), "b must be K-contiguous"),
        ("sa layout", swap(1, lambda x: x[1].contiguous()), "sa must be MN-major"),
        ("sb shape", swap(3, lambda x: x[3][:, :, :1]), "sb must have shape \\[2, 1, 2\\]"),
        ("sb dtype", swap(3, lambda x: x[3].double()), "sb must be float32"),
        ("out dtype", swap(4, lambda x: x[4].float()), "out must be bfloat16"),
        ("out shape", swap(4, lambda x: x[4][:, :16]), "out must have shape \\[20, 32\\]"),
        ("N odd", lambda x: (x[0], x[1], x[2][:, :31], x[3], x[4][:, :31], x[5]), "N must be even"),
        ("a dtype", swap(0, lambda x: x[0].float()), "a must be float8_e4m3fn"),
    ]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_rejected_and_out_untouched(case, device):
    name, make, pattern = case
    a, sa, b, sb, ks = _operands([7, 13], 32, 256, seed=1)
    out = torch.full((20, 32), 3.0, dtype=torch.bfloat16)
    args = (a, sa, b, sb, out, ks)
    if device == "meta":
        if pattern is None:
            return  # the sizes' values are data: not checked on meta tensors
        args = tuple(x.to("meta") for x in args)  # (dense layouts here: the conversion keeps them)
    args = make(args)
    with pytest.raises(RuntimeError, match=f"m_grouped_gemm_fp8_fp8_bf16_nt_contiguous: {pattern or 'sum'}"):
        OP(*args)
    if device == "cpu":
        assert torch.equal(out, torch.full((20, 32), 3.0, dtype=torch.bfloat16))


def test_api_allocates_out_and_converts_scale_layouts():
    a, sa, b, sb, ks = _operands([9, 0, 4], 48, 272, seed=2)
    out = wgrad.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa.contiguous()), (b, sb), ks)
    want = torch.empty(13, 48, dtype=torch.bfloat16)
    OP(a, sa, b, sb, want, ks)
    assert out.dtype == torch.bfloat16 and torch.equal(bits(out), bits(want))
    with pytest.raises(ValueError, match="b must be 3-D"):
        wgrad.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b[0], sb), ks)


# ------------------------------------------------------------------ GPU ---------------------------------


# Sizes: empty groups first, last and between; groups ending inside a 128-row tile; one row; many groups.
GPU_CASES = [
    ([0, 128, 0], 256, 256),
    ([1, 127, 129, 0, 300], 160, 200),
    ([513, 0, 17, 1000], 2048, 7168),
    ([64] * 32 + [0, 5], 144, 512),
    ([700, 300], 4096, 1024),
    ([33], 16, 16),
    ([5, 250, 0], 4000, 384),
    ([200, 77], 2112, 896),  # the last tile's second warpgroup lies wholly past N
    # last row tiles of 64, 65, 4, 61, 63, 67 and 64 of the group's rows (tiles start at a multiple of 4):
    # groups that end on either side of the tile's m64 halves
    ([64, 65, 3, 61, 62, 192, 189], 384, 640),
]


def _run_gpu(sizes, n, k, seed, **kw):
    a, sa, b, sb, ks = _operands(sizes, n, k, device="cuda", seed=seed, **kw)
    out = torch.full((sum(sizes), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    OP(a, sa, b, sb, out, ks)
    return out, (a, sa, b, sb, ks)


@pytest.mark.parametrize("sizes,n,k", GPU_CASES)
@gpu
def test_gpu_matches_the_float64_product(sizes, n, k):
    out, (a, sa, b, sb, _) = _run_gpu(sizes, n, k, seed=len(sizes) + n)
    assert not torch.isnan(out).any()  # every row of every group written, nothing else read as data
    ref = _float64_product(a, sa, b, sb, sizes) if n * k <= 300_000 else \
        wgrad.reference.m_grouped_reference(a.cpu(), sa.cpu(), b.cpu(), sb.cpu(), sizes)
    # bf16 rounding of the output (2^-9 relative at most) dominates: the bar is 2e-3.
    assert rel_frobenius(out.cpu(), ref) <= 2e-3


@gpu
def test_gpu_deterministic_and_dgrad_form_bitwise():
    sizes, n, k = [300, 0, 212, 1], 384, 640
    out, (a, sa, b, sb, ks) = _run_gpu(sizes, n, k, seed=5)
    again = torch.empty_like(out)
    OP(a, sa, b, sb, again, ks)
    assert torch.equal(bits(out), bits(again))
    # The strided transposed view of the same weights gives the same bits as its contiguous copy.
    w_t, sw_t = _transposed_weights(b.transpose(1, 2).contiguous(), sb.transpose(1, 2).contiguous())
    strided = torch.empty_like(out)
    OP(a, sa, w_t, sw_t, strided, ks)
    assert torch.equal(bits(strided), bits(out))


# out's row stride and start: 16-byte multiples (whole tiles go out by TMA stores), or not (every tile stored
# by the threads). Groups of 130 and 200 rows hold whole 128-row tiles.
@pytest.mark.parametrize("ld,start", [(80, 8), (82, 2)])
@gpu
def test_gpu_row_stride_of_a_and_out(ld, start):
    sizes, n, k = [40, 90, 130, 200], 64, 300
    a, sa, b, sb, ks = _operands(sizes, n, k, device="cuda", seed=6, row_stride=336)
    buf = torch.full((sum(sizes), ld), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, start:start + n]
    OP(a, sa, b, sb, out, ks)
    ref = _float64_product(a, sa, b, sb, sizes)
    assert rel_frobenius(out.cpu(), ref) <= 2e-3
    assert torch.isnan(buf[:, :start]).all() and torch.isnan(buf[:, start + n:]).all()


@pytest.mark.parametrize("bad", [[100, 31], [-1, 131], [131, 0, 1]])
@gpu
def test_gpu_invalid_sizes_leave_out_untouched(bad):
    a, sa, b, sb, _ = _operands([100, 30, 0], 128, 256, device="cuda", seed=7)
    ks = torch.tensor(bad, dtype=torch.int32, device="cuda")
    if len(bad) != 3:
        b, sb = b[:len(bad)], sb[:len(bad)]
    out = torch.full((130, 128), 7.0, dtype=torch.bfloat16, device="cuda")
    OP(a, sa, b, sb, out, ks)
    assert bool((out == 7.0).all())


@gpu
def test_gpu_cuda_graph_replays_with_new_sizes():
    n, k = 256, 512
    a, sa, b, sb, ks = _operands([200, 56, 0, 0], n, k, device="cuda", seed=8)
    out = torch.empty(256, n, dtype=torch.bfloat16, device="cuda")
    graph, _ = capture_graph(lambda: OP(a, sa, b, sb, out, ks))
    for sizes in ([0, 0, 256, 0], [1, 2, 3, 250], [128, 0, 0, 128]):
        ks.copy_(torch.tensor(sizes, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_frobenius(out.cpu(), _float64_product(a, sa, b, sb, sizes)) <= 2e-3
