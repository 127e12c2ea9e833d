"""Data parallelism of the FP8 layers on the CPU (gloo, two processes): the same training steps on two ranks
and on one give the same losses.

- DDP without `main_grad`: the layers fill `.grad` like `nn.Linear`, DDP averages it.
- Megatron's gradient-accumulation fusion: micro-batches accumulate into `weight.main_grad` (the model is not
  wrapped in DDP), `wgrad.nn.all_reduce_main_grads` reduces it once per step.
- FSDP2 (`fully_shard` on every Fp8Linear and on the model): the layers quantize the weight FSDP gathers;
  their `.grad` is reduce-scattered by FSDP.

Each rank's micro-batches are 128-token slices of the global batch, so the column-wise casts of the weight
gradient (1x128 blocks along the tokens) see the same blocks on two ranks as on one.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

import wgrad.nn as wnn
from helpers import finish_rank, spawn_ranks

STEPS, TOKENS, D_IN, D_HID, D_OUT, MICRO = 5, 512, 256, 128, 64, 128
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(wnn.Fp8Linear(D_IN, D_HID), nn.GELU(), wnn.Fp8Linear(D_HID, D_OUT))


def _data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(TOKENS, D_IN, generator=g), torch.randn(TOKENS, D_OUT, generator=g)) for _ in range(STEPS)]


def _sum_sq(model, x, y):
    return (model(x) - y).square().sum()


def _train(rank: int, world: int, main_grad: bool, fsdp: bool = False):
    """Losses (global means) of STEPS SGD steps on this rank's share of every global batch."""
    model = _model()
    ddp = None
    if fsdp and world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, wnn.Fp8Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif main_grad:
        for p in model.parameters():
            if p.dim() == 2:
                p.main_grad = torch.zeros_like(p, dtype=torch.float32)
    elif world > 1:
        ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    share = TOKENS // world
    losses = []
    for x, y in _data():
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        opt.zero_grad(set_to_none=True)
        local = torch.zeros(())
        if main_grad:
            for p in wnn.main_grads(model):
                p.zero_()
            for start in range(0, share, MICRO):  # micro-batches: each rank's loss is a mean over its tokens
                loss = _sum_sq(model, x[start:start + MICRO], y[start:start + MICRO]) / (share * D_OUT)
                loss.backward()
                local += loss.detach()
            if world > 1:
                wnn.all_reduce_main_grads(model)
            for p in model.parameters():
                if p.dim() == 2:
                    assert p.grad is None and p.grad_added_to_main_grad
                    p.grad = p.main_grad.clone()
        else:
            loss = _sum_sq(ddp or model, x, y) / (share * D_OUT)
            loss.backward()
            local += loss.detach()
        if world > 1:
            dist.all_reduce(local)
            local /= world
        losses.append(local.item())
        opt.step()
    return losses


def _worker(rank: int, init_file: str, out_dir: str, world: int, mode: str):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = _train(rank, world, mode == "main_grad", fsdp=mode == "fsdp")
    finish_rank(rank, out_dir, {"losses": losses, "warnings": [str(w.message) for w in caught]})


@pytest.mark.parametrize("mode", ["ddp", "main_grad", "fsdp"])
def test_two_ranks_train_like_one(tmp_path, mode):
    docs = spawn_ranks(_worker, 2, tmp_path, 2, mode)
    ranks = [d["losses"] for d in docs]
    # No module output is a view (FSDP2 warns about those: an in-place op on one would skip its hooks).
    assert not [w for d in docs for w in d["warnings"] if "view" in w]
    single = _train(0, 1, mode == "main_grad")
    assert ranks[0] == ranks[1]
    assert single[-1] < single[0]  # it trains
    for a, b in zip(ranks[0], single):
        assert abs(a - b) <= 1e-3 * abs(b), (ranks[0], single)


def test_main_grads_lists_only_parameters_with_one():
    model = _model()
    model[0].weight.main_grad = torch.zeros(D_HID, D_IN)
    assert [t.shape for t in wnn.main_grads(model)] == [torch.Size([D_HID, D_IN])]
