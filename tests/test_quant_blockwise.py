"""quantize_fp8_128x128: the weight cast of the FP8 layers (128 x 128 blocks, both orientations).

CPU: the reference rule checked against an independent float64 computation per block, the op's layouts,
opcheck, the fake kernel and the argument checks. GPU: the kernel bit for bit against the reference on
awkward shapes, every input dtype, both paths (vector and element-wise), UE8M0, zero and non-finite blocks,
with poisoned outputs.
"""

from __future__ import annotations

import math

import pytest
import torch

import wgrad
from helpers import gpu, bits, on_poisoned_outputs
from wgrad import reference

OP = torch.ops.wgrad.quantize_fp8_128x128
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Whole blocks, partial blocks on either edge, fewer than 8 rows or columns, odd sizes (element-wise path).
SHAPES = [(1, 1), (8, 8), (33, 129), (128, 128), (136, 264), (257, 300), (300, 257), (1000, 16)]


def _weights(rows, cols, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Rows of very different magnitude, so that every block gets its own scale.
    mag = 2.0 ** torch.randint(-6, 6, (rows, 1), generator=g).float()
    return (torch.randn(rows, cols, generator=g) * mag).to(dtype)


def _expected_scales64(w: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    rows, cols = w.shape
    nb, kb = math.ceil(rows / 128), math.ceil(cols / 128)
    out = torch.empty((nb, kb), dtype=torch.float64)
    wf = w.double()
    for i in range(nb):
        for j in range(kb):
            block = wf[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = block.abs().max().item() if block.numel() else 0.0
            s = torch.tensor(max(amax, 1e-4), dtype=torch.float32) / torch.tensor(448.0, dtype=torch.float32)
            if ue8m0:
                s = torch.tensor(2.0 ** math.ceil(math.log2(s.item())), dtype=torch.float32)
            out[i, j] = s.item()
    return out


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_scales_are_block_amax(shape, ue8m0):
    w = _weights(*shape, torch.float32, seed=1)
    q, s = reference.quantize_fp8_128x128_reference(w, ue8m0)
    torch.testing.assert_close(s.double(), _expected_scales64(w, ue8m0), rtol=0, atol=0)
    # Every code is the block's value over its scale, rounded to e4m3 (|error| <= half an e4m3 ulp, 2^-4
    # relative) and never beyond 448.
    deq = reference.dequantize_128x128(q, s)
    err = (deq - w.double()).abs()
    assert torch.all(err <= w.double().abs() * 2.0 ** -4 + s.double().max() * 2.0 ** -9)
    assert q.float().abs().max().item() <= 448.0


def test_reference_zero_and_nonfinite_blocks():
    w = torch.randn(256, 384)
    w[:128, 128:256] = 0.0
    w[200, 300] = float("nan")
    w[5, 5] = float("inf")
    q, s = reference.quantize_fp8_128x128_reference(w)
    assert s[0, 1].item() == pytest.approx(1e-4 / 448) and torch.all(q[:128, 128:256].float() == 0)
    assert math.isnan(s[1, 2].item()) and torch.all(q[128:, 256:].view(torch.uint8) == 0x7F)
    assert math.isnan(s[0, 0].item()) and torch.all(q[:128, :128].view(torch.uint8) == 0x7F)
    assert torch.isfinite(s[1, 0]) and torch.isfinite(s[0, 2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(33, 129), (256, 128)])
def test_cpu_op_layouts(shape, dtype):
    w = _weights(*shape, dtype, seed=2)
    q, s, q_t, s_t = wgrad.quantize_fp8_128x128(w)
    q_ref, s_ref = reference.quantize_fp8_128x128_reference(w)
    assert torch.equal(bits(q), bits(q_ref)) and torch.equal(s, s_ref)
    assert q_t.is_contiguous() and s.is_contiguous() and s_t.is_contiguous()
    assert torch.equal(bits(q_t), bits(q_ref.t().contiguous())) and torch.equal(s_t, s_ref.t())


@pytest.mark.parametrize("shape", [(33, 129), (0, 16), (16, 0)])
def test_opcheck(shape):
    w = _weights(*shape, torch.float32, seed=3) if 0 not in shape else torch.zeros(shape)
    torch.library.opcheck(OP, (w, True))


def test_fake_shapes():
    w = torch.empty(300, 257, device="meta", dtype=torch.bfloat16)
    q, s, q_t, s_t = OP(w)
    assert q.shape == (300, 257) and q_t.shape == (257, 300) and s.shape == (3, 3) and s_t.shape == (3, 3)
    assert q.dtype == q_t.dtype == torch.float8_e4m3fn and s.dtype == s_t.dtype == torch.float32


BAD_W = [
    (lambda: torch.zeros(4, 4, dtype=torch.int32), "w must be bfloat16, float16 or float32, got"),
    (lambda: torch.zeros(16), "w must be 2-D \\[N, K\\], got 1-D"),
    (lambda: torch.zeros(2, 16, 16), "w must be 2-D \\[N, K\\], got 3-D"),
    (lambda: torch.zeros(32, 16).t(), "w must be contiguous"),
]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("bad", range(len(BAD_W)))
def test_bad_w_rejected(device, bad):
    make, msg = BAD_W[bad]
    with pytest.raises(RuntimeError, match=f"quantize_fp8_128x128: {msg}"):
        OP(make().to(device))


def test_python_function_copies_non_contiguous():
    w = _weights(64, 48, torch.float32).t()
    q, s, _, _ = wgrad.quantize_fp8_128x128(w)
    q_ref, s_ref = reference.quantize_fp8_128x128_reference(w.contiguous())
    assert torch.equal(bits(q), bits(q_ref)) and torch.equal(s, s_ref)
    with pytest.raises(ValueError, match="w must be 2-D"):
        wgrad.quantize_fp8_128x128(torch.zeros(2, 3, 4))


# ------------------------------------------------------------------ GPU ---------------------------------


def _assert_kernel_matches(w_cpu: torch.Tensor, ue8m0: bool):
    w = w_cpu.cuda()
    (q, s, q_t, s_t), landed = on_poisoned_outputs(lambda: OP(w, ue8m0))
    assert all(landed)
    q_ref, s_ref = reference.quantize_fp8_128x128_reference(w_cpu, ue8m0)
    assert torch.equal(bits(q.cpu()), bits(q_ref))
    assert torch.equal(bits(q_t.cpu()), bits(q_ref.t().contiguous()))
    assert torch.equal(s.cpu().view(torch.int32), s_ref.view(torch.int32))
    assert torch.equal(s_t.cpu().view(torch.int32), s_ref.t().contiguous().view(torch.int32))


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(4096, 7168), (2112, 7168)])
@gpu
def test_gpu_bit_exact(shape, dtype, ue8m0):
    _assert_kernel_matches(_weights(*shape, dtype, seed=sum(shape)), ue8m0)


@pytest.mark.parametrize("dtype", DTYPES)
@gpu
def test_gpu_zero_and_nonfinite_blocks(dtype):
    w = _weights(384, 272, dtype, seed=5)
    w[:128, 128:256] = 0
    w[300, 200] = float("nan")
    w[7, 3] = float("-inf")
    _assert_kernel_matches(w, False)


@gpu
def test_gpu_unaligned_base_takes_the_element_path():
    # A view whose data pointer is not 16-byte aligned (one element in): element-wise loads, same bytes.
    buf = _weights(1, 64 * 48 + 1, torch.bfloat16, seed=6).cuda()
    w = buf[0, 1:].view(64, 48)
    q, s, q_t, s_t = OP(w)
    q_ref, s_ref = reference.quantize_fp8_128x128_reference(w.cpu())
    assert torch.equal(bits(q.cpu()), bits(q_ref)) and torch.equal(s.cpu(), s_ref)
    assert torch.equal(bits(q_t.cpu()), bits(q_ref.t().contiguous()))
