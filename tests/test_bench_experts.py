"""The m-grouped suite of the benchmark (`python -m wgrad bench --m-grouped`), without a GPU: its wiring into
the command line, the table and the check."""

from __future__ import annotations

import pytest

from wgrad.bench import bound, cli, experts


def test_option_plans_only_the_m_grouped_suite():
    runs = cli.plan_from_args(cli.build_parser().parse_args(["--m-grouped"]))
    assert runs["m-grouped"].wanted and not runs["layers"].wanted
    assert not cli.plan_from_args(cli.build_parser().parse_args([]))["m-grouped"].wanted


def _row(ours, loop, bf16, err=1e-3, bound_ms=None, binds=None):
    return experts.ExpertsRow("8 x 7168->4096, 32768 tokens", 1.924, ours, loop, bf16, 20.0, 400.0, err, 1.1e-3,
                              bound_ms, binds)


def test_table_and_check():
    rows = [_row(2.0, 2.4, 3.0), _row(1.0, 1.0, 2.0, err=5e-3)]
    table = experts.experts_table(rows)
    assert "| 8 x 7168->4096, 32768 tokens | 2.000 (962) | 2.400 (802) | 3.000 (641) | 1.20 | 1.50 | n/a | 20 / 400 |" in table
    assert "vs scaled_mm loop: geomean 1.095, min 1.000" in table and "vs bf16 grouped_mm: geomean 1.732" in table
    run = experts.ExpertsRun(cli.build_parser().parse_args(["--m-grouped"]), False)
    run.rows = rows
    assert run.failed_count() == 1 and "relative error 0.005" in run.failure_lines()[0]
    assert [r["vs_loop"] for r in run.json()["m_grouped"]] == pytest.approx([1.2, 1.0])


def test_bound_column_from_the_measured_rates():
    # 8 experts, 2048 -> 7168 at 32768 tokens: 0.962 TFLOP, 0.962 ms at 1000 TFLOPS; the bytes (a 64 MiB and its
    # scales 2 MiB, b 112 MiB and 28 KiB of block scales, out 448 MiB) take 0.22 ms at 3 TB/s: math binds.
    moved = experts.moved_bytes(8, 7168, 2048, 32768)
    assert moved == 32768 * 2048 + 4 * 32768 * 16 + 8 * 7168 * 2048 + 4 * 8 * 56 * 16 + 2 * 32768 * 7168
    rates = bound.MachineRates(1000.0, 3000.0, (8192,) * 3, 1 << 30)
    ms, binds = bound.bound_of(2.0 * 32768 * 7168 * 2048, moved, rates)
    assert binds == "math" and ms == pytest.approx(2.0 * 32768 * 7168 * 2048 / 1e15 * 1e3)
    assert bound.bound_of(1.0, 1e12, rates) == (pytest.approx(1e12 / 3e12 * 1e3), "memory")
    assert bound.bound_of(1.0, 1.0, bound.MachineRates(None, 3000.0, (8192,) * 3, 1 << 30)) is None
    row = _row(2.0, 1.9, 3.0, bound_ms=ms, binds=binds)
    assert f"| {100 * ms / 2.0:.1f} / {100 * ms / 1.9:.1f} (math) |" in experts.format_row(row)
    run = experts.ExpertsRun(cli.build_parser().parse_args(["--m-grouped"]), False)
    run.rows, run.rates = [row], rates
    doc = run.json()
    assert doc["m_grouped"][0]["pct_bound_ours"] == pytest.approx(100 * ms / 2.0)
    assert doc["m_grouped_machine_rates"]["fp8_tflops"] == 1000.0
    assert any("machine rates, measured in this process: tensor-wise FP8 1000 TFLOPS" in line for line in run.report())
