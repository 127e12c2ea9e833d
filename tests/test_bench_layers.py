"""The layers suite of the benchmark (`python -m wgrad bench --layers`), without a GPU: its wiring into the
command line, the token split, the table and the check."""

from __future__ import annotations

import pytest

from wgrad.bench import cli, layers


def test_layers_option_plans_only_the_layers():
    runs = cli.plan_from_args(cli.build_parser().parse_args(["--layers"]))
    assert runs["layers"].wanted and not runs["quant"].wanted
    runs = cli.plan_from_args(cli.build_parser().parse_args([]))
    assert not runs["layers"].wanted


@pytest.mark.parametrize("groups,total", [(8, 16384), (32, 16384), (3, 7)])
def test_uneven_split(groups, total):
    sizes = layers.uneven_split(total, groups, seed=groups)
    assert len(sizes) == groups and sum(sizes) == total and min(sizes) >= 0
    assert max(sizes) > 1.5 * total / groups  # uneven, as a router makes them


def _row(kind, ours, bf16, err=0.03, torchao=None, note=""):
    return layers.LayerRow(kind, "7168->2112 x 8192", ours, ours * 1.05, bf16, 0.25, 0.05, {"fprop": 0.1},
                           100 * 2**20, 200 * 2**20, 90.0 if kind == "dense" else None, err, torchao, note)


def test_table_and_check():
    rows = [_row("dense", 1.0, 1.5, note="features not multiples of 128"), _row("dense", 2.0, 2.4, torchao=2.5),
            _row("grouped", 1.0, 1.0, err=0.5)]
    table = layers.layers_table(rows)
    assert ("| dense 7168->2112 x 8192 | 1.000 | 1.050 | 1.500 | 1.50 | n/a (features not multiples of 128) | - | "
            "0.250 / 0.050 | 100.0 / 200.0 | 90.0 |") in table
    assert "| 2.000 | 2.100 | 2.400 | 1.20 | 2.500 | 1.25 | 0.250 / 0.050 |" in table
    assert "dense: geomean speedup 1.342" in table and "grouped: geomean speedup 1.000" in table
    assert "dense against torchao: geomean 1.250 over 1 of 2 layers" in table
    assert "torchao n/a (features not multiples of 128)" in layers.format_row(rows[0])
    assert "torchao 2.500 ms (x1.25)" in layers.format_row(rows[1])
    run = layers.LayersRun(cli.build_parser().parse_args(["--layers"]), False)
    run.rows = rows
    assert run.failed_count() == 1 and "relative difference to bf16 0.5" in run.failure_lines()[0]
    assert [r["speedup"] for r in run.json()["layers"]] == pytest.approx([1.5, 1.2, 1.0])
    assert [r["vs_torchao"] for r in run.json()["layers"]] == [None, pytest.approx(1.25), None]


class _FakeEvent:
    """A CUDA event on a fake clock: each recorded event reads the calls the fake GPU has run so far."""

    gpu_calls = 0

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = _FakeEvent.gpu_calls

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return float(end.at - self.at)  # one ms per call


def test_time_interleaved_gpu_and_host_columns(monkeypatch):
    """Without a GPU, on fake events and sleeps: every call is timed on the GPU once per repetition, and the host
    column comes from the burst method (timing.host_times_us), or is NaN when not asked for."""
    import math

    from wgrad.bench import timing

    monkeypatch.setattr(layers.torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(layers.torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(layers.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(layers, "sleep_cycles_per_ms", lambda: 1000.0)
    monkeypatch.setattr(timing, "sleep_cycles_per_ms", lambda: 1000.0)
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
            _FakeEvent.gpu_calls += 1
        return fn

    host_seen = []
    monkeypatch.setattr(layers, "host_times_us", lambda fn, reps: host_seen.append(reps) or [7.0, 9.0, 8.0])
    flush = layers.torch.empty(4)
    t = layers.time_interleaved({"a": make("a"), "b": make("b")}, 5, flush)
    assert set(t) == {"a", "b"} and all(v.gpu_ms == 1.0 for v in t.values())
    assert all(v.host_ms == pytest.approx(8.0e-3) for v in t.values()) and host_seen == [5, 5]
    assert calls == {"a": 3 + 5, "b": 3 + 5}  # warm-up (one, then two timed on the host) and the repetitions
    t = layers.time_interleaved({"a": make("a")}, 3, flush, host=False)
    assert t["a"].gpu_ms == 1.0 and math.isnan(t["a"].host_ms) and host_seen == [5, 5]
