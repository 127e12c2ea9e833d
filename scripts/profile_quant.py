"""Where does a quantization kernel's time go? Runs one kernel on one shape a few times, for ncu:

  ncu -k regex:quantize_fp8 --launch-skip 2 --launch-count 1 python3 scripts/profile_quant.py KIND R,C [dtype]

KIND is rowwise, colwise, both or segments (8 uneven segments, as `python -m wgrad bench --quant`);
segmentsA (e.g. 16, 32, 128) rounds those segment sizes down to multiples of A (the last takes the rest),
to separate the cost of segment starts inside a 16-byte chunk, a 32-byte sector or a 128-byte line of
q_t from the rest; segments_one is one segment of all R rows (Colwise's tiles, the segments kernel);
segments_pad32 the uneven split padded to 32 columns of q_t per segment (the benchmark's padded cast).
WGRAD_SEGMENT_ORDER=ranges|N forces the segments kernel's tile order.
Without ncu it prints the median time of single calls with the L2 flushed and the % of a copy.

  python3 scripts/profile_quant.py order-sweep [ORDERS] [KINDS] [SHAPES]

times the column casts (bf16) under every setting in ORDERS (comma-separated, default
auto,1,2,3,4,ranges): a WGRAD_SEGMENT_ORDER value, VAR=VALUE[+VAR=VALUE...] for any knob, or default.
For each KIND (default segments,segments16; colwise and both too, which the order knob does not change)
and shape (default the benchmark's), in one process, the settings interleaved within each of
SWEEP_REPS (default 3) repetitions, each starting one setting later than the one before (use a multiple of
the settings' count), and every call timed beside a copy of the same bytes; prints % of a copy. Compare the
settings against a kind none of them changes (colwise): its spread is the sweep's.

  python3 scripts/profile_quant.py timeline KIND:R,C ... > LOG; python3 scripts/profile_quant.py timeline-summary LOG

(measurement build) runs each cast once after an L2 flush with every consumer group printing when its
tiles landed and when it ended (WGRAD_QUANT_PROBE=2, TimelineProbe), and summarises the log.

  python3 scripts/profile_quant.py startup [SHAPES]

separates a launch's fixed cost (docs/perf-notes.md, session 11): Colwise against the segments cast with
one segment (the same tiles) and with the benchmark's 8 unaligned segments, timed (us, median of 15) with
the L2 flushed ("cold"), flushed and then the same kernel run on one 128 x 128 tile ("code warm": its
instructions and the sizes back in the L2, x still cold), and without a flush ("hot"). With a measurement
build (WGRAD_DIAG_VARIANTS=1) it then prints the kernel's clock probes of three cold calls and of one
call right after them (WGRAD_QUANT_PROBE=1; StartupProbe in quantize_colwise_sm90.cuh).
"""

import os
import statistics
import sys

import torch

import wgrad  # noqa: F401  (loads the extension)
from wgrad import bench_quant


def _random_sizes(rows, groups):
    """segments_gN: `groups` segments between sorted random cut points (seed = groups)."""
    g = torch.Generator().manual_seed(groups)
    cuts = torch.randint(0, rows + 1, (groups - 1,), generator=g).sort().values.tolist()
    bounds = [0] + cuts + [rows]
    return [bounds[i + 1] - bounds[i] for i in range(groups)]


def _groups_of(kind):
    """The segments of the cast KIND."""
    if kind == "segments_one":
        return 1
    return int(kind[len("segments_g"):]) if kind.startswith("segments_g") else bench_quant.SEGMENTS


def _kernel_fn(kind, x):
    """The cast KIND (rowwise, colwise, both, segments, segmentsA, segments_one or segments_gN) of x, as a call."""
    if not kind.startswith("segments"):
        op = getattr(torch.ops.wgrad, f"quantize_fp8_1x128_{kind}")
        return lambda: op(x, False)
    if kind == "segments_pad32":  # the benchmark's unaligned split, each segment padded to 32 columns of q_t
        sizes = torch.tensor(bench_quant._segment_sizes(x.shape[0], bench_quant.SEGMENTS), dtype=torch.int32,
                             device="cuda")
        return lambda: torch.ops.wgrad.quantize_fp8_1x128_colwise_segments_padded(x, sizes, 32, False)
    if kind == "segments_one":  # one segment of all R rows: Colwise's tiles through the segments kernel
        sizes_list = [x.shape[0]]
    elif kind.startswith("segments_g"):
        sizes_list = _random_sizes(x.shape[0], _groups_of(kind))
    else:
        align = int(kind[len("segments"):] or 1)
        sizes_list = bench_quant._segment_sizes(x.shape[0], bench_quant.SEGMENTS, align)
    sizes = torch.tensor(sizes_list, dtype=torch.int32, device="cuda")
    return lambda: torch.ops.wgrad.quantize_fp8_1x128_colwise_segments(x, sizes, False)


def _copy_fn(kind, x):
    """The reference copy for the cast KIND of x (bench_quant.reference_copy): (call, bytes it moves, bytes
    the cast moves). Compare bandwidths: pct(...)."""
    rows, cols = x.shape
    name = ("colwise_segments_pad32" if kind == "segments_pad32"
            else "colwise_segments" if kind.startswith("segments") else kind)
    nbytes = bench_quant._bytes(name, rows, cols, x.element_size(), _groups_of(kind))
    copy, copy_bytes = bench_quant.reference_copy(nbytes)
    return copy, copy_bytes, nbytes


def pct(ms, copy_ms, copy_bytes, nbytes):
    """The cast's bandwidth in % of the copy's."""
    return 100.0 * (nbytes / ms) / (copy_bytes / copy_ms)


def _env_of(token):
    """An ORDERS token: a WGRAD_SEGMENT_ORDER value, or VAR=VALUE settings joined by '+', or 'default'."""
    if token == "default":
        return {}
    if "=" not in token:
        return {"WGRAD_SEGMENT_ORDER": token}
    return dict(kv.split("=", 1) for kv in token.split("+"))


def order_sweep(orders, kinds, shapes):
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    reps = int(os.environ.get("SWEEP_REPS", "3"))
    print("shape kind " + " ".join(f"{o:>7}" for o in orders) +
          f"   (% of a copy: median of {reps} ratios (SWEEP_REPS) of medians of 9 calls, each beside a copy)")
    for rows, cols in shapes:
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        for kind in kinds:
            fn, (copy, copy_bytes, nbytes) = _kernel_fn(kind, x), _copy_fn(kind, x)
            ratios = {o: [] for o in orders}
            for rep in range(reps):
                # Each repetition starts one setting later: the same setting in the same place of every
                # repetition measured up to 3 points apart from the others with nothing changed (Colwise, which
                # no knob of the sweep changes, at 8192 x 2112 and 8192 x 4096; H200 session 24).
                for o in orders[rep % len(orders):] + orders[:rep % len(orders)]:
                    env = _env_of(o)
                    os.environ.update(env)
                    ms, copy_ms = bench_quant._time_pair_ms(fn, copy, 9, flush.zero_)
                    for k in env:
                        os.environ.pop(k)
                    ratios[o].append(pct(ms, copy_ms, copy_bytes, nbytes))
            cells = " ".join(f"{statistics.median(ratios[o]):7.1f}" for o in orders)
            print(f"{rows}x{cols} {kind} {cells}", flush=True)


def _startup_kinds(x):
    """(name, call, the same kernel on one 128 x 128 tile) for Colwise and two segments casts of x."""
    tiny = torch.randn(128, 128, dtype=x.dtype, device="cuda")
    one = torch.tensor([128], dtype=torch.int32, device="cuda")
    colwise = torch.ops.wgrad.quantize_fp8_1x128_colwise
    segments = torch.ops.wgrad.quantize_fp8_1x128_colwise_segments
    whole = torch.tensor([x.shape[0]], dtype=torch.int32, device="cuda")
    uneven = torch.tensor(bench_quant._segment_sizes(x.shape[0], bench_quant.SEGMENTS), dtype=torch.int32,
                          device="cuda")
    warm_segments = lambda: segments(tiny, one, False)  # noqa: E731
    return [("colwise", lambda: colwise(x, False), lambda: colwise(tiny, False)),
            ("segments_g1", lambda: segments(x, whole, False), warm_segments),
            ("segments_g8", lambda: segments(x, uneven, False), warm_segments)]


def _time_us(fn, before):
    """Median of 15 event-timed calls of fn (us), `before()` run ahead of each (outside the events)."""
    return bench_quant._time_ms(fn, 15, before) * 1e3


def startup(shapes):
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    print("shape kind cold code_warm hot (us, median of 15)")
    for rows, cols in shapes:
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        for name, fn, warm in _startup_kinds(x):
            cold = _time_us(fn, flush.zero_)
            code_warm = _time_us(fn, lambda: (flush.zero_(), warm()))
            hot = _time_us(fn, lambda: None)
            print(f"{rows}x{cols} {name} {cold:.1f} {code_warm:.1f} {hot:.1f}", flush=True)
    os.environ["WGRAD_QUANT_PROBE"] = "1"
    print("probes (cycles since entry; consumer thread 0 / producer: 1 barriers initialised, 2 table built, "
          "3 synced, 4 order chosen, 5 unused scales / first tile known, 6 first stage full / acquired, "
          "7 first tile stored / first load issued, 8 loop done, 9 end)", flush=True)
    for rows, cols in shapes:
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        for name, fn, _ in _startup_kinds(x):
            for _ in range(3):
                flush.zero_()
                torch.cuda.synchronize()
                print(f"-- {rows}x{cols} {name}", flush=True)
                fn()
                torch.cuda.synchronize()
            # The same kernel again right after (no flush): its instructions are cached in every SM.
            print(f"-- {rows}x{cols} {name} second call", flush=True)
            fn()
            torch.cuda.synchronize()
    os.environ.pop("WGRAD_QUANT_PROBE")


def timeline(specs):
    """Each KIND:R,C once after an L2 flush with WGRAD_QUANT_PROBE=2 (measurement build): the kernel's
    consumer groups print their timelines ("tl ..." lines, TimelineProbe), after a "== KIND:R,C" line."""
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for spec in specs:
        kind, shape = spec.split(":")
        rows, cols = (int(v) for v in shape.split(","))
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        fn = _kernel_fn(kind, x)
        fn()
        flush.zero_()
        torch.cuda.synchronize()
        print(f"== {spec}", flush=True)
        os.environ["WGRAD_QUANT_PROBE"] = "2"
        fn()
        torch.cuda.synchronize()
        os.environ.pop("WGRAD_QUANT_PROBE")


def timeline_summary(path):
    """Per case of a `timeline` log: when the groups' first tiles landed, their tile intervals and ends
    (us since the earliest group start), and how many groups end in each tenth of the kernel."""
    cases, cur = {}, None
    for line in open(path):
        if line.startswith("== "):
            cur = line[3:].strip()
            cases[cur] = []
        elif line.startswith("tl ") and cur is not None:
            v = [int(t) for t in line.split()[1:]]
            cases[cur].append(v)
    for spec, groups in cases.items():
        if not groups:
            continue
        t0 = min(g[3] for g in groups)
        ends = sorted((g[-1] - t0) / 1e3 for g in groups)
        first = [(g[4] - t0) / 1e3 for g in groups if g[2] > 0]
        gaps = []
        for g in groups:
            landed = g[4:-1][:g[2]]  # the marks between START and END (TimelineProbe::kTiles of them)
            gaps += [(b - a) / 1e3 for a, b in zip(landed, landed[1:])]
        tiles = [g[2] for g in groups]
        span = ends[-1]
        hist = [0] * 10
        for e in ends:
            hist[min(9, int(10 * e / span))] += 1
        print(f"{spec}: groups {len(groups)}, tiles {sum(tiles)} (max {max(tiles)}), end max {span:.1f} us, "
              f"median {statistics.median(ends):.1f}, min {ends[0]:.1f}; first tile landed median "
              f"{statistics.median(first):.2f} max {max(first):.2f}; tile interval median "
              f"{statistics.median(gaps):.2f} mean {statistics.mean(gaps):.2f} us; ends per tenth {hist}")


def main():
    if sys.argv[1] == "timeline":
        timeline(sys.argv[2:])
        return
    if sys.argv[1] == "timeline-summary":
        timeline_summary(sys.argv[2])
        return
    if sys.argv[1] == "startup":
        startup([tuple(int(v) for v in s.split(",")) for s in " ".join(sys.argv[2:]).split()] if len(sys.argv) > 2
                else [(128, 128), (8192, 2112), (8192, 4096)])
        return
    if sys.argv[1] == "order-sweep":
        orders = (sys.argv[2] if len(sys.argv) > 2 else "auto,1,2,3,4,ranges").split(",")
        kinds = (sys.argv[3] if len(sys.argv) > 3 else "segments,segments16").split(",")
        shapes = ([tuple(int(v) for v in s.split(",")) for s in sys.argv[4].split()] if len(sys.argv) > 4
                  else bench_quant.DEFAULT_SHAPES)
        order_sweep(orders, kinds, shapes)
        return
    kind, shape = sys.argv[1], sys.argv[2]
    dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.bfloat16
    rows, cols = (int(v) for v in shape.split(","))
    x = torch.randn(rows, cols, dtype=dtype, device="cuda")
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    copy, copy_bytes, nbytes = _copy_fn(kind, x)
    ms, copy_ms = bench_quant._time_pair_ms(_kernel_fn(kind, x), copy, 9, flush.zero_)
    print(f"{kind} {rows}x{cols} {dtype}: {ms * 1e3:.1f} us, copy {copy_ms * 1e3:.1f} us, "
          f"{pct(ms, copy_ms, copy_bytes, nbytes):.1f} % of copy")


if __name__ == "__main__":
    main()
