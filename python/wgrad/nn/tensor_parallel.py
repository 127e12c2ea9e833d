"""Tensor parallelism of `Fp8Linear` with DTensor weights on a 1-D device mesh: each rank runs the single-GPU
FP8 recipe on its local shards (`DTensor.to_local`) and returns a DTensor whose placement says how the ranks'
results combine. No sharding rule is registered for the `torch.ops.wgrad.*` ops: the recipe's casts and
GEMMs only ever see plain local tensors, which is what keeps the GPU path, the CPU reference and the weight
cache unchanged.

The rules are Megatron's column- and row-parallel linears, which is what
`torch.distributed.tensor.parallel.ColwiseParallel` and `RowwiseParallel` set up for an `nn.Linear` (and so
for `Fp8Linear`):

| weight [out, in] | x | bias | output | x's gradient |
|---|---|---|---|---|
| `Shard(0)` (column-parallel) | `Replicate()` | `Shard(0)` | `Shard(-1)` | `Partial()`: summed where x is replicated |
| `Shard(1)` (row-parallel) | `Shard(-1)` | `Replicate()` | `Partial()` (the bias counted once) | `Shard(-1)` |
| `Replicate()` | `Replicate()` | `Replicate()` | `Replicate()` | `Replicate()` |
| `Replicate()` | `Shard(d)`, d not the last | `Replicate()` | `Shard(d)` | `Shard(d)`; the weight's is `Partial()` |

The local feature counts must be multiples of 16 (the layer's rule). The FP8 numerics equal the unsharded
layer's where every shard boundary falls on a 128 boundary: the weight's 128x128 blocks and the 1x128 blocks
of x and dY along the features are then the same blocks on one rank as on many (with `Shard(d)` tokens, the
1x128 blocks of the weight gradient's casts run along the tokens: each rank's token count a multiple of 128).
Other shard sizes are the same recipe over other blocks. The gradients arrive in `.grad` as DTensors;
`weight.main_grad` is not supported on a DTensor weight.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import torch

_DTENSOR_MODULE = "torch.distributed.tensor"


def has_dtensor(*tensors: Optional[torch.Tensor]) -> bool:
    """True when any of `tensors` is a DTensor. A DTensor exists only once its module is imported, so the
    check looks it up rather than importing it (which would add about half a second to `import wgrad.nn`)."""
    module = sys.modules.get(_DTENSOR_MODULE)
    return module is not None and any(isinstance(t, module.DTensor) for t in tensors)


def _placement(op: str, name: str, t: torch.Tensor, mesh):
    """The placement of DTensor `t` on `mesh` (1-D), a negative shard dim made positive."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(t, DTensor):
        raise ValueError(f"{op}: {name} must be a DTensor on the weight's device mesh when the weight is one "
                         f"(ColwiseParallel / RowwiseParallel make the layer's input one), got {type(t).__name__}")
    if t.device_mesh != mesh:
        raise ValueError(f"{op}: {name} must be on the weight's device mesh {mesh}, got {t.device_mesh}")
    (p,) = t.placements
    if isinstance(p, Shard) and p.dim < 0:
        p = Shard(p.dim + t.dim())
    return p


def fp8_linear_dtensor(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       local_linear: Callable) -> torch.Tensor:
    """`local_linear(x, weight, bias)` (the FP8 linear on plain tensors) on DTensor arguments, by the rules of
    the module doc. Returns a DTensor on the weight's mesh."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    op = "fp8_linear"
    if not isinstance(weight, DTensor):
        raise ValueError(f"{op}: x or bias is a DTensor, so weight must be one on the same device mesh, "
                         f"got {type(weight).__name__}")
    mesh = weight.device_mesh
    if mesh.ndim != 1:
        raise ValueError(f"{op}: DTensor weights must live on a 1-D device mesh, got a {mesh.ndim}-D mesh {mesh}")
    if getattr(weight, "main_grad", None) is not None:
        raise ValueError(f"{op}: main_grad is not supported on a DTensor weight (its gradient is a DTensor in "
                         f".grad); remove weight.main_grad")
    w_p = _placement(op, "weight", weight, mesh)
    x_p = _placement(op, "x", x, mesh)
    b_p = _placement(op, "bias", bias, mesh) if bias is not None else None
    last = x.dim() - 1

    def expect(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"{op}: unsupported placements weight={w_p!r}, x={x_p!r}, bias={b_p!r}: {what} (see "
                             f"wgrad.nn.tensor_parallel for the supported ones)")

    local_bias = bias.to_local() if bias is not None else None
    if w_p == Shard(0):  # column-parallel: every rank computes its slice of the output features
        expect(x_p == Replicate(), "a column-parallel weight (Shard(0)) needs a Replicate() x")
        expect(b_p in (None, Shard(0)), "a column-parallel weight (Shard(0)) needs a Shard(0) bias")
        # x is replicated but each rank's dX covers only its output features: the sum over ranks is x's grad.
        y = local_linear(x.to_local(grad_placements=(Partial(),)), weight.to_local(), local_bias)
        return DTensor.from_local(y, mesh, (Shard(y.dim() - 1),), run_check=False)
    if w_p == Shard(1):  # row-parallel: every rank's product over its input features is a partial sum
        expect(x_p == Shard(last), "a row-parallel weight (Shard(1)) needs x sharded on its last dim")
        expect(b_p in (None, Replicate()), "a row-parallel weight (Shard(1)) needs a Replicate() bias")
        y = DTensor.from_local(local_linear(x.to_local(), weight.to_local(), None), mesh, (Partial(),),
                               run_check=False)
        # DTensor adds a replicated bias to a partial sum once over the ranks, not once per rank.
        return y if bias is None else y + bias
    expect(w_p == Replicate(), "the weight must be Shard(0), Shard(1) or Replicate()")
    expect(b_p in (None, Replicate()), "a replicated weight needs a Replicate() bias")
    if x_p == Replicate():
        y = local_linear(x.to_local(), weight.to_local(), local_bias)
        return DTensor.from_local(y, mesh, (Replicate(),), run_check=False)
    expect(isinstance(x_p, Shard) and x_p.dim != last, "with a replicated weight x is replicated or sharded on "
           "a token dim")
    # Each rank's tokens give a partial weight (and bias) gradient: the sum over ranks is the gradient.
    partial = (Partial(),)
    y = local_linear(x.to_local(), weight.to_local(grad_placements=partial),
                     bias.to_local(grad_placements=partial) if bias is not None else None)
    return DTensor.from_local(y, mesh, (x_p,), run_check=False)
