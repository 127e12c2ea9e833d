"""Tensor parallelism of `Fp8Linear` with DTensor weights on the CPU (gloo, two processes), against the
unsharded layers in one process.

- Megatron's MLP split: `parallelize_module` with `ColwiseParallel` on the first Fp8Linear and
  `RowwiseParallel` on the second (their weights become DTensors through `distribute_tensor`; the layers run
  the recipe on the local shards), three SGD steps.
- Tokens sharded, weight replicated (`fp8_linear` on a `Shard(0)` x and a `Replicate()` weight): the weight
  gradient is the sum of the ranks' partial gradients.

Every shard boundary falls on a 128 boundary (features split 512 -> 2 x 256, tokens 256 -> 2 x 128), so the
FP8 casts cut the same 1x128 and 128x128 blocks as the unsharded layers.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import wgrad.nn as wnn
from helpers import finish_rank, spawn_ranks, value_error_messages
from wgrad.nn.tensor_parallel import has_dtensor

WORLD, TOKENS, D_MODEL, D_FF, STEPS, LR = 2, 256, 128, 512, 3, 0.01
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(wnn.Fp8Linear(D_MODEL, D_FF), nn.GELU(), wnn.Fp8Linear(D_FF, D_MODEL))


def _data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(TOKENS, D_MODEL, generator=g), torch.randn(TOKENS, D_MODEL, generator=g))
            for _ in range(STEPS)]


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor as a plain one: DTensors gathered, and the results of the parallel styles' asynchronous
    redistributions (AsyncCollectiveTensor) waited for by the copy."""
    return (t.full_tensor() if has_dtensor(t) else t).detach().clone()


def _train(model: nn.Module):
    """Per step: the output, x's gradient and every parameter's gradient (whole tensors), then an SGD step."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    steps = []
    for x, dy in _data():
        x = x.clone().requires_grad_()
        opt.zero_grad(set_to_none=True)
        y = model(x)
        # A loss linear in y: dY is the same in both configurations whatever the rounding of y.
        ((y * dy).sum() / TOKENS).backward()
        steps.append({"y": _full(y), "x_grad": _full(x.grad),
                      "grads": {n: _full(p.grad) for n, p in model.named_parameters()}})
        opt.step()
    return steps


def _token_sharded(mesh=None):
    """fp8_linear of the first layer's parameters on x sharded along the tokens (or unsharded without a mesh):
    the output and the weight and bias gradients, whole."""
    layer = _mlp()[0]
    x = _data()[0][0]
    dy = torch.randn(TOKENS, D_FF, generator=torch.Generator().manual_seed(2))
    weight, bias = layer.weight, layer.bias
    if mesh is not None:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        weight = nn.Parameter(distribute_tensor(weight.detach(), mesh, [Replicate()]))
        bias = nn.Parameter(distribute_tensor(bias.detach(), mesh, [Replicate()]))
        x, dy = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(dy, mesh, [Shard(0)])
    y = wnn.fp8_linear(x, weight, bias)
    (y * dy).sum().backward()
    return {"y": _full(y), "w_grad": _full(weight.grad), "b_grad": _full(bias.grad),
            "y_placements": [repr(p) for p in getattr(y, "placements", ())]}


def _errors(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = torch.zeros(TOKENS, D_MODEL)
    col = distribute_tensor(torch.zeros(D_FF, D_MODEL), mesh, [Shard(0)])
    calls = {
        "x_sharded_on_features": lambda: wnn.fp8_linear(distribute_tensor(x, mesh, [Shard(1)]), col),
        "plain_x": lambda: wnn.fp8_linear(x, col),
        "plain_weight": lambda: wnn.fp8_linear(distribute_tensor(x, mesh, [Replicate()]), torch.zeros(D_FF, D_MODEL)),
    }
    with_main_grad = distribute_tensor(torch.zeros(D_FF, D_MODEL), mesh, [Shard(0)])
    with_main_grad.main_grad = torch.zeros(D_FF // WORLD, D_MODEL)
    calls["main_grad"] = lambda: wnn.fp8_linear(distribute_tensor(x, mesh, [Replicate()]), with_main_grad)
    return value_error_messages(calls)


def _worker(rank: int, init_file: str, out_dir: str):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (WORLD,))
    model = parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    result = {"mlp": _train(model), "local_weights": [tuple(model[i].weight.to_local().shape) for i in (0, 2)],
              "tokens": _token_sharded(mesh), "errors": _errors(mesh)}
    finish_rank(rank, out_dir, result)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("tensor_parallel"))


def _exact(actual, expected):
    # Each rank multiplies the same FP8 blocks as the unsharded layer, and the result is not a sum over ranks.
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def _summed(actual, expected):
    # A sum over the ranks of partial results, each rounded to float32 before the all-reduce adds them, where
    # the unsharded layer rounds the whole float64 product once: a few float32 ulps (2^-23 ~ 1.2e-7) of the
    # partials, which are of the order of the largest result.
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6 * float(expected.abs().max()))


def test_column_then_row_parallel_match_unsharded(ranks):
    single = _train(_mlp())
    for doc in ranks:
        assert doc["local_weights"] == [(D_FF // WORLD, D_MODEL), (D_MODEL, D_FF // WORLD)]
        for step, ref in zip(doc["mlp"], single):
            _summed(step["y"], ref["y"])  # the row-parallel output: an all-reduce of partial products
            _summed(step["x_grad"], ref["x_grad"])  # the column-parallel input's gradient: likewise
            assert step["grads"].keys() == ref["grads"].keys()
            for name, grad in step["grads"].items():
                _exact(grad, ref["grads"][name])
    # The steps train: the parameters moved, so later steps saw other weights.
    assert not torch.equal(single[0]["grads"]["0.weight"], single[-1]["grads"]["0.weight"])


def test_tokens_sharded_with_replicated_weight(ranks):
    ref = _token_sharded()
    for doc in ranks:
        tokens = doc["tokens"]
        assert tokens["y_placements"] == ["Shard(dim=0)"]
        _exact(tokens["y"], ref["y"])
        _summed(tokens["w_grad"], ref["w_grad"])
        _summed(tokens["b_grad"], ref["b_grad"])


def test_unsupported_placements_are_named(ranks):
    for doc in ranks:
        errors = doc["errors"]
        assert "unsupported placements weight=Shard(dim=0), x=Shard(dim=1)" in errors["x_sharded_on_features"]
        assert "needs a Replicate() x" in errors["x_sharded_on_features"]
        assert "x must be a DTensor on the weight's device mesh" in errors["plain_x"]
        assert "got Tensor" in errors["plain_x"]
        assert "weight must be one on the same device mesh, got Tensor" in errors["plain_weight"]
        assert "main_grad is not supported on a DTensor weight" in errors["main_grad"]
