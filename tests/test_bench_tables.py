"""CPU tests of the benchmark's report (wgrad.bench.tables): table layout, speed-up ratios, geometric
means, the list of rows that are not ok, and JSON clean-up."""

from __future__ import annotations

import math

import pytest
import torch

from wgrad.bench import common, runner, tables


def _row(shape, impl, tflops=None, status="ok", message="", kind="dense", **extra):
    row = {"kind": kind, "shape": shape, "dims": [], "impl": impl, "form": f"{impl}-form", "status": status,
           "message": message, "rel_err": 1.25e-4 if tflops else None, "ms": 1.0 if tflops else None,
           "tflops": tflops, "gbps": 3000.0 if tflops else None}
    row.update(extra)
    return row


def test_format_table_aligns_columns():
    text = tables.format_table(["name", "ms"], [["a", "1.5"], ["longer", "12.25"]], [False, True])
    assert text.splitlines() == ["name       ms", "------  -----", "a         1.5", "longer  12.25"]


def test_fill_ratios_and_dense_table():
    rows = [_row("7168x2112x4096", "ours", 1100.0, host_us=12.5, pct_bound=86.25, binds="math"),
            _row("7168x2112x4096", "deepgemm", 1000.0),
            _row("7168x2112x4096", "cublas", 700.0),
            _row("7168x2112x4096", "bf16", status="n/a", message="RuntimeError: " + "z" * 100)]
    runner.fill_ratios(rows, "cublas", "vs_cublas")
    runner.fill_ratios(rows, "deepgemm", "vs_deepgemm")
    assert rows[0]["vs_cublas"] == pytest.approx(1100 / 700) and "vs_cublas" not in rows[2]
    assert rows[0]["vs_deepgemm"] == pytest.approx(1.1) and rows[2]["vs_deepgemm"] == pytest.approx(0.7)
    assert "vs_cublas" not in rows[3] and "vs_deepgemm" not in rows[1] and "vs_deepgemm" not in rows[3]
    lines = tables.dense_table(rows).splitlines()
    assert lines[0].split()[:5] == ["shape", "MxNxK", "impl", "ms", "TFLOPS"]
    assert lines[0].index("vs DeepGEMM") < lines[0].index("vs cuBLAS")
    ours = lines[2].split()
    assert ours == ["7168x2112x4096", "ours", "1.000", "1100.0", "3000", "86.2", "math", "12.5", "1.10x", "1.57x",
                    "1.25e-04", "ok"]
    assert (lines[0].index("GB/s") < lines[0].index("% bound") < lines[0].index("binds") < lines[0].index("host us")
            < lines[0].index("vs DeepGEMM"))
    assert lines[5].rstrip().endswith("...") and "n/a: RuntimeError: zzz" in lines[5]


def test_grouped_ratios_vs_dense_and_loop():
    rows = [_row("4x7168x4096x4096", "ours-packed", 990.0, kind="grouped"),
            _row("4x7168x4096x4096", "ours-dense", 1000.0, kind="grouped"),
            _row("4x7168x4096x4096", "cublas-loop", 660.0, kind="grouped")]
    rows.append(_row("4x7168x4096x4096", "deepgemm-packed", 900.0, kind="grouped"))
    runner.fill_ratios(rows, "cublas-loop", "vs_cublas", dense_ref="ours-dense")
    runner.fill_ratios(rows, "deepgemm-packed", "vs_deepgemm")
    assert rows[0]["vs_dense"] == pytest.approx(0.99) and rows[0]["vs_cublas"] == pytest.approx(1.5)
    assert rows[0]["vs_deepgemm"] == pytest.approx(1.1)
    assert "vs_dense" not in rows[1] and "vs_dense" not in rows[2] and "vs_dense" not in rows[3]
    table = tables.grouped_table(rows)
    assert "0.99x" in table and "1.50x" in table and "1.10x" in table and "vs DeepGEMM" in table


def test_summarize_uses_only_timed_shapes():
    rows = [_row("s1", "ours", 1000.0), _row("s2", "ours", 1210.0),
            _row("s3", "ours", status="FAIL", message="rel. err"),
            _row("s1", "cublas", 500.0), _row("s2", "cublas", 605.0),
            _row("s1", "deepgemm", 800.0), _row("s2", "deepgemm", status="n/a", message="ImportError"),
            _row("s3", "deepgemm", 5.0)]
    runner.fill_ratios(rows, "cublas", "vs_cublas")
    runner.fill_ratios(rows, "deepgemm", "vs_deepgemm")
    s = tables.summarize(rows, ("dense",))
    assert s["ours"]["shapes"] == 2 and s["ours"]["tflops"] == pytest.approx(math.sqrt(1000 * 1210))
    assert s["ours"]["vs_cublas"] == pytest.approx(2.0) and s["ours"]["vs_cublas_shapes"] == 2
    # DeepGEMM timed on s1 only where ours is timed: the ratio's geomean is over that one shape.
    assert s["ours"]["vs_deepgemm"] == pytest.approx(1.25) and s["ours"]["vs_deepgemm_shapes"] == 1
    assert s["deepgemm"]["shapes"] == 2 and s["deepgemm"]["vs_deepgemm"] is None
    text = "\n".join(tables.summary_lines(s, "geometric means"))
    assert "vs DeepGEMM 1.25x (over 1); vs cuBLAS 2.00x" in text


def test_problem_lines_and_json_safe():
    rows = [_row("s1", "ours", 1.0), _row("s1", "cublas", status="n/a", message="ValueError: bad layout",
                                          tried=["v1: error: ValueError: bad layout", "v2: error: no F.scaled_mm"])]
    lines = tables.problem_lines(rows)
    assert lines[0] == "not ok:" and "s1 cublas: n/a: ValueError: bad layout" in lines[1] and len(lines) == 4
    assert tables.problem_lines(rows[:1]) == []
    assert common.json_safe({"a": float("nan"), "b": (1, 2.5), "c": torch.float32}) == {
        "a": None, "b": [1, 2.5], "c": "torch.float32"}


def test_legend_names_every_row_and_the_call_it_timed():
    rows = [_row("s1", "ours", 1.0), _row("s1", "cublas-loop", 1.0, kind="grouped")]
    text = "\n".join(tables.legend(rows))
    assert "wgrad.wgrad_gemm_fp8_fp8_fp32_nt: out += (a*sa) @ (b*sb)^T in one call" in text
    assert "timed: ours-form" in text and "timed: cublas-loop-form" in text
    assert "DESIGN" not in text and "vs DeepGEMM" in text and "same shape" in text
    assert "% bound = 100 * max(FLOPs / tensor-wise FP8 rate, bytes / copy rate) / median time" in text
    assert "host us" in text


def test_generic_table_takes_free_form_rows():
    text = tables.generic_table([{"name": "rowwise", "gbps": 4100.5, "valid": True},
                                 {"name": "both", "gbps": 3000.0, "extra": None}])
    lines = text.splitlines()
    assert lines[0].split() == ["name", "gbps", "valid", "extra"]
    assert lines[2].split() == ["rowwise", "4100", "True"] and lines[3].split() == ["both", "3000"]
