"""wgrad.nn.Fp8Linear and wgrad.nn.functional.fp8_linear.

CPU: output and all three gradients against the float64 emulation of the recipe (tests/nn_reference.py),
Megatron's main_grad protocol, the weight cache and its invalidation, state_dict compatibility with
nn.Linear, torch.compile(fullgraph=True) of a train step, argument errors, NaN propagation.
GPU: the same against the kernels (cuBLAS fprop/dgrad, wgrad's kernel), and a 2-layer MLP trained 300 steps
with AdamW against its bf16 twin.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

import nn_reference
import wgrad
from helpers import capture_graph, cuda_param, gpu, package_env, rel_frobenius
from wgrad.nn import Fp8Linear, fp8_linear
from wgrad.nn import _recipe


def _data(tokens, in_f, out_f, dtype, *, seed=0, device="cpu", bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, in_f, generator=g).to(dtype)
    w = (torch.randn(out_f, in_f, generator=g) / math.sqrt(in_f)).to(dtype)
    b = torch.randn(out_f, generator=g).to(dtype) if bias else None
    dy = torch.randn(tokens, out_f, generator=g).to(dtype)
    move = (lambda t: None if t is None else t.to(device))
    return move(x), move(w), move(b), move(dy)


def _layer(w, b, **factory):
    """An Fp8Linear holding w and b."""
    layer = Fp8Linear(w.shape[1], w.shape[0], **factory)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    return layer


def _run(x, w, b, dy, *, main_grad=False):
    """Forward and backward through fp8_linear; returns (y, dx, dw or main_grad, db, weight)."""
    x = x.clone().requires_grad_(True)
    weight = nn.Parameter(w.clone())
    bias = nn.Parameter(b.clone()) if b is not None else None
    if main_grad:
        weight.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    y = fp8_linear(x, weight, bias)
    y.backward(dy)
    dw = weight.main_grad if main_grad else weight.grad
    return y.detach(), x.grad, dw, (bias.grad if bias is not None else None), weight


# Token counts: a multiple of 128, of 16 but not 128, and of neither (the contiguous-K wgrad path).
CPU_CASES = [(256, 128, 256), (48, 256, 128), (33, 128, 144), (1, 16, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CPU_CASES)
def test_cpu_matches_recipe(case, dtype):
    x, w, b, dy = _data(*case, dtype, seed=sum(case))
    y, dx, dw, db, weight = _run(x, w, b, dy)
    y_ref, dx_ref, dw_ref, db_ref = nn_reference.linear(x, w, b, dy)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(dx, dx_ref, **tol)
    # dW accumulates in fp32 and is then handed to autograd, which rounds it to the weight's dtype.
    torch.testing.assert_close(dw, dw_ref.to(torch.float32).to(dtype), rtol=1e-6 if dtype == torch.float32 else 8e-3,
                               atol=1e-6)
    torch.testing.assert_close(db.double(), db_ref, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-4)
    assert weight.grad.dtype == dtype and not hasattr(weight, "grad_added_to_main_grad")


def test_cpu_leading_dims_and_shapes():
    x, w, b, dy = _data(24, 128, 256, torch.float32, seed=3)
    x3 = x.view(2, 3, 4, 128)
    layer = _layer(w, b)
    y = layer(x3)
    assert y.shape == (2, 3, 4, 256)
    torch.testing.assert_close(y.reshape(24, 256), nn_reference.linear(x, w, b, dy)[0], rtol=1e-6, atol=1e-6)
    assert layer(x[0]).shape == (256,)


def test_cpu_zero_tokens():
    layer = Fp8Linear(128, 256)
    x = torch.zeros(0, 128, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == (0, 256) and x.grad.shape == (0, 128)
    assert torch.all(layer.weight.grad == 0) and torch.all(layer.bias.grad == 0)


def test_cpu_main_grad_accumulates_over_two_backwards():
    x1, w, b, dy1 = _data(64, 128, 256, torch.float32, seed=4)
    x2, _, _, dy2 = _data(64, 128, 256, torch.float32, seed=5)
    weight = nn.Parameter(w.clone())
    weight.main_grad = torch.full(w.shape, 0.25, dtype=torch.float32)
    for x, dy in ((x1, dy1), (x2, dy2)):
        fp8_linear(x, weight, None).backward(dy)
    expected = 0.25 + nn_reference.linear(x1, w, None, dy1)[2] + nn_reference.linear(x2, w, None, dy2)[2]
    torch.testing.assert_close(weight.main_grad, expected.float(), rtol=1e-6, atol=1e-6)
    assert weight.grad is None and weight.grad_added_to_main_grad is True


def test_cpu_main_grad_checked():
    x, w, _, _ = _data(16, 256, 128, torch.float32)
    weight = nn.Parameter(w.clone())
    weight.main_grad = torch.zeros(w.shape, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp8_linear: weight.main_grad must be float32, got torch.bfloat16"):
        fp8_linear(x, weight)
    weight.main_grad = torch.zeros(128, 128)
    with pytest.raises(ValueError, match="weight.main_grad must have the weight's shape \\[128, 256\\], got \\[128, 128\\]"):
        fp8_linear(x, weight)


def test_cpu_weight_cache_follows_in_place_updates(monkeypatch):
    x, w, b, dy = _data(32, 128, 256, torch.float32, seed=6)
    layer = _layer(w, b)
    calls = []
    real = _recipe.quantize_fp8_128x128
    monkeypatch.setattr(_recipe, "quantize_fp8_128x128", lambda t: calls.append(1) or real(t))
    y1 = layer(x)
    y1b = layer(x)  # a second micro-batch of the same step: the cast is reused
    assert len(calls) == 1 and torch.equal(y1, y1b)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    y1.sum().backward()
    opt.step()  # an in-place update: the next forward must not see the old cast
    y2 = layer(x)
    assert len(calls) == 2
    torch.testing.assert_close(y2, nn_reference.linear(x, layer.weight.detach(), layer.bias.detach(), dy)[0],
                               rtol=1e-6, atol=1e-6)
    layer.weight.data = layer.weight.data.clone()  # new storage, same version: a miss too
    layer(x)
    assert len(calls) == 3
    with torch.no_grad():
        layer.weight.data.mul_(2)  # through .data: no version bump, so only an explicit clear is seen
    wgrad.nn.clear_weight_cache()
    layer(x)
    assert len(calls) == 4
    # An optimizer step invalidates every cast even where the weight's version does not move (foreach and
    # fused optimizers' CUDA kernels, Megatron's copies through .data).
    layer(x)
    assert len(calls) == 4
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()
    layer(x)
    assert len(calls) == 5


def test_cpu_state_dict_round_trip_with_nn_linear():
    ref = nn.Linear(128, 256, dtype=torch.bfloat16)
    layer = Fp8Linear(128, 256, dtype=torch.bfloat16)
    layer.load_state_dict(ref.state_dict())
    assert set(layer.state_dict()) == {"weight", "bias"}
    back = nn.Linear(128, 256, dtype=torch.bfloat16)
    back.load_state_dict(layer.state_dict())
    assert torch.equal(back.weight, ref.weight) and torch.equal(back.bias, ref.bias)
    layer(torch.randn(16, 128, dtype=torch.bfloat16))  # a cast is cached, and still never saved
    assert set(layer.state_dict()) == {"weight", "bias"}
    shared = Fp8Linear.from_linear(ref)
    assert shared.weight is ref.weight and shared.bias is ref.bias and "in_features=128" in repr(shared)


class _Scaled(nn.Linear):
    """A subclass with a forward of its own: convert_to_fp8 must leave it alone."""

    def forward(self, x):
        return 2 * super().forward(x)


def _model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(),
                         nn.ModuleDict({"proj": nn.Linear(128, 64, bias=False), "head": nn.Linear(64, 10),
                                        "scaled": _Scaled(64, 64)}))


def test_cpu_convert_to_fp8_in_place():
    model = _model()
    layers = {name: m for name, m in model.named_modules()}
    params = {name: p for name, p in model.named_parameters()}
    state = copy.deepcopy(model.state_dict())
    calls = []
    layers["0"].register_forward_hook(lambda m, args, out: calls.append(type(m)))
    model.eval()
    assert wgrad.nn.convert_to_fp8(model) is model
    kinds = {name: type(m) for name, m in model.named_modules()}
    assert kinds["0"] is Fp8Linear and kinds["2.proj"] is Fp8Linear
    assert kinds["2.head"] is nn.Linear  # 10 out features: not a multiple of 16
    assert kinds["2.scaled"] is _Scaled  # a subclass keeps its own forward
    # The same objects, parameters, hooks and mode: an optimizer built before still holds the parameters.
    assert all(m is layers[name] for name, m in model.named_modules())
    assert all(p is params[name] for name, p in model.named_parameters())
    assert not model[0].training
    state_after = model.state_dict()
    assert list(state_after) == list(state) and all(torch.equal(state_after[k], state[k]) for k in state)
    x = torch.randn(12, 64)
    assert torch.equal(model[0](x), fp8_linear(x, model[0].weight, model[0].bias))
    assert calls == [Fp8Linear]


def test_cpu_convert_to_fp8_filter_and_root():
    model = _model()
    seen = []

    def only_proj(linear, name):
        seen.append(name)
        return name.endswith("proj")

    wgrad.nn.convert_to_fp8(model, only_proj)
    assert seen == ["0", "2.proj"]  # the filter is asked about convertible layers only
    assert type(model[0]) is nn.Linear and type(model[2]["proj"]) is Fp8Linear
    root = nn.Linear(32, 48)
    assert wgrad.nn.convert_to_fp8(root) is root and type(root) is Fp8Linear
    assert not wgrad.nn.convertible(nn.Linear(32, 40)) and wgrad.nn.convertible(nn.Linear(32, 48))
    shared = nn.Linear(16, 16)
    tied = nn.Sequential(shared, nn.ReLU(), shared)
    wgrad.nn.convert_to_fp8(tied, lambda m, name: seen.append(name) or True)
    assert type(tied[0]) is Fp8Linear and tied[0] is tied[2] and seen[-1] == "0"  # visited once


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("device", ["cpu", cuda_param("cuda", id="cuda")])
def test_activation_checkpointing_gives_the_same_step(device, reentrant):
    """Under torch.utils.checkpoint the forward runs again in backward: the output, the input's gradient and
    main_grad are the bits of the step without it, and main_grad receives the weight gradient once."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(5)
    plain = nn.Sequential(Fp8Linear(128, 256), nn.GELU(), Fp8Linear(256, 128)).to(device, dtype)
    ckpt = copy.deepcopy(plain)
    for model in (plain, ckpt):
        for layer in (model[0], model[2]):
            layer.weight.main_grad = torch.zeros(layer.weight.shape, device=device)
    x = torch.randn(96, 128, device=device, dtype=dtype)
    x_plain, x_ckpt = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y_plain = plain(x_plain)
    y_ckpt = torch.utils.checkpoint.checkpoint(ckpt, x_ckpt, use_reentrant=reentrant)
    y_plain.float().square().sum().backward()
    y_ckpt.float().square().sum().backward()
    assert torch.equal(y_ckpt, y_plain) and torch.equal(x_ckpt.grad, x_plain.grad)
    for a, b in ((ckpt[0], plain[0]), (ckpt[2], plain[2])):
        assert torch.equal(a.weight.main_grad, b.weight.main_grad) and a.weight.grad is None
        assert a.weight.main_grad.abs().amax() > 0
    assert torch.equal(ckpt[0].bias.grad, plain[0].bias.grad)


@pytest.mark.parametrize("device", ["cpu", cuda_param("cuda", id="cuda")])
def test_autocast_runs_in_its_dtype_like_nn_linear(device):
    """Under torch.autocast an fp32 model's Fp8Linear returns the autocast dtype, as nn.Linear does there: the
    bits of the layer called outside autocast on x cast to bf16; the fp32 weight's gradient stays fp32."""
    torch.manual_seed(8)
    ref = nn.Linear(128, 64, device=device)
    layer = wgrad.nn.convert_to_fp8(copy.deepcopy(ref))
    twin = copy.deepcopy(layer)
    x = torch.randn(48, 128, device=device, requires_grad=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = layer(x)
        assert ref(x).dtype == y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    x16 = x.detach().bfloat16().requires_grad_(True)
    y16 = twin(x16)
    y16.float().square().sum().backward()
    assert torch.equal(y, y16)
    assert layer.weight.grad.dtype == torch.float32 and torch.equal(layer.weight.grad, twin.weight.grad)
    assert torch.equal(layer.bias.grad, twin.bias.grad)
    assert x.grad.dtype == torch.float32 and torch.equal(x.grad, x16.grad.float())
    # What autocast leaves as it is, the layer takes as it would without autocast: float64 is refused.
    with torch.autocast(device, dtype=torch.bfloat16), pytest.raises(ValueError, match="x must be bfloat16"):
        layer(x.detach().double())


def test_cpu_frozen_parts_skip_their_gemms():
    x, w, b, dy = _data(32, 128, 256, torch.float32, seed=7)
    weight = nn.Parameter(w.clone(), requires_grad=False)
    xr = x.clone().requires_grad_(True)
    fp8_linear(xr, weight, None).backward(dy)
    assert weight.grad is None
    torch.testing.assert_close(xr.grad, nn_reference.linear(x, w, None, dy)[1], rtol=1e-6, atol=1e-6)
    weight.requires_grad_(True)
    fp8_linear(x, weight, None).backward(dy)  # x needs no gradient: wgrad only
    torch.testing.assert_close(weight.grad, nn_reference.linear(x, w, None, dy)[2].float(), rtol=1e-6, atol=1e-6)


def test_cpu_inference_casts_x_once_row_wise(monkeypatch):
    import wgrad.nn.functional as functional

    x, w, b, dy = _data(32, 128, 256, torch.float32, seed=9)
    layer = _layer(w, b)
    both = []
    real = functional.quantize_fp8_1x128_both
    monkeypatch.setattr(functional, "quantize_fp8_1x128_both", lambda t: both.append(1) or real(t))
    with torch.no_grad():
        y = layer(x)
    assert not both and not y.requires_grad
    torch.testing.assert_close(y, nn_reference.linear(x, w, b, dy)[0], rtol=1e-6, atol=1e-6)
    layer(x)
    assert len(both) == 1


def test_cpu_nan_propagates():
    x, w, b, dy = _data(32, 128, 128, torch.float32, seed=8)
    x[3, 5] = float("nan")
    y, dx, dw, db, _ = _run(x, w, b, dy)
    assert torch.isnan(y[3]).all() and torch.isfinite(y[torch.arange(32) != 3]).all()
    assert torch.isnan(dw).any()


BAD_CALLS = [
    (lambda x, w: (x[:, :128], w, None), "fp8_linear: x must have in_features = 256 in its last dim, got shape \\(8, 128\\)"),
    (lambda x, w: (x.int(), w, None), "fp8_linear: x must be bfloat16, float16 or float32, got torch.int32"),
    (lambda x, w: (x, w.double(), None), "fp8_linear: weight must be bfloat16, float16 or float32, got torch.float64"),
    (lambda x, w: (x, w[0], None), "fp8_linear: weight must be 2-D"),
    (lambda x, w: (x, w, torch.zeros(5)), "fp8_linear: bias must have shape \\[128\\], got \\(5,\\)"),
    (lambda x, w: (x[:, :136], w[:, :136], None), "in_features \\(weight.shape\\[1\\]\\) must be a positive multiple of 16"),
]


@pytest.mark.parametrize("bad", range(len(BAD_CALLS)))
def test_cpu_bad_input_named(bad):
    x, w, _, _ = _data(8, 256, 128, torch.float32)
    make, msg = BAD_CALLS[bad]
    with pytest.raises(ValueError, match=msg):
        fp8_linear(*make(x, w))


def test_constructor_checks_features():
    with pytest.raises(ValueError, match="Fp8Linear: in_features must be a positive multiple of 16 .*, got 100"):
        Fp8Linear(100, 128)
    with pytest.raises(ValueError, match="Fp8Linear: out_features must be a positive multiple of 16 .*, got 8"):
        Fp8Linear(128, 8)


class _Mlp(nn.Module):
    def __init__(self, dim, hidden, linear=Fp8Linear, dtype=torch.float32, device=None):
        super().__init__()
        self.up = linear(dim, hidden, dtype=dtype, device=device)
        self.down = linear(hidden, dim, dtype=dtype, device=device)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_compile_fullgraph_train_step(dtype):
    """bf16: the weight gradients come from the bf16 weight-gradient ops (their fake kernels in the trace)."""
    torch.manual_seed(0)
    eager = _Mlp(128, 256, dtype=dtype)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(48, 128, dtype=dtype)
    for model, run in ((eager, eager), (compiled_model, compiled)):
        loss = run(x).float().square().mean()
        loss.backward()
        model.loss = loss.detach()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-3)
    torch.testing.assert_close(compiled_model.loss, eager.loss, **tol)
    for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
        assert p_compiled.grad.dtype == dtype
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, **tol)


def test_cpu_compile_fullgraph_main_grad():
    torch.manual_seed(1)
    model = _Mlp(128, 256)
    for p in (model.up.weight, model.down.weight):
        p.main_grad = torch.zeros(p.shape)
    eager = copy.deepcopy(model)
    for p_e, p in zip((eager.up.weight, eager.down.weight), (model.up.weight, model.down.weight)):
        p_e.main_grad = torch.zeros(p.shape)
    x = torch.randn(32, 128)
    torch.compile(model, fullgraph=True)(x).sum().backward()
    eager(x).sum().backward()
    for p_e, p in zip((eager.up.weight, eager.down.weight), (model.up.weight, model.down.weight)):
        assert p.grad is None
        torch.testing.assert_close(p.main_grad, p_e.main_grad, rtol=1e-5, atol=1e-6)


def test_cpu_compile_fullgraph_under_autocast():
    """A step under torch.autocast traces into one graph and gives the eager step's output and gradients."""
    torch.manual_seed(2)
    model = _Mlp(128, 256)
    eager = copy.deepcopy(model)
    x = torch.randn(32, 128)

    def step(m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
        y.float().sum().backward()
        return y

    y = step(torch.compile(model, backend="aot_eager", fullgraph=True))
    y_eager = step(eager)
    assert y.dtype == y_eager.dtype == torch.bfloat16 and torch.equal(y, y_eager)
    for p, p_e in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, p_e.grad, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ GPU ---------------------------------

# DeepSeek-V3-like and awkward token counts; features multiples of 16 (and not of 128).
GPU_CASES = [(512, 7168, 2112), (256, 1536, 512), (1000, 256, 384), (33, 144, 400), (4096, 2048, 7168), (4097, 2112, 1536)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", GPU_CASES)
@gpu
def test_gpu_matches_recipe(case, dtype):
    x, w, b, dy = _data(*case, dtype, seed=sum(case))
    y, dx, dw, db, _w = _run(*(t.cuda() for t in (x, w, b, dy)), main_grad=True)
    y_ref, dx_ref, dw_ref, db_ref = nn_reference.linear(x, w, b, dy)
    # cuBLAS's blockwise FP8 GEMM lands ~1e-4 from the float64 product (measured 9e-5 with fp32 output), then
    # rounds to bf16; wgrad's kernel matches the float64 product to ~1e-4 (its promotion every 128 tokens).
    out_tol = 2e-3 if dtype == torch.bfloat16 else 3e-4
    assert rel_frobenius(y.cpu(), y_ref) <= out_tol
    assert rel_frobenius(dx.cpu(), dx_ref) <= out_tol
    assert rel_frobenius(dw.cpu(), dw_ref) <= 2e-4
    assert rel_frobenius(db.cpu(), db_ref) <= (1e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("case", GPU_CASES)
@gpu
def test_gpu_bf16_weight_grad_is_the_fp32_gradient_rounded(case):
    """Without main_grad a bf16 weight's gradient is written in bf16 by the kernel (dense, or contiguous-K for
    token counts that are not multiples of 16): the fp32 gradient's bits rounded once."""
    x, w, b, dy = (t.cuda() for t in _data(*case, torch.bfloat16, seed=sum(case)))
    dw = _run(x, w, b, dy)[2]
    main_grad = _run(x, w, b, dy, main_grad=True)[2]
    assert dw.dtype == torch.bfloat16
    assert torch.equal(dw, main_grad.to(torch.bfloat16))


def test_cpu_weight_padding_keeps_the_product():
    # What fp8_mm hands cuBLAS on CUDA, checked where it can be: K padded to a multiple of 512 (zero codes, unit
    # scales), the scales' row stride then a multiple of 4 blocks, the dequantized operand unchanged.
    for rows, cols in ((384, 256), (2112, 7168), (7168, 2112), (144, 400)):
        w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(cols))
        q, s, _, _ = wgrad.quantize_fp8_128x128(w)
        qp, sp = _recipe._padded_weight(q, s)
        assert qp.shape == (rows, -(-cols // 512) * 512) and sp.shape == (-(-rows // 128), qp.shape[1] // 128)
        assert sp.is_contiguous() and sp.t().stride() == (1, sp.shape[1]) and sp.shape[1] % 4 == 0
        deq = wgrad.reference.dequantize_128x128(qp, sp)
        assert torch.equal(deq[:, :cols], wgrad.reference.dequantize_128x128(q, s))
        assert not deq[:, cols:].any()
        a = torch.randn(37, cols).to(torch.float8_e4m3fn)
        sa = torch.rand(37, s.shape[1]) + 0.5
        padded = _recipe._scales_padded(sa, 128, sp.shape[1])
        assert padded.shape == (128, sp.shape[1]) and padded.stride() == (1, 128)
        assert torch.equal(padded[:37, :s.shape[1]], sa) and bool((padded[37:] == 1).all())


# M, K, N around cuBLAS's layout rules: K-block counts of every residue mod 4, N-block counts not a multiple
# of 4, M neither a multiple of 128 nor of 4.
FP8_MM_CASES = [(128, 128, 128), (256, 256, 384), (1000, 384, 256), (512, 2112, 7168), (33, 640, 2112),
                (4097, 7168, 2112), (130, 1536, 400), (8, 16, 16)]


@pytest.mark.parametrize("case", FP8_MM_CASES)
@gpu
def test_gpu_fp8_mm_matches_the_float64_product(case):
    m, k, n = case
    g = torch.Generator().manual_seed(m + k + n)
    a, sa = wgrad.quantize_fp8_1x128_rowwise(torch.randn(m, k, generator=g).to(torch.bfloat16).cuda())
    w = (torch.randn(n, k, generator=g) * 2.0 ** torch.randint(-4, 4, (n, 1), generator=g)).to(torch.bfloat16)
    q, s, _, _ = _recipe.weight_operands(w.cuda())
    y = _recipe.fp8_mm(a, sa, q, s, torch.float32)
    # The same product with the unpadded weight cast: fp8_mm pads on its own.
    q0, s0, _, _ = wgrad.quantize_fp8_128x128(w.cuda())
    y0 = _recipe.fp8_mm(a, sa, q0, s0, torch.float32)
    ref = _recipe.fp8_mm(a.cpu(), sa.cpu(), q0.cpu(), s0.cpu(), torch.float64)
    # cuBLAS lands ~1.3e-4 from the float64 product on these data (its accumulation, not the padding).
    assert y.shape == (m, n) and rel_frobenius(y.cpu().double(), ref) <= 3e-4
    assert torch.equal(y, y0)


@pytest.mark.parametrize("case", FP8_MM_CASES)
@gpu
def test_gpu_dense_mm_matches_the_float64_product(case):
    # wgrad's m-grouped kernel with one group, fed the padded weight cast's first K columns; fp8_mm takes it
    # for bf16 wherever cuBLAS would need a padded copy of a (every case here: M % 128 or K % 512 != 0).
    m, k, n = case
    g = torch.Generator().manual_seed(m + k + n + 1)
    a, sa = wgrad.quantize_fp8_1x128_rowwise(torch.randn(m, k, generator=g).to(torch.bfloat16).cuda())
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    q, s, _, _ = _recipe.weight_operands(w.cuda())
    y = _recipe.dense_mm(a, sa, q, s)
    q0, s0, _, _ = wgrad.quantize_fp8_128x128(w.cuda())
    ref = _recipe.fp8_mm(a.cpu(), sa.cpu(), q0.cpu(), s0.cpu(), torch.float64)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert rel_frobenius(y.cpu().double(), ref) <= 2e-3  # bf16 rounding of the output
    assert torch.equal(y, _recipe.dense_mm(a, sa, q0, s0))  # the padding is never read
    assert (m % _recipe.M_PAD, k % _recipe.K_PAD) != (0, 0)
    assert torch.equal(y, _recipe.fp8_mm(a, sa, q, s, torch.bfloat16))


@gpu
def test_gpu_backward_thread_runs_a_wgrad_op_first():
    # In a fresh process autograd's backward thread has made no CUDA runtime call when the dense backward's
    # first op (the dY cast) encodes its TMA descriptors: the driver call must still find a context.
    code = ("import torch, wgrad.nn as wn\n"
            "layer = wn.Fp8Linear(256, 128, device='cuda', dtype=torch.bfloat16)\n"
            "x = torch.randn(64, 256, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
            "layer(x).float().sum().backward()\n"
            "torch.cuda.synchronize()\n"
            "print('ok', bool(torch.isfinite(x.grad).all()), bool(torch.isfinite(layer.weight.grad).all()))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=package_env(), timeout=300)
    assert run.returncode == 0 and run.stdout.split() == ["ok", "True", "True"], run.stderr[-2000:]


@gpu
def test_gpu_two_backwards_into_main_grad_and_cache():
    x1, w, b, dy1 = _data(256, 512, 256, torch.bfloat16, seed=11)
    x2, _, _, dy2 = _data(256, 512, 256, torch.bfloat16, seed=12)
    layer = _layer(w, b, dtype=torch.bfloat16, device="cuda")
    layer.weight.main_grad = torch.zeros(w.shape, device="cuda")
    for x, dy in ((x1, dy1), (x2, dy2)):
        layer(x.cuda()).backward(dy.cuda())
    expected = nn_reference.linear(x1, w, b, dy1)[2] + nn_reference.linear(x2, w, b, dy2)[2]
    assert rel_frobenius(layer.weight.main_grad.cpu(), expected) <= 2e-4
    assert layer.weight.grad is None and layer.weight.grad_added_to_main_grad
    with torch.no_grad():
        layer.weight.mul_(-1)
    y = layer(x1.cuda())
    assert rel_frobenius(y.cpu().float(), nn_reference.linear(x1, -w, b, dy1)[0].float()) <= 2e-3


@gpu
def test_gpu_cuda_graph_replays_with_new_weights():
    layer = Fp8Linear(256, 128, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    def step():
        layer.weight.grad = None  # the captured backward allocates the gradient in the graph's pool
        y = layer(x)
        y.sum().backward()
        return y

    graph, y = capture_graph(step, warmup=2)
    with torch.no_grad():
        layer.weight.add_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    expected = nn_reference.linear(x.detach().cpu(), layer.weight.detach().cpu(), layer.bias.detach().cpu(),
                                   torch.ones(64, 128, dtype=torch.bfloat16))[0]
    assert rel_frobenius(y.detach().cpu().float(), expected.float()) <= 2e-3


@gpu
def test_gpu_mlp_trains_like_bf16():
    torch.manual_seed(0)
    dim, hidden = 256, 1024
    teacher = _Mlp(dim, hidden, linear=nn.Linear, device="cuda")
    data = []
    for _step in range(16):
        x = torch.randn(512, dim, device="cuda")
        with torch.no_grad():
            data.append((x.bfloat16(), teacher(x) + 0.01 * torch.randn(512, dim, device="cuda")))
    torch.manual_seed(1)
    bf16 = _Mlp(dim, hidden, linear=nn.Linear, dtype=torch.bfloat16, device="cuda")
    fp8 = wgrad.nn.convert_to_fp8(copy.deepcopy(bf16))  # the bf16 model's layers, their class swapped
    assert all(type(m) is Fp8Linear for m in fp8.modules() if isinstance(m, nn.Linear))
    loss_bf16 = nn_reference.train_losses(bf16, data, 300)
    loss_fp8 = nn_reference.train_losses(fp8, data, 300)
    assert loss_bf16[-1] < 0.5 * loss_bf16[0]  # the task is learnt at all
    final_bf16 = sum(loss_bf16[-10:]) / 10
    final_fp8 = sum(loss_fp8[-10:]) / 10
    assert abs(final_fp8 - final_bf16) <= 0.02 * final_bf16, (final_fp8, final_bf16)
