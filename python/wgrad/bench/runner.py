"""Validate, then time: how one implementation becomes one row of a table.

An implementation (`Impl`) offers, for a problem, the ways it can be called (`Candidate`s). Each
candidate is run once and checked against the problem's float64 reference before anything is timed;
the first correct one is timed (with `pick_fastest`: every correct one briefly, and the fastest is
kept). A suite runs `measure_all` over its implementations on each of its problems and gets one dict
per (shape, impl): the rows every table and the JSON document are made of.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .bound import MachineRates, fill_bound
from .common import ProgressFn, first_line, gbps, is_cuda_fault, tflops
from .timing import sync, time_calls

# Accuracy bars, as relative Frobenius error of the accumulated product vs the float64 reference.
# FP8 implementations: DeepGEMM and CUTLASS reach ~1.3e-4 on this data too.
FP8_REL_ERR_MAX = 2e-4
# bf16 rounds the dequantized operands to 8 mantissa bits (~2e-3 expected): a sanity bound only.
BF16_REL_ERR_MAX = 1e-2


@dataclass
class Candidate:
    """One way of calling an implementation. `build()` makes the operands it needs (untimed) and returns
    `(run, out)`: `run()` does `out += product` once."""
    form: str
    build: Callable[[], Tuple[Callable[[], None], torch.Tensor]]


@dataclass(frozen=True)
class Impl:
    """An implementation of one benchmark row. `setup(problem)` -> candidates tried in order."""
    name: str
    family: str  # the --impl name that selects it
    summary: str
    setup: Callable[[object], List[Candidate]]
    flops: Callable[[object], int]
    bytes_moved: Callable[[object], int]
    max_rel_err: float = FP8_REL_ERR_MAX
    required: bool = False  # an exception is a FAIL (ours), not "n/a" (a baseline torch lacks)
    pick_fastest: bool = False  # time every correct candidate briefly and keep the fastest


@dataclass
class Selection:
    status: str  # "ok" | "FAIL" | "n/a"
    message: str = ""
    rel_err: Optional[float] = None
    form: str = ""
    run: Optional[Callable[[], None]] = None
    tried: List[str] = field(default_factory=list)


def select_candidate(candidates: Sequence[Candidate], check: Callable[[torch.Tensor, torch.Tensor], float],
                     max_rel_err: float, required: bool, device: torch.device,
                     time_fn: Optional[Callable[[Callable[[], None]], float]] = None) -> Selection:
    """Runs every candidate once (in order, stopping at the first correct one unless `time_fn` is given,
    then all are tried and the fastest correct one wins). `check(out_after, out_before)` returns the
    relative error. No correct candidate: FAIL if one ran and was wrong, or if `required`; else n/a."""
    tried: List[str] = []
    passing: List[Tuple[str, Callable[[], None], float]] = []
    wrong: List[Tuple[str, float]] = []
    errors: List[str] = []
    for cand in candidates:
        try:
            run, out = cand.build()
            before = out.clone()
            run()
            sync(device)
            err = check(out, before)
        except Exception as exc:
            if is_cuda_fault(exc):
                raise
            errors.append(first_line(exc))
            tried.append(f"{cand.form}: error: {first_line(exc)}")
            continue
        if err <= max_rel_err:  # False for NaN
            tried.append(f"{cand.form}: ok, rel. err {err:.2e}")
            passing.append((cand.form, run, err))
            if time_fn is None:
                break
        else:
            tried.append(f"{cand.form}: wrong, rel. err {err:.2e} > {max_rel_err:.0e}")
            wrong.append((cand.form, err))
    if passing:
        if time_fn is not None and len(passing) > 1:
            speeds = [(time_fn(run), i) for i, (_, run, _) in enumerate(passing)]
            best = passing[min(speeds)[1]]
            tried += [f"{passing[i][0]}: {ms:.3f} ms (quick median)" for ms, i in speeds]
            tried.append(f"fastest: {best[0]}")
        else:
            best = passing[0]
        return Selection("ok", "", best[2], best[0], best[1], tried)
    if wrong:
        form, err = min(wrong, key=lambda fe: fe[1] if fe[1] == fe[1] else math.inf)
        return Selection("FAIL", f"rel. err {err:.2e} > {max_rel_err:.0e} ({form})", err, form, None, tried)
    reason = errors[0] if errors else "no way to call it"  # every form's reason is in `tried`
    return Selection("FAIL" if required else "n/a", reason, None, "", None, tried)


# ------------------------------------------------------------------ rows ----------------------------


def new_row(kind: str, label: str, dims: Sequence[int], impl: Impl, reps: int) -> dict:
    return {"kind": kind, "shape": label, "dims": list(dims), "impl": impl.name, "form": "", "status": "",
            "message": "", "rel_err": None, "max_rel_err": impl.max_rel_err, "ms": None, "ms_min": None,
            "ms_max": None, "reps": reps, "flops": None, "bytes": None, "tflops": None, "gbps": None,
            "host_us": None, "bound_ms": None, "pct_bound": None, "binds": None}


def progress_line(row: dict) -> str:
    head = f"  {row['shape']:<24} {row['impl']:<16}"
    if row["ms"] is not None:
        bound = f"  {row['pct_bound']:5.1f} % of bound" if row.get("pct_bound") is not None else ""
        return (f"{head} {row['ms']:8.3f} ms {row['tflops']:7.1f} TFLOPS{bound}  host {row['host_us']:6.1f} us"
                f"  rel.err {row['rel_err']:.2e}  [{row['form']}]")
    return f"{head} {row['status']}: {row['message']}"


def unbuilt_rows(kind: str, label: str, dims: Sequence[int], impls: Sequence[Impl], reps: int,
                 exc: BaseException, progress: ProgressFn) -> List[dict]:
    """Rows for a shape whose operands or reference could not be made (e.g. out of memory)."""
    rows = []
    for impl in impls:
        row = new_row(kind, label, dims, impl, reps)
        row.update(status="FAIL" if impl.required else "n/a",
                   message=f"could not make the operands/reference: {first_line(exc)}")
        progress(progress_line(row))
        rows.append(row)
    return rows


def measure(impl: Impl, problem, check, label: str, dims: Sequence[int], kind: str, reps: int, warmup: int,
            flush: Optional[torch.Tensor], progress: ProgressFn, rates: Optional[MachineRates] = None) -> dict:
    """Validates `impl` on `problem` (first correct candidate), then times it: one result row (with its
    place under the machine's bound when `rates` are given)."""
    device = problem.device
    row = new_row(kind, label, dims, impl, reps)
    row.update(flops=impl.flops(problem), bytes=impl.bytes_moved(problem))
    try:
        quick = None
        if impl.pick_fastest:
            quick = lambda fn: statistics.median(time_calls(fn, 5, 2, flush, device))  # noqa: E731
        sel = select_candidate(impl.setup(problem), check, impl.max_rel_err, impl.required, device, quick)
        row.update(status=sel.status, message=sel.message, rel_err=sel.rel_err, form=sel.form, tried=sel.tried)
        if sel.run is not None:
            host_us: List[float] = []
            times = time_calls(sel.run, reps, warmup, flush, device, host_us)
            ms = statistics.median(times)
            row.update(ms=ms, ms_min=min(times), ms_max=max(times), tflops=tflops(row["flops"], ms),
                       gbps=gbps(row["bytes"], ms), host_us=statistics.median(host_us))
            fill_bound(row, rates)
    except Exception as exc:
        if is_cuda_fault(exc):
            raise
        row.update(status="FAIL" if impl.required else "n/a", message=first_line(exc))
    progress(progress_line(row))
    return row


def measure_all(impls: Sequence[Impl], problem, check_of: Callable[[Impl], Callable], label: str,
                dims: Sequence[int], kind: str, reps: int, warmup: int, flush: Optional[torch.Tensor],
                progress: ProgressFn, sink: List[dict], rates: Optional[MachineRates] = None,
                **extra) -> List[dict]:
    """`measure` of every impl on one shape. A sticky CUDA fault is recorded as a FAIL row and, with
    the rows of this shape so far, put into `sink` before it propagates."""
    out: List[dict] = []
    for impl in impls:
        try:
            row = measure(impl, problem, check_of(impl), label, dims, kind, reps, warmup, flush, progress, rates)
        except Exception as exc:
            row = new_row(kind, label, dims, impl, reps)
            row.update(status="FAIL", message=f"CUDA fault: {first_line(exc)}", **extra)
            progress(progress_line(row))
            sink.extend(out + [row])
            raise
        row.update(extra)
        out.append(row)
    return out


def fill_ratios(rows: List[dict], baseline: str, key: str, dense_ref: Optional[str] = None) -> None:
    """Adds `key` = this row's TFLOPS / the `baseline` row's TFLOPS on the same shape (a speed-up, also
    right when the two rows do different amounts of work) and, when `dense_ref` is given, `vs_dense` =
    TFLOPS / that row's TFLOPS for our rows (the grouped-vs-dense efficiency)."""
    by_shape: Dict[str, Dict[str, dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], {})[r["impl"]] = r
    for impls in by_shape.values():
        base = impls.get(baseline)
        dense = impls.get(dense_ref) if dense_ref else None
        for r in impls.values():
            if r["tflops"] is None:
                continue
            if base is not None and base["tflops"] and r is not base:
                r[key] = r["tflops"] / base["tflops"]
            if dense is not None and dense["tflops"] and r is not dense and r["impl"].startswith("ours"):
                r["vs_dense"] = r["tflops"] / dense["tflops"]
