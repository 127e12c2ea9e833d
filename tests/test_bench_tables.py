"""CPU tests of the benchmark's report (wgrad.bench.tables): table layout, speed-up ratios, geometric
means, the list of rows that are not ok, and JSON clean-up."""

from __future__ import annotations

import math

import pytest
import torch

from wgrad.bench import common, runner, tables


def _row(shape, impl, tflops=None, status="ok", message="", anchor=None, kind="dense", **extra):
    row = {"kind": kind, "shape": shape, "dims": [], "impl": impl, "form": f"{impl}-form", "status": status,
           "message": message, "rel_err": 1.25e-4 if tflops else None, "ms": 1.0 if tflops else None,
           "tflops": tflops, "gbps": 3000.0 if tflops else None, "anchor": None, "anchor_tflops": None,
           "vs_anchor": None}
    if anchor:
        row.update(anchor=anchor[0], anchor_tflops=anchor[1], vs_anchor=tflops / anchor[1] if tflops else None)
    row.update(extra)
    return row


def test_format_table_aligns_columns():
    text = tables.format_table(["name", "ms"], [["a", "1.5"], ["longer", "12.25"]], [False, True])
    assert text.splitlines() == ["name       ms", "------  -----", "a         1.5", "longer  12.25"]


def test_fill_ratios_and_dense_table():
    rows = [_row("7168x2112x4096", "ours", 1100.0, anchor=("DeepGEMM", 918.0)),
            _row("7168x2112x4096", "cublas", 700.0, anchor=("cuBLAS", 656.0)),
            _row("7168x2112x4096", "bf16", status="n/a", message="RuntimeError: " + "z" * 100)]
    runner.fill_ratios(rows, "cublas", "vs_cublas")
    assert rows[0]["vs_cublas"] == pytest.approx(1100 / 700) and "vs_cublas" not in rows[1]
    assert "vs_cublas" not in rows[2]
    lines = tables.dense_table(rows).splitlines()
    assert lines[0].split()[:5] == ["shape", "MxNxK", "impl", "ms", "TFLOPS"]
    ours = lines[2].split()
    assert ours[:5] == ["7168x2112x4096", "ours", "1.000", "1100.0", "3000"]
    assert "1.57x" in ours and "918" in ours and "DeepGEMM" in ours and "1.20x" in ours and "1.25e-04" in ours
    assert lines[4].rstrip().endswith("...") and "n/a: RuntimeError: zzz" in lines[4]


def test_grouped_ratios_vs_dense_and_loop():
    rows = [_row("4x7168x4096x4096", "ours-packed", 990.0, kind="grouped"),
            _row("4x7168x4096x4096", "ours-dense", 1000.0, kind="grouped"),
            _row("4x7168x4096x4096", "cublas-loop", 660.0, kind="grouped")]
    runner.fill_ratios(rows, "cublas-loop", "vs_cublas", dense_ref="ours-dense")
    assert rows[0]["vs_dense"] == pytest.approx(0.99) and rows[0]["vs_cublas"] == pytest.approx(1.5)
    assert "vs_dense" not in rows[1] and "vs_dense" not in rows[2]
    table = tables.grouped_table(rows)
    assert "0.99x" in table and "1.50x" in table


def test_summarize_uses_only_timed_shapes():
    rows = [_row("s1", "ours", 1000.0, anchor=("DeepGEMM", 900.0)),
            _row("s2", "ours", 1210.0, anchor=("DeepGEMM", 1000.0)),
            _row("s3", "ours", status="FAIL", message="rel. err", anchor=("DeepGEMM", 5.0)),
            _row("s1", "cublas", 500.0), _row("s2", "cublas", 605.0)]
    runner.fill_ratios(rows, "cublas", "vs_cublas")
    s = tables.summarize(rows, ("dense",))
    assert s["ours"]["shapes"] == 2 and s["ours"]["tflops"] == pytest.approx(math.sqrt(1000 * 1210))
    assert s["ours"]["anchor_tflops"] == pytest.approx(math.sqrt(900 * 1000))  # s3's anchor left out
    assert s["ours"]["vs_cublas"] == pytest.approx(2.0) and s["cublas"]["anchor_tflops"] is None
    text = "\n".join(tables.summary_lines(s, "geometric means"))
    assert "DeepGEMM" in text and "vs cuBLAS 2.00x" in text


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
    assert "DESIGN" not in text and "H200" in text


def test_generic_table_takes_free_form_rows():
    text = tables.generic_table([{"name": "rowwise", "gbps": 4100.5, "valid": True},
                                 {"name": "both", "gbps": 3000.0, "extra": None}])
    lines = text.splitlines()
    assert lines[0].split() == ["name", "gbps", "valid", "extra"]
    assert lines[2].split() == ["rowwise", "4100", "True"] and lines[3].split() == ["both", "3000"]
