"""CPU tests of the benchmark's command line (`python -m wgrad bench`, wgrad.bench.cli): argument
parsing, which suites a command line runs, the report, the JSON document and the exit paths, the
quantization suite's place in them, and the suite registry a new suite plugs into."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, package_env
from wgrad.bench import bound, cli, gemm, quant, shapes, timing
from wgrad.bench.suite import Suite, SuiteRun

# ------------------------------------------------------------------ parsing --------------------------


@pytest.mark.parametrize("text,expected", [
    ("7168,2112,4096", (7168, 2112, 4096)),
    ("7168x2112x4096", (7168, 2112, 4096)),
    ("1,1,16", (1, 1, 16)),
    ("33,127,144", (33, 127, 144)),
])
def test_parse_dense_shape_accepts(text, expected):
    assert gemm.parse_dense_shape(text) == expected


@pytest.mark.parametrize("text", ["1,2", "1,2,3,4", "a,b,c", "0,8,16", "8,0,16", "-1,8,16", "8,8,0", "8,8,20",
                                  "8,8,8", ""])
def test_parse_dense_shape_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        gemm.parse_dense_shape(text)


def test_parse_grouped_shape():
    assert gemm.parse_grouped_shape("8,2048,7168,4096") == (8, 2048, 7168, 4096)
    for bad in ["8,2048,7168", "0,2048,7168,4096", "8,2048,7168,100", "8,2048,7168,0"]:
        with pytest.raises(argparse.ArgumentTypeError):
            gemm.parse_grouped_shape(bad)


def test_parser_defaults_and_repeated_options():
    args = cli.build_parser().parse_args([])
    assert args.impl == ["ours", "deepgemm", "cublas", "bf16"]
    assert args.reps == timing.DEFAULT_REPS == 30 and args.shape is None and args.json is None
    args = cli.build_parser().parse_args(["--shape", "64,32,128", "--shape", "1x2x16", "--impl", "cublas,ours,ours",
                                          "--reps", "7", "--json", "x.json"])
    assert args.shape == [(64, 32, 128), (1, 2, 16)]
    assert args.impl == ["cublas", "ours"]  # order kept, duplicates dropped
    assert args.reps == 7 and args.json == "x.json"


@pytest.mark.parametrize("argv", [["--impl", "ours,cutlass"], ["--impl", ""], ["--reps", "0"], ["--warmup", "-1"],
                                  ["--shape", "64,32"], ["--grouped-shape", "4,64,32"]])
def test_parser_rejects_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def _plan(argv):
    return cli.plan_from_args(cli.build_parser().parse_args(argv))


def test_plan_selects_benchmarks():
    p = _plan([])
    assert p["gemm"].dense == list(shapes.DENSE_SEED_SHAPES) and p["gemm"].grouped == []
    assert not p["gemm"].skewed and not p["quant"].wanted
    p = _plan(["--grouped"])
    assert p["gemm"].dense == [] and p["gemm"].grouped == list(shapes.GROUPED_SEED_SHAPES) and p["gemm"].skewed
    p = _plan(["--grouped", "--dense"])
    assert p["gemm"].dense == list(shapes.DENSE_SEED_SHAPES) and p["gemm"].grouped == list(shapes.GROUPED_SEED_SHAPES)
    p = _plan(["--grouped-shape", "2,64,32,128"])
    assert p["gemm"].dense == [] and p["gemm"].grouped == [(2, 64, 32, 128)] and not p["gemm"].skewed
    p = _plan(["--shape", "64,32,128", "--grouped"])
    assert p["gemm"].dense == [(64, 32, 128)] and p["gemm"].grouped == list(shapes.GROUPED_SEED_SHAPES)
    p = _plan(["--quant"])
    assert p["gemm"].dense == [] and p["gemm"].grouped == [] and not p["gemm"].wanted and p["quant"].wanted


def test_plan_of_the_short_k_set():
    p = _plan(["--short-k"])
    assert p["gemm"].dense == list(shapes.SHORT_K_DENSE_SHAPES) and not p["gemm"].skewed
    assert p["gemm"].grouped == list(shapes.SHORT_K_GROUPED_SHAPES) and not p["quant"].wanted
    # Added to what else is asked for, each shape once.
    p = _plan(["--short-k", "--shape", "64,32,128", "--shape", "4096,4096,1024", "--grouped"])
    assert p["gemm"].dense == [(64, 32, 128), (4096, 4096, 1024), (4096, 4096, 2048)]
    assert p["gemm"].grouped == list(shapes.GROUPED_SEED_SHAPES) + list(shapes.SHORT_K_GROUPED_SHAPES)
    assert p["gemm"].skewed


def test_module_entry_point_parses_bench_subcommand(capsys):
    from wgrad import __main__ as entry

    args = entry.build_parser().parse_args(["bench", "--shape", "64,32,128", "--impl", "ours"])
    assert args.handler is cli.run_cli and args.shape == [(64, 32, 128)] and args.impl == ["ours"]
    with pytest.raises(SystemExit) as exc:
        entry.build_parser().parse_args([])
    assert exc.value.code == 2


def test_help_cites_only_documents_the_repository_holds(capsys):
    from wgrad import __main__ as entry

    with pytest.raises(SystemExit):
        entry.build_parser().parse_args(["bench", "--help"])
    text = capsys.readouterr().out
    assert "DESIGN" not in text and "docs/performance.md" in text
    assert "--quant" in text and "--grouped-shape" in text


# ------------------------------------------------------------------ exit paths -----------------------


def test_no_gpu_prints_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none\n"


def test_non_sm90_gpu_is_named(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    assert cli.main(["--grouped"]) == 2
    err = capsys.readouterr().err
    assert err == "wgrad bench: needs an SM90 GPU (H100/H200/H800); found: NVIDIA A100-SXM4-80GB (sm_80)\n"


def test_broken_driver_counts_as_no_gpu(monkeypatch):
    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert cli.sm90_problem().endswith("found: none (RuntimeError: CUDA driver initialization failed)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path of a machine without a GPU")
@pytest.mark.parametrize("module", [["-m", "wgrad", "bench"], ["-m", "wgrad.bench"]])
def test_module_command_without_gpu_has_no_traceback(module):
    proc = subprocess.run([sys.executable, *module], capture_output=True, text=True, env=package_env(), cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none"]
    assert proc.stdout == ""


def _row(shape, impl, tflops=None, status="ok", message=""):
    return {"kind": "dense", "shape": shape, "dims": [], "impl": impl, "form": f"{impl}-form", "status": status,
            "message": message, "rel_err": 1.25e-4 if tflops else None, "ms": 1.0 if tflops else None,
            "tflops": tflops, "gbps": 3000.0 if tflops else None}


RATES = bound.MachineRates(1300.0, 3000.0, (8192, 8192, 8192), 1 << 30)


def _fake_sm90(monkeypatch, dense_rows=(), grouped_rows=()):
    monkeypatch.setattr(cli, "sm90_problem", lambda: None)
    monkeypatch.setattr(gemm, "process_rates", lambda **k: RATES)
    monkeypatch.setattr(gemm, "run_dense", lambda *a, rows, **k: rows.extend(dict(r) for r in dense_rows))
    monkeypatch.setattr(gemm, "run_grouped", lambda *a, rows, **k: rows.extend(dict(r) for r in grouped_rows))


def test_cli_report_json_and_exit_status(monkeypatch, capsys, tmp_path):
    rows = [_row("64x32x128", "ours", 2.0), _row("64x32x128", "cublas", 1.0),
            _row("64x32x128", "bf16", status="n/a", message="RuntimeError: no bf16")]
    _fake_sm90(monkeypatch, dense_rows=rows)
    path = tmp_path / "bench.json"
    assert cli.main(["--shape", "64,32,128", "--json", str(path)]) == 0  # n/a is not a failure
    out = capsys.readouterr().out
    assert "dense (out += a @ b^T, fp32 out)" in out and "geometric means, dense" in out and "not ok:" in out
    assert ("machine rates, measured in this process: tensor-wise FP8 1300 TFLOPS (8192x8192x8192); "
            "copy 3000 GB/s") in out
    doc = json.loads(path.read_text())
    assert list(doc) == ["torch", "cuda", "device", "sm_count", "wgrad", "reps", "warmup", "l2_flush_bytes",
                         "bytes_note", "fp8_max_rel_err", "bf16_max_rel_err", "machine_rates", "dense", "grouped",
                         "geomean", "quant", "quant_unavailable", "layers", "m_grouped", "m_grouped_machine_rates",
                         "stopped_by", "failed"]
    assert doc["machine_rates"]["fp8_tflops"] == 1300.0 and doc["machine_rates"]["copy_gbps"] == 3000.0
    assert doc["torch"] == torch.__version__ and "device" in doc and doc["failed"] == 0
    assert [r["impl"] for r in doc["dense"]] == ["ours", "cublas", "bf16"] and doc["grouped"] == []
    assert doc["geomean"]["dense"]["ours"]["tflops"] == pytest.approx(2.0)
    assert doc["quant"] is None and doc["quant_unavailable"] is None and doc["layers"] == []
    assert doc["m_grouped"] == [] and doc["m_grouped_machine_rates"] is None

    _fake_sm90(monkeypatch, dense_rows=[_row("64x32x128", "ours", status="FAIL", message="rel. err 3e-3 > 2e-4")])
    assert cli.main(["--shape", "64,32,128"]) == 1
    assert "FAIL: 64x32x128 ours: rel. err 3e-3 > 2e-4" in capsys.readouterr().err


def test_cli_stops_cleanly_on_a_cuda_fault(monkeypatch, capsys):
    _fake_sm90(monkeypatch)

    def faulting(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gemm, "run_dense", faulting)
    assert cli.main([]) == 1
    assert "CUDA fault, run stopped" in capsys.readouterr().err


def test_cli_reports_a_bench_bug_without_losing_the_table(monkeypatch, capsys, tmp_path):
    _fake_sm90(monkeypatch)

    def partial(*a, rows, **k):
        rows.append(_row("64x32x128", "ours", 2.0))
        raise KeyError("oops")

    monkeypatch.setattr(gemm, "run_dense", partial)
    path = tmp_path / "b.json"
    assert cli.main(["--json", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "64x32x128" in out and "Traceback" in err and "benchmark error, run stopped: KeyError" in err
    assert json.loads(path.read_text())["stopped_by"].startswith("benchmark error")


# ------------------------------------------------------------------ the quantization suite -----------


def test_quant_that_cannot_run_is_reported_not_raised(monkeypatch, capsys):
    def no_gpu(**kwargs):
        raise RuntimeError("run_quant_bench needs a CUDA GPU")

    monkeypatch.setattr(quant, "run_quant_bench", no_gpu)
    rows, why = quant.run_quant(3, lambda msg: None)
    assert rows is None and why == "run_quant_bench failed: RuntimeError: run_quant_bench needs a CUDA GPU"
    _fake_sm90(monkeypatch)
    assert cli.main(["--quant"]) == 1
    assert "quantization: not run: run_quant_bench failed" in capsys.readouterr().out


def test_quant_fault_stops_the_run(monkeypatch):
    def fault(**kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(quant, "run_quant_bench", fault)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        quant.run_quant(3, lambda msg: None)


def test_quant_rows_are_passed_through(monkeypatch, capsys, tmp_path):
    calls = {}

    def run_quant_bench(reps, progress=None):
        calls["reps"] = reps
        # The row format of run_quant_bench: `valid` says whether its check passed.
        return [{"kernel": "rowwise", "shape": (4096, 7168), "GB/s": 4100.5, "valid": True},
                {"kernel": "transposed", "shape": (4096, 7168), "GB/s": 3000.0, "valid": False}]

    monkeypatch.setattr(quant, "run_quant_bench", run_quant_bench)
    rows, why = quant.run_quant(9, lambda msg: None)
    assert why == "" and calls["reps"] == 9 and [r["kernel"] for r in rows] == ["rowwise", "transposed"]
    assert [quant.quant_row_failed(r) for r in rows] == [False, True]
    assert quant.quant_row_failed({"status": "FAIL: too slow"}) and not quant.quant_row_failed({"status": "ok"})
    _fake_sm90(monkeypatch)
    path = tmp_path / "q.json"
    assert cli.main(["--quant", "--json", str(path)]) == 1  # its FAIL row fails the run
    out = capsys.readouterr().out
    assert "rowwise" in out and "4100" in out and out.index("kernel") < out.index("rowwise")
    doc = json.loads(path.read_text())
    assert doc["failed"] == 1 and [r["kernel"] for r in doc["quant"]] == ["rowwise", "transposed"]
    assert doc["dense"] == [] and doc["grouped"] == [] and doc["machine_rates"] is None  # no GEMM, no rates


# ------------------------------------------------------------------ the suite registry ---------------


def test_a_new_suite_plugs_in_through_the_registry(monkeypatch, capsys, tmp_path):
    class ToyRun(SuiteRun):
        def __init__(self, args, by_default):
            self.wanted = args.toy
            self.rows = []

        def run(self, args, progress):
            self.rows.append({"layer": "toy", "ms": 1.5, "reps": args.reps})

        def report(self):
            return ["", "toy suite", str(self.rows)] if self.wanted else []

        def json(self):
            return {"toy": self.rows}

    def add_arguments(parser):
        parser.add_argument("--toy", action="store_true", help="a suite of the test")

    toy = Suite("toy", add_arguments, lambda args: args.toy, ToyRun)
    monkeypatch.setattr(cli, "SUITES", cli.SUITES + [toy])
    _fake_sm90(monkeypatch, dense_rows=[_row("64x32x128", "ours", 2.0)])
    plan = _plan(["--toy"])
    assert plan["toy"].wanted and not plan["gemm"].wanted  # naming a suite drops the default dense seeds
    path = tmp_path / "t.json"
    assert cli.main(["--toy", "--reps", "3", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("toy suite") and "'layer': 'toy'" in out
    doc = json.loads(path.read_text())
    assert doc["toy"] == [{"layer": "toy", "ms": 1.5, "reps": 3}] and doc["dense"] == [] and doc["failed"] == 0
