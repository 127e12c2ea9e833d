"""CPU tests of the benchmark CLI (`python -m wgrad bench`): argument parsing, the shape and anchor
registry, the FLOP/byte math, the accuracy gate, table and JSON output, the exit paths, and an end-to-end
run of the runner on the CPU (where our ops run their reference kernels and cuBLAS is unavailable)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

try:
    import wgrad  # noqa: F401  (the built package: op schemas and CPU kernels)

    HAVE_EXTENSION = True
except ImportError:
    # Without python/wgrad/_C*.so the pure-Python modules (bench, api, reference, scales) still load when
    # the package's __init__ (which loads _C) is skipped; tests that call our ops are then skipped.
    for name in [m for m in sys.modules if m == "wgrad" or m.startswith("wgrad.")]:
        del sys.modules[name]
    _pkg = types.ModuleType("wgrad")
    _pkg.__path__ = [str(ROOT / "python" / "wgrad")]
    sys.modules["wgrad"] = _pkg
    HAVE_EXTENSION = False

from wgrad import bench  # noqa: E402
from wgrad.scales import is_mn_major  # noqa: E402

needs_extension = pytest.mark.skipif(not HAVE_EXTENSION, reason="needs the built extension (scripts/build.sh)")
CPU = torch.device("cpu")


# ------------------------------------------------------------------ registry and anchors -------------


def test_seed_shapes_and_anchor_tables_agree():
    assert len(bench.DENSE_SEED_SHAPES) == 12 and len(set(bench.DENSE_SEED_SHAPES)) == 12
    assert set(bench.DENSE_ANCHORS_TFLOPS) == set(bench.DENSE_SEED_SHAPES)
    assert all(set(v) == {"deepgemm", "cutlass", "cublas", "bf16"} for v in bench.DENSE_ANCHORS_TFLOPS.values())
    assert len(bench.GROUPED_SEED_SHAPES) == 6 and set(bench.GROUPED_ANCHORS_TFLOPS) == set(bench.GROUPED_SEED_SHAPES)
    # K (tokens) of the seeds is 4096 or 8192; the grouped ones share the DeepSeek-V3 (M, N) pairs.
    assert {k for _, _, k in bench.DENSE_SEED_SHAPES} == {4096, 8192}
    assert {(m, n) for _, m, n, _ in bench.GROUPED_SEED_SHAPES} == {(7168, 4096), (2048, 7168)}


def test_anchor_numbers_reproduce_design_geomeans():
    # DESIGN.md section 7 states the geomeans over the twelve shapes: a transcription error shows here.
    expected = {"deepgemm": 986, "cutlass": 841, "cublas": 738, "bf16": 690}
    for key, value in expected.items():
        gm = bench.geomean(v[key] for v in bench.DENSE_ANCHORS_TFLOPS.values())
        assert abs(gm - value) < 0.6, (key, gm)
    assert [bench.GROUPED_ANCHORS_TFLOPS[s]["deepgemm"] for s in bench.GROUPED_SEED_SHAPES] == [
        975, 949, 969, 1033, 980, 951]


# ------------------------------------------------------------------ parsing --------------------------


@pytest.mark.parametrize("text,expected", [
    ("7168,2112,4096", (7168, 2112, 4096)),
    ("7168x2112x4096", (7168, 2112, 4096)),
    ("1,1,16", (1, 1, 16)),
    ("33,127,144", (33, 127, 144)),
])
def test_parse_dense_shape_accepts(text, expected):
    assert bench.parse_dense_shape(text) == expected


@pytest.mark.parametrize("text", ["1,2", "1,2,3,4", "a,b,c", "0,8,16", "8,0,16", "-1,8,16", "8,8,0", "8,8,20",
                                  "8,8,8", ""])
def test_parse_dense_shape_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_dense_shape(text)


def test_parse_grouped_shape():
    assert bench.parse_grouped_shape("8,2048,7168,4096") == (8, 2048, 7168, 4096)
    for bad in ["8,2048,7168", "0,2048,7168,4096", "8,2048,7168,100", "8,2048,7168,0"]:
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_grouped_shape(bad)


def test_parser_defaults_and_repeated_options():
    args = bench.build_parser().parse_args([])
    assert args.impl == ["ours", "cublas", "bf16"]
    assert args.reps == bench.DEFAULT_REPS == 30 and args.shape is None and args.json is None
    args = bench.build_parser().parse_args(["--shape", "64,32,128", "--shape", "1x2x16", "--impl", "cublas,ours,ours",
                                            "--reps", "7", "--json", "x.json"])
    assert args.shape == [(64, 32, 128), (1, 2, 16)]
    assert args.impl == ["cublas", "ours"]  # order kept, duplicates dropped
    assert args.reps == 7 and args.json == "x.json"


@pytest.mark.parametrize("argv", [["--impl", "ours,cutlass"], ["--impl", ""], ["--reps", "0"], ["--warmup", "-1"],
                                  ["--shape", "64,32"], ["--grouped-shape", "4,64,32"]])
def test_parser_rejects_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def _plan(argv):
    return bench.plan_from_args(bench.build_parser().parse_args(argv))


def test_plan_selects_benchmarks():
    p = _plan([])
    assert p.dense == list(bench.DENSE_SEED_SHAPES) and p.grouped == [] and not p.skewed and not p.quant
    p = _plan(["--grouped"])
    assert p.dense == [] and p.grouped == list(bench.GROUPED_SEED_SHAPES) and p.skewed
    p = _plan(["--grouped", "--dense"])
    assert p.dense == list(bench.DENSE_SEED_SHAPES) and p.grouped == list(bench.GROUPED_SEED_SHAPES)
    p = _plan(["--grouped-shape", "2,64,32,128"])
    assert p.dense == [] and p.grouped == [(2, 64, 32, 128)] and not p.skewed
    p = _plan(["--shape", "64,32,128", "--grouped"])
    assert p.dense == [(64, 32, 128)] and p.grouped == list(bench.GROUPED_SEED_SHAPES)
    p = _plan(["--quant"])
    assert p.dense == [] and p.grouped == [] and p.quant


def test_module_entry_point_parses_bench_subcommand(capsys):
    from wgrad import __main__ as entry

    args = entry.build_parser().parse_args(["bench", "--shape", "64,32,128", "--impl", "ours"])
    assert args.handler is bench.run_cli and args.shape == [(64, 32, 128)] and args.impl == ["ours"]
    with pytest.raises(SystemExit) as exc:
        entry.build_parser().parse_args([])
    assert exc.value.code == 2


# ------------------------------------------------------------------ math -----------------------------


def test_flops_tflops_and_bytes():
    assert bench.dense_flops(7168, 2112, 4096) == 2 * 7168 * 2112 * 4096
    assert bench.tflops(2 * 4096 ** 3, 1.0) == pytest.approx(137.438953472)
    assert bench.gbps(3e9, 2.0) == pytest.approx(1500.0)
    # fp8 a [100, 272] + b [60, 272], 3 scale blocks per row (272 = 2 * 128 + 16), out read and written.
    assert bench.fp8_bytes(100, 60, 272) == 160 * 272 + 4 * 160 * 3 + 8 * 100 * 60
    assert bench.bf16_bytes(100, 60, 272) == 2 * 160 * 272 + 8 * 100 * 60
    # A group with no tokens leaves out[g] alone: it moves nothing.
    assert bench.grouped_bytes(100, 60, [272, 0, 16]) == bench.fp8_bytes(100, 60, 272) + bench.fp8_bytes(100, 60, 16)


def test_geomean():
    assert bench.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert bench.geomean([918, 918]) == pytest.approx(918)
    assert bench.geomean([]) is None
    assert bench.geomean([1.0, 0.0]) is None and bench.geomean([1.0, float("nan")]) is None


def test_zipf_split_of_the_skewed_case():
    ks = bench.skewed_sizes()
    assert len(ks) == 8 and sum(ks) == 32768
    assert all(k % 16 == 0 and k > 0 for k in ks)
    assert ks == sorted(ks, reverse=True)
    assert 7.0 < ks[0] / ks[-1] < 9.0  # 1/rank weights: the first expert gets ~8x the last
    assert abs(ks[1] / ks[0] - 0.5) < 0.01
    assert bench.zipf_split(1024, 4, exponent=0.0) == [256, 256, 256, 256]
    with pytest.raises(ValueError):
        bench.zipf_split(1000, 4)


def test_first_line_and_sticky_cuda_errors():
    long = RuntimeError("Could not run 'aten::mm.dtype' with arguments from the 'CPU' backend.\n" + "x" * 5000)
    expected = "RuntimeError: Could not run 'aten::mm.dtype' with arguments from the 'CPU' backend."
    assert bench.first_line(long) == expected
    assert len(bench.first_line(RuntimeError("y" * 1000))) == 160
    assert bench.is_cuda_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert bench.is_cuda_fault(RuntimeError("CUDA error: unspecified launch failure"))
    # torch's cuBLAS wrapper says "CUDA error" for a plain unsupported configuration: not sticky.
    assert not bench.is_cuda_fault(RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul"))
    assert not bench.is_cuda_fault(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))


# ------------------------------------------------------------------ problems and accuracy ------------


def test_dense_problem_operands():
    p = bench.make_dense_problem(40, 24, 272, CPU, seed=3)
    assert p.a.dtype == p.b.dtype == torch.float8_e4m3fn and p.a.shape == (40, 272) and p.b.shape == (24, 272)
    assert p.sa.shape == (40, 3) and p.sb.shape == (24, 3) and is_mn_major(p.sa) and is_mn_major(p.sb)
    for s in (p.sa, p.sb):  # 2**U(-8, 2): positive, spanning orders of magnitude
        assert s.min() >= 2.0 ** -8 and s.max() <= 4.0 and s.max() / s.min() > 100
    assert (p.a.float() != 0).float().mean() > 0.9
    expected = (p.a.double() * p.sa.double().repeat_interleave(128, 1)[:, :272]) @ (
        p.b.double() * p.sb.double().repeat_interleave(128, 1)[:, :272]).t()
    torch.testing.assert_close(p.ref, expected, rtol=1e-12, atol=0)
    rms_ratio = p.out_init.pow(2).mean().sqrt() / p.ref.pow(2).mean().sqrt()
    assert 0.05 < float(rms_ratio) < 0.2
    same = bench.make_dense_problem(40, 24, 272, CPU, seed=3)
    assert torch.equal(same.a.view(torch.uint8), p.a.view(torch.uint8)) and torch.equal(same.sa, p.sa)


def test_grouped_problem_layouts_hold_the_same_values():
    ks = [144, 0, 256, 16]
    p = bench.make_grouped_problem(24, 40, ks, CPU, seed=1)
    assert p.a_packed.numel() == 24 * sum(ks) and p.b_packed.numel() == 40 * sum(ks)
    kbs = [bench.num_k_blocks(k) for k in ks]
    assert p.sa_packed.shape == (24, sum(kbs)) and is_mn_major(p.sa_packed)
    assert p.sa_contig.shape == (24, bench.k_block_capacity(sum(ks), len(ks))) and is_mn_major(p.sa_contig)
    assert p.sizes.dtype == torch.int32 and p.sizes.tolist() == ks
    off = 0
    for g, k in enumerate(ks):
        a_g, sa_g, b_g, sb_g = p.group_operands(g)
        assert torch.equal(a_g.view(torch.uint8), p.a_contig[:, off:off + k].view(torch.uint8))
        assert torch.equal(b_g.view(torch.uint8), p.b_contig[:, off:off + k].view(torch.uint8))
        assert torch.equal(sa_g, p.sa_contig[:, sum(kbs[:g]):sum(kbs[:g + 1])])
        assert a_g.is_contiguous() and is_mn_major(sa_g)
        if k:
            from wgrad import reference

            torch.testing.assert_close(p.refs[g], reference.wgrad_gemm_reference(a_g, sa_g, b_g, sb_g))
        else:
            assert torch.count_nonzero(p.refs[g]) == 0
        off += k
    packed_refs = __import__("wgrad.reference").reference.k_grouped_reference(
        p.a_packed, p.sa_packed, p.b_packed, p.sb_packed, ks, 24, 40)
    for r_packed, r in zip(packed_refs, p.refs):
        torch.testing.assert_close(r_packed, r)


def test_relative_error_measures_what_one_call_accumulated():
    ref = torch.randn(30, 20, dtype=torch.float64)
    before = torch.randn(30, 20)
    after = before + ref.float()
    assert bench.relative_error(after, before, ref) < 1e-6
    assert bench.relative_error(after + 0.01 * ref.float(), before, ref) == pytest.approx(0.01, rel=1e-3)
    # Overwriting out instead of accumulating is an error as large as the initial out.
    assert bench.relative_error(ref.float(), before, ref) > 0.5
    errs = [bench.relative_error(after, before, ref), 0.25]
    grouped_after = torch.stack([after, before + 1.25 * ref.float()])
    assert bench.grouped_relative_error(grouped_after, torch.stack([before, before]), [ref, ref]) == pytest.approx(
        max(errs), rel=1e-4)


def _cand(form, fn):
    """A candidate that sets out to fn(out) and whose `check` is the identity on out's first element."""
    def build():
        out = torch.zeros(1)

        def run():
            out.copy_(fn(out))
        return run, out
    return bench.Candidate(form, build)


def _check(after, before):
    return float(after[0] - before[0])  # these fake candidates write their "error" into out


def _raise(out):
    raise RuntimeError("Invalid scaling configuration.\nmore text")


def test_select_candidate_first_correct_wins_and_records_the_rest():
    cands = [_cand("raises", _raise), _cand("wrong", lambda o: o + 1e-3), _cand("good", lambda o: o + 1e-5),
             _cand("never tried", lambda o: o)]
    sel = bench.select_candidate(cands, _check, 2e-4, required=False, device=CPU)
    assert sel.status == "ok" and sel.form == "good" and sel.rel_err == pytest.approx(1e-5)
    assert [t.split(":")[0] for t in sel.tried] == ["raises", "wrong", "good"]
    assert "Invalid scaling configuration." in sel.tried[0] and "more text" not in sel.tried[0]


def test_select_candidate_outcomes_without_a_correct_form():
    only_errors = [_cand("a", _raise), _cand("b", _raise)]
    sel = bench.select_candidate(only_errors, _check, 2e-4, required=False, device=CPU)
    assert sel.status == "n/a" and sel.run is None
    assert sel.message == "RuntimeError: Invalid scaling configuration."
    assert sel.tried == ["a: error: RuntimeError: Invalid scaling configuration.",
                         "b: error: RuntimeError: Invalid scaling configuration."]
    assert bench.select_candidate(only_errors, _check, 2e-4, required=True, device=CPU).status == "FAIL"
    wrong = [_cand("a", _raise), _cand("w1", lambda o: o + 5e-3), _cand("w2", lambda o: o + 1e-3)]
    sel = bench.select_candidate(wrong, _check, 2e-4, required=False, device=CPU)
    assert sel.status == "FAIL" and sel.form == "w2" and sel.rel_err == pytest.approx(1e-3)
    nan = [_cand("nan", lambda o: o + float("nan"))]
    assert bench.select_candidate(nan, _check, 2e-4, required=False, device=CPU).status == "FAIL"


def test_select_candidate_can_pick_the_fastest_correct_form():
    cands = [_cand("slow", lambda o: o + 1e-6), _cand("wrong", lambda o: o + 1.0), _cand("fast", lambda o: o + 2e-6)]
    speed = {}

    def time_fn(run):
        speed.setdefault("n", 0)
        speed["n"] += 1
        return 5.0 if speed["n"] == 1 else 1.0  # the first correct form is timed first

    sel = bench.select_candidate(cands, _check, 2e-4, required=False, device=CPU, time_fn=time_fn)
    assert sel.status == "ok" and sel.form == "fast" and speed["n"] == 2


def test_select_candidate_reraises_a_sticky_cuda_fault():
    def fault(out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        bench.select_candidate([_cand("f", fault), _cand("g", lambda o: o)], _check, 2e-4, False, CPU)


def test_an_impl_that_overwrites_out_fails_the_check():
    p = bench.make_dense_problem(32, 16, 256, CPU, seed=0)

    def build():
        out = p.out_init.clone()
        return (lambda: out.copy_(p.ref.float())), out

    check = lambda after, before: bench.relative_error(after, before, p.ref)  # noqa: E731
    sel = bench.select_candidate([bench.Candidate("overwrite", build)], check, bench.FP8_REL_ERR_MAX, True, CPU)
    assert sel.status == "FAIL" and sel.rel_err > 0.05


def test_time_calls_flushes_before_every_call_and_counts():
    flush = torch.ones(64, dtype=torch.uint8)
    seen = []

    def fn():
        seen.append(int(flush.sum()))
        flush.fill_(1)

    times = bench.time_calls(fn, reps=4, warmup=2, flush=flush, device=CPU)
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert seen == [64, 64, 0, 0, 0, 0]  # the 2 warm-up calls are not flushed; every timed one is


# ------------------------------------------------------------------ cuBLAS argument layout -----------


@pytest.mark.parametrize("m,n,k", [(256, 512, 1024), (100, 48, 384), (64, 32, 128)])
def test_cublas_scales_match_torch_scaled_mm_layout(m, n, k):
    kb = bench.num_k_blocks(k)
    gen = torch.Generator().manual_seed(0)
    sa = bench.random_scales(m, kb, CPU, gen)
    sb = bench.random_scales(n, kb, CPU, gen)
    scale_a, scale_b = bench.cublas_scales_1x128(sa, sb)
    assert torch.equal(scale_a, sa) and torch.equal(scale_b, sb.t())
    assert scale_a.shape == (m, kb) and scale_b.shape == (kb, n)
    if kb > 1:
        assert scale_a.stride() == (1, m)  # exactly M, not our 4-aligned leading dimension
    assert scale_b.is_contiguous()
    # torch's own (meta) checks of _scaled_mm accept this layout as 1x128 x 1x128 (or row-wise if kb == 1).
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="meta")
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta")
    out = torch._scaled_mm(a, b.t(), scale_a=scale_a.to("meta"), scale_b=scale_b.to("meta"), out_dtype=torch.float32)
    assert out.shape == (m, n) and out.dtype == torch.float32


def test_cublas_call_forms_are_tried_in_order():
    forms = [form for form, _ in bench.cublas_product_fns(*([None] * 4))]
    assert forms[0].startswith("torch._scaled_mm") and forms[1].startswith("F.scaled_mm")


# ------------------------------------------------------------------ tables and summaries -------------


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
    text = bench.format_table(["name", "ms"], [["a", "1.5"], ["longer", "12.25"]], [False, True])
    assert text.splitlines() == ["name       ms", "------  -----", "a         1.5", "longer  12.25"]


def test_fill_ratios_and_dense_table():
    rows = [_row("7168x2112x4096", "ours", 1100.0, anchor=("DeepGEMM", 918.0)),
            _row("7168x2112x4096", "cublas", 700.0, anchor=("cuBLAS", 656.0)),
            _row("7168x2112x4096", "bf16", status="n/a", message="RuntimeError: " + "z" * 100)]
    bench.fill_ratios(rows, "cublas", "vs_cublas")
    assert rows[0]["vs_cublas"] == pytest.approx(1100 / 700) and "vs_cublas" not in rows[1]
    assert "vs_cublas" not in rows[2]
    lines = bench.dense_table(rows).splitlines()
    assert lines[0].split()[:5] == ["shape", "MxNxK", "impl", "ms", "TFLOPS"]
    ours = lines[2].split()
    assert ours[:5] == ["7168x2112x4096", "ours", "1.000", "1100.0", "3000"]
    assert "1.57x" in ours and "918" in ours and "DeepGEMM" in ours and "1.20x" in ours and "1.25e-04" in ours
    assert lines[4].rstrip().endswith("...") and "n/a: RuntimeError: zzz" in lines[4]


def test_grouped_ratios_vs_dense_and_loop():
    rows = [_row("4x7168x4096x4096", "ours-packed", 990.0, kind="grouped"),
            _row("4x7168x4096x4096", "ours-dense", 1000.0, kind="grouped"),
            _row("4x7168x4096x4096", "cublas-loop", 660.0, kind="grouped")]
    bench.fill_ratios(rows, "cublas-loop", "vs_cublas", dense_ref="ours-dense")
    assert rows[0]["vs_dense"] == pytest.approx(0.99) and rows[0]["vs_cublas"] == pytest.approx(1.5)
    assert "vs_dense" not in rows[1] and "vs_dense" not in rows[2]
    table = bench.grouped_table(rows)
    assert "0.99x" in table and "1.50x" in table


def test_summarize_uses_only_timed_shapes():
    rows = [_row("s1", "ours", 1000.0, anchor=("DeepGEMM", 900.0)),
            _row("s2", "ours", 1210.0, anchor=("DeepGEMM", 1000.0)),
            _row("s3", "ours", status="FAIL", message="rel. err", anchor=("DeepGEMM", 5.0)),
            _row("s1", "cublas", 500.0), _row("s2", "cublas", 605.0)]
    bench.fill_ratios(rows, "cublas", "vs_cublas")
    s = bench.summarize(rows, ("dense",))
    assert s["ours"]["shapes"] == 2 and s["ours"]["tflops"] == pytest.approx(math.sqrt(1000 * 1210))
    assert s["ours"]["anchor_tflops"] == pytest.approx(math.sqrt(900 * 1000))  # s3's anchor left out
    assert s["ours"]["vs_cublas"] == pytest.approx(2.0) and s["cublas"]["anchor_tflops"] is None
    text = "\n".join(bench.summary_lines(s, "geometric means"))
    assert "DeepGEMM" in text and "vs cuBLAS 2.00x" in text


def test_problem_lines_and_json_safe():
    rows = [_row("s1", "ours", 1.0), _row("s1", "cublas", status="n/a", message="ValueError: bad layout",
                                          tried=["v1: error: ValueError: bad layout", "v2: error: no F.scaled_mm"])]
    lines = bench.problem_lines(rows)
    assert lines[0] == "not ok:" and "s1 cublas: n/a: ValueError: bad layout" in lines[1] and len(lines) == 4
    assert bench.problem_lines(rows[:1]) == []
    assert bench.json_safe({"a": float("nan"), "b": (1, 2.5), "c": torch.float32}) == {
        "a": None, "b": [1, 2.5], "c": "torch.float32"}


# ------------------------------------------------------------------ exit paths -----------------------


def test_no_gpu_prints_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none\n"


def test_non_sm90_gpu_is_named(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    assert bench.main(["--grouped"]) == 2
    err = capsys.readouterr().err
    assert err == "wgrad bench: needs an SM90 GPU (H100/H200/H800); found: NVIDIA A100-SXM4-80GB (sm_80)\n"


def test_broken_driver_counts_as_no_gpu(monkeypatch):
    def broken():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert bench.sm90_problem().endswith("found: none (RuntimeError: CUDA driver initialization failed)")


@needs_extension
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path of a machine without a GPU")
def test_module_command_without_gpu_has_no_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "wgrad", "bench"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["wgrad bench: needs an SM90 GPU (H100/H200/H800); found: none"]
    assert proc.stdout == ""


def _fake_sm90(monkeypatch, dense_rows=(), grouped_rows=()):
    monkeypatch.setattr(bench, "sm90_problem", lambda: None)
    monkeypatch.setattr(bench, "run_dense", lambda *a, rows, **k: rows.extend(dict(r) for r in dense_rows))
    monkeypatch.setattr(bench, "run_grouped", lambda *a, rows, **k: rows.extend(dict(r) for r in grouped_rows))


def test_cli_report_json_and_exit_status(monkeypatch, capsys, tmp_path):
    rows = [_row("64x32x128", "ours", 2.0, anchor=("DeepGEMM", 918.0)), _row("64x32x128", "cublas", 1.0),
            _row("64x32x128", "bf16", status="n/a", message="RuntimeError: no bf16")]
    _fake_sm90(monkeypatch, dense_rows=rows)
    path = tmp_path / "bench.json"
    assert bench.main(["--shape", "64,32,128", "--json", str(path)]) == 0  # n/a is not a failure
    out = capsys.readouterr().out
    assert "dense (out += a @ b^T, fp32 out)" in out and "geometric means, dense" in out and "not ok:" in out
    doc = json.loads(path.read_text())
    assert doc["torch"] == torch.__version__ and "device" in doc and doc["failed"] == 0
    assert [r["impl"] for r in doc["dense"]] == ["ours", "cublas", "bf16"] and doc["grouped"] == []
    assert doc["geomean"]["dense"]["ours"]["tflops"] == pytest.approx(2.0)

    _fake_sm90(monkeypatch, dense_rows=[_row("64x32x128", "ours", status="FAIL", message="rel. err 3e-3 > 2e-4")])
    assert bench.main(["--shape", "64,32,128"]) == 1
    assert "FAIL: 64x32x128 ours: rel. err 3e-3 > 2e-4" in capsys.readouterr().err


def test_cli_stops_cleanly_on_a_cuda_fault(monkeypatch, capsys):
    _fake_sm90(monkeypatch)

    def faulting(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(bench, "run_dense", faulting)
    assert bench.main([]) == 1
    assert "CUDA fault, run stopped" in capsys.readouterr().err


# ------------------------------------------------------------------ the quantization bench -----------


def test_quant_missing_is_reported_not_raised(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wgrad.bench_quant", None)  # import of it raises ModuleNotFoundError
    rows, why = bench.run_quant(3, 1, bench._silent)
    assert rows is None and "wgrad.bench_quant" in why
    _fake_sm90(monkeypatch)
    assert bench.main(["--quant"]) == 1
    assert "quantization: not run: wgrad.bench_quant" in capsys.readouterr().out


def test_quant_rows_are_passed_through(monkeypatch, capsys):
    calls = {}
    fake = types.ModuleType("wgrad.bench_quant")

    def run_quant_bench(reps, progress=None):  # takes no warmup: it must not be passed one
        calls["reps"] = reps
        # The row format of wgrad.bench_quant: `valid` says whether its check passed.
        return [{"kernel": "rowwise", "shape": (4096, 7168), "GB/s": 4100.5, "valid": True},
                {"kernel": "transposed", "shape": (4096, 7168), "GB/s": 3000.0, "valid": False}]

    fake.run_quant_bench = run_quant_bench
    monkeypatch.setitem(sys.modules, "wgrad.bench_quant", fake)
    monkeypatch.setattr(sys.modules["wgrad"], "bench_quant", fake, raising=False)
    rows, why = bench.run_quant(9, 1, bench._silent)
    assert why == "" and calls["reps"] == 9 and [r["kernel"] for r in rows] == ["rowwise", "transposed"]
    assert [bench.quant_row_failed(r) for r in rows] == [False, True]
    assert bench.quant_row_failed({"status": "FAIL: too slow"}) and not bench.quant_row_failed({"status": "ok"})
    _fake_sm90(monkeypatch)
    assert bench.main(["--quant"]) == 1  # its FAIL row fails the run
    out = capsys.readouterr().out
    assert "rowwise" in out and "4100" in out and out.index("kernel") < out.index("rowwise")


# ------------------------------------------------------------------ the runner end to end (CPU) ------


def test_run_dense_on_cpu_baselines():
    rows = bench.run_dense([(40, 32, 272)], impls=["cublas", "bf16"], reps=2, warmup=0, device="cpu",
                           flush_bytes=0)
    by = {r["impl"]: r for r in rows}
    # No block-wise _scaled_mm on a CPU: reported, not raised, and not a failure.
    assert by["cublas"]["status"] == "n/a" and by["cublas"]["ms"] is None and len(by["cublas"]["tried"]) == 2
    bf16 = by["bf16"]
    assert bf16["status"] == "ok" and 1e-4 < bf16["rel_err"] < 1e-2  # bf16 really rounds the operands
    assert bf16["flops"] == 2 * 40 * 32 * 272 and bf16["bytes"] == bench.bf16_bytes(40, 32, 272)
    assert bf16["ms"] > 0 and bf16["tflops"] == pytest.approx(bench.tflops(bf16["flops"], bf16["ms"]))


@needs_extension
def test_run_dense_on_cpu_ours():
    rows = bench.run_dense([(33, 20, 144)], impls=["ours"], reps=2, warmup=1, device="cpu", flush_bytes=1 << 16)
    (row,) = rows
    assert row["status"] == "ok" and row["rel_err"] < 1e-6 and row["form"] == "wgrad.wgrad_gemm_fp8_fp8_fp32_nt"
    assert row["bytes"] == bench.fp8_bytes(33, 20, 144) and row["anchor_tflops"] is None


@needs_extension
def test_run_grouped_on_cpu(monkeypatch):
    monkeypatch.setattr(bench, "SKEW_M", 24)
    monkeypatch.setattr(bench, "SKEW_N", 16)
    monkeypatch.setattr(bench, "SKEW_TOTAL_TOKENS", 1024)
    rows = bench.run_grouped([(3, 40, 32, 144)], impls=["ours", "cublas"], reps=2, warmup=0, device="cpu",
                             flush_bytes=0, skewed=True)
    grouped = [r for r in rows if r["kind"] == "grouped"]
    skewed = [r for r in rows if r["kind"] == "skewed"]
    assert [r["impl"] for r in grouped] == ["ours-packed", "ours-contig", "ours-dense", "ours-dense-loop",
                                            "cublas-loop"]
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-6 for r in grouped[:4])
    assert grouped[4]["status"] == "n/a"
    assert grouped[0]["flops"] == 3 * 2 * 40 * 32 * 144 and grouped[2]["flops"] == 2 * 40 * 32 * 144
    assert "vs_dense" in grouped[0] and "vs_dense" in grouped[3]
    assert [r["impl"] for r in skewed] == ["ours-packed", "ours-contig", "ours-dense-loop", "cublas-loop"]
    sizes = skewed[0]["group_sizes"]
    assert len(sizes) == 8 and sum(sizes) == 1024 and all(k % 16 == 0 for k in sizes)
    assert all(r["status"] == "ok" for r in skewed[:3]) and "vs_dense_loop" in skewed[0]
    skewed_any = [r for r in rows if r["kind"] == "skewed-any"]
    assert [r["impl"] for r in skewed_any] == ["ours-contig"] and skewed_any[0]["status"] == "ok"
    sizes = skewed_any[0]["group_sizes"]
    assert len(sizes) == 8 and sum(sizes) == 1024 and any(k % 16 != 0 for k in sizes)


def _fake_impl(name, run_fn, required=True):
    def setup(problem):
        def build():
            out = torch.zeros(2)
            return (lambda: run_fn(out)), out
        return [bench.Candidate(f"{name}-form", build)]
    return bench.Impl(name, name, f"{name} summary", setup, lambda p: 100, lambda p: 10, required=required)


def test_a_cuda_fault_keeps_the_rows_measured_before_it():
    problem = types.SimpleNamespace(device=CPU)

    def fault(out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    impls = [_fake_impl("good", lambda out: None), _fake_impl("bad", fault), _fake_impl("never", lambda o: None)]
    sink = [{"impl": "earlier shape"}]
    with pytest.raises(RuntimeError, match="illegal memory access"):
        bench._measure_all(impls, problem, lambda impl: (lambda after, before: 0.0), "s", [1], "dense", 2, 0,
                           None, bench._silent, None, sink, group_sizes=[1])
    assert [r["impl"] for r in sink] == ["earlier shape", "good", "bad"]
    assert sink[1]["status"] == "ok" and sink[1]["tflops"] > 0 and sink[1]["group_sizes"] == [1]
    assert sink[2]["status"] == "FAIL" and "illegal memory access" in sink[2]["message"]


def test_an_ordinary_impl_error_is_a_row_not_a_crash():
    problem = types.SimpleNamespace(device=CPU)

    def broken(out):
        raise NotImplementedError("wgrad_gemm_fp8_fp8_fp32_nt: no CUDA kernel yet")

    rows = bench._measure_all([_fake_impl("ours", broken), _fake_impl("cublas", broken, required=False)], problem,
                              lambda impl: (lambda after, before: 0.0), "s", [1], "dense", 2, 0, None,
                              bench._silent, None, [])
    assert [(r["status"], r["message"]) for r in rows] == [
        ("FAIL", "NotImplementedError: wgrad_gemm_fp8_fp8_fp32_nt: no CUDA kernel yet"),
        ("n/a", "NotImplementedError: wgrad_gemm_fp8_fp8_fp32_nt: no CUDA kernel yet")]


def test_cli_reports_a_bench_bug_without_losing_the_table(monkeypatch, capsys, tmp_path):
    _fake_sm90(monkeypatch)

    def partial(*a, rows, **k):
        rows.append(_row("64x32x128", "ours", 2.0))
        raise KeyError("oops")

    monkeypatch.setattr(bench, "run_dense", partial)
    path = tmp_path / "b.json"
    assert bench.main(["--json", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "64x32x128" in out and "Traceback" in err and "benchmark error, run stopped: KeyError" in err
    assert json.loads(path.read_text())["stopped_by"].startswith("benchmark error")
