"""Expert parallelism of the FP8 MoE layers on the CPU (gloo, two processes): an expert MLP of four experts,
two per rank, fed through `wgrad.nn.expert_dispatch` / `expert_combine`, against the same block with all four
experts in one process.

Routing is fixed (a seeded draw per rank): uneven counts, an expert with tokens from one rank only, an expert
with none, experts with more than 128 tokens. The one-process block sees every expert's tokens in the order
the dispatch delivers them (source rank 0's, then rank 1's), so the weight gradient's column-wise casts
(1x128 blocks along each expert's tokens) cut the same blocks in both configurations; the capacity slots'
padding rows are zeros, which raise no block's scale. The two configurations therefore run the same FP8
operands through the same float64 reference products.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import wgrad.nn as wnn
from helpers import finish_rank, spawn_ranks, value_error_messages

WORLD, EXPERTS, D_MODEL, D_FF = 2, 4, 128, 256
LOCAL = EXPERTS // WORLD
TOKENS = (300, 260)  # per rank; not multiples of 128
# Per-rank routing probabilities: expert 1 gets tokens from rank 0 only, expert 3 from nobody, experts 0 and
# 2 more than 128 over the two ranks.
PROBS = ((0.5, 0.15, 0.35, 0.0), (0.4, 0.0, 0.6, 0.0))
CAPACITY = 192  # above every (rank, expert) count of the draws below (asserted by the tests)
DROP_CAPACITY = 96  # below some of them: the drop_overflow case
MICRO_BATCHES = 2
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


class ExpertMLP(nn.Module):
    """The experts of an MoE layer: up, GELU, down, no bias (padding rows stay zero: see expert_parallel)."""

    def __init__(self, experts: int):
        super().__init__()
        self.up = wnn.Fp8GroupedLinear(experts, D_MODEL, D_FF)
        self.down = wnn.Fp8GroupedLinear(experts, D_FF, D_MODEL)

    def forward(self, x, sizes):
        return self.down(nn.functional.gelu(self.up(x, sizes)), sizes)


def _full_block() -> ExpertMLP:
    torch.manual_seed(0)
    return ExpertMLP(EXPERTS).to(torch.bfloat16)


def _local_block(rank: int) -> ExpertMLP:
    """Rank `rank`'s experts, [rank L, (rank + 1) L) of the full block."""
    full, local = _full_block(), ExpertMLP(LOCAL).to(torch.bfloat16)
    with torch.no_grad():
        for name in ("up", "down"):
            getattr(local, name).weight.copy_(getattr(full, name).weight[rank * LOCAL:(rank + 1) * LOCAL])
    return local


def _batch(rank: int, step: int):
    """Rank `rank`'s tokens of micro-batch `step`, sorted by expert, their counts [E] and an output gradient."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    experts = torch.multinomial(torch.tensor(PROBS[rank]), TOKENS[rank], replacement=True, generator=g)
    x = torch.randn(TOKENS[rank], D_MODEL, generator=g).to(torch.bfloat16)
    dy = torch.randn(TOKENS[rank], D_MODEL, generator=g).to(torch.bfloat16)
    order = torch.sort(experts, stable=True).indices
    return x[order], torch.bincount(experts, minlength=EXPERTS), dy


def _loss(out, dy):
    return (out.float() * dy.float()).sum()


def _ep_step(block, x, counts, dy, capacity, drop_overflow=False):
    x = x.clone().requires_grad_()
    d = wnn.expert_dispatch(x, counts, capacity, drop_overflow=drop_overflow)
    out = wnn.expert_combine(block(d.tokens, d.group_sizes), d)
    _loss(out, dy).backward()
    return d, out.detach(), x.grad


def _errors(rank: int):
    """Messages of the argument errors a rank raises (before any collective, so every rank raises alike)."""
    x, counts, _ = _batch(rank, 0)
    return value_error_messages({
        "experts_not_multiple_of_world": lambda: wnn.expert_dispatch(x, torch.tensor([TOKENS[rank], 0, 0]),
                                                                     CAPACITY),
        "overflow": lambda: wnn.expert_dispatch(x, counts, DROP_CAPACITY),
    })


def _worker(rank: int, init_file: str, out_dir: str):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    result = {}
    x, counts, dy = _batch(rank, 0)

    block = _local_block(rank)
    d, out, x_grad = _ep_step(block, x, counts, dy, CAPACITY)
    result["exact"] = {"out": out, "x_grad": x_grad, "tokens_per_expert": d.tokens_per_expert,
                       "group_sizes": d.group_sizes, "rows": d.tokens.shape[0],
                       "up": block.up.weight.grad, "down": block.down.weight.grad}

    block = _local_block(rank)
    for p in block.parameters():
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)
    for step in range(MICRO_BATCHES):
        _ep_step(block, *_batch(rank, step), CAPACITY)
    result["main_grad"] = {"up": block.up.weight.main_grad, "down": block.down.weight.main_grad,
                           "grad_is_none": all(p.grad is None for p in block.parameters()),
                           "added": all(p.grad_added_to_main_grad for p in block.parameters())}

    block = _local_block(rank)
    d, out, x_grad = _ep_step(block, x, counts, dy, DROP_CAPACITY, drop_overflow=True)
    result["drop"] = {"out": out, "x_grad": x_grad, "tokens_per_expert": d.tokens_per_expert,
                      "up": block.up.weight.grad, "down": block.down.weight.grad}

    result["errors"] = _errors(rank)
    finish_rank(rank, out_dir, result)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("expert_parallel"))


def _single(steps, capacity=None, main_grad=False):
    """The full block in one process over micro-batches `steps`: every expert's tokens from rank 0 then rank 1
    (the first `capacity` of each, when given). Returns the last step's output and x gradient as per-rank
    [T_r, D] tensors (0 for tokens left out), and the weight gradients (`.grad`, or the fp32 `main_grad`
    accumulated over the steps)."""
    block = _full_block()
    if main_grad:
        for p in block.parameters():
            p.main_grad = torch.zeros_like(p, dtype=torch.float32)
    for step in steps:
        batches = [_batch(r, step) for r in range(WORLD)]
        pieces = []  # (rank, rows of that rank's batch), in the one-process order
        for e in range(EXPERTS):
            for r, (_, counts, _) in enumerate(batches):
                start = int(counts[:e].sum())
                n = int(counts[e]) if capacity is None else min(int(counts[e]), capacity)
                pieces.append((r, torch.arange(start, start + n)))
        x = torch.cat([batches[r][0][rows] for r, rows in pieces]).requires_grad_()
        dy = torch.cat([batches[r][2][rows] for r, rows in pieces])
        sizes = [sum(len(pieces[e * WORLD + r][1]) for r in range(WORLD)) for e in range(EXPERTS)]
        out = block(x, sizes)
        _loss(out, dy).backward()
    outs = [torch.zeros(t, D_MODEL, dtype=torch.bfloat16) for t in TOKENS]
    grads = [torch.zeros(t, D_MODEL, dtype=torch.bfloat16) for t in TOKENS]
    start = 0
    for r, rows in pieces:
        outs[r][rows] = out.detach()[start:start + len(rows)]
        grads[r][rows] = x.grad[start:start + len(rows)]
        start += len(rows)
    attr = "main_grad" if main_grad else "grad"
    return outs, grads, getattr(block.up.weight, attr), getattr(block.down.weight, attr)


def _assert_same(actual, expected):
    # Exact: both configurations quantize the same blocks and take the same float64 products of them, each
    # rounded once (to bf16 outputs, token gradients and .grad, to fp32 main_grad).
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def _expert_rows(weights, rank):
    return weights[rank * LOCAL:(rank + 1) * LOCAL]


def test_routing_draws_cover_the_cases():
    counts = torch.stack([_batch(r, s)[1] for r in range(WORLD) for s in range(MICRO_BATCHES)])
    assert int(counts.max()) <= CAPACITY
    assert int(counts[0].max()) > DROP_CAPACITY
    total = _batch(0, 0)[1] + _batch(1, 0)[1]
    assert total[3] == 0 and _batch(1, 0)[1][1] == 0 < _batch(0, 0)[1][1]
    assert total[0] > 128 and total[2] > 128


def test_dispatch_layout(ranks):
    total = _batch(0, 0)[1] + _batch(1, 0)[1]
    for r, doc in enumerate(ranks):
        exact = doc["exact"]
        assert exact["rows"] == LOCAL * WORLD * CAPACITY
        assert exact["group_sizes"].dtype == torch.int32
        assert exact["group_sizes"].tolist() == [WORLD * CAPACITY] * LOCAL
        assert exact["tokens_per_expert"].tolist() == _expert_rows(total, r).tolist()


def test_two_ranks_match_one_process(ranks):
    outs, grads, up, down = _single([0])
    for r, doc in enumerate(ranks):
        exact = doc["exact"]
        _assert_same(exact["out"], outs[r])
        _assert_same(exact["x_grad"], grads[r])
        _assert_same(exact["up"], _expert_rows(up, r))
        _assert_same(exact["down"], _expert_rows(down, r))
    # Expert 3 (rank 1's second) has no tokens: a zero gradient.
    assert not ranks[1]["exact"]["up"][1].any()


def test_main_grad_accumulates_across_micro_batches(ranks):
    _, _, up, down = _single(range(MICRO_BATCHES), main_grad=True)
    for r, doc in enumerate(ranks):
        acc = doc["main_grad"]
        assert acc["grad_is_none"] and acc["added"]
        _assert_same(acc["up"], _expert_rows(up, r))
        _assert_same(acc["down"], _expert_rows(down, r))
    # Two micro-batches give another gradient than one: the comparison sees the accumulation.
    assert not torch.equal(_single([0], main_grad=True)[2], up)


def test_drop_overflow_keeps_the_first_tokens_of_each_slot(ranks):
    outs, grads, up, down = _single([0], capacity=DROP_CAPACITY)
    for r, doc in enumerate(ranks):
        drop = doc["drop"]
        _assert_same(drop["out"], outs[r])  # dropped tokens: 0
        _assert_same(drop["x_grad"], grads[r])
        _assert_same(drop["up"], _expert_rows(up, r))
        _assert_same(drop["down"], _expert_rows(down, r))
        kept = sum(_batch(s, 0)[1].clamp(max=DROP_CAPACITY) for s in range(WORLD))
        assert drop["tokens_per_expert"].tolist() == _expert_rows(kept, r).tolist()
    counts0 = _batch(0, 0)[1]
    dropped = slice(DROP_CAPACITY, int(counts0[0]))  # rank 0's expert 0 holds more than the capacity
    assert not ranks[0]["drop"]["out"][dropped].any() and ranks[0]["drop"]["out"][:DROP_CAPACITY].any()


def test_argument_errors_on_two_ranks(ranks):
    for doc in ranks:
        errors = doc["errors"]
        assert "positive multiple of the group size 2" in errors["experts_not_multiple_of_world"]
        assert "got shape (3,)" in errors["experts_not_multiple_of_world"]
        assert f"exceeds capacity = {DROP_CAPACITY}" in errors["overflow"]
        assert "drop_overflow=True" in errors["overflow"]


# ------------------------------------------------------------------ one rank, in this process -----------


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_equals_the_layer_on_unpadded_tokens(one_rank):
    torch.manual_seed(3)
    layer = wnn.Fp8GroupedLinear(3, D_MODEL, 64)
    x = torch.randn(257, D_MODEL)
    counts = torch.tensor([200, 0, 57])
    dy = torch.randn(257, 64)
    x_ep = x.clone().requires_grad_()
    d = wnn.expert_dispatch(x_ep, counts, capacity=200)
    out = wnn.expert_combine(layer(d.tokens, d.group_sizes), d)
    _loss(out, dy).backward()
    w_grad, layer.weight.grad = layer.weight.grad, None
    x_ref = x.clone().requires_grad_()
    ref = layer(x_ref, counts)
    _loss(ref, dy).backward()
    _assert_same(out, ref)
    _assert_same(x_ep.grad, x_ref.grad)
    _assert_same(w_grad, layer.weight.grad)


def test_empty_batch(one_rank):
    layer = wnn.Fp8GroupedLinear(2, D_MODEL, 64)
    x = torch.zeros(0, D_MODEL, requires_grad=True)
    d = wnn.expert_dispatch(x, torch.zeros(2, dtype=torch.int64), capacity=4)
    out = wnn.expert_combine(layer(d.tokens, d.group_sizes), d)
    assert out.shape == (0, 64)
    out.sum().backward()
    assert x.grad.shape == (0, D_MODEL)


@pytest.mark.parametrize("tokens, counts, capacity, match", [
    (torch.zeros(8, D_MODEL), torch.tensor([[8]]), 8, r"counts must have shape \[E\].*got shape \(1, 1\)"),
    (torch.zeros(8, D_MODEL), torch.tensor([8.0]), 8, "counts must hold integers, got torch.float32"),
    (torch.zeros(8, D_MODEL), [8], 8, "counts must be a tensor"),
    (torch.zeros(8, D_MODEL), torch.tensor([5, 2]), 8, "counts must sum to the number of tokens, T = 8, got 7"),
    (torch.zeros(8, D_MODEL), torch.tensor([9, -1]), 16, r"counts\[1\] must be >= 0, got -1"),
    (torch.zeros(8, D_MODEL), torch.tensor([6, 2]), 4, r"counts\[0\] = 6 exceeds capacity = 4"),
    (torch.zeros(8, D_MODEL), torch.tensor([8]), 0, "capacity must be an int >= 1, got 0"),
    (torch.zeros(8, D_MODEL), torch.tensor([8]), 8.0, "capacity must be an int >= 1, got 8.0"),
    (torch.zeros(8, 2, D_MODEL), torch.tensor([8]), 8,
     r"tokens must be a 2-D tensor \[T, hidden\], got \(8, 2, 128\)"),
    (torch.zeros(8, D_MODEL, dtype=torch.int32), torch.tensor([8]), 8,
     "tokens must be floating point, got torch.int32"),
])
def test_dispatch_argument_errors(one_rank, tokens, counts, capacity, match):
    with pytest.raises(ValueError, match=match):
        wnn.expert_dispatch(tokens, counts, capacity)


def test_combine_checks_the_rows(one_rank):
    d = wnn.expert_dispatch(torch.zeros(8, D_MODEL), torch.tensor([5, 3]), capacity=8)
    with pytest.raises(ValueError, match=r"expert_out must be 2-D with 16 rows \(those of dispatch.tokens\), "
                                         r"got \(15, 64\)"):
        wnn.expert_combine(torch.zeros(15, 64), d)


def test_grouped_linear_rejects_dtensors(one_rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    weight = distribute_tensor(torch.zeros(2, 64, D_MODEL), mesh, [Replicate()])
    with pytest.raises(ValueError, match="DTensor arguments are not supported.*expert_dispatch"):
        wnn.fp8_grouped_linear(torch.zeros(4, D_MODEL), weight, [2, 2])
