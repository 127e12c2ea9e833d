"""The layers suite (`python -m wgrad bench --layers`): forward + backward of the FP8 layers against their bf16 counterparts.

Dense: `wgrad.nn.Fp8Linear` (weight gradient into `.grad`, and into an fp32 `main_grad` as Megatron runs it)
against `nn.Linear` in bf16, on DeepSeek-V3 layer shapes at 8192 tokens. Grouped: `Fp8GroupedLinear` against
the same experts in bf16 through `torch._grouped_mm` (autograd's own backward), 8 and 32 experts with uneven
token counts. Per call: an L2 flush outside the timed region, then a GPU sleep long enough for the host to
enqueue the whole forward + backward, CUDA events around it, the implementations interleaved call by call;
medians. The GPU time is what a training step pays when the host runs ahead of the GPU, as it does when
layers follow each other; the host's time per step is its own column, taken the same way (steps enqueued back
to back behind a GPU sleep, each burst's first steps untimed: `timing.host_times_us`). A layer whose host time
exceeds its GPU time would be host-bound in training. Columns: the speedup, a per-step breakdown of our
layer (each step timed alone the same way), the activation bytes saved for backward, and the weight cast's
bandwidth against a device copy of the same bytes. Where torchao is importable, its blockwise FP8 linear
(`torchao.prototype.blockwise_fp8_training`, the same 1x128 / 128x128 recipe) is a column of the dense rows,
interleaved with the others (n/a, with the reason, where it cannot run a shape: it takes feature counts that
are multiples of 128). Its casts are Triton kernels, compiled (and autotuned) at their first call per shape:
with torchao installed the suite runs minutes longer.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import quant
from ..nn import Fp8GroupedLinear, Fp8Linear
from ..nn import _recipe
from ..nn import functional as nn_functional
from .common import ProgressFn
from .suite import Suite, SuiteRun
from .timing import L2_FLUSH_BYTES, host_times_us, sleep_cycles_per_ms

TOKENS = 8192
# (in_features, out_features) of DeepSeek-V3 layers (hidden 7168): attention and MLP projections.
DENSE_LAYER_SHAPES: List[Tuple[int, int]] = [
    (7168, 2112), (7168, 24576), (16384, 7168), (7168, 18432), (18432, 7168), (1536, 24576),
]
# (experts, in_features, out_features, tokens): DeepSeek-V3 experts (7168 <-> 2048), 8 and 32 local experts,
# 2048 and 512 tokens per expert on average, split unevenly.
GROUPED_LAYER_SHAPES: List[Tuple[int, int, int, int]] = [
    (8, 7168, 2048, 16384), (8, 2048, 7168, 16384), (32, 7168, 2048, 16384), (32, 2048, 7168, 16384),
]
DEFAULT_REPS = 15
# Our layer's output against the bf16 layer's, relative Frobenius: the FP8 casts of x and W (e4m3, 1x128 and
# 128x128 blocks) put it near 3e-2; a broken layer is far off.
MAX_REL_DIFF_TO_BF16 = 0.1


def uneven_split(total: int, groups: int, seed: int = 0) -> List[int]:
    """`groups` token counts summing to `total`, uneven as a router makes them (lognormal weights, one expert
    possibly empty)."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.exp(torch.randn(groups, generator=g))
    sizes = [int(v) for v in torch.floor(weights / weights.sum() * total).tolist()]
    sizes[0] += total - sum(sizes)
    return sizes


@dataclass
class Timing:
    gpu_ms: float  # median CUDA-event time of the call, its host enqueue hidden behind a GPU sleep
    host_ms: float  # median host time per call while the host runs ahead of the GPU (timing.host_times_us)


def _time_hidden(fn: Callable[[], object], flush: torch.Tensor, sleep_cycles: int) -> float:
    """One call: the flush, a GPU sleep that covers the host's enqueue of `fn`, then CUDA events around fn.
    Returns the GPU milliseconds."""
    flush.zero_()
    torch.cuda._sleep(sleep_cycles)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_interleaved(fns: Dict[str, Callable[[], object]], reps: int, flush: torch.Tensor,
                     host: bool = True) -> Dict[str, Timing]:
    """Median GPU milliseconds of each call, the calls taken in turn so that all see the same machine.
    The GPU sleep before each call lasts twice the slowest host enqueue seen in the warm-up after a first
    call (at least 1 ms), so the GPU time never includes waiting for the host (if it did, a host stall would
    show as GPU time). With `host`, also each call's host time as a training step pays it, the host running
    ahead of the GPU (`timing.host_times_us`: calls back to back behind a GPU sleep, each burst's first calls
    untimed). A call timed alone right after a synchronisation costs its thread up to ten times that
    (decision 0042); without `host`, host_ms is NaN."""
    slowest = 0.0
    for fn in fns.values():
        fn()  # first call: lazy module loads, cuBLAS heuristics, allocations; not an enqueue time
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            slowest = max(slowest, time.perf_counter() - t0)
    torch.cuda.synchronize()
    sleep_cycles = int(sleep_cycles_per_ms() * max(1.0, 2e3 * slowest))
    gpu: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            gpu[name].append(_time_hidden(fn, flush, sleep_cycles))
    return {name: Timing(statistics.median(gpu[name]),
                         statistics.median(host_times_us(fn, reps)) / 1e3 if host else math.nan)
            for name, fn in fns.items()}


def _gpu_ms(timings: Dict[str, Timing]) -> Dict[str, float]:
    return {name: t.gpu_ms for name, t in timings.items()}


def _train_step(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor, *args) -> Callable[[], None]:
    def step():
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        layer(x, *args).backward(dy)
    return step


@dataclass
class LayerRow:
    kind: str
    label: str
    ours_ms: float  # GPU time of forward + backward (host enqueue hidden)
    ours_main_grad_ms: Optional[float]
    bf16_ms: float
    ours_host_ms: float  # host time per call, the host running ahead (timing.host_times_us)
    bf16_host_ms: float
    steps_ms: Dict[str, float] = field(default_factory=dict)  # GPU time of each step alone
    saved_bytes_ours: int = 0
    saved_bytes_bf16: int = 0
    weight_cast_pct_of_copy: Optional[float] = None
    rel_error: Optional[float] = None
    torchao_ms: Optional[float] = None  # torchao's blockwise FP8 linear, the same call (dense rows)
    torchao_note: str = ""  # why there is no torchao time

    @property
    def speedup(self) -> float:
        return self.bf16_ms / self.ours_ms

    @property
    def vs_torchao(self) -> Optional[float]:
        return self.torchao_ms / self.ours_ms if self.torchao_ms is not None else None


def _copy_ms(nbytes: int, flush: torch.Tensor, reps: int) -> Tuple[float, int]:
    n = -(-(nbytes // 2) // 2**16) * 2**16
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return time_interleaved({"copy": lambda: dst.copy_(src)}, reps, flush, host=False)["copy"].gpu_ms, 2 * n


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def torchao_linear(linear: nn.Linear, x: torch.Tensor, dy: torch.Tensor) -> Tuple[Optional[nn.Module], str]:
    """torchao's blockwise FP8 linear over `linear`'s weight, checked by one forward + backward on (x, dy):
    (module, "") or (None, why not). Its cuBLAS path (`torch.nn.functional.scaled_mm`) first, then its Triton
    GEMMs, for torch versions without the former."""
    if linear.in_features % 128 or linear.out_features % 128:
        return None, "features not multiples of 128"
    try:
        from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinear
    except Exception as e:  # not installed, or not importable against this torch
        return None, f"not importable ({type(e).__name__})"
    reasons = []
    for use_triton in (False, True):
        try:
            module = Float8BlockwiseLinear.from_float(linear)
            module.use_triton = use_triton
            _train_step(module, x, dy)()
            torch.cuda.synchronize()
            return module, ""
        except Exception as e:
            reasons.append(f"{'triton' if use_triton else 'scaled_mm'}: {type(e).__name__}")
    return None, "; ".join(reasons)


def bench_dense(in_f: int, out_f: int, tokens: int, reps: int, flush: torch.Tensor) -> LayerRow:
    torch.manual_seed(0)
    ref = nn.Linear(in_f, out_f, bias=False, dtype=torch.bfloat16, device="cuda")
    ours = Fp8Linear.from_linear(ref)
    ours_mg = Fp8Linear(in_f, out_f, bias=False, dtype=torch.bfloat16, device="cuda")
    ours_mg.load_state_dict(ref.state_dict())
    ours_mg.weight.main_grad = torch.zeros(ours_mg.weight.shape, device="cuda")
    x = torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, out_f, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        err = _rel(ours(x), ref(x))
    torchao, torchao_note = torchao_linear(ref, x, dy)
    fns = {"ours": _train_step(ours, x, dy), "ours_mg": _train_step(ours_mg, x, dy), "bf16": _train_step(ref, x, dy)}
    if torchao is not None:
        fns["torchao"] = _train_step(torchao, x, dy)
    times = time_interleaved(fns, reps, flush)
    # Each step of our layer alone (the weight cast is cached across micro-batches: shown, not in the step).
    xd = x.detach()
    w = ref.weight.detach()
    w_q, w_s, w_q_t, w_s_t = _recipe.weight_operands(w)
    x_q, x_s, x_q_t, x_s_t = quant.quantize_fp8_1x128_both(xd)
    dy_q, dy_s, dy_q_t, dy_s_t = quant.quantize_fp8_1x128_both(dy)
    grad = torch.zeros(w.shape, device="cuda")
    steps = _gpu_ms(time_interleaved({
        "weight cast": lambda: quant.quantize_fp8_128x128(w),
        "x cast": lambda: quant.quantize_fp8_1x128_both(xd),
        "fprop": lambda: _recipe.fp8_mm(x_q, x_s, w_q, w_s, torch.bfloat16),
        "dy cast": lambda: quant.quantize_fp8_1x128_both(dy),
        "dgrad": lambda: _recipe.fp8_mm(dy_q, dy_s, w_q_t, w_s_t, torch.bfloat16),
        "wgrad": lambda: _recipe.accumulate_wgrad(dy_q_t, dy_s_t, x_q_t, x_s_t, grad),
        "wgrad bf16": lambda: _recipe.wgrad(dy_q_t, dy_s_t, x_q_t, x_s_t, torch.bfloat16),
    }, reps, flush, host=False))
    copy_ms, copy_bytes = _copy_ms(4 * w.numel(), flush, reps)
    # bf16 read, two e4m3 copies written, two fp32 scale tables written
    cast_bytes = 4 * w.numel() + 8 * (-(-w.shape[0] // 128)) * (-(-w.shape[1] // 128))
    cast_pct = 100.0 * (cast_bytes / steps["weight cast"]) / (copy_bytes / copy_ms)
    saved = x_q_t.untyped_storage().nbytes() + x_s_t.untyped_storage().nbytes()
    return LayerRow("dense", f"{in_f}->{out_f} x {tokens}", times["ours"].gpu_ms, times["ours_mg"].gpu_ms,
                    times["bf16"].gpu_ms, times["ours"].host_ms, times["bf16"].host_ms, steps,
                    saved, xd.numel() * 2, cast_pct, err,
                    times["torchao"].gpu_ms if torchao is not None else None, torchao_note)


class _Bf16Experts(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x, sizes):
        return torch._grouped_mm(x, self.weight.transpose(-2, -1), offs=torch.cumsum(sizes, 0, dtype=torch.int32))


def bench_grouped(experts: int, in_f: int, out_f: int, tokens: int, reps: int, flush: torch.Tensor) -> LayerRow:
    torch.manual_seed(0)
    split = uneven_split(tokens, experts, seed=experts)
    sizes = torch.tensor(split, dtype=torch.int32, device="cuda")
    ours = Fp8GroupedLinear(experts, in_f, out_f, dtype=torch.bfloat16, device="cuda")
    ref = _Bf16Experts(ours.weight.detach().clone())
    ours_mg = Fp8GroupedLinear(experts, in_f, out_f, dtype=torch.bfloat16, device="cuda")
    ours_mg.load_state_dict(ours.state_dict())
    ours_mg.weight.main_grad = torch.zeros(ours_mg.weight.shape, device="cuda")
    x = torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, out_f, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        err = _rel(ours(x, sizes), ref(x, sizes))
    times = time_interleaved({"ours": _train_step(ours, x, dy, sizes), "ours_mg": _train_step(ours_mg, x, dy, sizes),
                              "bf16": _train_step(ref, x, dy, sizes)}, reps, flush)
    xd = x.detach()
    w = ours.weight.detach()
    w_q, w_s, w_q_t, w_s_t = _recipe.grouped_weight_operands(w)
    pad = nn_functional.GROUPED_PAD  # the layer's own padding: the steps below are its steps
    x_q, x_s, x_q_t, x_s_t, padded = quant.quantize_fp8_1x128_both_segments_padded(xd, sizes, pad=pad)
    dy_q, dy_s, dy_q_t, dy_s_t, _ = quant.quantize_fp8_1x128_both_segments_padded(dy, sizes, pad=pad)
    grad = torch.zeros(w.shape, device="cuda")
    grad_bf16 = torch.empty(w.shape, device="cuda", dtype=torch.bfloat16)
    steps = _gpu_ms(time_interleaved({
        "weight cast": lambda: _recipe.grouped_weight_operands(w),
        "x cast": lambda: quant.quantize_fp8_1x128_both_segments_padded(xd, sizes, pad=pad),
        "fprop": lambda: _recipe.m_grouped_mm(x_q, x_s, w_q, w_s, sizes, torch.bfloat16),
        "dy cast": lambda: quant.quantize_fp8_1x128_both_segments_padded(dy, sizes, pad=pad),
        "dgrad": lambda: _recipe.m_grouped_mm(dy_q, dy_s, w_q_t, w_s_t, sizes, torch.bfloat16),
        "wgrad": lambda: torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(dy_q_t, dy_s_t, x_q_t,
                                                                                         x_s_t, grad, padded),
        "wgrad bf16": lambda: torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(
            dy_q_t, dy_s_t, x_q_t, x_s_t, grad_bf16, padded),
    }, reps, flush, host=False))
    saved = x_q_t.untyped_storage().nbytes() + x_s_t.untyped_storage().nbytes()
    return LayerRow("grouped", f"{experts} x {in_f}->{out_f} x {tokens}", times["ours"].gpu_ms,
                    times["ours_mg"].gpu_ms, times["bf16"].gpu_ms, times["ours"].host_ms, times["bf16"].host_ms,
                    steps, saved, xd.numel() * 2, None, err)


def run_layers(reps: int = DEFAULT_REPS, dense: Sequence[Tuple[int, int]] = DENSE_LAYER_SHAPES,
               grouped: Sequence[Tuple[int, int, int, int]] = GROUPED_LAYER_SHAPES, tokens: int = TOKENS,
               progress: Callable[[str], None] = lambda s: None,
               out: Optional[List[LayerRow]] = None) -> List[LayerRow]:
    """Every dense and grouped row; rows are appended to `out` (a new list by default) as they are made."""
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    rows = out if out is not None else []
    for in_f, out_f in dense:
        rows.append(bench_dense(in_f, out_f, tokens, reps, flush))
        progress(format_row(rows[-1]))
        torch.cuda.empty_cache()
    for experts, in_f, out_f, t in grouped:
        rows.append(bench_grouped(experts, in_f, out_f, t, reps, flush))
        progress(format_row(rows[-1]))
        torch.cuda.empty_cache()
    return rows


def format_row(r: LayerRow) -> str:
    steps = ", ".join(f"{k} {v:.3f}" for k, v in r.steps_ms.items())
    cast = f", weight cast {r.weight_cast_pct_of_copy:.1f} % of copy" if r.weight_cast_pct_of_copy else ""
    torchao = ""
    if r.kind == "dense":
        note = f" ({r.torchao_note})" if r.torchao_note else ""
        torchao = (f", torchao {r.torchao_ms:.3f} ms (x{r.vs_torchao:.2f})" if r.torchao_ms is not None else
                   f", torchao n/a{note}")
    return (f"{r.kind} {r.label}: ours {r.ours_ms:.3f} ms (main_grad {r.ours_main_grad_ms:.3f}), bf16 "
            f"{r.bf16_ms:.3f} ms, x{r.speedup:.2f}{torchao}; host {r.ours_host_ms:.3f} ms vs {r.bf16_host_ms:.3f} ms; "
            f"saved activations {r.saved_bytes_ours / 2**20:.1f} MiB vs {r.saved_bytes_bf16 / 2**20:.1f} MiB{cast}; steps (ms): {steps}; rel. diff to bf16 {r.rel_error:.2e}")


def layers_table(rows: Sequence[LayerRow]) -> str:
    head = ("| layer | FP8 fwd+bwd (ms) | with main_grad (ms) | bf16 (ms) | speedup | torchao (ms) | vs torchao | "
            "host FP8 / bf16 (ms) | saved activations FP8 / bf16 (MiB) | weight cast (% of copy) |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        cast = f"{r.weight_cast_pct_of_copy:.1f}" if r.weight_cast_pct_of_copy is not None else "-"
        note = f" ({r.torchao_note})" if r.torchao_note else ""
        torchao = (f"{r.torchao_ms:.3f} | {r.vs_torchao:.2f}" if r.torchao_ms is not None else
                   "- | -" if r.kind != "dense" else f"n/a{note} | -")
        lines.append(f"| {r.kind} {r.label} | {r.ours_ms:.3f} | {r.ours_main_grad_ms:.3f} | {r.bf16_ms:.3f} | "
                     f"{r.speedup:.2f} | {torchao} | {r.ours_host_ms:.3f} / {r.bf16_host_ms:.3f} | "
                     f"{r.saved_bytes_ours / 2**20:.1f} / {r.saved_bytes_bf16 / 2**20:.1f} | {cast} |")
    for kind in ("dense", "grouped"):
        sel = [r.speedup for r in rows if r.kind == kind]
        if sel:
            lines.append(f"\n{kind}: geomean speedup {_geomean(sel):.3f}")
    vs = [r.vs_torchao for r in rows if r.vs_torchao is not None]
    if vs:
        lines.append(f"\ndense against torchao: geomean {_geomean(vs):.3f} over {len(vs)} of "
                     f"{sum(r.kind == 'dense' for r in rows)} layers")
    return "\n".join(lines)


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


# ------------------------------------------------------------------ the suite -----------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", action="store_true",
                        help="forward + backward of wgrad.nn.Fp8Linear and Fp8GroupedLinear against bf16 layers "
                             "(wgrad.bench.layers)")


class LayersRun(SuiteRun):
    def __init__(self, args: argparse.Namespace, by_default: bool):
        self.wanted = bool(args.layers)
        self.rows: List[LayerRow] = []

    def run(self, args: argparse.Namespace, progress: ProgressFn) -> None:
        run_layers(reps=args.reps, progress=progress, out=self.rows)

    def report(self) -> List[str]:
        if not self.wanted:
            return []
        return ["", "layers (forward + backward)", layers_table(self.rows) if self.rows else "(no rows)"]

    def json(self):
        return dict(layers=[dict(dataclasses.asdict(r), speedup=r.speedup, vs_torchao=r.vs_torchao)
                            for r in self.rows])

    def failed_count(self) -> int:
        return sum(1 for r in self.rows if not (r.rel_error is not None and r.rel_error <= MAX_REL_DIFF_TO_BF16))

    def failure_lines(self) -> List[str]:
        return [f"FAIL: layers {r.kind} {r.label}: relative difference to bf16 {r.rel_error}" for r in self.rows
                if not (r.rel_error is not None and r.rel_error <= MAX_REL_DIFF_TO_BF16)]


SUITE = Suite("layers", add_arguments, lambda args: bool(args.layers), LayersRun)
