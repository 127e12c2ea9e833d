"""The m-grouped suite of the benchmark (`python -m wgrad bench --m-grouped`), without a GPU: its wiring into
the command line, the table and the check."""

from __future__ import annotations

import pytest

from wgrad.bench import cli, experts


def test_option_plans_only_the_m_grouped_suite():
    runs = cli.plan_from_args(cli.build_parser().parse_args(["--m-grouped"]))
    assert runs["m-grouped"].wanted and not runs["layers"].wanted
    assert not cli.plan_from_args(cli.build_parser().parse_args([]))["m-grouped"].wanted


def _row(ours, loop, bf16, err=1e-3):
    return experts.ExpertsRow("8 x 7168->4096, 32768 tokens", 1.924, ours, loop, bf16, 20.0, 400.0, err, 1.1e-3)


def test_table_and_check():
    rows = [_row(2.0, 2.4, 3.0), _row(1.0, 1.0, 2.0, err=5e-3)]
    table = experts.experts_table(rows)
    assert "| 8 x 7168->4096, 32768 tokens | 2.000 (962) | 2.400 (802) | 3.000 (641) | 1.20 | 1.50 | 20 / 400 |" in table
    assert "vs scaled_mm loop: geomean 1.095, min 1.000" in table and "vs bf16 grouped_mm: geomean 1.732" in table
    run = experts.ExpertsRun(cli.build_parser().parse_args(["--m-grouped"]), False)
    run.rows = rows
    assert run.failed_count() == 1 and "relative error 0.005" in run.failure_lines()[0]
    assert [r["vs_loop"] for r in run.json()["m_grouped"]] == pytest.approx([1.2, 1.0])
