"""The GEMM suites: dense and k-grouped weight-gradient GEMMs, ours against DeepGEMM, cuBLAS and bf16.

`run_dense` and `run_grouped` validate then time every selected implementation on every shape (see
`runner`); `SUITE` is their part of `python -m wgrad bench`: options, plan, tables and JSON keys.
"""

from __future__ import annotations

import argparse
from typing import List, Optional, Sequence, Tuple

import torch

from . import shapes as _shapes
from .bound import MachineRates, process_rates, rates_line
from .common import ProgressFn, format_shape, is_cuda_fault, silent
from .impls import (DEEPGEMM, DEEPGEMM_GROUPED, DENSE_IMPLS, GROUP_DENSE_IMPL, GROUPED_IMPLS, IMPL_NAMES,
                    group_dense_impl)
from .problems import BYTES_NOTE, grouped_relative_error, make_dense_problem, make_grouped_problem, relative_error
from .runner import BF16_REL_ERR_MAX, FP8_REL_ERR_MAX, fill_ratios, measure_all, unbuilt_rows
from .shapes import (DENSE_SEED_SHAPES, GROUPED_SEED_SHAPES, SHORT_K_DENSE_SHAPES, SHORT_K_GROUPED_SHAPES,
                     DenseShape, GroupedShape)
from .suite import Suite, SuiteRun
from .tables import dense_table, grouped_table, legend, problem_lines, summarize, summary_lines
from .timing import DEFAULT_REPS, DEFAULT_WARMUP, L2_FLUSH_BYTES, flush_buffer, free_cached


def run_dense(shapes: Sequence[DenseShape] = DENSE_SEED_SHAPES, impls: Sequence[str] = IMPL_NAMES,
              reps: int = DEFAULT_REPS, warmup: int = DEFAULT_WARMUP, *, seed: int = 0,
              progress: Optional[ProgressFn] = None, device="cuda", flush_bytes: int = L2_FLUSH_BYTES,
              rows: Optional[List[dict]] = None, rates: Optional[MachineRates] = None) -> List[dict]:
    """Validates then times each implementation on each (M, N, K); one dict per (shape, impl), appended
    to `rows` (if given) as each shape completes, so that they survive a CUDA fault that stops the run.
    With `rates` (`bound.measure_rates` on the same device), every timed row gets its bound."""
    device = torch.device(device)
    progress = progress or silent
    chosen = [impl for impl in DENSE_IMPLS if impl.name in impls]
    flush = flush_buffer(device, flush_bytes)
    rows = [] if rows is None else rows
    for i, (m, n, k) in enumerate(shapes):
        label = format_shape((m, n, k))
        progress(f"[dense {i + 1}/{len(shapes)}] {label}: making operands and the float64 reference")
        try:
            problem = make_dense_problem(m, n, k, device, seed + i)
        except Exception as exc:
            if is_cuda_fault(exc):
                raise
            rows.extend(unbuilt_rows("dense", label, (m, n, k), chosen, reps, exc, progress))
            free_cached(device)
            continue
        check = lambda after, before, p=problem: relative_error(after, before, p.ref)  # noqa: E731
        shape_rows = measure_all(chosen, problem, lambda impl: check, label, (m, n, k), "dense", reps, warmup,
                                 flush, progress, rows, rates)
        fill_ratios(shape_rows, "cublas", "vs_cublas")
        fill_ratios(shape_rows, DEEPGEMM, "vs_deepgemm")
        rows.extend(shape_rows)
        del problem, check
        free_cached(device)
    return rows


def _grouped_cases(shapes: Sequence[GroupedShape], skewed: bool) -> List[tuple]:
    """(kind, label, dims, M, N, K per group) of every grouped case: the shapes, then the skewed ones."""
    cases = [("grouped", format_shape((g, m, n, k)), [g, m, n, k], m, n, [k] * g) for g, m, n, k in shapes]
    if skewed:
        m, n = _shapes.SKEW_M, _shapes.SKEW_N
        ks = _shapes.skewed_sizes()
        cases.append(("skewed", f"skew {len(ks)}x{m}x{n} sumK={sum(ks)}", [len(ks), m, n, sum(ks)], m, n, ks))
        # The same split in exact token counts: groups start inside 16-byte chunks, which only the
        # contiguous-K op takes (shifted loads).
        ks = _shapes.skewed_sizes(1)
        cases.append(("skewed-any", f"skew {len(ks)}x{m}x{n} sumK={sum(ks)} any sizes", [len(ks), m, n, sum(ks)],
                      m, n, ks))
    return cases


def run_grouped(shapes: Sequence[GroupedShape] = GROUPED_SEED_SHAPES, impls: Sequence[str] = IMPL_NAMES,
                reps: int = DEFAULT_REPS, warmup: int = DEFAULT_WARMUP, *, skewed: bool = True, seed: int = 0,
                progress: Optional[ProgressFn] = None, device="cuda", flush_bytes: int = L2_FLUSH_BYTES,
                rows: Optional[List[dict]] = None, rates: Optional[MachineRates] = None) -> List[dict]:
    """Both grouped layouts, our dense kernel on one group's shape, a per-group loop of our dense
    kernel, DeepGEMM's k-grouped call and a per-group loop of cuBLAS, on each (G, M, N, K); then (if
    `skewed`) the Zipf-split MoE case. Rows are appended to `rows` (if given) and get their bound from
    `rates` (if given) as in `run_dense`."""
    device = torch.device(device)
    progress = progress or silent
    flush = flush_buffer(device, flush_bytes)
    cases = _grouped_cases(shapes, skewed)
    rows = [] if rows is None else rows
    for i, (kind, label, dims, m, n, ks) in enumerate(cases):
        progress(f"[grouped {i + 1}/{len(cases)}] {label} (K per group {ks}): making operands and references")
        chosen = [impl for impl in GROUPED_IMPLS if impl.family in impls]
        if kind == "skewed-any":
            chosen = [impl for impl in chosen if impl.name == "ours-contig"]
            if not chosen:
                continue
        if kind == "grouped" and "ours" in impls:
            chosen.insert(2, group_dense_impl())
        try:
            problem = make_grouped_problem(m, n, ks, device, seed + 1000 + i)
        except Exception as exc:
            if is_cuda_fault(exc):
                raise
            rows.extend(unbuilt_rows(kind, label, dims, chosen, reps, exc, progress))
            free_cached(device)
            continue
        check = lambda after, before, p=problem: grouped_relative_error(after, before, p.refs)  # noqa: E731
        check0 = lambda after, before, p=problem: relative_error(after, before, p.refs[0])  # noqa: E731
        checks = lambda impl: check0 if impl.name == GROUP_DENSE_IMPL else check  # noqa: E731
        case_rows = measure_all(chosen, problem, checks, label, dims, kind, reps, warmup, flush, progress,
                                rows, rates, group_sizes=list(ks))
        fill_ratios(case_rows, "cublas-loop", "vs_cublas", dense_ref=GROUP_DENSE_IMPL if kind == "grouped"
                    else None)
        fill_ratios(case_rows, DEEPGEMM_GROUPED, "vs_deepgemm")
        if kind == "skewed":
            fill_ratios(case_rows, "ours-dense-loop", "vs_dense_loop")
        rows.extend(case_rows)
        del problem, check, check0
        free_cached(device)
    return rows


# ------------------------------------------------------------------ command line --------------------


def _parse_ints(text: str, count: int, what: str) -> Tuple[int, ...]:
    parts = [p for p in text.replace("x", ",").replace("X", ",").split(",")]
    if len(parts) != count:
        raise argparse.ArgumentTypeError(f"{what} needs {count} integers separated by ',' or 'x', got {text!r}")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} needs integers, got {text!r}") from None


def parse_dense_shape(text: str) -> DenseShape:
    """'M,N,K' (or 'MxNxK'): M, N >= 1; K >= 16 and a multiple of 16 (the op's contract)."""
    m, n, k = _parse_ints(text, 3, "--shape M,N,K")
    if m < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"M and N must be >= 1, got {text!r}")
    if k < 16 or k % 16 != 0:
        raise argparse.ArgumentTypeError(f"K must be a positive multiple of 16, got {k}")
    return (m, n, k)


def parse_grouped_shape(text: str) -> GroupedShape:
    """'G,M,N,K' with K the token count of every group (a multiple of 16 for the packed layout)."""
    g, m, n, k = _parse_ints(text, 4, "--grouped-shape G,M,N,K")
    if g < 1 or m < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"G, M and N must be >= 1, got {text!r}")
    if k < 16 or k % 16 != 0:
        raise argparse.ArgumentTypeError(f"K must be a positive multiple of 16, got {k}")
    return (g, m, n, k)


def parse_impls(text: str) -> List[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in IMPL_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown implementation(s) {unknown or text!r}; choose from {', '.join(IMPL_NAMES)}")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", metavar="M,N,K", type=parse_dense_shape, action="append", default=None,
                        help="a dense shape (repeatable); replaces the 12 seed shapes")
    parser.add_argument("--dense", action="store_true",
                        help="also run the dense seed shapes when --grouped/--grouped-shape/--quant is given")
    parser.add_argument("--grouped", action="store_true",
                        help="the 6 k-grouped seed shapes in both layouts, plus the skewed 8-expert case")
    parser.add_argument("--grouped-shape", metavar="G,M,N,K", type=parse_grouped_shape, action="append",
                        default=None, help="a k-grouped shape, K tokens per group (repeatable)")
    parser.add_argument("--short-k", action="store_true",
                        help="the short-K / many-groups set: dense 4096x4096 at K = 1024, 2048; k-grouped "
                             "4096x7168 and 7168x2048 with 16 experts x 1024 tokens and 64 x 256 "
                             "(added to the other shapes given)")
    parser.add_argument("--impl", metavar="NAMES", type=parse_impls, default=list(IMPL_NAMES),
                        help=f"comma-separated subset of {','.join(IMPL_NAMES)} (default: all)")


def _asked(args: argparse.Namespace) -> bool:
    return bool(args.shape or args.dense or args.grouped or args.grouped_shape or args.short_k)


class GemmRun(SuiteRun):
    """Dense shapes, k-grouped shapes and the skewed case of one command line, and their rows."""

    def __init__(self, args: argparse.Namespace, by_default: bool):
        self.dense: List[DenseShape] = list(args.shape or [])
        if not self.dense and (args.dense or by_default):
            self.dense = list(DENSE_SEED_SHAPES)
        self.grouped: List[GroupedShape] = list(args.grouped_shape or [])
        if args.grouped and not args.grouped_shape:
            self.grouped = list(GROUPED_SEED_SHAPES)
        if args.short_k:
            self.dense += [s for s in SHORT_K_DENSE_SHAPES if s not in self.dense]
            self.grouped += [s for s in SHORT_K_GROUPED_SHAPES if s not in self.grouped]
        self.skewed: bool = args.grouped
        self.wanted = bool(self.dense or self.grouped or self.skewed)
        self.dense_rows: List[dict] = []
        self.grouped_rows: List[dict] = []
        self.rates: Optional[MachineRates] = None

    def run(self, args: argparse.Namespace, progress: ProgressFn) -> None:
        # Before any row, on the GPU the rows run on (once per process: process_rates), so that every
        # row's bound is a same-run figure.
        self.rates = process_rates(progress=progress)
        if self.dense:
            run_dense(self.dense, args.impl, args.reps, args.warmup, seed=args.seed, progress=progress,
                      rows=self.dense_rows, rates=self.rates)
        if self.grouped or self.skewed:
            run_grouped(self.grouped, args.impl, args.reps, args.warmup, skewed=self.skewed, seed=args.seed,
                        progress=progress, rows=self.grouped_rows, rates=self.rates)

    def report(self) -> List[str]:
        lines: List[str] = []
        dense_rows, grouped_rows = self.dense_rows, self.grouped_rows
        if self.rates is not None:
            lines += ["", f"machine rates, measured in this process: {rates_line(self.rates)}"]
        if dense_rows:
            lines += ["", "dense (out += a @ b^T, fp32 out)", dense_table(dense_rows), ""]
            lines += summary_lines(summarize(dense_rows, ("dense",)), "geometric means, dense")
        if grouped_rows:
            lines += ["", "k-grouped (MoE): TFLOPS over all groups", grouped_table(grouped_rows), ""]
            skew = [r for r in grouped_rows if r["kind"] == "skewed"]
            if skew:
                lines.append(f"skewed case: K per expert {skew[0]['group_sizes']} (Zipf-like split of "
                             f"{sum(skew[0]['group_sizes'])} tokens, multiples of 16)")
            skew_any = [r for r in grouped_rows if r["kind"] == "skewed-any"]
            if skew_any:
                lines.append(f"skewed case, any sizes: K per expert {skew_any[0]['group_sizes']} (the same split "
                             f"in exact token counts: contiguous-K only)")
            lines += summary_lines(summarize(grouped_rows, ("grouped",)),
                                   "geometric means, k-grouped shapes (not the skewed cases)")
        if dense_rows or grouped_rows:
            lines += [""] + legend(dense_rows + grouped_rows)
            problems = problem_lines(dense_rows + grouped_rows)
            if problems:
                lines += [""] + problems
        return lines

    def json(self):
        return dict(bytes_note=BYTES_NOTE, fp8_max_rel_err=FP8_REL_ERR_MAX, bf16_max_rel_err=BF16_REL_ERR_MAX,
                    machine_rates=self.rates.json() if self.rates is not None else None,
                    dense=self.dense_rows, grouped=self.grouped_rows,
                    geomean={"dense": summarize(self.dense_rows, ("dense",)),
                             "grouped": summarize(self.grouped_rows, ("grouped",))})

    def _failed(self) -> List[dict]:
        return [r for r in self.dense_rows + self.grouped_rows if r["status"] == "FAIL"]

    def failed_count(self) -> int:
        return len(self._failed())

    def failure_lines(self) -> List[str]:
        return [f"FAIL: {r['shape']} {r['impl']}: {r['message']}" for r in self._failed()]


SUITE = Suite("gemm", add_arguments, _asked, GemmRun)
