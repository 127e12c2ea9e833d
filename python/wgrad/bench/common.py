"""Small pieces every benchmark suite shares: throughput math, error texts, progress output, the device
check and JSON clean-up."""

from __future__ import annotations

import math
import sys
from typing import Callable, Iterable, Optional, Sequence

import torch

ProgressFn = Callable[[str], None]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def geomean(values: Iterable[float]) -> Optional[float]:
    vals = [float(v) for v in values]
    if not vals or any(not (v > 0) or math.isinf(v) for v in vals):
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def format_shape(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def first_line(exc: BaseException, limit: int = 160) -> str:
    """A short one-line reason for an exception (torch's dispatcher errors run to pages)."""
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}".strip()
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


# Messages of the CUDA errors that poison the context: every later call fails the same way. (A plain
# "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED" from torch's cuBLAS wrapper is not one of them.)
_STICKY_CUDA_ERRORS = ("illegal memory access", "illegal instruction", "misaligned address",
                       "unspecified launch failure", "device-side assert", "launch timed out",
                       "hardware stack error", "uncorrectable ECC")


def is_cuda_fault(exc: BaseException) -> bool:
    """A sticky CUDA error (illegal address, launch failure): the context is lost for every later call."""
    msg = str(exc)
    return any(s in msg for s in _STICKY_CUDA_ERRORS)


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def silent(msg: str) -> None:
    pass


def sm90_problem() -> Optional[str]:
    """None when the current device is an SM90 GPU, else a one-line explanation."""
    try:
        if not torch.cuda.is_available():
            return "wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            name = torch.cuda.get_device_name()
            return f"wgrad bench: needs an SM90 GPU (H100/H200/H800); found: {name} (sm_{major}{minor})"
    except Exception as exc:  # a broken driver is also "no usable GPU"
        return f"wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none ({first_line(exc, 100)})"
    return None


def json_safe(value):
    """NaN and Inf (a broken kernel's error) as None, tuples as lists, anything odd as its str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
