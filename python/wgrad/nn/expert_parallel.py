"""Expert parallelism for `Fp8GroupedLinear`: the experts of an MoE layer split over the ranks of a process
group, tokens exchanged by all-to-all, with no host synchronisation anywhere on the way.

The E = world * L experts are numbered globally and rank r holds experts [r L, (r + 1) L) in its own
`Fp8GroupedLinear(L, ...)`. Every rank routes its own tokens:

    d = expert_dispatch(tokens, counts, capacity)   # tokens [T, H] sorted by global expert, counts [E]
    h = experts(d.tokens, d.group_sizes)            # this rank's L experts (one layer or an expert MLP)
    out = expert_combine(h, d)                      # [T, H_out], row i the result of tokens[i]

Both are differentiable: the gradient of an all-to-all is the reverse all-to-all, so `out.backward()` brings
the token gradients home and each expert's weight gradient stays on the rank that owns it (into
`weight.main_grad` when the layer has one; with data parallelism on top, reduce it over the ranks that hold
the same experts).

Why a capacity. `torch.distributed.all_to_all_single` takes uneven split sizes as Python ints, so exchanging
exactly the routed tokens means reading the per-expert counts on the host: one synchronisation per MoE layer
and direction, which stalls the CPU's kernel launches behind the GPU and rules out CUDA graphs. Here every
(source rank, expert) pair owns a fixed slot of `capacity` rows instead: the counts and the tokens move in
equal splits whose sizes the host knows in advance, and the counts stay tensors on the device from the router
to the expert kernels. The price is memory and work sized for the capacity, not the traffic: the exchanged
buffers and the expert GEMMs have L * world * capacity rows per rank whatever the counts. A count above the
capacity is an error (a `ValueError` for counts on the CPU, a device-side assertion for counts on the GPU),
or, with `drop_overflow=True`, the tokens past the capacity of their slot are dropped: their output and
gradient are 0 (GShard's convention: with a residual connection they pass through unchanged).
`capacity = T` never overflows.

Layout on the receiving rank. Local expert l owns rows [l S, (l + 1) S) of `tokens`, S = world * capacity:
its tokens first, source rank 0's in their order, then rank 1's, and so on, then zero rows to the end of the
slot. `group_sizes` is S for every expert (the rows the layer multiplies), `tokens_per_expert` the real
counts. The zero rows change no real token's result: fprop and dgrad cast row by row, and in the weight
gradient's column-wise casts (1x128 blocks along the tokens, restarting at every expert) trailing zeros raise
no block's amax and add zero products, so expert l computes what a single GPU computes for the same tokens
in the same order. That holds while the padding rows stay zero through the expert block (no bias, an
activation with f(0) = 0 such as GELU, SiLU or SwiGLU); a bias carries nonzero values into the last block's
amax: the same math with other FP8 roundings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` with equal splits. The exchange is its own reverse (chunk s of rank r goes to chunk r
    of rank s), so the gradient takes the same collective back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.group), None


def _exchange(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    dist.all_to_all_single(out, x.contiguous(), group=group)
    return out


@dataclass(frozen=True)
class ExpertDispatch:
    """What `expert_dispatch` returns: the inputs of this rank's experts and the route back.

    - `tokens` [L * S, H] (S = world * capacity): local expert l's tokens in rows [l S, l S + n_l), zero rows
      after them to the end of its slot.
    - `group_sizes` int32 [L] on the tokens' device, S each: the `group_sizes` of `Fp8GroupedLinear(L, ...)`.
    - `tokens_per_expert` int64 [L] on the tokens' device: n_l, the real tokens of each local expert (those
      kept, with `drop_overflow`).
    """

    tokens: torch.Tensor
    group_sizes: torch.Tensor
    tokens_per_expert: torch.Tensor
    # Row of the received buffer that each row of `tokens` holds ([L * S]; a permutation).
    _rows: torch.Tensor = field(repr=False)
    # Row of the sent buffer that each routed token went to ([T]; E * capacity for a dropped token).
    _slots: torch.Tensor = field(repr=False)
    _group: Optional[dist.ProcessGroup] = field(repr=False)


def _checked_counts(op: str, counts: torch.Tensor, tokens: torch.Tensor, world: int, capacity: int,
                    drop_overflow: bool) -> torch.Tensor:
    """counts as int64 on the tokens' device. Counts on the CPU are checked here; counts on the GPU on the GPU,
    by a device-side assertion (raising would need a synchronisation)."""
    if not isinstance(counts, torch.Tensor):
        raise ValueError(f"{op}: counts must be a tensor (kept on the device: no synchronisation), "
                         f"got {type(counts).__name__}")
    if counts.dtype.is_floating_point or counts.dtype.is_complex or counts.dtype == torch.bool:
        raise ValueError(f"{op}: counts must hold integers, got {counts.dtype}")
    if counts.dim() != 1 or counts.shape[0] < world or counts.shape[0] % world != 0:
        raise ValueError(f"{op}: counts must have shape [E] with E a positive multiple of the group size "
                         f"{world} (one count per global expert), got shape {tuple(counts.shape)}")
    if counts.device != tokens.device and counts.device.type != "cpu":
        raise ValueError(f"{op}: counts must be on {tokens.device} like tokens (or on the CPU), got {counts.device}")
    num_tokens = tokens.shape[0]
    if counts.device.type == "cpu" and not torch.compiler.is_compiling():
        values = counts.tolist()
        for e, v in enumerate(values):
            if v < 0:
                raise ValueError(f"{op}: counts[{e}] must be >= 0, got {v}")
            if v > capacity and not drop_overflow:
                raise ValueError(f"{op}: counts[{e}] = {v} exceeds capacity = {capacity} (raise the capacity, or "
                                 f"pass drop_overflow=True to drop the excess tokens)")
        if sum(values) != num_tokens:
            raise ValueError(f"{op}: counts must sum to the number of tokens, T = {num_tokens}, got {sum(values)}")
        return counts.to(device=tokens.device, dtype=torch.int64)
    wide = counts.to(device=tokens.device, dtype=torch.int64)
    valid = (wide.min() >= 0) & (wide.sum() == num_tokens)
    if not drop_overflow:
        valid = valid & (wide.max() <= capacity)
    torch._assert_async(valid, f"{op}: counts must be >= 0, sum to the number of tokens, T = {num_tokens}"
                        + ("" if drop_overflow else f", and be at most capacity = {capacity}"))
    return wide


def expert_dispatch(tokens: torch.Tensor, counts: torch.Tensor, capacity: int,
                    group: Optional[dist.ProcessGroup] = None, drop_overflow: bool = False) -> ExpertDispatch:
    """Sends this rank's tokens to the ranks that own their experts (see the module doc). `tokens` [T, H]
    (floating point) sorted by global expert, `counts` [E] integer tensor (expert e's tokens are rows
    [sum(counts[:e]), sum(counts[:e + 1])) of `tokens`), E a multiple of the group's size; expert e lives on
    rank e // (E / world). `capacity` (>= 1): the rows reserved for each (source rank, expert) pair. Two
    all-to-alls of equal splits (counts, then tokens); the counts are never read on the host when they are on
    the GPU. Returns the local experts' tokens and group sizes (`ExpertDispatch`)."""
    op = "expert_dispatch"
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(f"{op}: tokens must be a 2-D tensor [T, hidden], got "
                         f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}")
    if not tokens.dtype.is_floating_point:
        raise ValueError(f"{op}: tokens must be floating point, got {tokens.dtype}")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"{op}: capacity must be an int >= 1, got {capacity!r}")
    world = dist.get_world_size(group)
    counts = _checked_counts(op, counts, tokens, world, capacity, drop_overflow)
    num_tokens, hidden = tokens.shape
    experts = counts.shape[0]
    local = experts // world
    device = tokens.device

    # Sent buffer [E * capacity, H]: row e * capacity + j holds expert e's j-th token, or a zero row past its
    # count. Rows [s L capacity, (s + 1) L capacity) go to rank s.
    kept = counts.clamp(max=capacity)
    starts = torch.cumsum(counts, 0) - counts
    j = torch.arange(capacity, device=device)
    source = torch.where(j < kept[:, None], starts[:, None] + j, num_tokens).reshape(-1)  # [E * capacity]
    with_zero_row = torch.cat([tokens, tokens.new_zeros((1, hidden))])
    sent = with_zero_row.index_select(0, source)
    # Where each token went, for the way back: the inverse of `source` on the real rows. Every zero-row entry
    # of `source` writes the extra slot `num_tokens`, dropped after the scatter.
    slots = torch.full((num_tokens + 1,), experts * capacity, dtype=torch.int64, device=device)
    slots.scatter_(0, source, torch.arange(experts * capacity, device=device))
    slots = slots[:num_tokens]

    received_counts = _exchange(kept, group).view(world, local)  # [source rank, local expert]
    received = _AllToAll.apply(sent, group)  # [world * L * capacity, H], rows (source, local expert, j)

    # Local expert l's slot: its rows from every source, real ones first (source-major, in order), then the
    # zero rows. A stable sort of the "is padding" flags gives that order without reading a count on the host.
    per_expert = world * capacity
    padding = (j >= received_counts[:, :, None]).transpose(0, 1).reshape(local, per_expert)  # [L, S]
    order = torch.sort(padding.to(torch.int8), dim=1, stable=True).indices  # position in (source, j) order
    src_rank, row = order // capacity, order % capacity
    expert = torch.arange(local, device=device)[:, None]
    rows = ((src_rank * local + expert) * capacity + row).reshape(-1)  # [L * S] rows of `received`
    grouped = received.index_select(0, rows)

    return ExpertDispatch(
        tokens=grouped,
        group_sizes=torch.full((local,), per_expert, dtype=torch.int32, device=device),
        tokens_per_expert=received_counts.sum(0),
        _rows=rows,
        _slots=slots,
        _group=group,
    )


def expert_combine(expert_out: torch.Tensor, dispatch: ExpertDispatch) -> torch.Tensor:
    """The experts' results back to the ranks and rows their tokens came from: `expert_out` [L * S, H_out]
    (rows as `dispatch.tokens`') gives [T, H_out] whose row i is the result of the dispatched `tokens[i]`
    (0 for a token dropped by `drop_overflow`). The padding rows' values are ignored and get a zero gradient.
    One all-to-all of equal splits."""
    op = "expert_combine"
    rows = dispatch._rows
    if not isinstance(expert_out, torch.Tensor) or expert_out.dim() != 2 or expert_out.shape[0] != rows.shape[0]:
        shape = tuple(expert_out.shape) if isinstance(expert_out, torch.Tensor) else type(expert_out).__name__
        raise ValueError(f"{op}: expert_out must be 2-D with {rows.shape[0]} rows (those of dispatch.tokens), "
                         f"got {shape}")
    if expert_out.device != rows.device:
        raise ValueError(f"{op}: expert_out must be on {rows.device} like dispatch.tokens, got {expert_out.device}")
    # Back into the received buffer's row order (the inverse permutation of `rows`), then to the sources.
    inverse = torch.empty_like(rows).scatter_(0, rows, torch.arange(rows.shape[0], device=rows.device))
    returned = _AllToAll.apply(expert_out.index_select(0, inverse), dispatch._group)  # [E * capacity, H_out]
    with_zero_row = torch.cat([returned, returned.new_zeros((1, returned.shape[1]))])
    return with_zero_row.index_select(0, dispatch._slots)
