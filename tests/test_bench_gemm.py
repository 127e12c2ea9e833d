"""CPU tests of the GEMM suites of the benchmark (wgrad.bench.gemm and what it builds on): the shape
registry, the FLOP/byte math, the problems and their references, the accuracy gate, the timer, the cuBLAS
and DeepGEMM argument layouts, and the runner end to end on the CPU (where our ops run their reference
kernels, cuBLAS is unavailable and DeepGEMM is a fake module of the test)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from wgrad import reference
from wgrad.bench import bound, common, gemm, impls, problems, runner, shapes, timing
from wgrad.scales import is_mn_major, k_block_capacity, num_k_blocks

CPU = torch.device("cpu")


# ------------------------------------------------------------------ registry ------------------------


def test_seed_shapes():
    assert len(shapes.DENSE_SEED_SHAPES) == 12 and len(set(shapes.DENSE_SEED_SHAPES)) == 12
    assert len(shapes.GROUPED_SEED_SHAPES) == 6 and len(set(shapes.GROUPED_SEED_SHAPES)) == 6
    # K (tokens) of the seeds is 4096 or 8192; the grouped ones share the DeepSeek-V3 (M, N) pairs.
    assert {k for _, _, k in shapes.DENSE_SEED_SHAPES} == {4096, 8192}
    assert {(m, n) for _, m, n, _ in shapes.GROUPED_SEED_SHAPES} == {(7168, 4096), (2048, 7168)}


def test_short_k_set():
    assert shapes.SHORT_K_DENSE_SHAPES == ((4096, 4096, 1024), (4096, 4096, 2048))
    assert shapes.SHORT_K_GROUPED_SHAPES == ((16, 4096, 7168, 1024), (16, 7168, 2048, 1024),
                                             (64, 4096, 7168, 256), (64, 7168, 2048, 256))
    # One training step's 16384 tokens spread over the experts: K per group a multiple of 128 (every
    # comparator takes it).
    assert all(g * k == 16384 and k % 128 == 0 for g, _, _, k in shapes.SHORT_K_GROUPED_SHAPES)


# ------------------------------------------------------------------ math -----------------------------


def test_flops_tflops_and_bytes():
    assert problems.dense_flops(7168, 2112, 4096) == 2 * 7168 * 2112 * 4096
    assert common.tflops(2 * 4096 ** 3, 1.0) == pytest.approx(137.438953472)
    assert common.gbps(3e9, 2.0) == pytest.approx(1500.0)
    # fp8 a [100, 272] + b [60, 272], 3 scale blocks per row (272 = 2 * 128 + 16), out read and written.
    assert problems.fp8_bytes(100, 60, 272) == 160 * 272 + 4 * 160 * 3 + 8 * 100 * 60
    assert problems.bf16_bytes(100, 60, 272) == 2 * 160 * 272 + 8 * 100 * 60
    # A group with no tokens leaves out[g] alone: it moves nothing.
    assert problems.grouped_bytes(100, 60, [272, 0, 16]) == (problems.fp8_bytes(100, 60, 272)
                                                             + problems.fp8_bytes(100, 60, 16))


def test_geomean():
    assert common.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert common.geomean([918, 918]) == pytest.approx(918)
    assert common.geomean([]) is None
    assert common.geomean([1.0, 0.0]) is None and common.geomean([1.0, float("nan")]) is None


def test_zipf_split_of_the_skewed_case():
    ks = shapes.skewed_sizes()
    assert len(ks) == 8 and sum(ks) == 32768
    assert all(k % 16 == 0 and k > 0 for k in ks)
    assert ks == sorted(ks, reverse=True)
    assert 7.0 < ks[0] / ks[-1] < 9.0  # 1/rank weights: the first expert gets ~8x the last
    assert abs(ks[1] / ks[0] - 0.5) < 0.01
    assert shapes.zipf_split(1024, 4, exponent=0.0) == [256, 256, 256, 256]
    with pytest.raises(ValueError):
        shapes.zipf_split(1000, 4)


def test_first_line_and_sticky_cuda_errors():
    long = RuntimeError("Could not run 'aten::mm.dtype' with arguments from the 'CPU' backend.\n" + "x" * 5000)
    expected = "RuntimeError: Could not run 'aten::mm.dtype' with arguments from the 'CPU' backend."
    assert common.first_line(long) == expected
    assert len(common.first_line(RuntimeError("y" * 1000))) == 160
    assert common.is_cuda_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert common.is_cuda_fault(RuntimeError("CUDA error: unspecified launch failure"))
    # torch's cuBLAS wrapper says "CUDA error" for a plain unsupported configuration: not sticky.
    assert not common.is_cuda_fault(RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul"))
    assert not common.is_cuda_fault(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))


# ------------------------------------------------------------------ problems and accuracy ------------


def test_dense_problem_operands():
    p = problems.make_dense_problem(40, 24, 272, CPU, seed=3)
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
    same = problems.make_dense_problem(40, 24, 272, CPU, seed=3)
    assert torch.equal(same.a.view(torch.uint8), p.a.view(torch.uint8)) and torch.equal(same.sa, p.sa)


@pytest.mark.parametrize("bf16", [False, True])
def test_timing_only_calls_run_the_entry_points(bf16):
    """The sweeps' timing-only calls (problems.dense_wgrad_call / contiguous_wgrad_call): the public entry point
    on fresh operands of the asked shape, a bf16 one returning its written out, an empty group's rows zeros."""
    gen = torch.Generator().manual_seed(0)
    dense = problems.dense_wgrad_call(32, 48, 256, bf16, CPU, gen)()
    grouped = problems.contiguous_wgrad_call(32, 48, [64, 0, 96], bf16, CPU, gen)()
    if not bf16:
        assert dense is None and grouped is None  # the fp32 forms accumulate into their own out
        return
    assert dense.shape == (32, 48) and dense.dtype == torch.bfloat16 and dense.abs().sum() > 0
    assert grouped.shape == (3, 32, 48) and grouped.dtype == torch.bfloat16
    assert grouped[1].abs().sum() == 0 and grouped[0].abs().sum() > 0 and grouped[2].abs().sum() > 0


def test_grouped_problem_layouts_hold_the_same_values():
    ks = [144, 0, 256, 16]
    p = problems.make_grouped_problem(24, 40, ks, CPU, seed=1)
    assert p.a_packed.numel() == 24 * sum(ks) and p.b_packed.numel() == 40 * sum(ks)
    kbs = [num_k_blocks(k) for k in ks]
    assert p.sa_packed.shape == (24, sum(kbs)) and is_mn_major(p.sa_packed)
    assert p.sa_contig.shape == (24, k_block_capacity(sum(ks), len(ks))) and is_mn_major(p.sa_contig)
    assert p.sizes.dtype == torch.int32 and p.sizes.tolist() == ks
    off = 0
    for g, k in enumerate(ks):
        a_g, sa_g, b_g, sb_g = p.group_operands(g)
        assert torch.equal(a_g.view(torch.uint8), p.a_contig[:, off:off + k].view(torch.uint8))
        assert torch.equal(b_g.view(torch.uint8), p.b_contig[:, off:off + k].view(torch.uint8))
        assert torch.equal(sa_g, p.sa_contig[:, sum(kbs[:g]):sum(kbs[:g + 1])])
        assert a_g.is_contiguous() and is_mn_major(sa_g)
        if k:
            torch.testing.assert_close(p.refs[g], reference.wgrad_gemm_reference(a_g, sa_g, b_g, sb_g))
        else:
            assert torch.count_nonzero(p.refs[g]) == 0
        off += k
    packed_refs = reference.k_grouped_reference(p.a_packed, p.sa_packed, p.b_packed, p.sb_packed, ks, 24, 40)
    for r_packed, r in zip(packed_refs, p.refs):
        torch.testing.assert_close(r_packed, r)


def test_relative_error_measures_what_one_call_accumulated():
    ref = torch.randn(30, 20, dtype=torch.float64)
    before = torch.randn(30, 20)
    after = before + ref.float()
    assert problems.relative_error(after, before, ref) < 1e-6
    assert problems.relative_error(after + 0.01 * ref.float(), before, ref) == pytest.approx(0.01, rel=1e-3)
    # Overwriting out instead of accumulating is an error as large as the initial out.
    assert problems.relative_error(ref.float(), before, ref) > 0.5
    errs = [problems.relative_error(after, before, ref), 0.25]
    grouped_after = torch.stack([after, before + 1.25 * ref.float()])
    assert problems.grouped_relative_error(grouped_after, torch.stack([before, before]), [ref, ref]) == (
        pytest.approx(max(errs), rel=1e-4))


def _cand(form, fn):
    """A candidate that sets out to fn(out) and whose `check` is the identity on out's first element."""
    def build():
        out = torch.zeros(1)

        def run():
            out.copy_(fn(out))
        return run, out
    return runner.Candidate(form, build)


def _check(after, before):
    return float(after[0] - before[0])  # these fake candidates write their "error" into out


def _raise(out):
    raise RuntimeError("Invalid scaling configuration.\nmore text")


def test_select_candidate_first_correct_wins_and_records_the_rest():
    cands = [_cand("raises", _raise), _cand("wrong", lambda o: o + 1e-3), _cand("good", lambda o: o + 1e-5),
             _cand("never tried", lambda o: o)]
    sel = runner.select_candidate(cands, _check, 2e-4, required=False, device=CPU)
    assert sel.status == "ok" and sel.form == "good" and sel.rel_err == pytest.approx(1e-5)
    assert [t.split(":")[0] for t in sel.tried] == ["raises", "wrong", "good"]
    assert "Invalid scaling configuration." in sel.tried[0] and "more text" not in sel.tried[0]


def test_select_candidate_outcomes_without_a_correct_form():
    only_errors = [_cand("a", _raise), _cand("b", _raise)]
    sel = runner.select_candidate(only_errors, _check, 2e-4, required=False, device=CPU)
    assert sel.status == "n/a" and sel.run is None
    assert sel.message == "RuntimeError: Invalid scaling configuration."
    assert sel.tried == ["a: error: RuntimeError: Invalid scaling configuration.",
                         "b: error: RuntimeError: Invalid scaling configuration."]
    assert runner.select_candidate(only_errors, _check, 2e-4, required=True, device=CPU).status == "FAIL"
    wrong = [_cand("a", _raise), _cand("w1", lambda o: o + 5e-3), _cand("w2", lambda o: o + 1e-3)]
    sel = runner.select_candidate(wrong, _check, 2e-4, required=False, device=CPU)
    assert sel.status == "FAIL" and sel.form == "w2" and sel.rel_err == pytest.approx(1e-3)
    nan = [_cand("nan", lambda o: o + float("nan"))]
    assert runner.select_candidate(nan, _check, 2e-4, required=False, device=CPU).status == "FAIL"


def test_select_candidate_can_pick_the_fastest_correct_form():
    cands = [_cand("slow", lambda o: o + 1e-6), _cand("wrong", lambda o: o + 1.0), _cand("fast", lambda o: o + 2e-6)]
    speed = {}

    def time_fn(run):
        speed.setdefault("n", 0)
        speed["n"] += 1
        return 5.0 if speed["n"] == 1 else 1.0  # the first correct form is timed first

    sel = runner.select_candidate(cands, _check, 2e-4, required=False, device=CPU, time_fn=time_fn)
    assert sel.status == "ok" and sel.form == "fast" and speed["n"] == 2


def test_select_candidate_reraises_a_sticky_cuda_fault():
    def fault(out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        runner.select_candidate([_cand("f", fault), _cand("g", lambda o: o)], _check, 2e-4, False, CPU)


def test_an_impl_that_overwrites_out_fails_the_check():
    p = problems.make_dense_problem(32, 16, 256, CPU, seed=0)

    def build():
        out = p.out_init.clone()
        return (lambda: out.copy_(p.ref.float())), out

    check = lambda after, before: problems.relative_error(after, before, p.ref)  # noqa: E731
    sel = runner.select_candidate([runner.Candidate("overwrite", build)], check, runner.FP8_REL_ERR_MAX, True, CPU)
    assert sel.status == "FAIL" and sel.rel_err > 0.05


def test_time_calls_flushes_before_every_call_and_counts():
    flush = torch.ones(64, dtype=torch.uint8)
    seen = []

    def fn():
        seen.append(int(flush.sum()))
        flush.fill_(1)

    host_us = []
    times = timing.time_calls(fn, reps=4, warmup=2, flush=flush, device=CPU, host_us=host_us)
    assert len(times) == 4 and all(t >= 0 for t in times)
    assert seen == [64, 64, 0, 0, 0, 0]  # the 2 warm-up calls are not flushed; every timed one is
    assert host_us == pytest.approx([t * 1e3 for t in times])  # on a CPU the host time is the call's time


# ------------------------------------------------------------------ cuBLAS argument layout -----------


@pytest.mark.parametrize("m,n,k", [(256, 512, 1024), (100, 48, 384), (64, 32, 128)])
def test_cublas_scales_match_torch_scaled_mm_layout(m, n, k):
    kb = num_k_blocks(k)
    gen = torch.Generator().manual_seed(0)
    sa = problems.random_scales(m, kb, CPU, gen)
    sb = problems.random_scales(n, kb, CPU, gen)
    scale_a, scale_b = impls.cublas_scales_1x128(sa, sb)
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
    forms = [form for form, _ in impls.cublas_product_fns(*([None] * 4))]
    assert forms[0].startswith("torch._scaled_mm") and forms[1].startswith("F.scaled_mm")


# ------------------------------------------------------------------ the machine's bound --------------


def test_machine_rates_are_measured_the_same_way_on_a_cpu():
    rates = bound.measure_rates("cpu", gemm_size=64, copy_bytes=1 << 16, reps=2, warmup=1, flush_bytes=1 << 12)
    assert rates.complete() and rates.fp8_tflops > 0 and rates.copy_gbps > 0
    assert rates.fp8_shape == (64, 64, 64) and rates.copy_bytes == 1 << 16 and not rates.fp8_message
    doc = rates.json()
    assert doc["fp8_tflops"] == rates.fp8_tflops and "_scaled_mm" in doc["fp8_form"] and "copy_" in doc["copy_form"]
    assert "TFLOPS (64x64x64)" in bound.rates_line(rates) and "GB/s" in bound.rates_line(rates)


def test_process_rates_are_measured_once_per_device(monkeypatch):
    calls = []

    def measure(device, progress=None):
        calls.append(device)
        return _rates(tflops=1000.0 + len(calls))

    monkeypatch.setattr(bound, "_PROCESS_RATES", {})
    monkeypatch.setattr(bound, "measure_rates", measure)
    first = bound.process_rates("cpu")
    assert bound.process_rates(torch.device("cpu")) is first and first.fp8_tflops == 1001.0
    assert calls == [torch.device("cpu")]


def test_a_rate_that_cannot_be_measured_is_a_reason_not_an_error(monkeypatch):
    def no_fp8(*args):
        raise RuntimeError("_scaled_mm: tensor-wise FP8 needs an SM89+ GPU\nmore")

    monkeypatch.setattr(bound, "fp8_rate_tflops", no_fp8)
    rates = bound.measure_rates("cpu", gemm_size=16, copy_bytes=1 << 12, reps=1, warmup=0, flush_bytes=0)
    assert rates.fp8_tflops is None and rates.copy_gbps > 0 and not rates.complete()
    assert rates.fp8_message == "RuntimeError: _scaled_mm: tensor-wise FP8 needs an SM89+ GPU"
    assert "not measured (RuntimeError" in bound.rates_line(rates)
    row = {"ms": 1.0, "flops": 10, "bytes": 10, "bound_ms": None, "pct_bound": None, "binds": None}
    bound.fill_bound(row, rates)
    assert row["pct_bound"] is None and row["binds"] is None


def _rates(tflops=1000.0, gbps=2000.0):
    return bound.MachineRates(tflops, gbps, (8192, 8192, 8192), 1 << 30)


def test_bound_is_the_slower_of_math_and_memory():
    math_row = {"ms": 4.0, "flops": 2e12, "bytes": 1e9}  # 2 ms of math, 0.5 ms of bytes
    bound.fill_bound(math_row, _rates())
    assert math_row["bound_ms"] == pytest.approx(2.0) and math_row["pct_bound"] == pytest.approx(50.0)
    assert math_row["binds"] == "math"
    memory_row = {"ms": 1.0, "flops": 2e11, "bytes": 1.6e9}  # 0.2 ms of math, 0.8 ms of bytes
    bound.fill_bound(memory_row, _rates())
    assert memory_row["bound_ms"] == pytest.approx(0.8) and memory_row["pct_bound"] == pytest.approx(80.0)
    assert memory_row["binds"] == "memory"
    untimed, no_rates = {"ms": None, "flops": 2e12, "bytes": 1e9}, {"ms": 1.0, "flops": 2e12, "bytes": 1e9}
    bound.fill_bound(untimed, _rates())
    bound.fill_bound(no_rates, None)
    assert "pct_bound" not in untimed and "pct_bound" not in no_rates


def test_timed_rows_get_their_bound_from_the_rates():
    rates = _rates(tflops=1e-3, gbps=1e-3)  # a machine this slow makes any CPU time look fast
    rows = gemm.run_dense([(32, 16, 256)], impls=["ours", "cublas"], reps=2, warmup=0, device="cpu",
                          flush_bytes=0, rates=rates)
    ours, cublas = rows
    expected = max(ours["flops"] / 1e9 * 1e3, ours["bytes"] / 1e6 * 1e3)
    assert ours["bound_ms"] == pytest.approx(expected)
    assert ours["pct_bound"] == pytest.approx(100 * expected / ours["ms"])
    assert ours["binds"] == ("math" if ours["flops"] / 1e9 >= ours["bytes"] / 1e6 else "memory")
    assert cublas["status"] == "n/a" and cublas["pct_bound"] is None and cublas["binds"] is None
    grouped = gemm.run_grouped([(2, 24, 16, 128)], impls=["ours"], reps=1, warmup=0, device="cpu", flush_bytes=0,
                               skewed=False, rates=rates)
    assert all(r["pct_bound"] is not None for r in grouped)
    assert gemm.run_dense([(32, 16, 256)], impls=["ours"], reps=1, warmup=0, device="cpu",
                          flush_bytes=0)[0]["pct_bound"] is None  # no rates given: no bound


# ------------------------------------------------------------------ DeepGEMM argument layout ---------


class FakeDeepGemm(types.ModuleType):
    """A stand-in for `deep_gemm` with DeepGEMM 04278f6's two calls: records what it receives and
    accumulates the float64 product of what it is given (so a wrongly laid-out argument fails the check)."""

    def __init__(self):
        super().__init__("deep_gemm")
        self.calls = []

    def wgrad_gemm_fp8_fp8_fp32_nt(self, lhs, rhs, out):
        (a, sa_km), (b, sb_km) = lhs, rhs
        self.calls.append(("dense", a, sa_km, b, sb_km, out))
        out += reference.wgrad_gemm_reference(a, sa_km.t(), b, sb_km.t()).float()

    def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(self, lhs, rhs, out, ks):
        (a, sa_km), (b, sb_km) = lhs, rhs
        self.calls.append(("grouped", a, sa_km, b, sb_km, out, ks))
        _, m, n = out.shape
        ao = bo = so = 0
        for g, k in enumerate(ks):  # DeepGEMM's own walk over the packed layout
            kb = num_k_blocks(k)
            out[g] += reference.wgrad_gemm_reference(a[ao:ao + m * k].view(m, k), sa_km[so:so + kb].t(),
                                                     b[bo:bo + n * k].view(n, k), sb_km[so:so + kb].t()).float()
            ao, bo, so = ao + m * k, bo + n * k, so + kb


@pytest.fixture
def fake_deep_gemm(monkeypatch):
    fake = FakeDeepGemm()
    monkeypatch.setitem(sys.modules, "deep_gemm", fake)
    return fake


def test_deepgemm_scales_are_ours_transposed_and_contiguous():
    gen = torch.Generator().manual_seed(0)
    s = problems.random_scales(64, 3, CPU, gen)  # ld == 64: the transpose is already contiguous
    km = impls.deepgemm_scales(s)
    assert km.shape == (3, 64) and km.is_contiguous() and torch.equal(km, s.t())
    assert km.data_ptr() == s.data_ptr()  # a view: nothing copied
    s = problems.random_scales(6, 3, CPU, gen)  # ld == 8: a copy with exactly M columns
    km = impls.deepgemm_scales(s)
    assert km.shape == (3, 6) and km.is_contiguous() and torch.equal(km, s.t()) and km.data_ptr() != s.data_ptr()


def test_deepgemm_rows_are_na_with_the_import_error_without_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # `import deep_gemm` raises, whatever is installed
    rows = gemm.run_dense([(32, 16, 256)], impls=["deepgemm"], reps=1, warmup=0, device="cpu", flush_bytes=0)
    (row,) = rows
    assert row["impl"] == "deepgemm" and row["status"] == "n/a" and row["ms"] is None
    assert row["message"].startswith(("ImportError", "ModuleNotFoundError")) and "deep_gemm" in row["message"]
    rows = gemm.run_grouped([(2, 32, 16, 128)], impls=["deepgemm"], reps=1, warmup=0, device="cpu",
                            flush_bytes=0, skewed=False)
    assert [(r["impl"], r["status"]) for r in rows] == [("deepgemm-packed", "n/a")]
    assert "deep_gemm" in rows[0]["message"]


def test_deepgemm_dense_gets_our_operands_and_transposed_scales(fake_deep_gemm):
    p = problems.make_dense_problem(64, 32, 384, CPU, seed=2)
    (impl,) = [i for i in impls.DENSE_IMPLS if i.name == "deepgemm"]
    check = lambda after, before: problems.relative_error(after, before, p.ref)  # noqa: E731
    row = runner.measure(impl, p, check, "64x32x384", (64, 32, 384), "dense", 2, 0, None, common.silent)
    assert row["status"] == "ok" and row["rel_err"] < 1e-6 and row["form"].startswith("deep_gemm.wgrad_gemm")
    kind, a, sa_km, b, sb_km, out = fake_deep_gemm.calls[0]
    assert a is p.a and b is p.b and out.shape == (64, 32) and out.dtype == torch.float32
    assert sa_km.shape == (3, 64) and sb_km.shape == (3, 32) and sa_km.is_contiguous() and sb_km.is_contiguous()
    assert torch.equal(sa_km, p.sa.t()) and torch.equal(sb_km, p.sb.t())
    assert len(fake_deep_gemm.calls) == 1 + 2  # the check, then the timed calls; the scales made once
    assert all(c[2] is sa_km for c in fake_deep_gemm.calls)


def test_deepgemm_grouped_gets_the_packed_layout(fake_deep_gemm):
    ks = [256, 128, 384]
    rows = gemm.run_grouped([(3, 24, 40, 128)], impls=["deepgemm", "ours"], reps=1, warmup=0, device="cpu",
                            flush_bytes=0, skewed=False)
    by = {r["impl"]: r for r in rows}
    assert by["deepgemm-packed"]["status"] == "ok" and by["deepgemm-packed"]["rel_err"] < 1e-6
    assert by["ours-packed"]["vs_deepgemm"] == pytest.approx(by["ours-packed"]["tflops"]
                                                             / by["deepgemm-packed"]["tflops"])
    _, a, sa_km, b, sb_km, out, got_ks = fake_deep_gemm.calls[0]
    assert got_ks == [128, 128, 128] and a.shape == (24 * 384,) and b.shape == (40 * 384,)
    assert sa_km.shape == (3, 24) and sb_km.shape == (3, 40) and sa_km.is_contiguous() and out.shape == (3, 24, 40)
    # Unequal groups: the scales' rows follow the groups, ceil(K_g / 128) each.
    p = problems.make_grouped_problem(24, 40, ks, CPU, seed=5)
    (impl,) = [i for i in impls.GROUPED_IMPLS if i.name == "deepgemm-packed"]
    check = lambda after, before: problems.grouped_relative_error(after, before, p.refs)  # noqa: E731
    row = runner.measure(impl, p, check, "s", [3, 24, 40, sum(ks)], "grouped", 1, 0, None, common.silent)
    assert row["status"] == "ok" and row["rel_err"] < 1e-6
    _, a, sa_km, _, _, _, got_ks = fake_deep_gemm.calls[-1]
    assert a is p.a_packed and got_ks == ks and torch.equal(sa_km, p.sa_packed.t()) and sa_km.shape == (6, 24)


@pytest.mark.parametrize("kind,dims,ks,reason", [
    ("dense", (30, 32, 256), None, "multiples of 4, got M=30, N=32"),
    ("grouped", (24, 40), [144, 128], "positive multiple of 128, got [144, 128]"),
    ("grouped", (24, 40), [128, 0], "positive multiple of 128, got [128, 0]"),
])
def test_deepgemm_shapes_it_does_not_take_are_na(fake_deep_gemm, kind, dims, ks, reason):
    if kind == "dense":
        p = problems.make_dense_problem(*dims, CPU, seed=0)
        (impl,) = [i for i in impls.DENSE_IMPLS if i.name == "deepgemm"]
    else:
        p = problems.make_grouped_problem(*dims, ks, CPU, seed=0)
        (impl,) = [i for i in impls.GROUPED_IMPLS if i.name == "deepgemm-packed"]
    row = runner.measure(impl, p, lambda after, before: 0.0, "s", [1], kind, 1, 0, None, common.silent)
    assert row["status"] == "n/a" and reason in row["message"] and not fake_deep_gemm.calls


# ------------------------------------------------------------------ the runner end to end (CPU) ------


def test_run_dense_on_cpu_baselines():
    rows = gemm.run_dense([(40, 32, 272)], impls=["cublas", "bf16"], reps=2, warmup=0, device="cpu",
                          flush_bytes=0)
    by = {r["impl"]: r for r in rows}
    # No block-wise _scaled_mm on a CPU: reported, not raised, and not a failure.
    assert by["cublas"]["status"] == "n/a" and by["cublas"]["ms"] is None and len(by["cublas"]["tried"]) == 2
    bf16 = by["bf16"]
    assert bf16["status"] == "ok" and 1e-4 < bf16["rel_err"] < 1e-2  # bf16 really rounds the operands
    assert bf16["flops"] == 2 * 40 * 32 * 272 and bf16["bytes"] == problems.bf16_bytes(40, 32, 272)
    assert bf16["ms"] > 0 and bf16["tflops"] == pytest.approx(common.tflops(bf16["flops"], bf16["ms"]))


def test_run_dense_on_cpu_ours():
    rows = gemm.run_dense([(33, 20, 144)], impls=["ours"], reps=2, warmup=1, device="cpu", flush_bytes=1 << 16)
    (row,) = rows
    assert row["status"] == "ok" and row["rel_err"] < 1e-6 and row["form"] == "wgrad.wgrad_gemm_fp8_fp8_fp32_nt"
    assert row["bytes"] == problems.fp8_bytes(33, 20, 144) and "vs_deepgemm" not in row
    assert row["host_us"] > 0 and row["host_us"] == pytest.approx(row["ms"] * 1e3)


def test_run_grouped_on_cpu(monkeypatch):
    monkeypatch.setattr(shapes, "SKEW_M", 24)
    monkeypatch.setattr(shapes, "SKEW_N", 16)
    monkeypatch.setattr(shapes, "SKEW_TOTAL_TOKENS", 1024)
    rows = gemm.run_grouped([(3, 40, 32, 144)], impls=["ours", "cublas"], reps=2, warmup=0, device="cpu",
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
        return [runner.Candidate(f"{name}-form", build)]
    return runner.Impl(name, name, f"{name} summary", setup, lambda p: 100, lambda p: 10, required=required)


def test_a_cuda_fault_keeps_the_rows_measured_before_it():
    problem = types.SimpleNamespace(device=CPU)

    def fault(out):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    impl_list = [_fake_impl("good", lambda out: None), _fake_impl("bad", fault), _fake_impl("never", lambda o: None)]
    sink = [{"impl": "earlier shape"}]
    with pytest.raises(RuntimeError, match="illegal memory access"):
        runner.measure_all(impl_list, problem, lambda impl: (lambda after, before: 0.0), "s", [1], "dense", 2, 0,
                           None, common.silent, sink, group_sizes=[1])
    assert [r["impl"] for r in sink] == ["earlier shape", "good", "bad"]
    assert sink[1]["status"] == "ok" and sink[1]["tflops"] > 0 and sink[1]["group_sizes"] == [1]
    assert sink[2]["status"] == "FAIL" and "illegal memory access" in sink[2]["message"]


def test_an_ordinary_impl_error_is_a_row_not_a_crash():
    problem = types.SimpleNamespace(device=CPU)

    def broken(out):
        raise NotImplementedError("wgrad_gemm_fp8_fp8_fp32_nt: no CUDA kernel yet")

    rows = runner.measure_all([_fake_impl("ours", broken), _fake_impl("cublas", broken, required=False)], problem,
                              lambda impl: (lambda after, before: 0.0), "s", [1], "dense", 2, 0, None,
                              common.silent, [])
    assert [(r["status"], r["message"]) for r in rows] == [
        ("FAIL", "NotImplementedError: wgrad_gemm_fp8_fp8_fp32_nt: no CUDA kernel yet"),
        ("n/a", "NotImplementedError: wgrad_gemm_fp8_fp8_fp32_nt: no CUDA kernel yet")]
