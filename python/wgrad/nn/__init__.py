"""FP8 training layers over wgrad's kernels: `Fp8Linear` and `Fp8GroupedLinear` (see `wgrad.nn.functional`
for the recipe and what runs where)."""

from . import functional
from ._recipe import clear_weight_cache
from .distributed import all_reduce_main_grads, main_grads
from .functional import fp8_grouped_linear, fp8_linear
from .modules import Fp8GroupedLinear, Fp8Linear

__all__ = ["Fp8GroupedLinear", "Fp8Linear", "all_reduce_main_grads", "clear_weight_cache", "fp8_grouped_linear",
           "fp8_linear", "functional", "main_grads"]
