"""The padded MoE segments cast (`quantize_fp8_1x128_colwise_segments_padded`): every segment's q_t
columns padded with zero columns to a multiple of `pad`, and the padded sizes that the contiguous-K GEMM
takes with them, so that any expert token counts work end to end."""

from __future__ import annotations

import pytest
import torch

import wgrad
from wgrad import reference
from wgrad.scales import align_up, k_block_capacity, num_k_blocks

from helpers import SEGMENT_CASES, capture_graph, on_poisoned_outputs, rel_frobenius
from quant_helpers import sm90

OPS = torch.ops.wgrad
PADS = [16, 32, 64, 128]
SCALE_NAN_BITS = 0x7FC00000
CASES = SEGMENT_CASES + [(0, [0])]  # (0, [0]): K = 0, no cast to launch: the table kernel alone writes padded



def _random_x(rows, cols, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((rows, cols), generator=g, dtype=torch.float64)
    x *= 10.0 ** torch.randint(-4, 5, (rows, 1), generator=g).double()
    return x.to(dtype)


def _bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.view(torch.int32)


def _full_q_t(q_t):
    """Every byte of q_t's storage rows, padding included: [C, row stride]."""
    ld = q_t.stride(0)
    return _bits(q_t.as_strided((q_t.shape[0], ld), (ld, 1)))


def _check_against_unpadded(x, sizes, pad, outs):
    """The padded outputs are the unpadded cast's, moved: segment g's q_t columns start at
    sum(padded[:g]), every other byte of q_t (padding of the row stride included) is 0, the scale columns
    are the unpadded ones followed by zeros, and padded = align_up(size, pad), summing to at most K."""
    q_t, s_t, padded = outs
    rows, cols = x.shape
    k = reference.padded_segment_columns(rows, len(sizes), pad)
    q_u, s_u = OPS.quantize_fp8_1x128_colwise_segments(x.cpu(), torch.tensor(sizes, dtype=torch.int32), False)
    padded = padded.cpu().tolist()
    assert len(padded) == len(sizes) and sum(padded) <= k
    assert padded == [align_up(s, pad) for s in sizes]
    assert q_t.dtype == torch.float8_e4m3fn and q_t.shape == (cols, k)
    assert q_t.stride() == (align_up(max(k, 1), 16), 1)
    assert s_t.dtype == torch.float32 and s_t.shape == (cols, k_block_capacity(k, len(sizes)))
    assert s_t.stride() == (1, align_up(max(cols, 1), 4))
    full = _full_q_t(q_t)
    expected = torch.zeros_like(full)
    src = dst = 0
    for s, p in zip(sizes, padded):
        expected[:, dst : dst + s] = _bits(q_u)[:, src : src + s]
        src += s
        dst += p
    diff = (full != expected).nonzero()
    assert diff.numel() == 0, f"q_t: {diff.shape[0]} bytes differ, first at {diff[0].tolist()}"
    s_bits = _bits(s_t)
    assert torch.equal(s_bits[:, : s_u.shape[1]], _bits(s_u))
    assert bool((s_bits[:, s_u.shape[1] :] == 0).all())


def _gemm_round_trip(a_x, b_x, sizes, pad, device):
    """out[g] += a_g @ b_g^T through the padded casts (pad 0: the unpadded casts) of dy and x and the
    contiguous-K GEMM, against the float64 product of the unpadded casts' dequantized segments."""
    s = torch.tensor(sizes, dtype=torch.int32, device=device)
    if pad == 0:  # groups start wherever the sizes put them, inside 16-byte chunks too
        qa, sa = OPS.quantize_fp8_1x128_colwise_segments(a_x.to(device), s, False)
        qb, sb = OPS.quantize_fp8_1x128_colwise_segments(b_x.to(device), s, False)
        pa = s
    else:
        qa, sa, pa = OPS.quantize_fp8_1x128_colwise_segments_padded(a_x.to(device), s, pad, False)
        qb, sb, pb = OPS.quantize_fp8_1x128_colwise_segments_padded(b_x.to(device), s, pad, False)
        assert torch.equal(pa, pb)
    m, n = a_x.shape[1], b_x.shape[1]
    out = torch.zeros(len(sizes), m, n, device=device)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((qa, sa), (qb, sb), out, pa)
    ua, usa = OPS.quantize_fp8_1x128_colwise_segments(a_x, torch.tensor(sizes, dtype=torch.int32), False)
    ub, usb = OPS.quantize_fp8_1x128_colwise_segments(b_x, torch.tensor(sizes, dtype=torch.int32), False)
    expected = reference.k_grouped_contiguous_reference(ua, usa, ub, usb, sizes)
    for g, e in enumerate(expected):
        err = rel_frobenius(out[g].cpu(), e)
        assert err <= 2e-4, (g, sizes[g], err)


# ------------------------------------------------------------------ CPU ---------------------------------


@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cpu_padded_is_the_unpadded_cast_moved(case, pad):
    rows, sizes = CASES[case]
    x = _random_x(rows, 200, torch.bfloat16, seed=rows + len(sizes))
    outs = OPS.quantize_fp8_1x128_colwise_segments_padded(x, torch.tensor(sizes, dtype=torch.int32), pad, False)
    _check_against_unpadded(x, sizes, pad, outs)


@pytest.mark.parametrize("pad", [0, 16, 32])
def test_cpu_any_token_counts_through_the_contiguous_gemm(pad):
    # Token counts that are not multiples of 16, zeros included: straight from the unpadded cast (pad 0)
    # or through the padded one.
    sizes = [100, 0, 1008, 37, 211]
    rows = sum(sizes)
    _gemm_round_trip(_random_x(rows, 96, torch.float32, 5), _random_x(rows, 80, torch.float32, 6), sizes, pad,
                     "cpu")


def test_meta_layouts():
    x = torch.empty(1000, 4097, dtype=torch.float16, device="meta")
    sizes = torch.empty(5, dtype=torch.int32, device="meta")
    q_t, s_t, padded = OPS.quantize_fp8_1x128_colwise_segments_padded(x, sizes, 32, False)
    k = (1000 + 5 * 31) // 32 * 32
    assert q_t.shape == (4097, k) and q_t.stride() == (k, 1) and q_t.device.type == "meta"
    assert s_t.shape == (4097, num_k_blocks(k) + 4) and s_t.stride() == (1, align_up(4097, 4))
    assert padded.shape == (5,) and padded.dtype == torch.int32


@pytest.mark.parametrize("shape", [(129, 130), (0, 5), (7, 0)])
def test_opcheck(shape):
    x = _random_x(*shape, torch.float32, seed=13)
    sizes = torch.tensor([shape[0], 0], dtype=torch.int32)
    torch.library.opcheck(OPS.quantize_fp8_1x128_colwise_segments_padded, (x, sizes, 32, True))


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("pad", [0, 8, 48, 256])
def test_bad_pad_rejected(device, pad):
    x = torch.zeros(8, 16, device=device)
    sizes = torch.tensor([8], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=f"quantize_fp8_1x128_colwise_segments_padded: pad must be 16, 32, 64 "
                                           f"or 128, got {pad}"):
        OPS.quantize_fp8_1x128_colwise_segments_padded(x, sizes, pad, False)


def test_bad_sizes_rejected_on_cpu():
    x = torch.zeros(8, 16)
    with pytest.raises(RuntimeError, match="quantize_fp8_1x128_colwise_segments_padded: sum\\(sizes\\) must equal"):
        OPS.quantize_fp8_1x128_colwise_segments_padded(x, torch.tensor([3, 4], dtype=torch.int32), 32, False)


def test_python_api():
    x = _random_x(6 * 50, 256, torch.bfloat16, seed=17)
    q_t, s_t, padded = wgrad.quantize_fp8_1x128_colwise_segments_padded(x.view(6, 50, 256), [77, 223])
    _check_against_unpadded(x, [77, 223], 32, (q_t, s_t, padded))
    q_t16, _, padded16 = wgrad.quantize_fp8_1x128_colwise_segments_padded(x, torch.tensor([77, 223]), pad=16)
    assert padded16.tolist() == [80, 224] and q_t16.shape == (256, 320)


# ------------------------------------------------------------------ GPU ---------------------------------


def _check_gpu(x, sizes, pad, plan=None):
    # (Into poisoned outputs: a byte the kernel does not write, a padding column or the zero tail, shows up.)
    # A plan (csrc/quant/plan.h) takes the private plan op instead of the public one.
    x_gpu = x.cuda()
    sizes_gpu = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    if plan is None:
        cast = lambda: OPS.quantize_fp8_1x128_colwise_segments_padded(x_gpu, sizes_gpu, pad, False)
    else:
        cast = lambda: OPS._quantize_fp8_1x128_colwise_segments_with_plan(x_gpu, sizes_gpu, pad, False, plan)
    outs, _ = on_poisoned_outputs(cast)
    torch.cuda.synchronize()
    _check_against_unpadded(x, sizes, pad, outs)


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_gpu_padded_bit_exact(case, pad, dtype):
    rows, sizes = CASES[case]
    _check_gpu(_random_x(rows, 1000, dtype, seed=rows + len(sizes)), sizes, pad)


@sm90
@pytest.mark.parametrize("cols", [8, 100, 264])
def test_gpu_padded_other_widths(cols):
    # C % 8 != 0 takes the generic kernel (with a global segment table); 264: a partial column tile.
    _check_gpu(_random_x(1000, cols, torch.bfloat16, seed=cols), [1, 127, 129, 3, 0, 740], 32)


@sm90
@pytest.mark.parametrize("order", ["1", "2", "ranges", "cranges", "c2", "c5"])
def test_gpu_padded_tile_orders(order):
    # pad 16 leaves blocks 16 bytes into a sector: the orders that carry sectors from block to block work
    # on the padded q_t positions (runs of blocks stop at every padding gap).
    _check_gpu(_random_x(6000, 520, torch.bfloat16, seed=3), [1000, 37, 0, 2963, 5, 1995], 16, f"order={order}")


@sm90
def test_gpu_padded_large_table_and_many_segments():
    # 3000 segments: a table too large for shared memory (the one-CTA table kernel first), most blocks
    # partial, long zero tails.
    g = torch.Generator().manual_seed(9)
    cuts = torch.randint(0, 6001, (2999,), generator=g).sort().values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([6000])])
    sizes = (bounds[1:] - bounds[:-1]).tolist()
    _check_gpu(_random_x(6000, 136, torch.bfloat16, seed=10), sizes, 32)


@sm90
@pytest.mark.parametrize("groups", [32, 33])
def test_gpu_padded_warp_table_boundary(groups):
    # 32 segments: the warps' scan writes the padded sizes; 33: the CTA-wide scan (every other one empty).
    sizes = [0 if g % 2 else 17 + 61 * g for g in range(groups)]
    _check_gpu(_random_x(sum(sizes), 264, torch.bfloat16, seed=groups), sizes, 32)


@sm90
@pytest.mark.parametrize("pad", [0, 16, 32, 128])
def test_gpu_any_token_counts_through_the_contiguous_gemm(pad):
    sizes = [100, 0, 1008, 37, 2903, 16]
    rows = sum(sizes)
    _gemm_round_trip(_random_x(rows, 384, torch.bfloat16, 21), _random_x(rows, 272, torch.bfloat16, 22), sizes,
                     pad, "cuda")


@sm90
def test_gpu_padded_graph_replay_with_new_sizes():
    # No host synchronisation: captured once, replayed with other sizes written into the same tensor.
    x = _random_x(3000, 256, torch.bfloat16, seed=31)
    xg = x.cuda()
    sizes = torch.tensor([1000, 1000, 1000], dtype=torch.int32, device="cuda")
    graph, outs = capture_graph(lambda: OPS.quantize_fp8_1x128_colwise_segments_padded(xg, sizes, 32, False))
    for new in ([1000, 1000, 1000], [7, 2900, 93], [0, 0, 3000]):
        sizes.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        _check_against_unpadded(x, new, 32, outs)


@sm90
def test_gpu_padded_invalid_sizes_give_nan_scales():
    x = torch.randn(300, 200, device="cuda")
    _, s_t, _ = OPS.quantize_fp8_1x128_colwise_segments_padded(x, torch.tensor([100, 100, 99], dtype=torch.int32,
                                                                                  device="cuda"), 32, False)
    assert bool((_bits(s_t) == SCALE_NAN_BITS).all())
