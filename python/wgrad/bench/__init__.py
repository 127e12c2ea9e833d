"""The benchmark harness behind `python -m wgrad bench`.

Layout:
- `cli`: the command line (options common to every suite, report, JSON, exit status) and the list of
  suites it runs; `suite`: the interface a suite implements to plug in.
- `gemm`: the dense and k-grouped GEMM suites (`run_dense`, `run_grouped`); `impls`: the
  implementations they compare (ours, DeepGEMM where importable, cuBLAS via `torch._scaled_mm`, bf16);
  `problems`: operands, float64 references, FLOPs and bytes; `shapes`: the seed and short-K shapes;
  `runner`: validate, then time, one implementation into one row; `bound`: the machine's tensor-wise
  FP8 and copy rates, measured once per process, and each row's % of the bound they set; `tables`: the
  printed tables.
- `quant`: the quantization suite (`run_quant_bench`); `layers`: the FP8 layers against bf16 (`run_layers`).
- `timing`: L2 flush, CUDA-event timing, medians; `common`: small shared helpers.

Every implementation is validated against a float64 reference before it is timed; times are medians of
single calls with the L2 flushed before each.
"""

from .cli import SUITES, build_parser, main, run_cli
from .gemm import run_dense, run_grouped
from .layers import run_layers
from .quant import run_quant_bench

__all__ = ["SUITES", "build_parser", "main", "run_cli", "run_dense", "run_grouped", "run_layers", "run_quant_bench"]
