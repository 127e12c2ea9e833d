"""The fp32 GEMMs' two epilogues (csrc/kernels/gemm/epilogue_sm90.cuh): the TMA reduce-add into out, and out
loaded ahead into shared memory, added to there and stored back. WGRAD_FP32_EPILOGUE forces either (unset,
the K of the call picks). Both add each accumulator to out with one fp32 addition, so they agree bit for bit:
every mode, partial tiles, a ragged right edge (N % 4 != 0), windows of NaN-filled buffers, empty groups, and
CTAs that run many tiles in turn (the loaded buffer's barriers change phase at every tile). At BLOCK_N 128 the
loaded epilogue moves a warpgroup's slice as two boxes of 32 columns in the 128B swizzle, elsewhere as one
plain box: out's right edge is put inside and at the end of each box, at every tile width."""

from __future__ import annotations

import pytest
import torch

from helpers import (
    GPU_MARKS,
    bits,
    blockwise_reference,
    contiguous_group_references,
    generator,
    ks_tensor,
    make_contiguous,
    make_dense,
    make_packed,
    packed_group_references,
    poisoned_out,
    poisoned_window_mask,
    rel_frobenius,
)

DENSE = torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt
PACKED = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt
CONTIG = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous
FORMS = ("reduce-add", "loaded")
REL_TOL = 2e-4  # the tensor cores' accumulation against float64 (as tests/test_gemm.py)


def _both_forms(monkeypatch, shape, call, seed):
    """Runs `call(out)` once per epilogue on a window of a NaN-filled buffer that starts as the same random
    values; checks that nothing outside the window changed and that both give the same bits. Returns (the
    initial values, the window after the loaded epilogue)."""
    gen = generator("cuda", seed)
    init = torch.randn(shape, device="cuda", generator=gen)
    results = {}
    for form in FORMS:
        monkeypatch.setenv("WGRAD_FP32_EPILOGUE", form)
        buf, out = poisoned_out(shape, device="cuda")
        out.copy_(init)
        outside = ~poisoned_window_mask(buf, out)
        before = bits(buf)
        call(out)
        torch.cuda.synchronize()
        assert torch.equal(bits(buf)[outside], before[outside]), f"{form}: wrote outside the out window"
        results[form] = out
    assert torch.equal(bits(results["loaded"]), bits(results["reduce-add"])), "the two epilogues disagree"
    return init, results["loaded"]


def _check(out, init, product64, what):
    err = rel_frobenius(out.double() - init.double(), product64)
    assert err <= REL_TOL, f"{what}: rel. Frobenius error {err:.3e}"


@pytest.mark.parametrize("m, n, k", [pytest.param(*s, marks=GPU_MARKS) for s in [
    (1, 1, 16), (33, 331, 144), (129, 4097, 1008), (255, 1000, 2064), (1000, 4098, 512), (7168, 2112, 1024),
]])
def test_gpu_dense_epilogues_agree(monkeypatch, m, n, k):
    op = make_dense(m, n, k, device="cuda", seed=m + n + k)
    init, out = _both_forms(monkeypatch, (m, n), lambda out: DENSE(*op.args(), out), seed=k)
    if m * n >= 1024:
        _check(out, init, blockwise_reference(*op.args()), f"dense {m}x{n}x{k}")


@pytest.mark.parametrize("m, n, ks", [pytest.param(*c, marks=GPU_MARKS) for c in [
    (300, 1031, [128, 0, 256, 16, 1008]),
    (128, 4096, [128] * 40),  # 1280 tiles: each CTA runs about ten
    (257, 130, [512, 0, 0, 2048, 48]),
]])
def test_gpu_packed_epilogues_agree(monkeypatch, m, n, ks):
    op = make_packed(m, n, ks, device="cuda", seed=m + len(ks))
    init, out = _both_forms(monkeypatch, (len(ks), m, n), lambda out: PACKED(*op.args(), out, ks), seed=n)
    for g, ref in enumerate(packed_group_references(op, m, n)):
        if ks[g] == 0:
            assert torch.equal(bits(out[g]), bits(init[g])), f"empty group {g} changed"
        else:
            _check(out[g], init[g], ref, f"packed group {g}")


@pytest.mark.parametrize("m, n, ks", [pytest.param(*c, marks=GPU_MARKS) for c in [
    (1024, 1031, [32, 0, 64, 96, 128, 0, 1, 33, 160, 250, 0, 31, 0]),
    (300, 2000, [0, 7, 0, 0, 128, 97]),
    (256, 4096, [512] * 24),  # 768 tiles of four K blocks each
    (130, 515, [3000, 17, 0, 4096]),
]])
def test_gpu_contiguous_epilogues_agree(monkeypatch, m, n, ks):
    op = make_contiguous(m, n, ks, device="cuda", seed=m + len(ks))
    sizes = ks_tensor(ks, "cuda")
    init, out = _both_forms(monkeypatch, (len(ks), m, n), lambda out: CONTIG(*op.args(), out, sizes), seed=n)
    for g, ref in enumerate(contiguous_group_references(op)):
        if ks[g] == 0:
            assert torch.equal(bits(out[g]), bits(init[g])), f"empty group {g} changed"
        else:
            _check(out[g], init[g], ref, f"contiguous group {g}")


def _edges(block_n):
    """N of two column tiles whose right edge falls at or inside each box of the last tile's two warpgroups
    (32-column boxes at BLOCK_N 128, one box per warpgroup elsewhere); odd ends leave a ragged edge."""
    half = block_n // 2
    inside = [2, 32, 35, half - 2, half, half + 18, half + 32, half + 35, block_n - 3, block_n]
    return [block_n + e for e in sorted(set(inside))]


@pytest.mark.parametrize("block_n, n", [pytest.param(bn, n, marks=GPU_MARKS)
                                        for bn in (128, 144, 160) for n in _edges(bn)])
def test_gpu_every_box_at_the_right_edge(monkeypatch, block_n, n):
    monkeypatch.setenv("WGRAD_BLOCK_N", str(block_n))
    m, k = 130, 384
    op = make_dense(m, n, k, device="cuda", seed=n)
    init, out = _both_forms(monkeypatch, (m, n), lambda out: DENSE(*op.args(), out), seed=block_n)
    _check(out, init, blockwise_reference(*op.args()), f"dense {m}x{n}x{k} at BLOCK_N {block_n}")


@pytest.mark.parametrize("value", [pytest.param(v, marks=GPU_MARKS) for v in ["fast", "Loaded", "1"]])
def test_gpu_unknown_epilogue_name_is_an_error(monkeypatch, value):
    op = make_dense(128, 128, 128, device="cuda")
    out = torch.zeros(128, 128, device="cuda")
    monkeypatch.setenv("WGRAD_FP32_EPILOGUE", value)
    with pytest.raises(RuntimeError, match=f"WGRAD_FP32_EPILOGUE must be 'reduce-add' or 'loaded', got '{value}'"):
        DENSE(*op.args(), out)
    torch.cuda.synchronize()
    assert torch.count_nonzero(out).item() == 0


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_empty_value_lets_k_decide(monkeypatch, dummy):
    op = make_dense(256, 256, 256, device="cuda")
    monkeypatch.setenv("WGRAD_FP32_EPILOGUE", "")
    out = torch.zeros(256, 256, device="cuda")
    DENSE(*op.args(), out)
    monkeypatch.setenv("WGRAD_FP32_EPILOGUE", "loaded")
    forced = torch.zeros(256, 256, device="cuda")
    DENSE(*op.args(), forced)
    assert torch.equal(bits(out), bits(forced))
