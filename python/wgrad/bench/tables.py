"""The plain-text report: the tables of the GEMM suites, geometric means, the legend, the rows that are
not ok, and a generic table for suites whose rows are free-form dicts (the quantization suite's)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from .bound import RATE_COPY_BYTES, RATE_GEMM_SIZE
from .common import geomean
from .impls import impl_summaries
from .problems import BYTES_NOTE
from .timing import HOST_BURST, HOST_BURSTS, HOST_UNTIMED


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """A plain-text table: columns as wide as their widest cell, numbers right-aligned."""
    widths = [len(h) for h in headers]
    for r in rows:
        for j, cell in enumerate(r):
            widths[j] = max(widths[j], len(cell))

    def line(cells):
        out = [c.rjust(w) if right[j] else c.ljust(w) for j, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def _num(value: Optional[float], fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _ratio(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.2f}x"


def _check_cell(row: dict, width: int = 60) -> str:
    if row["status"] == "ok":
        return "ok"
    text = f"{row['status']}: {row['message']}" if row["message"] else row["status"]
    return text if len(text) <= width else text[: width - 3] + "..."


def dense_table(rows: Sequence[dict]) -> str:
    headers = ["shape MxNxK", "impl", "ms", "TFLOPS", "GB/s", "% bound", "binds", "host us", "vs DeepGEMM",
               "vs cuBLAS", "rel.err", "check"]
    right = [False, False, True, True, True, True, False, True, True, True, True, False]
    body = [[r["shape"], r["impl"], _num(r["ms"], ".3f"), _num(r["tflops"], ".1f"), _num(r["gbps"], ".0f"),
             _num(r.get("pct_bound"), ".1f"), r.get("binds") or "", _num(r.get("host_us"), ".1f"),
             _ratio(r.get("vs_deepgemm")), _ratio(r.get("vs_cublas")), _num(r["rel_err"], ".2e"), _check_cell(r)]
            for r in rows]
    return format_table(headers, body, right)


def grouped_table(rows: Sequence[dict]) -> str:
    headers = ["shape GxMxNxK", "impl", "ms", "TFLOPS", "GB/s", "% bound", "binds", "host us", "vs DeepGEMM",
               "vs cuBLAS loop", "vs dense", "vs dense loop", "rel.err", "check"]
    right = [False, False, True, True, True, True, False, True, True, True, True, True, True, False]
    body = [[r["shape"], r["impl"], _num(r["ms"], ".3f"), _num(r["tflops"], ".1f"), _num(r["gbps"], ".0f"),
             _num(r.get("pct_bound"), ".1f"), r.get("binds") or "", _num(r.get("host_us"), ".1f"),
             _ratio(r.get("vs_deepgemm")), _ratio(r.get("vs_cublas")), _ratio(r.get("vs_dense")),
             _ratio(r.get("vs_dense_loop")), _num(r["rel_err"], ".2e"), _check_cell(r)]
            for r in rows]
    return format_table(headers, body, right)


# Same-run ratio columns that get a geometric mean per impl, and their names in the summary lines.
SUMMARY_RATIOS = (("vs_deepgemm", "vs DeepGEMM"), ("vs_cublas", "vs cuBLAS"))


def summarize(rows: Sequence[dict], kinds: Sequence[str] = ("dense", "grouped")) -> Dict[str, dict]:
    """Geometric means per impl over the shapes (of `kinds`) where it was timed: TFLOPS, and each ratio
    of SUMMARY_RATIOS over the shapes where it exists (`<ratio>_shapes` of them: its baseline may be n/a
    on some)."""
    out: Dict[str, dict] = {}
    impls = list(dict.fromkeys(r["impl"] for r in rows if r["kind"] in kinds))
    for name in impls:
        timed = [r for r in rows if r["impl"] == name and r["kind"] in kinds and r["tflops"] is not None]
        entry = {"shapes": len(timed), "tflops": geomean(r["tflops"] for r in timed)}
        for key, _ in SUMMARY_RATIOS:
            ratios = [r[key] for r in timed if r.get(key) is not None]
            entry[key] = geomean(ratios) if ratios else None
            entry[f"{key}_shapes"] = len(ratios)
        out[name] = entry
    return out


def summary_lines(summary: Dict[str, dict], title: str) -> List[str]:
    lines = [f"{title}:"]
    for name, s in summary.items():
        if s["tflops"] is None:
            lines.append(f"  {name:<16} not timed on any shape")
            continue
        text = f"  {name:<16} {s['tflops']:7.1f} TFLOPS over {s['shapes']} shape(s)"
        for key, label in SUMMARY_RATIOS:
            if s.get(key) is None:
                continue
            text += f"; {label} {s[key]:.2f}x"
            if s.get(f"{key}_shapes", s["shapes"]) != s["shapes"]:
                text += f" (over {s[f'{key}_shapes']})"
        lines.append(text)
    return lines


def legend(rows: Sequence[dict]) -> List[str]:
    """What each row name means and the exact call each one timed."""
    forms: Dict[str, List[str]] = {}
    for r in rows:
        fs = forms.setdefault(r["impl"], [])
        if r["form"] and r["form"] not in fs:
            fs.append(r["form"])
    summaries = impl_summaries()
    lines = ["legend:"]
    for name, fs in forms.items():
        lines.append(f"  {name:<16} {summaries.get(name, '')}")
        lines += [f"  {'':<16}   timed: {f}" for f in fs]
    lines.append(f"  {BYTES_NOTE}.")
    lines.append("  TFLOPS = 2*M*N*K / median time. 'vs DeepGEMM', 'vs cuBLAS' = this TFLOPS / that row's on the "
                 "same shape, measured in this process (no figure from another machine or process enters a "
                 "ratio); DeepGEMM is measured only where `import deep_gemm` works.")
    lines.append("  % bound = 100 * max(FLOPs / tensor-wise FP8 rate, bytes / copy rate) / median time, with both "
                 "rates measured at the start of this process on this GPU (the 'machine rates' line): "
                 f"torch._scaled_mm with one scale per tensor on {RATE_GEMM_SIZE}^3 e4m3, and a "
                 f"{RATE_COPY_BYTES / 2 ** 30:g} GiB copy_ (read + write); 'binds' = the larger term (math or "
                 "memory). Every row, bf16 too, is held to the FP8 rate.")
    lines.append("  host us = the launching thread's time per call when it runs ahead of the GPU (calls enqueued "
                 f"{HOST_BURST} at a time behind a GPU sleep that outlasts them, after {HOST_UNTIMED} untimed calls "
                 f"that follow the synchronisation; median of the per-call means over --reps calls, at least "
                 f"{HOST_BURSTS} bursts).")
    return lines


def problem_lines(rows: Sequence[dict]) -> List[str]:
    """Every row that is not ok, with its full reason and what was tried (the table truncates)."""
    lines = []
    for r in rows:
        if r["status"] == "ok":
            continue
        lines.append(f"  {r['shape']} {r['impl']}: {r['status']}: {r['message']}")
        lines += [f"      tried {t}" for t in r.get("tried", [])]
    return ["not ok:"] + lines if lines else []


def generic_table(rows: Sequence[dict]) -> str:
    """A table of arbitrary dict rows (the quantization bench's), columns in first-seen key order."""
    keys: List[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)

    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    body = [[cell(r.get(k)) for k in keys] for r in rows]
    right = [all(isinstance(r.get(k), (int, float)) or r.get(k) is None for r in rows) for k in keys]
    return format_table(keys, body, right)
