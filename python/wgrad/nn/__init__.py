"""FP8 training layers over wgrad's kernels: `Fp8Linear` and `Fp8GroupedLinear` (see `wgrad.nn.functional`
for the recipe and what runs where), `convert_to_fp8` (a model's `nn.Linear` layers into `Fp8Linear`, in
place), and their multi-GPU pieces: data parallelism with `main_grad`
(`wgrad.nn.distributed`), expert parallelism (`wgrad.nn.expert_parallel`), tensor parallelism with DTensor
weights (`wgrad.nn.tensor_parallel`)."""

from . import functional
from ._recipe import clear_weight_cache
from .distributed import all_reduce_main_grads, main_grads
from .expert_parallel import ExpertDispatch, expert_combine, expert_dispatch
from .functional import fp8_grouped_linear, fp8_linear
from .modules import Fp8GroupedLinear, Fp8Linear, convert_to_fp8, convertible

__all__ = ["ExpertDispatch", "Fp8GroupedLinear", "Fp8Linear", "all_reduce_main_grads", "clear_weight_cache",
           "convert_to_fp8", "convertible", "expert_combine", "expert_dispatch", "fp8_grouped_linear", "fp8_linear",
           "functional", "main_grads"]
