"""How the benchmark times a call: L2 flushed before every timed call, CUDA events around single calls,
medians.

Two timers share the flush and the event pattern:
- `time_calls` (the GEMM suites): warm-up calls, then a busy period so the GPU's clocks are up, then
  `reps` single calls; returns every time (the caller takes the median); optionally also the host time
  per call (`host_us`, from `host_times_us`).
- `time_pair_ms` / `median_ms` (the quantization suite): a kernel and the copy it is compared with,
  timed call by call in turn so both see the same state of the machine.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Optional, Tuple

import torch

DEFAULT_REPS = 30
DEFAULT_WARMUP = 5
WARMUP_SECONDS = 0.1  # GPU only: minimum busy time before timing (time_calls)
# Host time: calls enqueued this many at a time behind one GPU sleep, in at least HOST_BURSTS bursts, each
# burst's first HOST_UNTIMED calls made but not timed (host_times_us).
HOST_BURST = 8
HOST_BURSTS = 5
HOST_UNTIMED = 2
# Five times the 50 MB L2 of an H100/H200; zeroed before every timed call.
L2_FLUSH_BYTES = 256 * 1024 * 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flush_buffer(device: torch.device, flush_bytes: int) -> Optional[torch.Tensor]:
    """The buffer whose zeroing evicts the L2 (None: no flush)."""
    return torch.empty(flush_bytes, dtype=torch.uint8, device=device) if flush_bytes > 0 else None


def free_cached(device: torch.device) -> None:
    """Returns the caching allocator's blocks between shapes, so a large shape is not refused memory that
    the previous one left cached."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def time_calls(fn: Callable[[], None], reps: int, warmup: int, flush: Optional[torch.Tensor],
               device: torch.device, host_us: Optional[List[float]] = None) -> List[float]:
    """Milliseconds of `reps` single calls of `fn`, each preceded (outside the timed region) by zeroing
    `flush`. CUDA events on a GPU; wall clock on a CPU (used only by the CPU tests).

    With `host_us`, it also gets the host time per call in microseconds (`host_times_us`)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        # An idle GPU drops its clocks within milliseconds, and the accuracy check before the timing
        # leaves it idle: keep calling until it has been busy for a while (measured: without this the
        # first implementation timed on a shape lost up to 20 %).
        sync(device)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < WARMUP_SECONDS:
            for _ in range(4):
                fn()
            sync(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            if flush is not None:
                flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) for start, end in events]
        if host_us is not None:
            host_us.extend(host_times_us(fn, reps))
        return times
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    if host_us is not None:  # on a CPU the call's host time is its time
        host_us.extend(t * 1e3 for t in times)
    return times


def sleep_cycles_per_ms() -> float:
    """GPU clock cycles of `torch.cuda._sleep` per millisecond on this device (measured once)."""
    cycles = 2_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


def host_times_us(fn: Callable[[], object], calls: int) -> List[float]:
    """What `fn` costs the thread that launches it, in microseconds per call, as a training step pays it: the
    host running ahead of the GPU. The calls are enqueued HOST_BURST at a time, back to back, behind a GPU
    sleep that outlasts the burst (so the queue never fills and blocks the thread), `calls` calls but at
    least HOST_BURSTS bursts; each burst gives its mean. Each burst starts right after a synchronisation,
    and its first calls pay for the thread's wait, not for themselves (an H100 host, the dense entry point:
    215 us for the first call, 42 for the second, 23-25 from the third on; the packed layout at 64 groups
    350, 85, then 57-65): the first HOST_UNTIMED calls of a burst are made but not timed, as no step of a
    training loop that keeps the GPU busy pays them."""
    burst = HOST_UNTIMED + HOST_BURST
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(burst):
        fn()
    burst_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    sleep_cycles = int(sleep_cycles_per_ms() * max(1.0, 4 * burst_ms))
    times = []
    for _ in range(max(HOST_BURSTS, -(-calls // HOST_BURST))):
        torch.cuda._sleep(sleep_cycles)
        for _ in range(HOST_UNTIMED):
            fn()
        t0 = time.perf_counter()
        for _ in range(HOST_BURST):
            fn()
        times.append((time.perf_counter() - t0) * 1e6 / HOST_BURST)
        torch.cuda.synchronize()
    return times


def time_once_ms(fn: Callable[[], object], before: Callable[[], object]) -> float:
    """One CUDA-event interval around fn, `before()` (the benchmark: the L2 flush) run ahead of it."""
    before()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_ms(fn: Callable[[], object], reps: int, before: Callable[[], object]) -> float:
    """Median of `reps` CUDA-event intervals around fn after a warm-up call, `before()` ahead of each."""
    fn()  # warm-up (and lazy allocations)
    return statistics.median(time_once_ms(fn, before) for _ in range(reps))


def time_pair_ms(fn: Callable[[], object], ref: Callable[[], object], reps: int,
                 before: Callable[[], object]) -> Tuple[float, float]:
    """Medians of fn and ref timed call by call in turn (`before()`, the benchmark's L2 flush, ahead of
    each), so that both see the same state of the machine: timed one after the other, the copy of the same
    bytes moved by up to 11 % between two rows of one shape on the H200, and every % of a copy with it."""
    fn()
    ref()
    times, ref_times = [], []
    for _ in range(reps):
        ref_times.append(time_once_ms(ref, before))
        times.append(time_once_ms(fn, before))
    return statistics.median(times), statistics.median(ref_times)
