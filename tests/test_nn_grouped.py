"""wgrad.nn.Fp8GroupedLinear and wgrad.nn.functional.fp8_grouped_linear (MoE experts).

CPU: output and all three gradients against the emulation (tests/nn_reference.py) with empty experts,
main_grad accumulation leaving empty experts untouched, group-size errors, torch.compile(fullgraph=True).
GPU: the same against the kernels, CUDA-graph capture of forward and backward replayed with new group sizes,
and a small MoE block trained 300 steps with AdamW against its bf16 twin.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import nn_reference
from helpers import capture_graph, cuda_param, gpu, rel_frobenius
from wgrad.nn import Fp8GroupedLinear, fp8_grouped_linear


def _data(sizes, in_f, out_f, dtype, *, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    tokens = sum(sizes)
    x = torch.randn(tokens, in_f, generator=g).to(dtype)
    w = (torch.randn(len(sizes), out_f, in_f, generator=g) / math.sqrt(in_f)).to(dtype)
    b = torch.randn(len(sizes), out_f, generator=g).to(dtype) if bias else None
    dy = torch.randn(tokens, out_f, generator=g).to(dtype)
    return x, w, b, dy


def _run(x, w, b, dy, sizes, *, main_grad=None):
    x = x.clone().requires_grad_(True)
    weight = nn.Parameter(w.clone())
    bias = nn.Parameter(b.clone()) if b is not None else None
    if main_grad is not None:
        weight.main_grad = main_grad
    y = fp8_grouped_linear(x, weight, sizes, bias)
    y.backward(dy)
    return y.detach(), x.grad, (weight.main_grad if main_grad is not None else weight.grad), \
        (bias.grad if bias is not None else None), weight


SPLITS = [[64, 0, 37, 155], [0, 0, 256], [1, 2, 3, 4, 5, 6, 7, 100], [128]]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("split", range(len(SPLITS)))
def test_cpu_matches_recipe(split, bias):
    sizes = SPLITS[split]
    x, w, b, dy = _data(sizes, 128, 144, torch.float32, seed=split, bias=bias)
    y, dx, dw, db, _ = _run(x, w, b, dy, torch.tensor(sizes))
    y_ref, dx_ref, dw_ref, db_ref = nn_reference.grouped(x, w, b, sizes, dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dw, dw_ref.float(), rtol=1e-6, atol=1e-6)
    if bias:
        torch.testing.assert_close(db.double(), db_ref, rtol=1e-6, atol=1e-5)


def test_cpu_main_grad_leaves_empty_experts_untouched():
    sizes = [40, 0, 88]
    x, w, _, dy = _data(sizes, 64, 32, torch.float32, seed=3)
    main_grad = torch.full(w.shape, 7.0)
    _, _, _, _, weight = _run(x, w, None, dy, sizes, main_grad=main_grad)
    dw_ref = nn_reference.grouped(x, w, None, sizes, dy)[2]
    assert torch.all(main_grad[1] == 7.0)
    torch.testing.assert_close(main_grad, (7.0 + dw_ref).float(), rtol=1e-6, atol=1e-6)
    assert weight.grad is None and weight.grad_added_to_main_grad


@pytest.mark.parametrize("device", ["cpu", cuda_param("cuda", id="cuda")])
def test_main_grad_of_empty_experts_keeps_its_bits(device):
    """An expert without tokens, the last one included (the padded cast's zero columns after the last
    expert are not handed to it), leaves its main_grad bitwise as it was: -0.0 stays -0.0."""
    sizes = [40, 0, 88, 0]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, w, _, dy = _data(sizes, 128, 32, dtype, seed=4)
    main_grad = torch.full(w.shape, -0.0, device=device)
    _run(x.to(device), w.to(device), None, dy.to(device), torch.tensor(sizes, device=device), main_grad=main_grad)
    for g in (1, 3):
        assert torch.equal(main_grad[g].view(torch.int32).cpu(), torch.full((32, 128), -0.0).view(torch.int32))
    assert main_grad[0].abs().amax() > 0 and main_grad[2].abs().amax() > 0


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("device", ["cpu", cuda_param("cuda", id="cuda")])
def test_activation_checkpointing_gives_the_same_step(device, reentrant):
    """Under torch.utils.checkpoint the experts' forward runs again in backward: the same output, input
    gradient and weight gradient bits as the step without it."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(6)
    plain = Fp8GroupedLinear(4, 128, 64, device=device, dtype=dtype)
    ckpt = Fp8GroupedLinear(4, 128, 64, device=device, dtype=dtype)
    ckpt.load_state_dict(plain.state_dict())
    sizes = torch.tensor([50, 0, 31, 79], device=device)
    x = torch.randn(160, 128, device=device, dtype=dtype)
    x_plain, x_ckpt = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y_plain = plain(x_plain, sizes)
    y_ckpt = torch.utils.checkpoint.checkpoint(ckpt, x_ckpt, sizes, use_reentrant=reentrant)
    y_plain.float().square().sum().backward()
    y_ckpt.float().square().sum().backward()
    assert torch.equal(y_ckpt, y_plain) and torch.equal(x_ckpt.grad, x_plain.grad)
    assert torch.equal(ckpt.weight.grad, plain.weight.grad) and plain.weight.grad.abs().amax() > 0


@pytest.mark.parametrize("device", ["cpu", cuda_param("cuda", id="cuda")])
def test_autocast_runs_in_its_dtype(device):
    """Under torch.autocast (bf16) fp32 experts on fp32 tokens give bf16, the bits of the layer called outside
    autocast on the tokens cast to bf16; the fp32 weight's gradient stays fp32."""
    torch.manual_seed(9)
    layer = Fp8GroupedLinear(3, 128, 64, bias=True, device=device)
    twin = Fp8GroupedLinear(3, 128, 64, bias=True, device=device)
    twin.load_state_dict(layer.state_dict())
    sizes = torch.tensor([20, 0, 45], device=device)
    x = torch.randn(65, 128, device=device, requires_grad=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = layer(x, sizes)
    assert y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    x16 = x.detach().bfloat16().requires_grad_(True)
    y16 = twin(x16, sizes)
    y16.float().square().sum().backward()
    assert torch.equal(y, y16) and torch.equal(x.grad, x16.grad.float())
    assert layer.weight.grad.dtype == torch.float32 and torch.equal(layer.weight.grad, twin.weight.grad)
    assert torch.equal(layer.bias.grad, twin.bias.grad)


def test_cpu_module_and_init():
    layer = Fp8GroupedLinear(4, 32, 48, bias=True)
    assert layer.weight.shape == (4, 48, 32) and layer.bias.shape == (4, 48)
    bound = 1 / math.sqrt(32)
    assert layer.weight.abs().max() <= bound + 1e-6 and layer.bias.abs().max() <= bound + 1e-6
    y = layer(torch.randn(10, 32), torch.tensor([3, 0, 7, 0]))
    assert y.shape == (10, 48)
    assert "num_experts=4" in repr(layer)


BAD = [
    (lambda x, s: (x, torch.tensor([10, 0, 5])), "group_sizes must sum to the tokens of x, T = 16, got 15"),
    (lambda x, s: (x, torch.tensor([17, -1, 0])), "group_sizes\\[1\\] must be >= 0, got -1"),
    (lambda x, s: (x, torch.tensor([8.0, 8.0, 0.0])), "group_sizes must hold integers, got torch.float32"),
    (lambda x, s: (x, [8, 8.5, 0]), "group_sizes\\[1\\] must be an int, got 8.5"),
    (lambda x, s: (x, torch.tensor([16, 0])), "group_sizes must have shape \\[3\\]"),
    (lambda x, s: (x[:, :16], s), "x must be 2-D \\[T, in_features = 32\\], got shape \\(16, 16\\)"),
    (lambda x, s: (x.double(), s), "x must be bfloat16, float16 or float32, got torch.float64"),
]


@pytest.mark.parametrize("bad", range(len(BAD)))
def test_cpu_bad_input_named(bad):
    layer = Fp8GroupedLinear(3, 32, 16)
    x, sizes = torch.randn(16, 32), torch.tensor([8, 8, 0])
    make, msg = BAD[bad]
    with pytest.raises(ValueError, match=f"fp8_grouped_linear: {msg}"):
        layer(*make(x, sizes))


@pytest.mark.parametrize("sizes_dtype", [torch.int64, torch.int32])
def test_cpu_compile_fullgraph(sizes_dtype):
    torch.manual_seed(0)
    layer = Fp8GroupedLinear(3, 64, 32, dtype=torch.bfloat16)  # (the traced grouped GEMM takes 16-bit operands)
    x = torch.randn(80, 64, dtype=torch.bfloat16, requires_grad=True)
    sizes = torch.tensor([30, 0, 50], dtype=sizes_dtype)
    compiled = torch.compile(layer, fullgraph=True)
    y = compiled(x, sizes)
    y.square().sum().backward()
    ref_w = layer.weight.grad.clone()
    ref_x = x.grad.clone()
    layer.weight.grad = None
    x.grad = None
    y_eager = layer(x, sizes)
    y_eager.square().sum().backward()
    torch.testing.assert_close(y, y_eager)
    torch.testing.assert_close(ref_w, layer.weight.grad)
    torch.testing.assert_close(ref_x, x.grad)


@pytest.mark.parametrize("sizes_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("sizes", [[30, 0, 49], [30, -1, 51]])
def test_cpu_compiled_sizes_checked_in_the_graph(sizes, sizes_dtype):
    """Traced, the sizes are checked by a device-side assertion in the graph (on the CPU it raises at once),
    int32 sizes as they are and others in int64."""
    torch._dynamo.reset()
    layer = Fp8GroupedLinear(3, 64, 32, dtype=torch.bfloat16)
    x = torch.randn(80, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="group_sizes must be >= 0 and sum to the tokens of x, T = 80"):
        torch.compile(layer, fullgraph=True)(x, torch.tensor(sizes, dtype=sizes_dtype))


# ------------------------------------------------------------------ GPU ---------------------------------

GPU_SPLITS = [([512, 0, 300, 1237, 99, 0, 1, 2048], 2048, 7168), ([1024] * 8, 7168, 2048), ([0, 17, 0, 4000], 256, 512)]


@pytest.mark.parametrize("case", range(len(GPU_SPLITS)))
@gpu
def test_gpu_matches_recipe(case):
    sizes, in_f, out_f = GPU_SPLITS[case]
    x, w, b, dy = _data(sizes, in_f, out_f, torch.bfloat16, seed=case, bias=True)
    main_grad = torch.full(w.shape, 3.0, device="cuda")
    y, dx, dw, db, weight = _run(x.cuda(), w.cuda(), b.cuda(), dy.cuda(), torch.tensor(sizes, device="cuda"),
                                 main_grad=main_grad)
    y_ref, dx_ref, dw_ref, db_ref = nn_reference.grouped(x, w, b, sizes, dy)
    # The expert GEMM and the reference both round the FP8 product to bf16: at most an ulp apart.
    assert rel_frobenius(y.cpu(), y_ref) <= 3e-3 and rel_frobenius(dx.cpu(), dx_ref) <= 3e-3
    assert rel_frobenius(dw.cpu() - 3.0, dw_ref) <= 2e-4
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.all(main_grad[g] == 3.0)
    assert rel_frobenius(db.cpu(), db_ref) <= 1e-2


@pytest.mark.parametrize("case", range(len(GPU_SPLITS)))
@gpu
def test_gpu_bf16_weight_grad_is_the_fp32_gradient_rounded(case):
    """Without main_grad a bf16 weight's gradient is written in bf16 by the kernel: the fp32 gradient's bits
    rounded once, zeros for an expert with no tokens."""
    sizes, in_f, out_f = GPU_SPLITS[case]
    x, w, _, dy = _data(sizes, in_f, out_f, torch.bfloat16, seed=case)
    x, w, dy = x.cuda(), w.cuda(), dy.cuda()
    sizes_t = torch.tensor(sizes, device="cuda")
    dw = _run(x, w, None, dy, sizes_t)[2]
    main_grad = torch.zeros(w.shape, device="cuda")
    _run(x, w, None, dy, sizes_t, main_grad=main_grad)
    assert dw.dtype == torch.bfloat16
    assert torch.equal(dw, main_grad.to(torch.bfloat16))
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.all(dw[g] == 0)


@gpu
def test_gpu_cuda_graph_with_changing_group_sizes():
    torch.manual_seed(0)
    layer = Fp8GroupedLinear(4, 256, 128, dtype=torch.bfloat16, device="cuda")
    layer.weight.main_grad = torch.zeros(layer.weight.shape, device="cuda")
    x = torch.randn(600, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sizes = torch.tensor([150, 150, 150, 150], device="cuda", dtype=torch.int32)
    dy = torch.randn(600, 128, device="cuda", dtype=torch.bfloat16)
    def step():
        y = layer(x, sizes)
        y.backward(dy)
        return y

    graph, y = capture_graph(step, warmup=2)
    for split in ([600, 0, 0, 0], [1, 99, 0, 500], [200, 17, 383, 0]):
        sizes.copy_(torch.tensor(split))
        layer.weight.main_grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        y_ref, dx_ref, dw_ref, _ = nn_reference.grouped(x.detach().cpu(), layer.weight.detach().cpu(), None, split,
                                                        dy.cpu())
        assert rel_frobenius(y.detach().cpu(), y_ref) <= 1e-2
        assert rel_frobenius(layer.weight.main_grad.cpu(), dw_ref) <= 2e-4
        for g, size in enumerate(split):
            if size == 0:
                assert torch.all(layer.weight.main_grad[g] == 0)


class _MoE(nn.Module):
    """A small MoE block: a fixed router (top-1 by argmax), tokens sorted by expert, up/gelu/down experts."""

    def __init__(self, dim, hidden, experts, fp8, dtype=torch.bfloat16, device="cuda"):
        super().__init__()
        self.experts = experts
        self.router = nn.Linear(dim, experts, bias=False, dtype=dtype, device=device)
        self.router.requires_grad_(False)
        self.up = Fp8GroupedLinear(experts, dim, hidden, dtype=dtype, device=device)
        self.down = Fp8GroupedLinear(experts, hidden, dim, dtype=dtype, device=device)
        self.fp8 = fp8

    def _experts(self, layer, x, sizes):
        if self.fp8:
            return layer(x, sizes)
        offsets = torch.cumsum(sizes, 0, dtype=torch.int32)
        return torch._grouped_mm(x, layer.weight.transpose(-2, -1), offs=offsets)

    def forward(self, x):
        expert = self.router(x).argmax(-1)
        order = torch.argsort(expert, stable=True)
        sizes = torch.bincount(expert, minlength=self.experts).to(torch.int32)
        h = torch.nn.functional.gelu(self._experts(self.up, x[order], sizes))
        out = torch.empty_like(x)
        out[order] = self._experts(self.down, h, sizes)
        return out


@gpu
def test_gpu_moe_block_trains_like_bf16():
    torch.manual_seed(0)
    dim, hidden, experts = 256, 512, 8
    teacher = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)).cuda()
    data = []
    for _step in range(16):
        x = torch.randn(1024, dim, device="cuda")
        with torch.no_grad():
            data.append((x.bfloat16(), teacher(x)))
    torch.manual_seed(1)
    bf16 = _MoE(dim, hidden, experts, fp8=False)
    fp8 = _MoE(dim, hidden, experts, fp8=True)
    fp8.load_state_dict(bf16.state_dict())
    losses = {name: nn_reference.train_losses(model, data, 300) for name, model in (("bf16", bf16), ("fp8", fp8))}
    assert losses["bf16"][-1] < 0.5 * losses["bf16"][0]
    final = {k: sum(v[-10:]) / 10 for k, v in losses.items()}
    assert abs(final["fp8"] - final["bf16"]) <= 0.02 * final["bf16"], final
