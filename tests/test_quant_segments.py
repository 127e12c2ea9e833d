"""The CUDA kernels of the MoE segments cast on an SM90 GPU, bit for bit against the reference: both kernels
(the persistent TMA kernel and the carried-sectors kernel), every tile order, packed tiles, the carry kernel's
dynamic tail, tables in shared and in global memory, invalid sizes, CUDA graphs and streams. The forced paths
go through the private op _quantize_fp8_1x128_colwise_segments_with_plan (csrc/quant/plan.h); the automatic
ones through the public op. The padded cast: test_quant_padded.py."""

from __future__ import annotations

import pytest
import torch

import wgrad
from wgrad import reference

from helpers import SEGMENT_CASES, capture_graph
from quant_helpers import (
    DTYPES,
    OPS,
    SCALE_NAN_BITS,
    assert_bits_equal,
    bf16_segment_casts,
    bits,
    check_gpu_op,
    random_split,
    random_x,
    segment_sizes,
    segments_with_plan,
    sm90,
)

@sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(SEGMENT_CASES)))
def test_gpu_segments_bit_exact(case, dtype):
    rows, sizes_list = SEGMENT_CASES[case]
    for cols in (1, 129, 1000):
        x = random_x(rows, cols, dtype, seed=case)
        sizes = torch.tensor(sizes_list, dtype=torch.int32)
        for ue8m0 in (False, True):
            check_gpu_op("segments", x, ue8m0, sizes)


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["tma", "carry"])
def test_gpu_segments_special_blocks(kernel, dtype):
    # The segments cast of both kernels on zero, huge, tiny, NaN and Inf blocks in unaligned segments: a NaN
    # or Inf poisons its block's column only (scale and every q NaN), in the block of its own segment.
    x = random_x(1000, 400, torch.float32, seed=41)
    x[:130, :] = 0
    x[5, :] = -0.0
    big = 6e4 if dtype == torch.float16 else 1e30
    x[140, 10] = big
    x[200, 300] = -big
    x[150:160, 200:210] = 1e-7
    x[250, 50] = float("nan")   # segment 1 (rows 37-299)
    x[260, 390] = float("inf")
    x[270, 150] = float("-inf")
    x[301, 7] = float("nan")    # segment 2's first block (rows 300-427)
    x[999, 399] = float("nan")  # the last row
    sizes = torch.tensor([37, 263, 0, 411, 289], dtype=torch.int32)
    assert int(sizes.sum()) == x.shape[0]
    x = x.to(dtype)
    for ue8m0 in (False, True):
        check_gpu_op("segments", x, ue8m0, sizes, plan=f"kernel={kernel}")


@sm90
def test_gpu_segments_many_tiles_per_cta():
    rows = 6000
    sizes = torch.tensor([1000, 37, 0, 2963, 5, 1995], dtype=torch.int32)  # unaligned segment starts
    x = random_x(rows, 1032, torch.bfloat16, seed=61)
    check_gpu_op("segments", x, False, sizes)


@sm90
@pytest.mark.parametrize("order", ["auto", "ranges", "cranges", "c12", "1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_segments_long_runs_of_blocks(dtype, order):
    # Segments that start inside 32-byte sectors, and at least 12 tiles per consumer group: the column
    # kernel quantizes runs of consecutive row blocks (auto: strips of 39 blocks shared by a CTA's three
    # groups for bf16, of 37 blocks per group for fp32, choose_segment_order; c12: shared strips of 12;
    # ranges: one range per group; cranges: one range per CTA, shared by its groups; 1: row-major, every
    # edge sector shared with another worker's block and written byte-exact) and hands the sector a block
    # ends inside on to the next block (gs.carry, from group to group in shared strips; TileOrder in
    # kernels/quant/colwise_tile_order.cuh). Segment starts at every offset within a sector, segments shorter
    # than a sector (one block inside one sector, several in a row), empty ones, and a partial last column
    # tile.
    rows, cols = 200_000, 264
    head = [5, 17, 31, 1, 16, 0, 33, 3, 2, 29, 64, 7, 0, 0, 48, 1000, 129, 127, 15, 200, 2500, 96, 31, 1]
    gen = torch.Generator().manual_seed(83)
    cuts = torch.randint(0, rows - sum(head) + 1, (59,), generator=gen).sort().values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([rows - sum(head)])])
    sizes = torch.tensor(head + (bounds[1:] - bounds[:-1]).tolist(), dtype=torch.int32)
    assert int(sizes.sum()) == rows and int((sizes % 32 != 0).sum()) > 40
    used_blocks = int(((sizes + 127) // 128).sum())
    tiles = used_blocks * ((cols + 127) // 128)
    workers = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count) * (1 if dtype == torch.float32 else 3)
    assert tiles >= 12 * workers, "the shape must give every consumer group at least 12 tiles (long runs)"
    x = random_x(rows, cols, dtype, seed=87)
    check_gpu_op("segments", x, False, sizes, plan=f"kernel=tma,order={order}")


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,cols,groups,seed", [
    (200_000, 264, 32, 101),  # long ranges of consecutive blocks, a partial last column tile
    (100_000, 264, 32, 111),  # the same with a smaller table
    (6000, 1000, 9, 103),     # ranges of ~2 tiles: most sectors shared between two CTAs' ranges
    (700, 1032, 32, 107),     # more CTAs than tiles: one-tile ranges, many tiny and empty segments
    (3001, 2048, 5, 109),     # R % 16 == 9: the last block stores q_t's zero columns [R, align16(R))
])
def test_gpu_segments_carry_kernel(rows, cols, groups, seed, dtype):
    # The plan kernel=carry takes the kernel of kernels/quant/segments_carry.cuh for unpadded 16-bit casts of
    # at most 32 segments (all of these): each CTA one range of tiles in column-major order, walked up (even
    # CTAs) or down (odd), the sectors a range's neighbouring blocks share stored whole from its ring, those
    # it shares with another range in aligned pieces. Segment starts at every offset within a sector, segments
    # shorter than a sector (one block inside one sector, several in a row), empty ones; both scale modes;
    # sizes that are invalid only because their sum is off by one give NaN scales.
    head = [5, 17, 31, 1, 16, 0, 33, 3, 2, 29, 64, 7, 0, 0, 48, 1, 129, 127, 15, 31, 1]
    head = head[: min(len(head), groups - 2)]
    if sum(head) > rows // 2:
        head = [1, 0, 3]
    sizes = torch.cat([torch.tensor(head, dtype=torch.int32),
                       random_split(rows - sum(head), groups - len(head), seed=seed)])
    assert int(sizes.sum()) == rows and len(sizes) == groups <= 32
    x = random_x(rows, cols, dtype, seed=seed)
    for ue8m0 in (False, True):
        check_gpu_op("segments", x, ue8m0, sizes, plan="kernel=carry")
    bad = sizes.clone()
    bad[-1] += 1  # sum != R
    _, s_t = segments_with_plan(x.cuda(), bad.cuda(), False, "kernel=carry")
    assert bool((bits(s_t) == SCALE_NAN_BITS).all())


def _capture_segments_cast(x, sizes, plan=None):
    """A CUDA graph of the segments cast of x with the device tensor `sizes` (the public op, or the plan op
    with `plan`; warmed up on a side stream first), and the outputs its replays write: (graph, q_t,
    scales_t)."""
    def cast():
        if plan is None:
            return OPS.quantize_fp8_1x128_colwise_segments(x, sizes, False)
        return segments_with_plan(x, sizes, False, plan)

    graph, (q_t, s_t) = capture_graph(cast)
    return graph, q_t, s_t


@sm90
@pytest.mark.parametrize("tail", ["on", "off"])
def test_gpu_segments_carry_dynamic_tail(tail):
    # The carry kernel's dynamic tail forced on (every CTA walks a static range of tiles / CTAs tiles, then
    # takes the remainder one tile at a time from a counter; with more CTAs than tiles every tile comes from
    # the counter) or off (one range per CTA). The counter must be 0 at every launch, so the same cast runs
    # three times in a row; the shapes of the carry kernel's test (ranges of ~2 tiles, more CTAs than tiles,
    # R % 16 != 0) and the benchmark's split at 4096 x 2112.
    for x, sizes in bf16_segment_casts(((6000, 1000, 9, 103), (700, 1032, 32, 107), (3001, 2048, 5, 109),
                                        (4096, 2112, 8, 0))):
        for ue8m0 in (False, True, False):
            check_gpu_op("segments", x, ue8m0, sizes, plan=f"kernel=carry,tail={tail}")


@sm90
@pytest.mark.parametrize("tail", ["auto", "on"])
def test_gpu_segments_carry_dynamic_tail_two_streams(tail):
    # Casts on two streams at once: each stream has a counter of its own (a shared one would hand a tile to
    # one launch only, and the other's q_t would miss it). auto: the automatic tail (the remainder from the
    # counter when it is at most half the CTAs: 36 of 396 here on an H200), on: always.
    rows, cols = 4096, 7168
    sizes_cpu = torch.tensor(segment_sizes(rows, 8), dtype=torch.int32)
    xs_cpu = [random_x(rows, cols, torch.bfloat16, seed=s) for s in (157, 163)]
    expected = [reference.quantize_fp8_1x128_colwise_segments_reference(x, sizes_cpu.tolist()) for x in xs_cpu]
    xs, sizes = [x.cuda() for x in xs_cpu], sizes_cpu.cuda()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = [[], []]
    for _ in range(4):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[i].append(segments_with_plan(xs[i], sizes, False, f"kernel=carry,tail={tail}"))
    torch.cuda.synchronize()
    for i in range(2):
        for k, (q_t, s_t) in enumerate(outs[i]):
            assert_bits_equal(q_t, expected[i][0], f"q_t of stream {i}, call {k}")
            assert_bits_equal(s_t, expected[i][1], f"scales_t of stream {i}, call {k}")


@sm90
def test_gpu_segments_carry_dynamic_tail_graph_replay():
    # The counter is set to 0 in the stream before every launch, in a CUDA graph too: replays with new
    # sizes, and eager calls between them, give the reference's bits.
    plan = "kernel=carry,tail=on"
    rows, cols = 3000, 2048
    x_cpu = random_x(rows, cols, torch.bfloat16, seed=151)
    x = x_cpu.cuda()
    sizes = torch.tensor([1500, 0, 1500], dtype=torch.int32, device="cuda")
    graph, q_t, s_t = _capture_segments_cast(x, sizes, plan)
    for new in ([3000, 0, 0], [1, 2998, 1], [777, 1000, 1223]):
        sizes.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        eager_q, eager_s = segments_with_plan(x, sizes, False, plan)
        torch.cuda.synchronize()
        exp_q, exp_s = reference.quantize_fp8_1x128_colwise_segments_reference(x_cpu, new)
        for got_q, got_s, what in ((q_t, s_t, "replay"), (eager_q, eager_s, "eager")):
            assert_bits_equal(got_q, exp_q, f"q_t after {what} with {new}")
            assert_bits_equal(got_s, exp_s, f"scales_t after {what} with {new}")


@sm90
@pytest.mark.parametrize("plan", [None, "kernel=auto", "kernel=tma"])
def test_gpu_segments_automatic_kernel_choice(plan):
    # 4096 x 4096 in 8 and 16 random segments (256 rows each on average or more, R x C = 2^24): the automatic
    # choice (the public op, or the plan op's kernel=auto) takes the carry kernel (carry_kernel_by_default in
    # segments_carry_plan.h), kernel=tma forces the TMA kernel; the bits are the reference's either way.
    # 4096 x 2112 (R x C < 2^24), 4095 x 4096, 4096 x 4096 in 17 segments and 16384 x 2040: below the rule, the
    # TMA kernel.
    for rows, cols, groups, seed in ((4096, 4096, 8, 113), (4096, 4096, 16, 117), (4096, 2112, 8, 127),
                                     (4095, 4096, 8, 131), (4096, 4096, 17, 137), (16384, 2040, 8, 139)):
        sizes = random_split(rows, groups, seed=seed)
        x = random_x(rows, cols, torch.bfloat16, seed=seed)
        check_gpu_op("segments", x, False, sizes, plan=plan)


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_segments_sector_aligned_in_the_kernel_of_any_order(dtype):
    # The shape of the long-runs test with segment sizes that are multiples of 32 (some empty): the host's
    # table of the automatic order has strips for this shape, so the launch takes the kernel of any order
    # (SegmentTiles::kBlocks), and the kernel finds no segment starting inside a sector and walks row-major
    # with its runtime order (the launches known to be row-major take SegmentTiles::kRowMajorBlocks, which
    # the other tests at the automatic order run).
    rows, cols = 200_000, 264
    gen = torch.Generator().manual_seed(97)
    cuts = (torch.randint(0, rows // 32 + 1, (23,), generator=gen).sort().values * 32).tolist()
    bounds = [0] + cuts + [rows]
    sizes = torch.tensor([bounds[i + 1] - bounds[i] for i in range(24)], dtype=torch.int32)
    assert int(sizes.sum()) == rows and bool((sizes % 32 == 0).all()) and int((sizes % 128 != 0).sum()) > 10
    x = random_x(rows, cols, dtype, seed=99)
    check_gpu_op("segments", x, False, sizes)


@sm90
def test_gpu_segments_auto_shared_ranges():
    # 3584 x 8704 in 8 unaligned segments: 32 used blocks x 68 column tiles, 6 tiles per consumer group on an
    # H200's 132 SMs, and no strip keeps row-major's balance, so the automatic order takes shared ranges
    # (kSharedRanges in segment_order.h; one range of blocks per CTA, crossing column tiles, its three
    # groups handing the sectors on). The bits are the reference's on any GPU.
    sizes = torch.tensor([485, 411, 559, 337, 633, 263, 707, 189], dtype=torch.int32)
    x = random_x(3584, 8704, torch.bfloat16, seed=89)
    check_gpu_op("segments", x, False, sizes)


@sm90
@pytest.mark.parametrize("order", ["auto", "1"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,groups", [(4000, 300), (6000, 3000)])
def test_gpu_segments_many_segments(rows, groups, dtype, order):
    # The column kernel builds the segment table in shared memory when segments + scale columns fit
    # (3072 entries for 16-bit x, 768 for fp32): 300 + 331 entries do, in two scan passes for fp32
    # (288 threads). 3000 + 3046 do not: a one-CTA kernel builds the table in global memory first.
    # Order 1 takes the row-major kernel (SegmentTiles::kRowMajorBlocks) on the table in global memory too
    # (auto: strips for 3000 segments; packed tiles for 300 either way).
    plan = f"order={order}"
    sizes = random_split(rows, groups, seed=groups)  # many empty and tiny segments
    assert int((sizes == 0).sum()) > 0
    x = random_x(rows, 64, dtype, seed=groups)
    check_gpu_op("segments", x, False, sizes, plan=plan)
    bad = sizes.clone()
    bad[groups // 2] += 1  # sum != R
    q_t, s_t = segments_with_plan(x.cuda(), bad.cuda(), False, plan)
    assert bool((bits(s_t) == SCALE_NAN_BITS).all())


@sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("groups", [31, 32, 33])
def test_gpu_segments_warp_table_boundary(groups, dtype):
    # Up to 32 segments every warp scans the sizes in its lanes (build_segment_table_warps); from 33 on
    # the CTA-wide scan builds the table. Both sides of the boundary, with empty first, inner and last
    # segments, and sizes that are invalid only because their sum is off by one.
    sizes = random_split(3000, groups, seed=groups, empty_first_inner_last=True)
    assert int(sizes[0]) == 0 and int(sizes[-1]) == 0 and int(sizes[groups // 2]) == 0
    x = random_x(3000, 200, dtype, seed=groups)
    check_gpu_op("segments", x, False, sizes)
    bad = sizes.clone()
    bad[groups // 2] += 1
    _, s_t = OPS.quantize_fp8_1x128_colwise_segments(x.cuda(), bad.cuda(), False)
    assert bool((bits(s_t) == SCALE_NAN_BITS).all())


@sm90
@pytest.mark.parametrize("packed", ["off", "on", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_segments_packed_tiles(packed, dtype):
    # The plan packed=on takes packed tiles (consecutive short blocks share a tile, each starting on a 16-row
    # box: build_packed_tiles) wherever the cast is unpadded and its table fits in the kernel, off one tile per
    # block, auto (the public ops' choice) packs at 64 rows per segment or fewer. The bits are the reference's
    # either way: few and many segments, one-row and empty ones, runs of short blocks across 8-box windows,
    # C not a multiple of 128, both scale modes, and sizes that are invalid only because their sum is off by
    # one.
    plan = f"kernel=tma,packed={packed}"
    cases = SEGMENT_CASES + [
        (700, [1] * 64 + [0] * 10 + [636]),
        (3000, random_split(3000, 100, seed=5).tolist()),
        (5000, random_split(5000, 40, seed=6, empty_first_inner_last=True).tolist()),
        (2000, [17, 33, 5, 90, 31, 16, 15, 1, 200, 127, 129, 64, 48, 80, 1144]),
    ]
    for rows, sizes_list in cases:
        x = random_x(rows, 1000, dtype, seed=rows + len(sizes_list))
        sizes = torch.tensor(sizes_list, dtype=torch.int32)
        for ue8m0 in (False, True):
            check_gpu_op("segments", x, ue8m0, sizes, plan=plan)
        if rows > 0:
            bad = sizes.clone()
            bad[-1] += 1  # sum != R
            _, s_t = segments_with_plan(x.cuda(), bad.cuda(), False, plan)
            assert bool((bits(s_t) == SCALE_NAN_BITS).all())


@sm90
@pytest.mark.parametrize("order", ["1", "ranges", "cranges", "2", "3", "64", "c2", "c3", "c4", "c7", "c64"])
def test_gpu_segments_tile_orders(order):
    # The plan's order forces the TMA kernel's tile order: "ranges" (one contiguous range of
    # blocks per consumer group), "cranges" (one per CTA, its groups taking the blocks in turn), strips of
    # N > 1 blocks and shared strips cN (a CTA's groups take the blocks in turn and hand the sector over
    # through shared memory; fp32, one group: strips of N; cranges: ranges per group) carry
    # shared sectors from block to block even on tiny inputs and aligned segments, "1" (row-major) never;
    # the bits are the same as the reference's either way. C = 1000: a partial last column tile.
    for rows, sizes_list in SEGMENT_CASES + [(6000, [1000, 37, 0, 2963, 5, 1995])]:
        for dtype in (torch.bfloat16, torch.float32):
            x = random_x(rows, 1000, dtype, seed=rows + len(sizes_list))
            check_gpu_op("segments", x, False, torch.tensor(sizes_list, dtype=torch.int32),
                          plan=f"kernel=tma,order={order}")


@sm90
# (The last: sizes whose sum is R + 2^32, R if added up in 32 bits.)
@pytest.mark.parametrize("sizes_list", [[100, 100, 99], [300, -1, 0], [-5, 305], [301],
                                        [2**31 - 1, 2**31 - 1, 302]])
def test_gpu_invalid_sizes_give_nan_scales(sizes_list):
    x = torch.randn(300, 200, device="cuda")
    q_t, s_t = OPS.quantize_fp8_1x128_colwise_segments(x, torch.tensor(sizes_list, dtype=torch.int32,
                                                                        device="cuda"), False)
    assert bool((bits(s_t) == SCALE_NAN_BITS).all())


@sm90
def test_gpu_segments_no_sync_and_graph_replay_with_new_sizes():
    rows, cols = 1000, 384
    x_cpu = random_x(rows, cols, torch.bfloat16, seed=47)
    x = x_cpu.cuda()
    sizes = torch.tensor([500, 0, 500], dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        OPS.quantize_fp8_1x128_colwise_segments(x, sizes, False)
        wgrad.quantize_fp8_1x128_colwise_segments(x, sizes, True)
    finally:
        torch.cuda.set_sync_debug_mode("default")

    graph, q_t, s_t = _capture_segments_cast(x, sizes)
    for new in ([1000, 0, 0], [1, 998, 1], [0, 129, 871], [333, 333, 334]):
        sizes.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        exp_q, exp_s = reference.quantize_fp8_1x128_colwise_segments_reference(x_cpu, new)
        assert_bits_equal(q_t, exp_q, f"q_t after replay with {new}")
        assert_bits_equal(s_t, exp_s, f"scales_t after replay with {new}")

