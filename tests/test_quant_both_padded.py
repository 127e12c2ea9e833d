"""Both over padded segments (`quantize_fp8_1x128_both_segments_padded`): the row-wise cast and the padded
segments cast of an MoE activation from one read, bit for bit the two casts' outputs, on every path (one
kernel for 16-byte aligned rows with pad 32/64/128 and a table that fits in shared memory; the row-wise
kernel and the padded cast otherwise)."""

from __future__ import annotations

import pytest
import torch

import wgrad
from wgrad import reference
from wgrad.scales import align_up, num_k_blocks

from helpers import SEGMENT_CASES, capture_graph, on_poisoned_outputs
from quant_helpers import SCALE_NAN_BITS, bits, random_x, sm90

OPS = torch.ops.wgrad
OP = "quantize_fp8_1x128_both_segments_padded"
PADS = [16, 32, 64, 128]
CASES = SEGMENT_CASES + [(0, [0])]


def _full_q_t(q_t):
    """Every byte of q_t's storage rows, padding included."""
    ld = q_t.stride(0)
    return bits(q_t.as_strided((q_t.shape[0], ld), (ld, 1)))


def _assert_same(name, got, expected):
    assert got.shape == expected.shape and got.stride() == expected.stride(), (name, got.shape, got.stride(),
                                                                              expected.shape, expected.stride())
    g, e = (_full_q_t(got), _full_q_t(expected)) if name == "q_t" else (bits(got), bits(expected))
    diff = (g != e).nonzero()
    assert diff.numel() == 0, f"{name}: {diff.shape[0]} elements differ, first at {diff[0].tolist()}"


def _check_against_two_casts(x, sizes, pad, outs, ue8m0=False):
    """outs == quantize_fp8_1x128_rowwise(x) + quantize_fp8_1x128_colwise_segments_padded(x, sizes, pad), bit for
    bit (q_t's row padding included), the separate ops run on x's device."""
    assert len(outs) == 5
    q_r, s_r = OPS.quantize_fp8_1x128_rowwise(x, ue8m0)
    q_t, s_t, padded = OPS.quantize_fp8_1x128_colwise_segments_padded(x, sizes, pad, ue8m0)
    for name, got, expected in zip(("q", "scales", "q_t", "scales_t", "padded_sizes"), outs,
                                   (q_r, s_r, q_t, s_t, padded)):
        assert got.dtype == expected.dtype and got.device == x.device, name
        _assert_same(name, got, expected)


# ------------------------------------------------------------------ CPU ---------------------------------


@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cpu_is_the_two_casts(case, pad):
    rows, sizes = CASES[case]
    x = random_x(rows, 200, torch.bfloat16, seed=rows + len(sizes))
    s = torch.tensor(sizes, dtype=torch.int32)
    _check_against_two_casts(x, s, pad, OPS.quantize_fp8_1x128_both_segments_padded(x, s, pad, False))


def test_cpu_against_the_reference():
    sizes = [100, 0, 37, 211]
    x = random_x(sum(sizes), 300, torch.float32, seed=3)
    q, s, q_t, s_t, padded = wgrad.quantize_fp8_1x128_both_segments_padded(x, sizes, pad=32, ue8m0=True)
    q_ref, s_ref = reference.quantize_fp8_1x128_rowwise_reference(x, True)
    assert torch.equal(bits(q), bits(q_ref)) and torch.equal(bits(s), bits(s_ref))
    qt_ref, st_ref, padded_ref = reference.quantize_fp8_1x128_colwise_segments_padded_reference(x, sizes, 32, True)
    assert torch.equal(bits(q_t), bits(qt_ref)) and torch.equal(bits(s_t), bits(st_ref))
    assert padded.tolist() == list(padded_ref) and padded.tolist()[:3] == [128, 0, 64]


def test_meta_layouts():
    x = torch.empty(1000, 4097, dtype=torch.float16, device="meta")
    sizes = torch.empty(5, dtype=torch.int32, device="meta")
    q, s, q_t, s_t, padded = OPS.quantize_fp8_1x128_both_segments_padded(x, sizes, 32, False)
    k = (1000 + 5 * 31) // 32 * 32
    assert q.shape == (1000, 4097) and q.dtype == torch.float8_e4m3fn
    assert s.shape == (1000, num_k_blocks(4097)) and s.stride() == (1, align_up(1000, 4))
    assert q_t.shape == (4097, k) and q_t.stride() == (k, 1)
    assert s_t.shape == (4097, num_k_blocks(k) + 4) and s_t.stride() == (1, align_up(4097, 4))
    assert padded.shape == (5,) and padded.dtype == torch.int32


@pytest.mark.parametrize("shape", [(129, 130), (0, 5), (7, 0)])
def test_opcheck(shape):
    x = random_x(*shape, torch.float32, seed=13)
    sizes = torch.tensor([shape[0], 0], dtype=torch.int32)
    torch.library.opcheck(OPS.quantize_fp8_1x128_both_segments_padded, (x, sizes, 32, True))


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("pad", [0, 8, 48, 256])
def test_bad_pad_rejected(device, pad):
    x = torch.zeros(8, 16, device=device)
    sizes = torch.tensor([8], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=f"{OP}: pad must be 16, 32, 64 or 128, got {pad}"):
        OPS.quantize_fp8_1x128_both_segments_padded(x, sizes, pad, False)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_sizes_dtype_rejected(device):
    x = torch.zeros(8, 16, device=device)
    with pytest.raises(RuntimeError, match=f"{OP}: sizes must be int32, got "):
        OPS.quantize_fp8_1x128_both_segments_padded(x, torch.tensor([8], device=device), 32, False)


def test_bad_sizes_rejected_on_cpu():
    x = torch.zeros(8, 16)
    with pytest.raises(RuntimeError, match=f"{OP}: sum\\(sizes\\) must equal"):
        OPS.quantize_fp8_1x128_both_segments_padded(x, torch.tensor([3, 4], dtype=torch.int32), 32, False)


def test_python_api_flattens_and_converts_sizes():
    x = random_x(6 * 50, 256, torch.bfloat16, seed=17)
    outs = wgrad.quantize_fp8_1x128_both_segments_padded(x.view(6, 50, 256), [77, 223])
    _check_against_two_casts(x, torch.tensor([77, 223], dtype=torch.int32), 32, outs)
    with pytest.raises(ValueError, match="sizes"):
        wgrad.quantize_fp8_1x128_both_segments_padded(x, torch.tensor([77.0, 223.0]))


# ------------------------------------------------------------------ GPU ---------------------------------


def _check_gpu(x, sizes, pad, ue8m0=False):
    # Into poisoned outputs (a byte the kernel does not write shows up), against the separate CUDA casts.
    xg = x.cuda()
    sg = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    outs, _ = on_poisoned_outputs(lambda: OPS.quantize_fp8_1x128_both_segments_padded(xg, sg, pad, ue8m0))
    torch.cuda.synchronize()
    _check_against_two_casts(xg, sg, pad, outs, ue8m0)
    return outs


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_gpu_bit_exact(case, pad, dtype):
    rows, sizes = CASES[case]
    _check_gpu(random_x(rows, 1000, dtype, seed=rows + len(sizes)), sizes, pad)


@sm90
def test_gpu_against_the_cpu_reference():
    sizes = [1000, 37, 0, 2963, 5, 1995]
    x = random_x(sum(sizes), 520, torch.bfloat16, seed=5)
    outs = _check_gpu(x, sizes, 32, ue8m0=True)
    ref = OPS.quantize_fp8_1x128_both_segments_padded(x, torch.tensor(sizes, dtype=torch.int32), 32, True)
    for name, got, expected in zip(("q", "scales", "q_t", "scales_t", "padded_sizes"), outs, ref):
        _assert_same(name, got.cpu(), expected)


@sm90
@pytest.mark.parametrize("cols", [8, 100, 264, 7168])
def test_gpu_other_widths(cols):
    # C % 8 != 0: the row-wise and the generic kernels; 264: a partial column tile; 7168: DeepSeek-V3's hidden.
    _check_gpu(random_x(1000, cols, torch.bfloat16, seed=cols), [1, 127, 129, 3, 0, 740], 32)


@sm90
def test_gpu_large_table_and_many_segments():
    # 3000 segments: a table too large for the kernel's shared memory (the row-wise kernel, then the padded cast
    # with its table in global memory).
    g = torch.Generator().manual_seed(9)
    cuts = torch.randint(0, 6001, (2999,), generator=g).sort().values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([6000])])
    _check_gpu(random_x(6000, 136, torch.bfloat16, seed=10), (bounds[1:] - bounds[:-1]).tolist(), 32)


@sm90
@pytest.mark.parametrize("groups", [32, 33, 256])
def test_gpu_table_boundaries(groups):
    # 32 segments: the warps' scan; 33 and 256: the CTA-wide scan (every other segment empty).
    sizes = [0 if g % 2 else 17 + 61 * (g % 40) for g in range(groups)]
    _check_gpu(random_x(sum(sizes), 264, torch.bfloat16, seed=groups), sizes, 32)


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_invalid_sizes(dtype):
    # The column-wise scales become NaN (q_t unwritten); the row-wise outputs do not depend on the sizes.
    x = random_x(3000, 384, dtype, seed=7).cuda()
    for sizes in ([1000, 1000, 999], [2000, -1, 1001], [3001, 0]):
        sg = torch.tensor(sizes, dtype=torch.int32, device="cuda")
        (q, s, _, s_t, _), _ = on_poisoned_outputs(lambda: OPS.quantize_fp8_1x128_both_segments_padded(x, sg, 32, False))
        q_r, s_r = OPS.quantize_fp8_1x128_rowwise(x, False)
        _assert_same("q", q, q_r)
        _assert_same("scales", s, s_r)
        assert bool((bits(s_t) == SCALE_NAN_BITS).all()), sizes


@sm90
def test_gpu_graph_replay_with_new_sizes():
    # No host synchronisation: captured once, replayed with other sizes written into the same tensor.
    x = random_x(3000, 256, torch.bfloat16, seed=31).cuda()
    sizes = torch.tensor([1000, 1000, 1000], dtype=torch.int32, device="cuda")
    graph, outs = capture_graph(lambda: OPS.quantize_fp8_1x128_both_segments_padded(x, sizes, 32, False))
    for new in ([1000, 1000, 1000], [7, 2900, 93], [0, 0, 3000]):
        sizes.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        _check_against_two_casts(x, sizes, 32, outs)
