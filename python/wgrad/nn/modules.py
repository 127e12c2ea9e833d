"""Drop-in FP8 layers: `Fp8Linear` (an `nn.Linear` whose GEMMs run in FP8) and `Fp8GroupedLinear` (the experts
of an MoE layer), and `convert_to_fp8` (a model's `nn.Linear` layers into `Fp8Linear`, in place). Parameters
are named, shaped and initialised as their bf16 counterparts', so a bf16 model's state_dict loads as it is;
the FP8 copies of the weight are derived, never stored."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

from . import _recipe
from .functional import fp8_grouped_linear, fp8_linear


class Fp8Linear(nn.Linear):
    """`nn.Linear` with FP8 fprop, dgrad and wgrad (DeepSeek-V3 recipe; `wgrad.nn.functional.fp8_linear`).
    Weight gradients accumulate in fp32 into `weight.main_grad` when the weight has one (Megatron's
    gradient-accumulation fusion), else into `weight.grad` as `nn.Linear`'s do. in_features and out_features
    are multiples of 16; runs on the CPU (reference math) and on SM90 GPUs."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        _recipe.check_features("Fp8Linear", "in_features", in_features)
        _recipe.check_features("Fp8Linear", "out_features", out_features)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Fp8Linear":
        """An Fp8Linear sharing `linear`'s parameters (no copy)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        for name in ("in_features", "out_features"):
            _recipe.check_features("Fp8Linear.from_linear", name, getattr(linear, name))
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.bias)


def convertible(linear: nn.Module) -> bool:
    """True for a module `convert_to_fp8` turns into an `Fp8Linear`: of type exactly `nn.Linear` (a subclass
    may compute something else in its forward) with in and out features multiples of 16."""
    multiple = _recipe.FEATURE_MULTIPLE
    return (type(linear) is nn.Linear and linear.in_features % multiple == 0 and linear.in_features > 0
            and linear.out_features % multiple == 0 and linear.out_features > 0)


def convert_to_fp8(module: nn.Module,
                   module_filter: Optional[Callable[[nn.Linear, str], bool]] = None) -> nn.Module:
    """Turns every convertible `nn.Linear` in `module` (itself included) into an `Fp8Linear`, in place, and
    returns `module`. A converted layer is the same object with the same parameters, buffers, hooks and
    training mode; only its class changes, so references to it, its state_dict and an optimizer built on
    its parameters stay valid. Convertible (`convertible`): type exactly `nn.Linear`, in and out features
    multiples of 16; `module_filter(linear, name)` (name: its qualified name in `module`, "" for `module`
    itself) picks among them, all when None. Other modules are left as they are. Convert before wrapping
    the model (FSDP2's `fully_shard`, DDP, `torch.compile`): a wrapper's own subclass of `nn.Linear` is not
    converted."""
    for name, child in module.named_modules(remove_duplicate=True):
        if convertible(child) and (module_filter is None or module_filter(child, name)):
            child.__class__ = Fp8Linear
    return module


class Fp8GroupedLinear(nn.Module):
    """The experts of an MoE layer: `forward(x, group_sizes)` multiplies expert g's rows of `x` [T, in] (tokens
    grouped by expert, `group_sizes` [G] their counts on x's device, any counts, 0 included) by
    `weight[g]^T` [in, out]. `weight` [G, out, in] (and `bias` [G, out]) initialised per expert as
    `nn.Linear`'s. fprop and dgrad run in FP8 on wgrad's m-grouped kernel, wgrad in FP8 on its k-grouped
    kernel, into `weight.main_grad` when it exists. No host synchronisation: capturable in a CUDA graph."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, bias: bool = False, device=None,
                 dtype=None):
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"Fp8GroupedLinear: num_experts must be >= 1, got {num_experts}")
        _recipe.check_features("Fp8GroupedLinear", "in_features", in_features)
        _recipe.check_features("Fp8GroupedLinear", "out_features", out_features)
        self.num_experts, self.in_features, self.out_features = num_experts, in_features, out_features
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty((num_experts, out_features, in_features), **factory))
        self.bias = nn.Parameter(torch.empty((num_experts, out_features), **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Each expert as nn.Linear(in, out) initialises itself: kaiming_uniform(a=sqrt(5)) on [out, in], the
        # bias uniform in +-1/sqrt(in).
        for g in range(self.num_experts):
            nn.init.kaiming_uniform_(self.weight[g], a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, group_sizes: Union[torch.Tensor, Sequence[int]]) -> torch.Tensor:
        return fp8_grouped_linear(x, self.weight, group_sizes, self.bias)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
