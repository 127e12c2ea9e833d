"""The k-grouped ops (MoE weight gradients) in both layouts, and their Python API.

packed:     k_grouped_wgrad_gemm_fp8_fp8_fp32_nt, DeepGEMM's layout, sizes as a host list (multiples of 16).
contiguous: k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous, one [M, K_total] operand whose column
            ranges belong to the groups, sizes as an int32 tensor on the operands' device (any value).
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import wgrad
from helpers import (
    GPU_MARKS,
    FP8,
    Grouped,
    assert_fp32_of,
    bits,
    blockwise_reference,
    capture_graph,
    contiguous_group_references,
    cuda_param,
    group_block_starts,
    ks_tensor,
    make_contiguous,
    make_packed,
    new_out,
    packed_group_references,
    poisoned_out,
    poisoned_window_mask,
    record_calls,
    rel_frobenius,
)
from wgrad import reference
from wgrad.scales import num_k_blocks

PACKED = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt
CONTIG = torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous

# The accuracy bar of test_gemm.py, per group, against the float64 reference.
GPU_REL_TOL = 2e-4

# opcheck's test_schema cannot compare float8 tensors on the CPU; see test_gemm.OPCHECK_UTILS.
OPCHECK_UTILS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _run(layout, op, out):
    if layout == "packed":
        PACKED(*op.args(), out, op.ks)
    else:
        CONTIG(*op.args(), out, ks_tensor(op.ks, out.device))


def _make(layout, m, n, ks, device="cpu", seed=0):
    maker = make_packed if layout == "packed" else make_contiguous
    return maker(m, n, ks, device=device, seed=seed)


def _references(layout, op, m, n, ref=blockwise_reference):
    if layout == "packed":
        return packed_group_references(op, m, n, ref)
    return contiguous_group_references(op, ref)


def _grouped_out(g, m, n, ks, device="cpu"):
    """out [G, M, N] (16-byte rows): random where K_g > 0, NaN where K_g == 0 (must stay untouched)."""
    out = new_out(g, m, n, device=device, randn=True)
    for i, k in enumerate(ks):
        if k == 0:
            out[i] = float("nan")
    return out


# ------------------------------------------------------------------ CPU -----------------------------

PACKED_KS = [[0], [16], [144, 0, 48], [1008, 16, 112, 0, 128], [0, 0, 0],
             [16 * random.Random(8).randrange(0, 40) for _ in range(8)]]
# Contiguous-K sizes are any values >= 0 (groups may start inside a 16-byte chunk).
CONTIG_KS = [[112], [16, 112, 1008], [0, 0, 48], [144, 0, 16, 256], [0, 0, 0], [100, 1, 37, 0, 1007, 15],
             [16 * random.Random(16).randrange(0, 19) for _ in range(16)],
             [random.Random(17).randrange(0, 300) for _ in range(16)]]
CPU_MN = [(1, 1), (7, 33), (33, 7), (129, 129), (1000, 16)]


def _cpu_params():
    for layout, all_ks in (("packed", PACKED_KS), ("contiguous", CONTIG_KS)):
        for ks, (m, n) in itertools.product(all_ks, CPU_MN):
            yield pytest.param(layout, m, n, ks, id=f"{layout}-{m}x{n}-ks{'_'.join(map(str, ks))}")


@pytest.mark.parametrize("layout, m, n, ks", list(_cpu_params()))
def test_cpu_matches_blockwise_reference(layout, m, n, ks):
    op = _make(layout, m, n, ks, seed=m + n + len(ks))
    out = _grouped_out(len(ks), m, n, ks)
    before = out.clone()
    _run(layout, op, out)
    for g, (k, ref) in enumerate(zip(ks, _references(layout, op, m, n))):
        if k == 0:
            assert torch.equal(bits(out[g]), bits(before[g])), f"group {g} has K_g == 0 but out[{g}] changed"
        else:
            assert_fp32_of(out[g], before[g].double() + ref)


def test_cpu_layouts_and_dense_agree():
    """The same experts through the contiguous op, the packed op and one dense call per group."""
    m, n, ks = 65, 40, [144, 0, 1008, 16, 256]
    cont = make_contiguous(m, n, ks, seed=21)
    offs = [sum(ks[:g]) for g in range(len(ks))]
    packed_a = torch.cat([cont.a[:, o : o + k].reshape(-1) for o, k in zip(offs, ks)])
    packed_b = torch.cat([cont.b[:, o : o + k].reshape(-1) for o, k in zip(offs, ks)])
    used = sum(num_k_blocks(k) for k in ks)
    sa, sb = cont.sa[:, :used], cont.sb[:, :used]

    out_c = new_out(len(ks), m, n)
    CONTIG(*cont.args(), out_c, ks_tensor(ks, "cpu"))
    out_p = new_out(len(ks), m, n)
    PACKED(packed_a, sa, packed_b, sb, out_p, ks)
    out_d = new_out(len(ks), m, n)
    for g, (o, k, c) in enumerate(zip(offs, ks, group_block_starts(ks))):
        kb = num_k_blocks(k)
        torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt(cont.a[:, o : o + k], sa[:, c : c + kb], cont.b[:, o : o + k],
                                                   sb[:, c : c + kb], out_d[g])
    # All three round the same float64 sums once to float32 (summed in possibly different orders).
    torch.testing.assert_close(out_p, out_c, rtol=2.0**-23, atol=0)
    torch.testing.assert_close(out_d, out_c, rtol=2.0**-23, atol=0)
    assert out_c[2].abs().max() > 0 and torch.all(out_c[1] == 0)


@pytest.mark.parametrize("layout", ["packed", "contiguous"])
def test_cpu_accumulate_twice_gives_twice(layout):
    ks = [256, 0, 1008] if layout == "packed" else [240, 0, 1008]
    op = _make(layout, 33, 40, ks, seed=2)
    out = new_out(3, 33, 40)
    _run(layout, op, out)
    once = out.clone()
    _run(layout, op, out)
    # fp32(x + P) with x = fp32(P) is the float32 nearest to 2P (up to a tie): at most one ulp from 2x.
    torch.testing.assert_close(out, 2 * once, rtol=2.0**-23, atol=0)
    assert once[0].abs().max() > 0 and torch.all(once[1] == 0)


def test_cpu_contiguous_groups_not_on_128_boundaries():
    """Groups of 16 and 112 tokens: blocks restart at every group, partial blocks on both sides."""
    ks = [16, 112, 1008]
    op = make_contiguous(33, 24, ks, seed=5)
    assert op.a.shape[1] == 1136
    out = new_out(3, 33, 24)
    CONTIG(*op.args(), out, ks_tensor(ks, "cpu"))
    for g, ref in enumerate(contiguous_group_references(op)):
        assert_fp32_of(out[g], ref)


def test_cpu_contiguous_unused_scale_columns_are_not_read():
    """The trailing capacity columns of the scales hold NaN (make_contiguous): out stays finite."""
    ks = [128, 128, 128]  # every group block-aligned: 3 blocks used of a capacity of 5
    op = make_contiguous(16, 16, ks, seed=6)
    assert op.sa.shape[1] == 5 and torch.isnan(op.sa[:, 3:]).all()
    out = new_out(3, 16, 16)
    CONTIG(*op.args(), out, ks_tensor(ks, "cpu"))
    assert torch.isfinite(out).all()


# Sizes that sum to less than K_total, and the columns after them: the last group ends inside a block with
# the tail behind it (masked like a next group's tokens), ends on a block edge, starts inside a 16-byte chunk
# (the shifted load), or every group is empty.
TAIL_SPLITS = [([64, 0, 100], 60), ([128, 37], 200), ([16, 144, 1], 15), ([5, 20], 60), ([0, 0], 48),
               ([256], 128)]


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("device", ["cpu", cuda_param("cuda", id="cuda")])
@pytest.mark.parametrize("ks, tail", TAIL_SPLITS)
def test_contiguous_columns_past_the_sizes_are_not_read(ks, tail, device, bf16, monkeypatch):
    """The columns past sum(ks) (the zero tail of the padded segments cast) are never read: NaN there, in a,
    b and their scale columns, changes nothing; the call gives the bits of the same call on a and b cut
    at sum(ks). One tile width and epilogue for both calls, so that the bits compare."""
    monkeypatch.setenv("WGRAD_BLOCK_N", "128")
    monkeypatch.setenv("WGRAD_FP32_EPILOGUE", "reduce-add")
    m, n, used = 40, 24, sum(ks)
    op = make_contiguous(m, n, list(ks) + [tail], device=device, seed=len(ks) + tail)
    op.a[:, used:] = float("nan")
    op.b[:, used:] = float("nan")
    blocks = sum(num_k_blocks(k) for k in ks)
    op.sa[:, blocks:] = float("nan")
    op.sb[:, blocks:] = float("nan")
    sizes = ks_tensor(ks, device)
    cut = (op.a[:, :used], op.sa, op.b[:, :used], op.sb)
    if bf16:
        got = wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous((op.a, op.sa), (op.b, op.sb), sizes)
        want = wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(cut[:2], cut[2:], sizes)
    else:
        got = _grouped_out(len(ks), m, n, ks, device)
        want = got.clone()
        CONTIG(*op.args(), got, sizes)
        CONTIG(*cut, want, sizes)
    assert torch.equal(bits(got), bits(want))
    for g, k in enumerate(ks):
        if k > 0:
            assert torch.all(torch.isfinite(got[g])), f"a NaN past the sizes reached group {g}"
        elif bf16:
            assert torch.all(got[g] == 0), "an empty group's bf16 gradient is zeros"
        else:
            assert torch.all(torch.isnan(got[g])), "an empty group's out is left as it was"


@pytest.mark.parametrize("layout", ["packed", "contiguous"])
def test_cpu_inputs_are_not_mutated(layout):
    ks = [144, 0, 48]
    op = _make(layout, 36, 24, ks, seed=3)
    before = [bits(t) for t in op.args()]
    ks_t = ks_tensor(ks, "cpu")
    out = new_out(3, 36, 24)
    if layout == "packed":
        PACKED(*op.args(), out, ks)
    else:
        CONTIG(*op.args(), out, ks_t)
        assert ks_t.tolist() == ks
    assert all(torch.equal(bits(t), b) for t, b in zip(op.args(), before))


@pytest.mark.parametrize("ks", [[144, 0, 48], [0], [16, 1008, 128, 0]])
def test_opcheck_packed(ks):
    op = make_packed(36, 24, ks, seed=1)
    torch.library.opcheck(PACKED, (*op.args(), torch.zeros(len(ks), 36, 24), ks), test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("ks", [[96, 0, 64], [0], [128, 1008, 16, 0]])
def test_opcheck_contiguous(ks):
    op = make_contiguous(36, 24, ks, seed=1)
    args = (*op.args(), torch.zeros(len(ks), 36, 24), ks_tensor(ks, "cpu"))
    torch.library.opcheck(CONTIG, args, test_utils=OPCHECK_UTILS)


def test_fake_kernels_on_meta():
    m, n, ks = 129, 255, [144, 0, 48]
    out = new_out(3, m, n, device="meta")
    kb = sum(num_k_blocks(k) for k in ks)
    a = torch.empty(m * 192, dtype=FP8, device="meta")
    b = torch.empty(n * 192, dtype=FP8, device="meta")
    assert PACKED(a, wgrad.empty_mn_major_scales(m, kb, "meta"), b, wgrad.empty_mn_major_scales(n, kb, "meta"),
                  out, ks) is None
    cap = wgrad.k_block_capacity(192, 3)
    a2 = torch.empty(m, 192, dtype=FP8, device="meta")
    b2 = torch.empty(n, 192, dtype=FP8, device="meta")
    assert CONTIG(a2, wgrad.empty_mn_major_scales(m, cap, "meta"), b2, wgrad.empty_mn_major_scales(n, cap, "meta"),
                  out, torch.empty(3, dtype=torch.int32, device="meta")) is None
    assert out.device.type == "meta" and out.shape == (3, m, n)


# ---- Python API ------------------------------------------------------------------------------------


def test_api_packed_kb_by_mn_scales_and_c():
    m, n, ks = 33, 24, [144, 0, 48]
    op = make_packed(m, n, ks, seed=7)
    refs = packed_group_references(op, m, n)
    c = torch.randn(3, m, n)
    out = torch.full((3, m, n), float("nan"))
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa.t()), (op.b, op.sb.t()), out, ks, c=c)
    for g in range(3):
        assert_fp32_of(out[g], c[g].double() + refs[g])


@pytest.mark.parametrize("groups", [3, 97])
def test_api_packed_hands_mn_major_arguments_to_the_op_as_they_are(monkeypatch, groups):
    """With MN-major scales and at most one launch's groups (96) the entry point calls the op once on the
    objects given; beyond, it takes the converting path (several launches). Either way the products; a bool
    among the sizes is still named, never read as 0 or 1."""
    calls = record_calls(monkeypatch, wgrad.api, "_PACKED_FP32")
    m, n = 17, 8
    ks = ([144, 0, 48] * 33)[:groups]
    op = make_packed(m, n, ks, seed=groups)
    out = torch.zeros(groups, m, n)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb), out, ks)
    if groups <= 96:
        (args,) = calls
        assert args[0] is op.a and args[1] is op.sa and args[4] is out
    else:
        assert calls == []
    for g, ref in enumerate(packed_group_references(op, m, n)):
        assert_fp32_of(out[g], ref)
    with pytest.raises(ValueError, match=r"batch_sizes\[1\] must be an integer, got False \(bool\)"):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb), out, [ks[0], False] + ks[2:])


def test_api_packed_rejected_call_with_c_leaves_out_untouched():
    m, n, ks = 33, 24, [144, 0, 48]
    op = make_packed(m, n, ks, seed=7)
    out = torch.randn(3, m, n)
    before = bits(out)
    with pytest.raises(RuntimeError, match=r"ks\[1\] must be >= 0"):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb), out, [144, -16, 64],
                                                   c=torch.zeros(3, m, n))
    assert torch.equal(bits(out), before)


@pytest.mark.parametrize("view", ["mn_major", "kb_mn"])
def test_api_contiguous_scale_views(view):
    m, n, ks = 33, 24, [112, 0, 64]
    op = make_contiguous(m, n, ks, seed=8)
    sa = op.sa if view == "mn_major" else op.sa.t()
    sb = op.sb if view == "mn_major" else op.sb.t()
    out = new_out(3, m, n)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((op.a, sa), (op.b, sb), out, ks_tensor(ks, "cpu"))
    for g, ref in enumerate(contiguous_group_references(op)):
        assert_fp32_of(out[g], ref)


def test_cpu_packed_scales_block_count_checked_against_ks():
    """The packed entry point takes the scales' block count as given (no loop over the groups in Python):
    a count that does not match sum_g ceil(K_g / 128), in either orientation, is rejected by the op's check,
    a scale tensor that is not 2-D by name, and out is left as it was."""
    op = make_packed(64, 48, [128, 256, 16])
    out = torch.zeros(3, 64, 48)
    for sa in (op.sa[:, :-1], op.sa.t().contiguous()[:-1]):
        with pytest.raises(RuntimeError, match=r"sa must have shape \[64, 4\]"):
            wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((op.a, sa), (op.b, op.sb), out, op.ks)
    with pytest.raises(ValueError, match=r"sb must be 2-D \[48, blocks\] or \[blocks, 48\], got shape \(4,\)"):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((op.a, op.sa), (op.b, op.sb[0]), out, op.ks)
    assert torch.count_nonzero(out) == 0


# ------------------------------------------------------------------ GPU (SM90) ----------------------

GPU_GROUPS = [1, 2, 8, 64, 1024]
# Mean tokens per group: enough work per group for the bigger G, a bounded total for G = 1024.
MEAN_K = {1: 4096, 2: 4096, 8: 1024, 64: 256, 1024: 64}
PATTERNS = ["equal", "random", "zeros", "one_holds_all", "unaligned"]
# Contiguous-K only: sizes that are not multiples of 16 (groups start inside 16-byte chunks).
CONTIG_PATTERNS = ["any", "odd_first"]


def group_sizes(pattern, groups, *, seed=0):
    """Group sizes of a test pattern: multiples of 16 (both layouts) but for the contiguous-K only
    patterns of CONTIG_PATTERNS."""
    rng = random.Random(seed)
    mean = MEAN_K[groups]
    unit = 16  # the packed layout takes multiples of 16 (its groups are [M, K_g] row-major TMA matrices)
    if pattern == "equal":
        return [mean] * groups
    if pattern == "random":
        return [rng.randrange(0, 2 * mean // unit + 1) * unit for _ in range(groups)]
    if pattern == "zeros":  # every third group empty, the first one included
        return [0 if g % 3 == 0 else rng.randrange(1, 2 * mean // unit + 1) * unit for g in range(groups)]
    if pattern == "one_holds_all":
        return [mean * groups if g == groups // 2 else 0 for g in range(groups)]
    if pattern == "unaligned":
        return [(16, 112, 1008)[g % 3] for g in range(groups)]  # not multiples of 128
    if pattern == "any":  # any sizes, zeros and 1-token groups included
        return [rng.choice([0, 1, 15, 17, rng.randrange(0, 2 * mean + 1)]) if g % 4 == 3 else rng.randrange(0, 2 * mean + 1)
                for g in range(groups)]
    if pattern == "odd_first":  # every group but the first starts inside a 16-byte chunk
        return [mean + 7] + [mean] * (groups - 1)
    raise ValueError(pattern)


def _gpu_params():
    cases = list(itertools.product(("packed", "contiguous"), PATTERNS, GPU_GROUPS))
    cases += list(itertools.product(("contiguous",), CONTIG_PATTERNS, GPU_GROUPS))
    for layout, pattern, groups in cases:
        shapes = [(129, 255)] if groups >= 64 else [(129, 255), (1000, 4097)]
        for m, n in shapes:
            yield pytest.param(layout, pattern, groups, m, n, marks=GPU_MARKS,
                               id=f"{layout}-{pattern}-G{groups}-{m}x{n}")


@pytest.mark.parametrize("layout, pattern, groups, m, n", list(_gpu_params()))
def test_gpu_accuracy_per_group(layout, pattern, groups, m, n):
    ks = group_sizes(pattern, groups, seed=groups)
    op = _make(layout, m, n, ks, device="cuda", seed=groups + m)
    buf, out = poisoned_out((groups, m, n), device="cuda")
    for g, k in enumerate(ks):
        if k == 0:
            out[g] = float("nan")
    before = bits(buf)
    _run(layout, op, out)
    refs = _references(layout, op, m, n, ref=reference.wgrad_gemm_reference)
    window = poisoned_window_mask(buf, out)
    for g, k in enumerate(ks):
        if k == 0:
            window[g] = False  # an empty group's out[g] must be left as it was too
    assert torch.equal(bits(buf)[~window], before[~window]), "wrote outside the out window or into an empty group"
    for g, (k, ref) in enumerate(zip(ks, refs)):
        if k:
            err = rel_frobenius(out[g], ref)
            assert err <= GPU_REL_TOL, f"group {g} (K_g={k}): rel. Frobenius error {err:.3e}"


@pytest.mark.parametrize("layout, pattern", [pytest.param(*x, marks=GPU_MARKS) for x in
                                             [("packed", "random"), ("contiguous", "random"), ("contiguous", "any")]])
def test_gpu_grouped_bitwise_deterministic(layout, pattern):
    ks = group_sizes(pattern, 8, seed=3)
    op = _make(layout, 1000, 4097, ks, device="cuda", seed=3)
    results = []
    for _ in range(3):
        out = new_out(8, 1000, 4097, device="cuda")
        _run(layout, op, out)
        results.append(bits(out))
    assert all(torch.equal(results[0], r) for r in results[1:])


@pytest.mark.parametrize("layout", [pytest.param(x, marks=GPU_MARKS) for x in ["packed", "contiguous"]])
def test_gpu_grouped_accumulate_twice_gives_twice(layout):
    ks = [1024, 0, 4096, 256]
    op = _make(layout, 129, 255, ks, device="cuda", seed=4)
    out = new_out(4, 129, 255, device="cuda")
    _run(layout, op, out)
    once = out.clone()
    _run(layout, op, out)
    # See test_gemm.test_gpu_accumulate_twice_gives_twice.
    torch.testing.assert_close(out, 2 * once, rtol=4 * 2.0**-23, atol=1e-30)
    assert torch.all(once[1] == 0) and once[2].abs().max() > 0


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_contiguous_cuda_graph_replay_with_new_sizes(dummy):
    """Capture once; change the sizes (same total) and the scales on the device; replay: right results."""
    m, n = 257, 384
    ks1 = [512, 112, 0, 1424, 16, 1008, 16, 1008]
    ks2 = [0, 4096, 0, 0, 0, 0, 0, 0]
    ks3 = [511, 100, 0, 1437, 1, 1007, 17, 1023]  # groups starting inside 16-byte chunks
    assert sum(ks1) == sum(ks2) == sum(ks3)
    static = make_contiguous(m, n, ks1, device="cuda", seed=1)
    sizes = ks_tensor(ks1, "cuda")
    out = new_out(8, m, n, device="cuda")

    graph, _ = capture_graph(lambda: wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(
        (static.a, static.sa), (static.b, static.sb), out, sizes))

    for ks, seed in ((ks1, 1), (ks2, 2), (ks3, 3), (ks1, 4)):
        fresh = make_contiguous(m, n, ks, device="cuda", seed=seed)
        for dst, src in zip(static.args(), fresh.args()):
            dst.copy_(src)
        sizes.copy_(ks_tensor(ks, "cuda"))
        out.fill_(0.0)
        graph.replay()
        for g, (k, ref) in enumerate(zip(ks, contiguous_group_references(fresh, reference.wgrad_gemm_reference))):
            if k == 0:
                assert torch.all(out[g] == 0), f"sizes {ks}: empty group {g} written"
            else:
                assert rel_frobenius(out[g], ref) <= GPU_REL_TOL, f"sizes {ks}: group {g}"


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_packed_calls_keep_their_own_descriptors(dummy):
    """Every packed call carries its groups' descriptors: calls queued back to back with other splits (other
    group counts, two launches past 96 groups) each read their own, and a CUDA graph replays its captured
    split on new data after eager calls with other descriptors."""
    m, n = 136, 200
    splits = [[1024, 0, 2048], [16] * 64 + [2048], [3072], [32] * 96, [16] * 192, [16, 3040, 16], [2048, 1024]]
    assert all(sum(ks) == 3072 for ks in splits)
    ops = [make_packed(m, n, ks, device="cuda", seed=20 + i) for i, ks in enumerate(splits)]
    outs = [new_out(len(op.ks), m, n, device="cuda") for op in ops]
    for op, out in zip(ops, outs):  # all queued before any result is read
        PACKED(*op.args(), out, op.ks)
    for op, out in zip(ops, outs):
        for g, (k, ref) in enumerate(zip(op.ks, packed_group_references(op, m, n, reference.wgrad_gemm_reference))):
            if k == 0:
                assert torch.all(out[g] == 0), f"split {op.ks}: empty group {g} written"
            else:
                assert rel_frobenius(out[g], ref) <= GPU_REL_TOL, f"split {op.ks}: group {g}"

    ks = [48, 0, 1024, 2000]
    static = make_packed(m, n, ks, device="cuda", seed=30)
    out = new_out(len(ks), m, n, device="cuda")
    graph, _ = capture_graph(lambda: PACKED(*static.args(), out, ks))
    for seed in (31, 32):
        fresh = make_packed(m, n, ks, device="cuda", seed=seed)
        for dst, src in zip(static.args(), fresh.args()):
            dst.copy_(src)
        PACKED(*ops[4].args(), outs[4], ops[4].ks)  # other descriptors, eager
        out.fill_(0.0)
        graph.replay()
        for g, (k, ref) in enumerate(zip(ks, packed_group_references(fresh, m, n, reference.wgrad_gemm_reference))):
            if k:
                assert rel_frobenius(out[g], ref) <= GPU_REL_TOL, f"replay, group {g}"


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_packed_splits_of_one_buffer(dummy):
    """Splits of the same flat a and b put groups of other K at the same addresses: each call, first or
    repeated, must read its groups through descriptors of their own K (nothing may be reused by address
    alone, decision 0043)."""
    m, n = 136, 200
    whole = make_packed(m, n, [3072], device="cuda", seed=40)
    for ks in ([3072], [1024, 0, 2048], [2048, 1024], [1024, 0, 2048], [3072], [2048, 1024]):
        op = Grouped(whole.a, whole.sa, whole.b, whole.sb, ks)
        out = new_out(len(ks), m, n, device="cuda")
        PACKED(*op.args(), out, ks)
        for g, (k, ref) in enumerate(zip(ks, packed_group_references(op, m, n, reference.wgrad_gemm_reference))):
            if k == 0:
                assert torch.all(out[g] == 0), f"split {ks}: empty group {g} written"
            else:
                assert rel_frobenius(out[g], ref) <= GPU_REL_TOL, f"split {ks}: group {g}"


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_contiguous_unaligned_groups_keep_to_their_columns(dummy):
    """Groups that start inside 16-byte chunks read only their own columns: a NaN in the first and the
    last column of one group's row reaches that row of that group's out only, and the NaN padding past
    K_total (rand_fp8 pads each row to 16 elements with NaN) reaches nothing."""
    m, n = 200, 300
    ks = [37, 1, 300, 0, 129, 100]  # K_total = 567
    op = make_contiguous(m, n, ks, device="cuda", seed=9)
    refs = contiguous_group_references(op, reference.wgrad_gemm_reference)
    g_bad, row = 2, 17
    start = sum(ks[:g_bad])
    op.a[row, start] = float("nan")
    op.a[row, start + ks[g_bad] - 1] = float("nan")
    out = new_out(len(ks), m, n, device="cuda")
    CONTIG(*op.args(), out, ks_tensor(ks, "cuda"))
    for g, (k, ref) in enumerate(zip(ks, refs)):
        if k == 0:
            assert torch.all(out[g] == 0), f"empty group {g} written"
            continue
        rows = torch.ones(m, dtype=torch.bool, device="cuda")
        if g == g_bad:
            assert torch.all(torch.isnan(out[g, row])), "the NaN of the group's row is lost"
            rows[row] = False
        assert torch.all(torch.isfinite(out[g][rows])), f"a NaN leaked into group {g}"
        assert rel_frobenius(out[g][rows], ref[rows]) <= GPU_REL_TOL, f"group {g}"


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_contiguous_partial_last_blocks_read_only_their_group(dummy):
    """A group that ends inside a 128-wide block is followed there by the next group's tokens: for every
    count of valid columns (k32 steps 1 to 4, ends inside and at the edge of a 16-byte chunk), a NaN in the
    first token of the next group, in a and in b, reaches only that group's row and column."""
    m, n = 136, 168
    ks = [16, 32, 48, 64, 80, 96, 112, 144, 176, 40, 24, 200, 33, 7, 256, 120, 16]
    op = make_contiguous(m, n, ks, device="cuda", seed=12)
    refs = contiguous_group_references(op, reference.wgrad_gemm_reference)
    row, col = 5, 77
    starts = [sum(ks[:g]) for g in range(len(ks))]
    for g in range(1, len(ks)):
        op.a[row, starts[g]] = float("nan")
        op.b[col, starts[g]] = float("nan")
    sizes = ks_tensor(ks, "cuda")
    out = torch.zeros(len(ks), m, n, device="cuda")
    CONTIG(*op.args(), out, sizes)
    for g, (k, ref) in enumerate(zip(ks, refs)):
        keep = torch.ones(m, n, dtype=torch.bool, device="cuda")
        if g > 0:
            assert torch.all(torch.isnan(out[g, row])) and torch.all(torch.isnan(out[g, :, col])), \
                f"the NaN of group {g}'s first token is lost"
            keep[row] = False
            keep[:, col] = False
        assert torch.all(torch.isfinite(out[g][keep])), f"a NaN leaked into group {g} (K_g = {k})"
        assert rel_frobenius(out[g][keep], ref[keep]) <= GPU_REL_TOL, f"group {g} (K_g = {k})"
    # The bf16 form runs the same mainloop: the same NaNs, and elsewhere the fp32 sums rounded.
    out16 = wgrad.k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous((op.a, op.sa), (op.b, op.sb), sizes)
    assert torch.equal(torch.isnan(out16), torch.isnan(out))
    finite = ~torch.isnan(out)
    assert torch.equal(bits(out16[finite]), bits(out[finite].to(torch.bfloat16)))


@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_contiguous_has_no_host_sync(dummy):
    ks = [112, 0, 1008, 16]
    op = make_contiguous(129, 255, ks, device="cuda", seed=5)
    sizes = ks_tensor(ks, "cuda")
    out = new_out(4, 129, 255, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((op.a, op.sa), (op.b, op.sb), out, sizes)
        CONTIG(*op.args(), out, sizes)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for g, (k, ref) in enumerate(zip(ks, contiguous_group_references(op, reference.wgrad_gemm_reference))):
        if k:
            assert rel_frobenius(out[g], 2 * ref) <= GPU_REL_TOL


def _chunked_reference(a, sa, b, sb, k_lo, k_hi, col0, chunk=1 << 16):
    """float64 product of columns [k_lo, k_hi) whose first scale column is col0, dequantized in chunks of
    whole 128-blocks so that a 2^21-column operand never needs a full float64 copy."""
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    for lo in range(k_lo, k_hi, chunk):
        hi = min(k_hi, lo + chunk)
        c = col0 + (lo - k_lo) // 128
        kb = num_k_blocks(hi - lo)
        out += reference.wgrad_gemm_reference(a[:, lo:hi], sa[:, c : c + kb], b[:, lo:hi], sb[:, c : c + kb])
    return out


@pytest.mark.large_memory
@pytest.mark.parametrize("dummy", [pytest.param(0, marks=GPU_MARKS)])
def test_gpu_64bit_offsets(dummy):
    """a [2048, 2^21 + 16] holds 4.3e9 bytes: element offsets past 2^31 (and 2^32) in both the dense op
    and the contiguous op. Group 0 ends on a block boundary, so the dense op sees the same blocks."""
    m, n = 2048, 128
    ks = [1 << 20, (1 << 20) + 16]
    op = make_contiguous(m, n, ks, device="cuda", seed=7)
    assert op.a.numel() * op.a.element_size() > 2**32
    refs = [_chunked_reference(*op.args(), 0, ks[0], 0),
            _chunked_reference(*op.args(), ks[0], sum(ks), num_k_blocks(ks[0]))]

    out = new_out(2, m, n, device="cuda")
    CONTIG(*op.args(), out, ks_tensor(ks, "cuda"))
    for g in range(2):
        assert rel_frobenius(out[g], refs[g]) <= GPU_REL_TOL, f"group {g}"

    kb = num_k_blocks(sum(ks))
    dense_out = new_out(m, n, device="cuda")
    torch.ops.wgrad.wgrad_gemm_fp8_fp8_fp32_nt(op.a, op.sa[:, :kb], op.b, op.sb[:, :kb], dense_out)
    assert rel_frobenius(dense_out, refs[0] + refs[1]) <= GPU_REL_TOL


@pytest.mark.parametrize("sizes, k_total, message", [
    ([16, -16, 32], 32, r"group_sizes\[1\] must be >= 0, got -16"),
    ([16, 0, 64], 64, r"sum\(group_sizes\) must be at most K_total = 64, got 80"),
])
def test_check_group_sizes_names_the_bad_size(sizes, k_total, message):
    with pytest.raises(ValueError, match=message):
        wgrad.check_group_sizes(torch.tensor(sizes, dtype=torch.int32), k_total)


def test_check_group_sizes_accepts_the_contract():
    wgrad.check_group_sizes(torch.tensor([0, 16, 112, 1008], dtype=torch.int32), 1136)
    wgrad.check_group_sizes(torch.tensor([100, 1, 0, 27], dtype=torch.int32), 128)
    wgrad.check_group_sizes(torch.tensor([16, 0, 32], dtype=torch.int32), 64)  # columns past the sum unread


def test_python_functions_under_torch_compile():
    # Both grouped functions (their scales' layout test included) trace into one graph and give the ops'
    # results: the packed one with a host list, the contiguous-K one with a size tensor and a group starting
    # inside a 16-byte chunk.
    m, n = 40, 24

    @torch.compile(backend="aot_eager", fullgraph=True)
    def packed(a, sa, b, sb, out):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out, [16, 0, 144])
        return out

    @torch.compile(backend="aot_eager", fullgraph=True)
    def contiguous(a, sa, b, sb, out, ks):
        wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((a, sa), (b, sb), out, ks)
        return out

    op = make_packed(m, n, [16, 0, 144], seed=2)
    got, want = torch.zeros(3, m, n), torch.zeros(3, m, n)
    packed(*op.args(), got)
    torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(*op.args(), want, [16, 0, 144])
    assert torch.equal(got, want) and want.abs().sum() > 0
    op = make_contiguous(m, n, [16, 0, 137], seed=2)
    ks = torch.tensor([16, 0, 137], dtype=torch.int32)
    got, want = torch.zeros(3, m, n), torch.zeros(3, m, n)
    contiguous(*op.args(), got, ks)
    torch.ops.wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(*op.args(), want, ks)
    assert torch.equal(got, want) and want.abs().sum() > 0
