"""What bounds a GEMM row on this machine: the tensor-wise FP8 rate and the copy rate, measured once per
benchmark process on the GPU the rows run on, and each timed row's place under them.

A row's bound is `max(FLOPs / FP8 rate, bytes / copy rate)`: the time the call would take if it ran at
the tensor cores' rate without fine-grained scaling, or moved its bytes (operands, scales, out read and
written) at the rate of a device-to-device copy, whichever is longer. `% bound` = 100 * bound / time:
how close the row comes to what this machine can do for that work, a same-run figure like every ratio of
the tables. Both rates are measured, not taken from a data sheet: clocks, power limits and the memory
of one machine differ from the next by 10-20 %.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from .common import ProgressFn, first_line, is_cuda_fault, silent
from .timing import L2_FLUSH_BYTES, flush_buffer, free_cached, time_calls

# torch._scaled_mm with one scale per tensor on a square e4m3 GEMM of this size: large enough to keep
# every SM busy for a millisecond, so the figure is the tensor cores' sustained rate.
RATE_GEMM_SIZE = 8192
# A copy this large runs far past the L2: the figure is DRAM's.
RATE_COPY_BYTES = 1 << 30
RATE_REPS = 10
RATE_WARMUP = 3

FP8_RATE_FORM = "torch._scaled_mm(a, b.t(), scale_a=1, scale_b=1, out_dtype=bf16), e4m3, tensor-wise"
COPY_RATE_FORM = "dst.copy_(src), bytes read + written"


@dataclass
class MachineRates:
    """The two rates (None where one could not be measured, with the reason in its message)."""
    fp8_tflops: Optional[float]
    copy_gbps: Optional[float]
    fp8_shape: tuple
    copy_bytes: int
    fp8_form: str = FP8_RATE_FORM
    copy_form: str = COPY_RATE_FORM
    fp8_message: str = ""
    copy_message: str = ""

    def json(self) -> dict:
        return asdict(self)

    def complete(self) -> bool:
        return bool(self.fp8_tflops) and bool(self.copy_gbps)


def fp8_rate_tflops(size: int, reps: int, warmup: int, flush: Optional[torch.Tensor], device: torch.device) -> float:
    """Median TFLOPS of tensor-wise FP8 `torch._scaled_mm` on size x size x size, same timer as the rows."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((size, size), device=device, generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn((size, size), device=device, generator=gen).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device=device)
    bt = b.t()

    def call():
        torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    ms = statistics.median(time_calls(call, reps, warmup, flush, device))
    return 2.0 * size ** 3 / (ms * 1e-3) / 1e12


def copy_rate_gbps(nbytes: int, reps: int, warmup: int, flush: Optional[torch.Tensor], device: torch.device) -> float:
    """Median GB/s of `dst.copy_(src)` of nbytes, counting the read and the write."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = statistics.median(time_calls(lambda: dst.copy_(src), reps, warmup, flush, device))
    return 2.0 * nbytes / (ms * 1e-3) / 1e9


def _measured(rate: Callable[[], float]) -> Tuple[Optional[float], Optional[str]]:
    """(rate(), None), or (None, the reason) when it cannot be measured; a sticky CUDA fault propagates."""
    try:
        return rate(), None
    except Exception as exc:
        if is_cuda_fault(exc):
            raise
        return None, first_line(exc)


def measure_rates(device="cuda", *, gemm_size: int = RATE_GEMM_SIZE, copy_bytes: int = RATE_COPY_BYTES,
                  reps: int = RATE_REPS, warmup: int = RATE_WARMUP, flush_bytes: int = L2_FLUSH_BYTES,
                  progress: Optional[ProgressFn] = None) -> MachineRates:
    """Both rates on `device`. A rate that cannot be measured (a torch without tensor-wise FP8, out of
    memory) is None with its reason: the rows then have no bound, and nothing else changes. A sticky CUDA
    fault propagates (nothing after it could run)."""
    device = torch.device(device)
    progress = progress or silent
    rates = MachineRates(None, None, (gemm_size, gemm_size, gemm_size), copy_bytes)
    flush = flush_buffer(device, flush_bytes)
    progress(f"machine rates: tensor-wise FP8 GEMM {gemm_size}^3 and a {copy_bytes / 2 ** 30:g} GiB copy")
    rates.fp8_tflops, rates.fp8_message = _measured(lambda: fp8_rate_tflops(gemm_size, reps, warmup, flush, device))
    free_cached(device)
    rates.copy_gbps, rates.copy_message = _measured(lambda: copy_rate_gbps(copy_bytes, reps, warmup, flush, device))
    del flush
    free_cached(device)
    progress("  " + rates_line(rates))
    return rates


# process_rates' measurements, one per GPU.
_PROCESS_RATES: Dict[torch.device, MachineRates] = {}


def process_rates(device="cuda", progress: Optional[ProgressFn] = None) -> MachineRates:
    """`measure_rates(device)` as measured at the first call in this process: every suite of a command line
    (the GEMM tables, the m-grouped table) stands against the same rates, measured once."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _PROCESS_RATES:
        _PROCESS_RATES[device] = measure_rates(device, progress=progress)
    return _PROCESS_RATES[device]


def rates_line(rates: MachineRates) -> str:
    fp8 = f"{rates.fp8_tflops:.0f} TFLOPS" if rates.fp8_tflops else f"not measured ({rates.fp8_message})"
    copy = f"{rates.copy_gbps:.0f} GB/s" if rates.copy_gbps else f"not measured ({rates.copy_message})"
    m, n, k = rates.fp8_shape
    return (f"tensor-wise FP8 {fp8} ({m}x{n}x{k}); copy {copy} ({rates.copy_bytes / 2 ** 30:g} GiB, "
            f"read + write)")


def bound_of(flops: float, nbytes: float, rates: Optional[MachineRates]) -> Optional[Tuple[float, str]]:
    """(bound in ms, "math" or "memory": which term is the larger) of `flops` and `nbytes`; None without
    both rates."""
    if rates is None or not rates.complete():
        return None
    math_ms = flops / (rates.fp8_tflops * 1e12) * 1e3
    memory_ms = nbytes / (rates.copy_gbps * 1e9) * 1e3
    return max(math_ms, memory_ms), "math" if math_ms >= memory_ms else "memory"


def fill_bound(row: dict, rates: Optional[MachineRates]) -> None:
    """`bound_ms`, `pct_bound` and `binds` ("math" or "memory") of a timed row; left None without both
    rates or without a time."""
    if not row.get("ms") or row.get("flops") is None:
        return
    bound = bound_of(row["flops"], row["bytes"], rates)
    if bound is None:
        return
    row.update(bound_ms=bound[0], pct_bound=100.0 * bound[0] / row["ms"], binds=bound[1])
