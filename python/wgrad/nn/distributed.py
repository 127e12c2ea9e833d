"""Data parallelism with Megatron's gradient-accumulation fusion: the weight gradients of every micro-batch
accumulate in fp32 into `weight.main_grad` inside wgrad's kernel, and one collective per optimizer step
reduces them across the data-parallel ranks.

`torch.nn.parallel.DistributedDataParallel` reduces `.grad` and never sees `main_grad` (the layers leave
`.grad` None for weights that have one), so with `main_grad` the model is NOT wrapped in DDP: every rank runs
its micro-batches, then calls `all_reduce_main_grads(model)` once before the optimizer step. Without
`main_grad` the layers fill `.grad` like `nn.Linear` and DDP works as it does for any module.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
from torch import nn


def main_grads(module: nn.Module) -> List[torch.Tensor]:
    """The `main_grad` buffers of `module`'s parameters, in `module.parameters()` order (shared parameters
    once)."""
    return [p.main_grad for p in module.parameters() if getattr(p, "main_grad", None) is not None]


def all_reduce_main_grads(module: nn.Module, group: Optional[dist.ProcessGroup] = None,
                          average: bool = True) -> None:
    """Sums every parameter's `main_grad` over the ranks of `group` (the default group when None), then
    divides by the group's size when `average` (DDP's convention: each rank's loss is a mean over its own
    tokens). One all-reduce per dtype and device over a flat copy of the buffers, written back in place.
    Call it once per optimizer step, after the last micro-batch's backward."""
    grads = main_grads(module)
    if not grads:
        return
    world = dist.get_world_size(group)
    by_kind = {}
    for g in grads:
        by_kind.setdefault((g.dtype, g.device), []).append(g)
    for tensors in by_kind.values():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        if average and world > 1:
            flat.div_(world)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
