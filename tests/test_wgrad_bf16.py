"""The bf16 forms of the weight-gradient GEMMs: `wgrad_gemm_fp8_fp8_bf16_nt` (dense) and
`k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous`, which write `out = bf16(a b^T)` instead of adding into fp32.

Their contract: the bits of the fp32 form into zeros, then cast to bf16 (one fp32 accumulation, one rounding);
K == 0 and empty groups write zeros; only the out window is written. CPU: the reference kernels against that
rule and against the float64 product; opcheck; the Python API. GPU: bitwise against the fp32 kernel + cast on
awkward shapes, every tile width, ragged right edges (N % 8 != 0), strided and poisoned out windows, empty and
unaligned groups, invalid device sizes, CUDA-graph replay. (Argument checks: tests/test_checks.py.)
"""

from __future__ import annotations

import pytest
import torch

import wgrad
from helpers import (
    GPU_MARKS,
    bits,
    capture_graph,
    ks_tensor,
    make_contiguous,
    make_dense,
    new_out,
    rel_frobenius,
)
from wgrad import reference

DENSE = torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt
DENSE_BF16 = torch.ops.wgrad.wgrad_gemm_fp8_fp8_bf16_nt
CONTIG = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous
CONTIG_BF16 = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous

OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
BF16_REL_TOL = 4e-3  # bf16 rounding of the result (2^-9 relative per element) on top of the fp32 bar


def bf16_out(*shape, device="cpu", fill=float("nan")):
    """bf16 out of `shape` whose row stride is N rounded up to 8 (16-byte rows), filled with `fill`."""
    *lead, m, n = shape
    buf = torch.full((*lead, m, -(-max(n, 1) // 8) * 8), fill, dtype=torch.bfloat16, device=device)
    return buf[..., :n]


def poisoned_bf16_out(shape, device):
    """A bf16 window of `shape` inside a NaN buffer: a NaN row above and below, 8 NaN columns to the left and
    at least 8 to the right, 16-byte aligned rows. Returns (buffer, window, mask of the window)."""
    *lead, m, n = shape
    ld = -(-n // 8) * 8 + 16
    buf = torch.full((*lead, m + 2, ld), float("nan"), dtype=torch.bfloat16, device=device)
    window = buf[..., 1 : 1 + m, 8 : 8 + n]
    mask = torch.zeros(buf.shape, dtype=torch.bool, device=device)
    mask[..., 1 : 1 + m, 8 : 8 + n] = True
    return buf, window, mask


def fp32_then_cast_dense(op):
    m, n = op.a.shape[0], op.b.shape[0]
    out = new_out(m, n, device=op.a.device)
    DENSE(*op.args(), out)
    return out.to(torch.bfloat16)


def fp32_then_cast_contig(op, sizes):
    m, n = op.a.shape[0], op.b.shape[0]
    out = new_out(len(op.ks), m, n, device=op.a.device)
    CONTIG(*op.args(), out, sizes)
    return out.to(torch.bfloat16)


# ------------------------------------------------------------------ CPU -----------------------------


@pytest.mark.parametrize("m, n, k", [(1, 1, 16), (33, 24, 144), (129, 7, 1008), (7, 130, 0)])
def test_cpu_dense_is_the_fp32_form_cast(m, n, k):
    op = make_dense(m, n, k, seed=m + n + k)
    out = bf16_out(m, n)
    DENSE_BF16(*op.args(), out)
    assert torch.equal(bits(out), bits(fp32_then_cast_dense(op)))
    if k > 0:
        assert rel_frobenius(out, reference.wgrad_gemm_reference(*op.args())) <= BF16_REL_TOL
    else:
        assert torch.equal(bits(out), bits(torch.zeros_like(out)))


@pytest.mark.parametrize("ks", [[96, 0, 64], [0, 0], [1, 200, 17], [300]])
def test_cpu_contiguous_is_the_fp32_form_cast_and_empty_groups_are_zero(ks):
    op = make_contiguous(33, 24, ks, seed=sum(ks))
    sizes = ks_tensor(ks, "cpu")
    out = bf16_out(len(ks), 33, 24)
    CONTIG_BF16(*op.args(), out, sizes)
    assert torch.equal(bits(out), bits(fp32_then_cast_contig(op, sizes)))
    for g, k in enumerate(ks):
        if k == 0:
            assert torch.equal(bits(out[g]), bits(torch.zeros_like(out[g])))


@pytest.mark.parametrize("which", ["dense", "contiguous"])
def test_opcheck(which):
    if which == "dense":
        op = make_dense(36, 24, 144, seed=1)
        args = (*op.args(), bf16_out(36, 24, fill=0.0))
        target = DENSE_BF16
    else:
        op = make_contiguous(36, 24, [100, 0, 60], seed=2)
        args = (*op.args(), bf16_out(3, 36, 24, fill=0.0), ks_tensor(op.ks, "cpu"))
        target = CONTIG_BF16
    torch.library.opcheck(target, args, test_utils=OPCHECK_UTILS)


def test_api_allocates_out_and_converts_scale_layouts():
    op = make_dense(40, 24, 272, seed=5)
    out = wgrad.wgrad_gemm_fp8_fp8_bf16_nt((op.a, op.sa.t().contiguous()), (op.b, op.sb))
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (40, 24)
    assert torch.equal(bits(out), bits(fp32_then_cast_dense(op)))
    g = make_contiguous(40, 24, [100, 0, 172], seed=6)
    sizes = ks_tensor(g.ks, "cpu")
    out = wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous((g.a, g.sa), (g.b, g.sb), sizes)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (3, 40, 24)
    assert torch.equal(bits(out), bits(fp32_then_cast_contig(g, sizes)))


# ------------------------------------------------------------------ GPU -----------------------------

GPU_SHAPES = [(1, 1, 16), (33, 100, 144), (129, 255, 1008), (255, 1000, 4096), (1000, 4097, 8208),
              (7168, 2112, 4096), (4097, 129, 128)]


def _gpu_dense_window(m, n, k, seed):
    """Only the window of a poisoned buffer is written, with the fp32 kernel's bits rounded to bf16."""
    op = make_dense(m, n, k, device="cuda", seed=seed)
    buf, out, mask = poisoned_bf16_out((m, n), "cuda")
    before = bits(buf)
    DENSE_BF16(*op.args(), out)
    assert torch.equal(bits(buf)[~mask], before[~mask]), "wrote outside the out window"
    assert torch.equal(bits(out), bits(fp32_then_cast_dense(op)))
    return op, out


@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS) for s in GPU_SHAPES])
def test_gpu_dense_bitwise_the_fp32_kernel_cast(m, n, k):
    op, out = _gpu_dense_window(m, n, k, seed=m + k)
    assert rel_frobenius(out, reference.wgrad_gemm_reference(*op.args())) <= BF16_REL_TOL


@pytest.mark.parametrize("block_n", [128, 144, 160])
@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS)
                                     for s in [(129, 4097, 1008), (255, 1003, 144), (33, 331, 8208)]])
def test_gpu_dense_every_tile_width(monkeypatch, block_n, m, n, k):
    """Every kernel instance (the 64-column swizzled boxes and, at 144 / 160, the 8-column ones) and the
    ragged right edge (N % 8 != 0)."""
    monkeypatch.setenv("WGRAD_BLOCK_N", str(block_n))
    _gpu_dense_window(m, n, k, seed=block_n + m)


@pytest.mark.parametrize("m, n", [pytest.param(m, n, marks=GPU_MARKS) for m, n in [(1, 1), (33, 129), (4097, 255)]])
def test_gpu_dense_k_zero_writes_zeros(m, n):
    op = make_dense(m, n, 0, device="cuda")
    buf, out, mask = poisoned_bf16_out((m, n), "cuda")
    before = bits(buf)
    DENSE_BF16(*op.args(), out)
    assert torch.equal(bits(buf)[~mask], before[~mask])
    assert torch.equal(bits(out), bits(torch.zeros_like(out)))


CONTIG_GPU = [
    (257, 384, [512, 112, 0, 1424, 16, 1008, 16, 1008]),
    (129, 255, [511, 100, 0, 1437, 1, 1007, 17, 1023]),  # groups starting inside 16-byte chunks
    (1000, 4097, [0, 4096, 0]),
    (7168, 2048, [512] * 4 + [0] + [384] * 3),
    (33, 24, [0, 0]),  # K_total == 0: every group zeros
]


@pytest.mark.parametrize("m, n, ks", [pytest.param(*c, marks=GPU_MARKS) for c in CONTIG_GPU])
def test_gpu_contiguous_bitwise_the_fp32_kernel_cast(m, n, ks):
    op = make_contiguous(m, n, ks, device="cuda", seed=m)
    sizes = ks_tensor(ks, "cuda")
    buf, out, mask = poisoned_bf16_out((len(ks), m, n), "cuda")
    before = bits(buf)
    CONTIG_BF16(*op.args(), out, sizes)
    assert torch.equal(bits(buf)[~mask], before[~mask]), "wrote outside the out window"
    assert torch.equal(bits(out), bits(fp32_then_cast_contig(op, sizes)))
    for g, k in enumerate(ks):
        if k == 0:
            assert torch.equal(bits(out[g]), bits(torch.zeros_like(out[g])))


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_contiguous_cuda_graph_replay_with_new_sizes(dummy):
    m, n = 257, 384
    ks1 = [512, 112, 0, 1424, 16, 1008, 16, 1008]
    ks2 = [0, 4096, 0, 0, 0, 0, 0, 0]
    op = make_contiguous(m, n, ks1, device="cuda", seed=1)
    sizes = ks_tensor(ks1, "cuda")
    out = bf16_out(8, m, n, device="cuda")
    graph, _ = capture_graph(lambda: CONTIG_BF16(*op.args(), out, sizes))
    for ks in (ks2, ks1):
        sizes.copy_(ks_tensor(ks, "cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        op.ks = list(ks)
        assert torch.equal(bits(out), bits(fp32_then_cast_contig(op, sizes)))
