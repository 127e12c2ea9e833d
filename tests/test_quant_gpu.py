"""The CUDA kernels of the row-wise, column-wise and "both" casts on an SM90 GPU, bit for bit against the
reference (python/wgrad/reference.py); and what every cast shares: 64-bit offsets, errors, round trips
through the GEMMs, repeated calls, the poisoned outputs the GPU tests write into. The segments casts:
test_quant_segments.py, test_quant_padded.py."""

from __future__ import annotations

import pytest
import torch

from wgrad import reference

from helpers import on_poisoned_outputs
from quant_helpers import (
    DTYPES,
    OPS,
    assert_bits_equal,
    bf16_segment_casts,
    call,
    check_gpu_op,
    grouped_round_trip,
    random_x,
    rounding_edge_cases,
    segment_sizes,
    sm90,
    wgrad_round_trip,
)

GPU_SIZES = [1, 127, 129, 1000, 4097]


GPU_SHAPES = [(r, c) for r in GPU_SIZES for c in GPU_SIZES] + [(256, 384), (4096, 512), (128, 7168), (384, 128)]


@sm90
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["rowwise", "colwise", "both"])
def test_gpu_bit_exact(op, dtype, shape):
    x = random_x(*shape, dtype, seed=hash(shape) % 1000)
    for ue8m0 in (False, True):
        check_gpu_op(op, x, ue8m0)


@sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["rowwise", "colwise", "both"])
def test_gpu_special_blocks(op, dtype):
    # all-zero blocks, one huge value per block, NaN / Inf blocks, signed zeros and subnormal inputs
    x = random_x(300, 400, torch.float32, seed=37)
    x[:130, :] = 0  # whole zero column blocks and row blocks
    x[5, :] = -0.0
    big = 6e4 if dtype == torch.float16 else 1e30
    x[140, 10] = big
    x[200, 300] = -big
    x[150:160, 200:210] = 1e-30 if dtype == torch.float32 else 1e-7  # tiny values next to normal ones
    x[250, 50] = float("nan")
    x[260, 390] = float("inf")
    x[270, 150] = float("-inf")
    x = x.to(dtype)
    for ue8m0 in (False, True):
        check_gpu_op(op, x, ue8m0)


@sm90
@pytest.mark.parametrize("op", ["rowwise", "colwise", "both"])
def test_gpu_rounding_edge_cases(op):
    # The kernels multiply by the scale's reciprocal, computed in fp64 (kernels/quant/numerics.cuh); these
    # blocks put products on and next to e4m3 ties, next to 448, and in the tiny and signed-zero range.
    # Column-wise: the same blocks, transposed, so that they are column blocks.
    x = rounding_edge_cases(384)
    if op != "rowwise":
        x = x.t().contiguous()
    for ue8m0 in (False, True):
        check_gpu_op(op, x, ue8m0)
    if op == "rowwise":
        for dtype in (torch.bfloat16, torch.float16):
            check_gpu_op(op, x.to(dtype), False)


@sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["rowwise", "colwise", "both"])
def test_gpu_many_tiles_per_cta(op, dtype):
    # Far more tiles than SMs: the persistent kernels loop, and the TMA ring wraps around many times.
    x = random_x(6000, 2056, dtype, seed=59)
    check_gpu_op(op, x, False)


@sm90
@pytest.mark.parametrize("op", ["rowwise", "colwise", "both"])
def test_gpu_unaligned_x_takes_the_scalar_path(op):
    # contiguous but not 16-byte aligned: the kernels fall back to element-wise loads
    base = random_x(1, 256 * 512 + 1, torch.bfloat16, seed=41).view(-1)
    x_cpu = base[1:].view(256, 512)
    x_gpu = base.cuda()[1:].view(256, 512)
    assert x_gpu.data_ptr() % 16 != 0
    check_gpu_op(op, x_cpu, False, x_gpu=x_gpu)


@sm90
def test_gpu_both_equals_rowwise_and_colwise():
    x = random_x(1000, 4097, torch.bfloat16, seed=43).cuda()
    q, s, q_t, s_t = OPS.quantize_fp8_1x128_both(x, False)
    q1, s1 = OPS.quantize_fp8_1x128_rowwise(x, False)
    q2, s2 = OPS.quantize_fp8_1x128_colwise(x, False)
    for a, b, n in ((q, q1, "q"), (s, s1, "scales"), (q_t, q2, "q_t"), (s_t, s2, "scales_t")):
        assert_bits_equal(a, b, n)


@sm90
def test_gpu_64bit_indexing():
    # more than 2^31 elements: compare the last rows (blocks are independent)
    rows, cols = 2**31 // 128 + 1024, 128 + 8
    if torch.cuda.mem_get_info()[0] < 24 * 2**30:
        pytest.skip("needs 24 GiB of free GPU memory")
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    q, s, q_t, s_t = OPS.quantize_fp8_1x128_both(x, False)
    lo = rows - 1024 - 128 * 3  # 128-aligned
    tail = x[lo:].cpu()
    eq, es = reference.quantize_fp8_1x128_rowwise_reference(tail)
    assert_bits_equal(q[lo:], eq, "q tail")
    assert_bits_equal(s[lo:], es, "scales tail")
    eq_t, es_t = reference.quantize_fp8_1x128_colwise_reference(tail)
    assert_bits_equal(q_t[:, lo:], eq_t, "q_t tail")
    assert_bits_equal(s_t[:, lo // 128:], es_t, "scales_t tail")


@sm90
def test_gpu_errors():
    x = torch.randn(8, 16, device="cuda")
    with pytest.raises(RuntimeError, match="quantize_fp8_1x128_colwise_segments: sizes must be on cuda"):
        OPS.quantize_fp8_1x128_colwise_segments(x, torch.tensor([8], dtype=torch.int32), False)
    with pytest.raises(RuntimeError, match="quantize_fp8_1x128_rowwise: x must be contiguous"):
        OPS.quantize_fp8_1x128_rowwise(x.t(), False)


@sm90
def test_gpu_round_trip_through_gemm():
    wgrad_round_trip("cuda")


@sm90
def test_gpu_round_trip_through_grouped_gemm():
    grouped_round_trip("cuda")


@sm90
@pytest.mark.parametrize("op,align", [("colwise", 0), ("both", 0), ("segments", 1), ("segments", 16)])
def test_gpu_repeated_calls_on_a_large_input(op, align):
    # Regression test: with 4 pipeline stages shared by 3 consumer groups, a group could wait
    # for the next fill of a stage whose previous fill (another group's tile) had not landed; the mbarrier
    # wait compares phase parity only, so it returned at once and the group read and released the wrong
    # tile. It showed only under many calls on large inputs with the L2 flushed in between (wrong bits,
    # "unspecified launch failure", hangs), most often with 16-aligned segments. Every call must give the
    # bits of the first.
    rows, cols = 16384, 7168
    gen = torch.Generator(device="cuda").manual_seed(71)
    x = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
    sizes = None
    if op == "segments":
        sizes_list = segment_sizes(rows, 8, align)  # the benchmark's uneven split
        sizes = torch.tensor(sizes_list, dtype=torch.int32, device="cuda")
    first = [t.clone() for t in call(op, x, False, sizes)]
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    for i in range(300):
        flush.zero_()
        outs = call(op, x, False, sizes)
        if i % 50 == 49:
            for got, exp in zip(outs, first):
                assert_bits_equal(got, exp, f"{op} call {i + 1}")


@sm90
@pytest.mark.parametrize("op", ["rowwise", "colwise", "both", "segments", "padded"])
def test_gpu_outputs_land_on_the_poison(op):
    # The premise of the GPU tests' poison (helpers.on_poisoned_outputs): the second run's outputs land on the
    # first run's poisoned storage, for outputs of the small pool (< 1 MB) and the large one, through both
    # segments kernels (the padded cast has one, the TMA kernel). (The last test of the file: its failure stops
    # no other.)
    for plan in ("kernel=tma", "kernel=carry") if op == "segments" else (None,):
        for rows, cols, groups, seed in ((300, 1000, 3, 131), (4097, 1000, 5, 137), (8192, 2112, 8, 0)):
            x, sizes = next(bf16_segment_casts(((rows, cols, groups, seed),)))
            x_gpu, sizes_gpu = x.cuda(), sizes.cuda()
            if op == "padded":
                run = lambda: OPS.quantize_fp8_1x128_colwise_segments_padded(x_gpu, sizes_gpu, 32, False)
            else:
                run = lambda: call(op, x_gpu, False, sizes_gpu if op == "segments" else None, plan)
            _, landed = on_poisoned_outputs(run)
            assert all(landed), f"{plan}, {rows} x {cols}: outputs on the poison {landed}"

