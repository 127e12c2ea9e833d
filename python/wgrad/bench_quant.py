"""The quantization benchmark under its former import path; it lives in `wgrad.bench.quant` (timing
helpers in `wgrad.bench.timing`). Import from there in new code."""

from .bench.quant import DEFAULT_SHAPES, SEGMENTS, reference_copy, reference_copy_size, run_quant_bench
from .bench.quant import bytes_moved as _bytes  # noqa: F401
from .bench.quant import segment_sizes as _segment_sizes  # noqa: F401
from .bench.timing import L2_FLUSH_BYTES as _L2_FLUSH_BYTES  # noqa: F401
from .bench.timing import median_ms as _time_ms  # noqa: F401
from .bench.timing import time_once_ms as _time_once_ms  # noqa: F401
from .bench.timing import time_pair_ms as _time_pair_ms  # noqa: F401

__all__ = ["DEFAULT_SHAPES", "SEGMENTS", "reference_copy", "reference_copy_size", "run_quant_bench"]
