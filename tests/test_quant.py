"""FP8 1x128 quantization on the CPU and meta tensors: the reference numerics, the ops' contract (layouts,
checks, opcheck), the Python functions, and the private plan op's. The CUDA kernels: test_quant_gpu.py
(row-wise, column-wise, both), test_quant_segments.py and test_quant_padded.py (the MoE segments casts)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import wgrad
from wgrad import reference
from wgrad.scales import k_block_capacity

from helpers import cuda_param
from quant_helpers import (
    DTYPES,
    E4M3_NAN,
    OPS,
    SCALE_NAN_BITS,
    assert_bits_equal,
    bits,
    call,
    check_layouts,
    expected,
    grouped_round_trip,
    q_t_padding,
    random_x,
    rounding_edge_cases,
    segments_with_plan,
    wgrad_round_trip,
)


def _dequant_rowwise(q, s):
    return reference.dequantize_1x128(q.cpu().float(), s.cpu())



# ==================================================================== reference numerics ===========


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_reference_error_bound(dtype, ue8m0):
    # e4m3 keeps 3 mantissa bits: |x - q * s| <= 2^-4 |x| in the normal range, and at most half the
    # smallest subnormal step (2^-10 * s) below it.
    x = random_x(300, 1000, dtype)
    q, s = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0)
    xd = x.double()
    err = (_dequant_rowwise(q, s) - xd).abs()
    s_exp = s.double().repeat_interleave(128, dim=1)[:, :1000]
    bound = torch.maximum(xd.abs() * 2.0**-4, s_exp * 2.0**-10) * (1 + 1e-6)
    assert bool((err <= bound).all())


def test_reference_rule_matches_numpy():
    # The scale and q of the reference equal an independent numpy float32 evaluation of the formula:
    # s = max(amax, 1e-4) / 448, r = 1 / s (both float32 divisions), q = e4m3(clamp(x * r)).
    x = random_x(64, 512, torch.float32, seed=3)
    q, s = reference.quantize_fp8_1x128_rowwise_reference(x)
    xb = x.numpy().reshape(64, 4, 128)
    amax = np.abs(xb).max(axis=2).astype(np.float32)
    s_np = np.maximum(amax, np.float32(1e-4)) / np.float32(448.0)
    assert np.array_equal(s.numpy().view(np.int32), s_np.view(np.int32))
    r_np = np.float32(1.0) / s_np
    t = np.clip(xb * r_np[:, :, None], np.float32(-448), np.float32(448)).astype(np.float32)
    q_np = torch.from_numpy(t.reshape(64, 512)).to(torch.float8_e4m3fn)
    assert_bits_equal(q, q_np, "q")


def _deepgemm_cast_rule(x: torch.Tensor, ue8m0: bool):
    """DeepGEMM's per_token_cast_to_fp8 (its test utilities), written out from its description:
    sf = amax.clamp(1e-4) / 448, optionally rounded up to a power of two from the float32 bits,
    q = (x * (1.0 / sf)).to(float8_e4m3fn). x [R, C] with C % 128 == 0."""
    rows, cols = x.shape
    xv = x.view(rows, cols // 128, 128)
    sf = xv.abs().float().amax(dim=2).clamp(1e-4) / 448.0
    if ue8m0:
        bits = sf.view(torch.int32)
        exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).int()
        sf = (exp << 23).view(torch.float32)
    return (xv * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(rows, cols), sf


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_equals_deepgemm_cast_rule(dtype, ue8m0):
    # Same bytes and scales as DeepGEMM's cast. (The IEEE quotient x / s, an earlier rule of ours, differs
    # from it in ~0.04 % of random bf16 elements and in 1720 of the 49152 edge-case elements.)
    cases = [random_x(512, 1024, dtype, seed=17)]
    if dtype == torch.float32:
        cases.append(rounding_edge_cases(384))
    for x in cases:
        x[3, 5] = 0.0
        x[4, :128] = 0.0  # an all-zero block
        q, s = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0)
        q_dg, s_dg = _deepgemm_cast_rule(x, ue8m0)
        assert torch.equal(s.view(torch.int32), s_dg.view(torch.int32))
        assert_bits_equal(q, q_dg, "q")


def test_reference_amax_maps_to_448_and_zero_block():
    x = torch.zeros(3, 256)
    x[0, 5] = -3.0
    x[0, 7] = 1.5
    x[1, 130] = 2.0**-20  # below the 1e-4 floor
    q, s = reference.quantize_fp8_1x128_rowwise_reference(x)
    assert q[0, 5].float().item() == -448.0
    floor_scale = np.float32(1e-4) / np.float32(448.0)
    assert s[2, 0].item() == s[2, 1].item() == float(floor_scale)  # all-zero blocks: finite scale
    assert bool((q[2].float() == 0).all()) and bool(torch.isfinite(s).all())
    _, s8 = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0=True)
    assert s8[2, 0].item() == 2.0**-22  # 1e-4 / 448 = 2.23e-7, rounded up to a power of two


def test_reference_ue8m0_powers_of_two_rounded_up():
    x = random_x(200, 640, torch.float32, seed=5)
    _, s = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0=True)
    _, s_plain = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0=False)
    assert bool(((s.view(torch.int32) & 0x7FFFFF) == 0).all())
    assert bool((s >= s_plain).all()) and bool((s < 2 * s_plain).all())


def test_reference_nan_and_inf_poison_their_block_only():
    x = torch.randn(4, 300)
    x[0, 3] = float("nan")
    x[1, 200] = float("inf")
    x[2, 299] = float("-inf")
    for ue8m0 in (False, True):
        q, s = reference.quantize_fp8_1x128_rowwise_reference(x, ue8m0)
        qb, sb = bits(q), bits(s)
        bad = [(0, 0), (1, 1), (2, 2)]
        for r, kb in bad:
            assert sb[r, kb].item() == SCALE_NAN_BITS
            lo, hi = kb * 128, min(300, kb * 128 + 128)
            assert bool((qb[r, lo:hi] == E4M3_NAN).all())
        good = torch.ones_like(sb, dtype=torch.bool)
        for r, kb in bad:
            good[r, kb] = False
        assert bool(torch.isfinite(s[good]).all())
        clean = x.clone()
        clean[0, 3] = clean[1, 200] = clean[2, 299] = 0
        q2, s2 = reference.quantize_fp8_1x128_rowwise_reference(clean, ue8m0)
        assert torch.equal(sb[good], bits(s2)[good])


def test_reference_colwise_is_rowwise_of_transpose_and_segments_restart():
    x = random_x(300, 130, torch.bfloat16, seed=7)
    q_t, s_t = reference.quantize_fp8_1x128_colwise_reference(x)
    q_r, s_r = reference.quantize_fp8_1x128_rowwise_reference(x.t().contiguous())
    assert_bits_equal(q_t, q_r, "q_t")
    assert_bits_equal(s_t, s_r, "scales_t")
    sizes = [0, 100, 0, 200]
    q_s, s_s = reference.quantize_fp8_1x128_colwise_segments_reference(x, sizes)
    assert s_s.shape == (130, k_block_capacity(300, 4))  # ceil(300/128) + 3 = 6
    q_a, s_a = reference.quantize_fp8_1x128_colwise_reference(x[:100])
    q_b, s_b = reference.quantize_fp8_1x128_colwise_reference(x[100:])
    assert_bits_equal(q_s[:, :100], q_a, "segment 1")
    assert_bits_equal(q_s[:, 100:], q_b, "segment 3")
    assert_bits_equal(s_s[:, :1], s_a, "segment 1 scales")
    assert_bits_equal(s_s[:, 1:3], s_b, "segment 3 scales")
    assert bool((s_s[:, 3:] == 0).all())



# ==================================================================== ops on CPU and meta ===========


OP_NAMES = ["rowwise", "colwise", "both", "segments"]


CPU_SHAPES = [(1, 1), (127, 129), (129, 127), (256, 384), (300, 8)]


@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("shape", CPU_SHAPES)
def test_cpu_ops_layouts_and_values(op, shape):
    x = random_x(*shape, torch.bfloat16, seed=11)
    sizes = torch.tensor([shape[0] // 3, 0, shape[0] - shape[0] // 3], dtype=torch.int32)
    outs = call(op, x, sizes=sizes)
    check_layouts(x, outs, op, sizes if op == "segments" else None)
    for got, exp in zip(outs, expected(op, x, sizes=sizes)):
        assert_bits_equal(got, exp, op)
    if op != "rowwise":
        assert bool((q_t_padding(outs[-2]) == 0).all())


@pytest.mark.parametrize("op", OP_NAMES)
def test_meta_matches_cpu_layouts(op):
    x = torch.empty(1000, 4097, dtype=torch.float16, device="meta")
    sizes = torch.empty(5, dtype=torch.int32, device="meta")
    outs = call(op, x, sizes=sizes)
    check_layouts(x, outs, op, [0] * 5 if op == "segments" else None)
    assert all(o.device.type == "meta" for o in outs)


@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("shape", [(129, 130), (0, 5), (7, 0)])
def test_opcheck(op, shape):
    x = random_x(*shape, torch.float32, seed=13) if 0 not in shape else torch.zeros(shape)
    sizes = torch.tensor([shape[0], 0], dtype=torch.int32)
    args = (x, sizes, True) if op == "segments" else (x, True)
    torch.library.opcheck(getattr(OPS, f"quantize_fp8_1x128_{'colwise_segments' if op == 'segments' else op}"),
                          args)


BAD_X = [
    (lambda: torch.zeros(4, 4, dtype=torch.int32), "x must be bfloat16, float16 or float32"),
    (lambda: torch.zeros(4, 4, dtype=torch.float64), "x must be bfloat16, float16 or float32"),
    (lambda: torch.zeros(16), "x must be 2-D"),
    (lambda: torch.zeros(2, 4, 4), "x must be 2-D"),
    (lambda: torch.zeros(8, 16).t(), "x must be contiguous"),
]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("op", OP_NAMES)
@pytest.mark.parametrize("bad", range(len(BAD_X)))
def test_bad_x_rejected(device, op, bad):
    make, msg = BAD_X[bad]
    x = make().to(device)
    sizes = torch.tensor([x.shape[0] if x.dim() else 0], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=f"quantize_fp8_1x128.*{msg}"):
        call(op, x, sizes=sizes)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("op", OP_NAMES)
def test_too_wide_x_rejected(op, device):
    x = torch.empty(4, 65535 * 128 + 1, dtype=torch.bfloat16, device=device)
    with pytest.raises(RuntimeError, match="quantize_fp8_1x128.*x must have at most 8388480 columns"):
        call(op, x, sizes=torch.tensor([4], dtype=torch.int32, device=device))


BAD_SIZES = [
    (lambda d: torch.tensor([4, 4], dtype=torch.int64, device=d), "sizes must be int32"),
    (lambda d: torch.tensor([[8]], dtype=torch.int32, device=d), "sizes must be 1-D"),
    (lambda d: torch.zeros(0, dtype=torch.int32, device=d), "sizes must name at least one segment"),
    (lambda d: torch.tensor([4, 0, 4, 0], dtype=torch.int32, device=d)[::2], "sizes must be contiguous"),
]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("bad", range(len(BAD_SIZES)))
def test_bad_sizes_rejected(device, bad):
    make, msg = BAD_SIZES[bad]
    x = torch.zeros(8, 16, device=device)
    with pytest.raises(RuntimeError, match=f"quantize_fp8_1x128_colwise_segments: {msg}"):
        OPS.quantize_fp8_1x128_colwise_segments(x, make(device), False)


@pytest.mark.parametrize("sizes,msg", [([3, 4], "sum\\(sizes\\) must equal the rows of x, R = 8, got 7"),
                                       ([10, -2], "sizes\\[1\\] must be >= 0, got -2")])
def test_bad_size_values_rejected_on_cpu(sizes, msg):
    x = torch.zeros(8, 16)
    with pytest.raises(RuntimeError, match=f"quantize_fp8_1x128_colwise_segments: {msg}"):
        OPS.quantize_fp8_1x128_colwise_segments(x, torch.tensor(sizes, dtype=torch.int32), False)


def test_python_functions_copy_a_strided_x_and_cast_integer_sizes():
    # The Python functions (not the ops) take a non-contiguous x through a contiguous copy and sizes of any
    # integer dtype through an int32 cast, with the results of the contiguous int32 call; float sizes would be
    # truncated by that cast, so they are refused.
    x = random_x(300, 256, torch.bfloat16, seed=3)
    sizes = [100, 0, 200]
    want = wgrad.quantize_fp8_1x128_colwise_segments(x, torch.tensor(sizes, dtype=torch.int32))
    strided = x.t().contiguous().t()
    assert not strided.is_contiguous()
    for got in (wgrad.quantize_fp8_1x128_colwise_segments(strided, torch.tensor(sizes, dtype=torch.int64)),
                wgrad.quantize_fp8_1x128_colwise_segments(strided, sizes)):
        for g, w in zip(got, want):
            assert_bits_equal(g, w, "segments cast of a strided x")
    assert_bits_equal(wgrad.quantize_fp8_1x128_colwise(strided)[0], wgrad.quantize_fp8_1x128_colwise(x)[0], "q_t")
    with pytest.raises(ValueError, match="sizes must hold integers .*got torch.float32"):
        wgrad.quantize_fp8_1x128_colwise_segments(x, torch.tensor([100.5, 0.0, 199.5]))
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        OPS.quantize_fp8_1x128_colwise(strided, False)


def test_python_api_flattens_and_converts():
    x = random_x(6 * 50, 256, torch.bfloat16, seed=17)
    q, s = wgrad.quantize_fp8_1x128_rowwise(x.view(6, 50, 256))
    assert_bits_equal(q, reference.quantize_fp8_1x128_rowwise_reference(x)[0], "q")
    q2, s2 = wgrad.per_token_cast_to_fp8(x)
    assert_bits_equal(s2, s, "per_token_cast_to_fp8 scales")
    # non-contiguous input is copied first
    q_t, s_t = wgrad.quantize_fp8_1x128_colwise(x.t().contiguous().t())
    assert_bits_equal(q_t, reference.quantize_fp8_1x128_colwise_reference(x)[0], "q_t")
    q_s, s_s = wgrad.quantize_fp8_1x128_colwise_segments(x, [100, 200])
    exp = reference.quantize_fp8_1x128_colwise_segments_reference(x, [100, 200])
    assert_bits_equal(q_s, exp[0], "segments q_t")
    q_s2, _ = wgrad.quantize_fp8_1x128_colwise_segments(x, torch.tensor([100, 200]))  # int64 converted
    assert_bits_equal(q_s2, exp[0], "segments q_t")
    with pytest.raises(ValueError, match="at least 2 dims"):
        wgrad.quantize_fp8_1x128_rowwise(torch.zeros(8))


@pytest.mark.parametrize("shape", [(7, 0), (2, 3, 0), (0, 5), (2, 0, 5)])
def test_python_api_takes_empty_inputs_like_the_ops(shape):
    # Zero rows or zero columns, with or without leading dims: the Python functions give what the ops
    # give for the flattened [R, C] (no reshape error for C == 0).
    x = torch.zeros(shape)
    x2 = x.reshape(math.prod(shape[:-1]), shape[-1])
    for name in ("rowwise", "colwise"):
        got = getattr(wgrad, f"quantize_fp8_1x128_{name}")(x)
        want = getattr(OPS, f"quantize_fp8_1x128_{name}")(x2, False)
        assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in want], name


def test_round_trip_through_cpu_gemm():
    wgrad_round_trip("cpu")


def test_round_trip_through_cpu_grouped_gemm():
    grouped_round_trip("cpu")



# ==================================================================== the private plan op =============
# _quantize_fp8_1x128_colwise_segments_with_plan(x, sizes, pad, ue8m0, plan): the segments casts on the path a
# plan names (csrc/quant/plan.h) instead of the automatic one; the GPU tests reach every kernel path through
# it (test_quant_segments.py, test_quant_padded.py). Its CPU kernel is the reference, like the public ops'.

PLANS = ["auto", "", "kernel=tma", "kernel=carry", "kernel=auto,order=auto,packed=auto,tail=auto", "order=ranges",
         "order=cranges", "order=1", "order=c64", "packed=on", "packed=off", "tail=on", "tail=off",
         "kernel=carry,tail=off", "order=c12,packed=off,kernel=tma"]


@pytest.mark.parametrize("pad", [0, 32])
@pytest.mark.parametrize("plan", PLANS)
def test_plan_op_gives_the_public_ops_results(plan, pad):
    x = random_x(300, 200, torch.bfloat16, seed=5)
    sizes = torch.tensor([100, 0, 37, 163], dtype=torch.int32)
    got = OPS._quantize_fp8_1x128_colwise_segments_with_plan(x, sizes, pad, False, plan)
    if pad == 0:
        want = (*OPS.quantize_fp8_1x128_colwise_segments(x, sizes, False), sizes)
    else:
        want = OPS.quantize_fp8_1x128_colwise_segments_padded(x, sizes, pad, False)
    assert len(got) == 3
    for i, (g, w) in enumerate(zip(got, want)):
        assert_bits_equal(g, w, f"{plan!r}, pad {pad}: output {i}")
    assert got[2].untyped_storage().data_ptr() != sizes.untyped_storage().data_ptr(), "padded_sizes aliases sizes"
    for g, w in zip(segments_with_plan(x, sizes, False, plan, pad), want):
        assert_bits_equal(g, w, f"segments_with_plan({plan!r}, pad {pad})")


@pytest.mark.parametrize("pad", [0, 16])
def test_plan_op_meta_and_opcheck(pad):
    x = random_x(129, 130, torch.float32, seed=13)
    sizes = torch.tensor([100, 0, 29], dtype=torch.int32)
    cpu = OPS._quantize_fp8_1x128_colwise_segments_with_plan(x, sizes, pad, True, "kernel=tma,order=c4")
    meta = OPS._quantize_fp8_1x128_colwise_segments_with_plan(x.to("meta"), sizes.to("meta"), pad, True,
                                                               "kernel=tma,order=c4")
    for c, m in zip(cpu, meta):
        assert m.device.type == "meta" and (m.dtype, m.shape, m.stride()) == (c.dtype, c.shape, c.stride())
    torch.library.opcheck(OPS._quantize_fp8_1x128_colwise_segments_with_plan, (x, sizes, pad, True, "order=ranges"))


def test_plan_op_checks_its_arguments_like_the_public_ops():
    # pad 0: the checks of the unpadded cast; any other pad: the padded cast's (pad 0 is no padding).
    x = torch.zeros(8, 16)
    with pytest.raises(RuntimeError, match="quantize_fp8_1x128_colwise_segments: sum\\(sizes\\) must equal"):
        OPS._quantize_fp8_1x128_colwise_segments_with_plan(x, torch.tensor([3, 4], dtype=torch.int32), 0, False, "auto")
    for device in ("cpu", "meta"):
        with pytest.raises(RuntimeError, match="quantize_fp8_1x128_colwise_segments_padded: pad must be 16, 32, 64 "
                                               "or 128, got 7"):
            OPS._quantize_fp8_1x128_colwise_segments_with_plan(x.to(device), torch.tensor([8], dtype=torch.int32,
                                                                                          device=device), 7, False, "")


BAD_PLANS = ["tma", "kernel", "kernel=", "kernel=tmaa", "kernel=tma,kernel=carry", "order=0", "order=65", "order=2x",
             "order=c", "order=c0", "order=c65", "order=crange", "order=cranges2", "order=", "packed=1", "packed=yes",
             "tail=1:1", "tail=0:1", "kernel=tma,", ",kernel=tma", "kernel=tma;order=1", "tile=64x8", "prefetch=2",
             "AUTO", " auto"]


@pytest.mark.parametrize("device", ["cpu", "meta", cuda_param("cuda", id="cuda")])
@pytest.mark.parametrize("plan", BAD_PLANS)
def test_bad_plan_rejected(plan, device):
    x = torch.zeros(300, 128, dtype=torch.bfloat16, device=device)
    sizes = torch.tensor([100, 200], dtype=torch.int32, device=device)
    message = (f"_quantize_fp8_1x128_colwise_segments_with_plan: plan must be 'auto' or comma-separated items.*"
               f"got '{re.escape(plan)}'")
    with pytest.raises(RuntimeError, match=message):
        OPS._quantize_fp8_1x128_colwise_segments_with_plan(x, sizes, 0, False, plan)
