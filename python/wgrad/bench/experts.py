"""`python -m wgrad bench --m-grouped`: the m-grouped FP8 expert GEMM (MoE fprop and dgrad) against what a user
has without it, in one process on identical operands:

- "scaled_mm loop": one `torch._scaled_mm` (cuBLAS, 1x128 x 128x128 blockwise FP8, bf16 out) per expert, with
  the group sizes given on the host for free and every expert's operands, scales and output laid out (rows
  padded to a multiple of 16, which cuBLAS needs) before the clock starts (the loop a user writes when a
  host synchronisation is acceptable);
- "bf16 grouped_mm": `torch._grouped_mm` in bf16 with device offsets (what `Fp8GroupedLinear` used before).

GPU time with the host's enqueue hidden (layers.time_interleaved), L2 flushed before every call, medians; the
host's time per call as its own column (calls back to back behind a GPU sleep, each burst's first calls untimed:
`timing.host_times_us`). Errors: relative Frobenius distance of each FP8 output to the fp32
product of the dequantized operands. `% bound`: how close each FP8 row comes to max(FLOPs at the tensor-wise
FP8 rate, bytes at the copy rate), both rates measured once in the process, before the first row, and shared
with the GEMM tables (wgrad.bench.bound.process_rates); the bytes are a, b, their scales and out, each moved
once.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .. import quant, reference
from ..api import m_grouped_gemm_fp8_fp8_bf16_nt_contiguous
from ..nn import _recipe
from ..scales import SCALE_BLOCK_K, ceil_div, num_k_blocks
from .bound import MachineRates, bound_of, process_rates, rates_line
from .common import ProgressFn
from .layers import _rel, time_interleaved, uneven_split
from .suite import Suite, SuiteRun
from .timing import L2_FLUSH_BYTES

# (experts, N, K, tokens): DeepSeek-V3 experts, gate/up 7168 -> 4096 and down 2048 -> 7168 (fprop; the dgrad
# of gate/up is the down shape), 8 / 32 / 64 local experts at 512-4096 tokens each on average, split unevenly.
M_GROUPED_SHAPES: List[Tuple[int, int, int, int]] = [
    (8, 4096, 7168, 32768), (8, 7168, 2048, 32768),
    (32, 4096, 7168, 16384), (32, 7168, 2048, 16384),
    (64, 4096, 7168, 32768), (64, 7168, 2048, 32768),
]
DEFAULT_REPS = 15
MAX_REL_ERROR = 2e-3  # the bf16 output's rounding (2^-9 relative at most) dominates


@dataclass
class ExpertsRow:
    label: str
    tflop: float
    ours_ms: float
    loop_ms: float
    bf16_ms: float
    ours_host_us: float
    loop_host_us: float
    ours_err: float
    loop_err: float
    bound_ms: Optional[float] = None  # max(FLOPs at the tensor-wise FP8 rate, bytes at the copy rate)
    binds: Optional[str] = None       # "math" or "memory": the larger term

    def pct_bound(self, ms: float) -> Optional[float]:
        return None if self.bound_ms is None else 100.0 * self.bound_ms / ms

    @property
    def vs_loop(self) -> float:
        return self.loop_ms / self.ours_ms

    @property
    def vs_bf16(self) -> float:
        return self.bf16_ms / self.ours_ms


def moved_bytes(experts: int, n: int, k: int, tokens: int) -> int:
    """What one call must move at least: a and its 1x128 scales, b and its 128x128 block scales, read once, and
    the bf16 out written once."""
    kb = num_k_blocks(k)
    return (tokens * k + 4 * tokens * kb + experts * n * k + 4 * experts * ceil_div(n, SCALE_BLOCK_K) * kb
            + 2 * tokens * n)


def bench_m_grouped(experts: int, n: int, k: int, tokens: int, reps: int, flush: torch.Tensor,
                    rates: Optional[MachineRates] = None) -> ExpertsRow:
    torch.manual_seed(0)
    split = uneven_split(tokens, experts, seed=experts)
    sizes = torch.tensor(split, dtype=torch.int32, device="cuda")
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
    a, sa = quant.quantize_fp8_1x128_rowwise(x)
    q, s, _, _ = quant.quantize_fp8_128x128(w.reshape(experts * n, k))
    b, sb = q.view(experts, n, k), s.view(experts, -(-n // 128), -(-k // 128))
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    ours = lambda: m_grouped_gemm_fp8_fp8_bf16_nt_contiguous((a, sa), (b, sb), sizes, out)

    # The loop's operands, prepared outside the clock: per expert its rows of a padded with zero rows to a
    # multiple of 16 (cuBLAS's blockwise FP8 GEMM rejects other row counts), their scales with strides exactly
    # (1, rows) as cuBLAS takes them, the expert's weight blocks, and an output of the padded rows.
    starts = [0]
    for m in split:
        starts.append(starts[-1] + m)
    per_expert = []
    for g, m in enumerate(split):
        if m == 0:
            continue
        rows = -(-m // 16) * 16
        a_g = _recipe._padded(a[starts[g]:starts[g + 1]], rows, k)
        sa_g = _recipe._scales_padded(sa[starts[g]:starts[g + 1]], rows, sa.shape[1])
        out_g = torch.empty((rows, n), dtype=torch.bfloat16, device="cuda")
        per_expert.append((g, a_g, sa_g, b[g], sb[g].contiguous(), out_g))

    def loop():
        for _g, a_g, sa_g, b_g, sb_g, out_g in per_expert:
            torch._scaled_mm(a_g, b_g.t(), scale_a=sa_g, scale_b=sb_g.t(), out_dtype=torch.bfloat16, out=out_g)

    offsets = torch.cumsum(sizes, 0, dtype=torch.int32)
    w_t = w.transpose(-2, -1)
    bf16 = lambda: torch._grouped_mm(x, w_t, offs=offsets)

    # Errors against the fp32 product of the dequantized operands, expert by expert.
    ours()
    loop()
    loop_out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    for g, _a, _s, _b, _sb, out_g in per_expert:
        loop_out[starts[g]:starts[g + 1]] = out_g[:split[g]]
    # (The dequantized values, e4m3 codes times fp32 scales, are exact in fp32.)
    deq_a = reference.dequantize_1x128(a, sa).float()
    ref = torch.empty(tokens, n, device="cuda", dtype=torch.float32)
    for g in range(experts):
        if split[g]:
            deq_b = reference.dequantize_128x128(b[g], sb[g]).float()
            ref[starts[g]:starts[g + 1]] = deq_a[starts[g]:starts[g + 1]] @ deq_b.t()
    errs = [_rel(out, ref), _rel(loop_out, ref)]
    del ref, deq_a
    times = time_interleaved({"ours": ours, "loop": loop, "bf16": bf16}, reps, flush)
    flops = 2.0 * tokens * n * k
    bound = bound_of(flops, moved_bytes(experts, n, k, tokens), rates) or (None, None)
    return ExpertsRow(f"{experts} x {k}->{n}, {tokens} tokens", flops / 1e12,
                      times["ours"].gpu_ms, times["loop"].gpu_ms, times["bf16"].gpu_ms,
                      1e3 * times["ours"].host_ms, 1e3 * times["loop"].host_ms, errs[0], errs[1], *bound)


def run_m_grouped(reps: int = DEFAULT_REPS, shapes: Sequence[Tuple[int, int, int, int]] = M_GROUPED_SHAPES,
                  progress: Callable[[str], None] = lambda s: None,
                  out: Optional[List[ExpertsRow]] = None, rates: Optional[MachineRates] = None) -> List[ExpertsRow]:
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    rows = out if out is not None else []
    for shape in shapes:
        rows.append(bench_m_grouped(*shape, reps, flush, rates))
        progress(format_row(rows[-1]))
        torch.cuda.empty_cache()
    return rows


def format_row(r: ExpertsRow) -> str:
    tf = lambda ms: r.tflop / (ms * 1e-3)
    if r.bound_ms is None:
        bound = "n/a"
    else:
        bound = f"{r.pct_bound(r.ours_ms):.1f} / {r.pct_bound(r.loop_ms):.1f} ({r.binds})"
    return (f"| {r.label} | {r.ours_ms:.3f} ({tf(r.ours_ms):.0f}) | {r.loop_ms:.3f} ({tf(r.loop_ms):.0f}) | "
            f"{r.bf16_ms:.3f} ({tf(r.bf16_ms):.0f}) | {r.vs_loop:.2f} | {r.vs_bf16:.2f} | {bound} | "
            f"{r.ours_host_us:.0f} / {r.loop_host_us:.0f} | {r.ours_err:.1e} / {r.loop_err:.1e} |")


def experts_table(rows: Sequence[ExpertsRow]) -> str:
    lines = ["| shape | wgrad m-grouped ms (TFLOPS) | scaled_mm loop ms (TFLOPS) | bf16 grouped_mm ms (TFLOPS) | "
             "vs loop | vs bf16 | % bound (ours / loop) | host us (ours / loop) | rel. error (ours / loop) |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [format_row(r) for r in rows]
    for name, attr in (("scaled_mm loop", "vs_loop"), ("bf16 grouped_mm", "vs_bf16")):
        vals = [getattr(r, attr) for r in rows]
        if vals:
            lines.append(f"\nvs {name}: geomean {math.exp(sum(map(math.log, vals)) / len(vals)):.3f}, "
                         f"min {min(vals):.3f}")
    return "\n".join(lines)


# ------------------------------------------------------------------ the suite -----------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--m-grouped", action="store_true",
                        help="the m-grouped FP8 expert GEMM (MoE fprop/dgrad) against a per-expert torch._scaled_mm "
                             "loop and bf16 torch._grouped_mm (wgrad.bench.experts)")


class ExpertsRun(SuiteRun):
    def __init__(self, args: argparse.Namespace, by_default: bool):
        self.wanted = bool(args.m_grouped)
        self.rows: List[ExpertsRow] = []
        self.rates: Optional[MachineRates] = None

    def run(self, args: argparse.Namespace, progress: ProgressFn) -> None:
        # Before any row, on the GPU the rows run on (once per process: process_rates), so that every
        # row's bound is a same-run figure.
        self.rates = process_rates(progress=progress)
        run_m_grouped(reps=args.reps, progress=progress, out=self.rows, rates=self.rates)

    def report(self) -> List[str]:
        if not self.wanted:
            return []
        lines = ["", "m-grouped expert GEMM (bf16 out)", experts_table(self.rows) if self.rows else "(no rows)"]
        if self.rates is not None:
            lines += ["", f"machine rates, measured in this process: {rates_line(self.rates)}"]
        return lines

    def json(self):
        rows = [dict(dataclasses.asdict(r), vs_loop=r.vs_loop, vs_bf16=r.vs_bf16, pct_bound_ours=r.pct_bound(r.ours_ms),
                     pct_bound_loop=r.pct_bound(r.loop_ms)) for r in self.rows]
        return dict(m_grouped=rows, m_grouped_machine_rates=self.rates.json() if self.rates is not None else None)

    def _bad(self) -> List[ExpertsRow]:
        return [r for r in self.rows if not (r.ours_err <= MAX_REL_ERROR)]

    def failed_count(self) -> int:
        return len(self._bad())

    def failure_lines(self) -> List[str]:
        return [f"FAIL: m-grouped {r.label}: relative error {r.ours_err}" for r in self._bad()]


SUITE = Suite("m-grouped", add_arguments, lambda args: bool(args.m_grouped), ExpertsRun)
