"""Where does a short-K weight-gradient GEMM's time go? For an SM90 machine; `diag` and `ksweep` need the
measurement build (`WGRAD_DIAG_VARIANTS=1 ./scripts/build.sh`, docs/design.md, Knobs).

  diag:   each shape with each WGRAD_DIAG bit set, interleaved in one process (the L2 flushed before every
          call, the host's enqueue hidden, medians): ms, TFLOPS and the share of the call's time a bit removes
          (bits 256 and 512 remove nothing: they start the second consumer warpgroup later, see diag.h).
          The fp32 shapes of K <= 1024 per tile load out ahead, an epilogue that bit 4 leaves whole. The
          measurement build's contiguous-K kernels at BLOCK_N 160 spill (its ptxas report; the release's do
          not): `--block-n 128|144` forces a width, or compare its bits-0 times with the release build's.
  ksweep: one M x N at several K, at one tile width, with and without the epilogue (bit 4). The time of a
          wave of tiles against the K blocks of a tile is fitted by a line: its slope is one K block's cost,
          its intercept what every tile costs beside its K blocks (the epilogue, the mainloop's start and
          end). With a few K blocks per tile, the intercept is what short K pays.
  splits: one contiguous-K M x N (bf16 or fp32 out, the release build's heuristics) over 32 groups of equal
          K_g, then the expert layers' uneven split against the same split with every group rounded up to a
          multiple of 128 tokens, and groups of whole K blocks that start on a 128-token boundary against the
          same groups shifted by 32 tokens (a group of 32 tokens last, then first: K_total stays the same).
          Equal groups give the time of a group against its K_g; from that curve the uneven split's time is
          predicted and set beside its measured time.
  ncu:    runs shape NAME three times, for
          `ncu -k regex:wgrad_gemm_kernel --launch-skip 2 --launch-count 1 python3 scripts/profile_short_k.py ncu NAME`.
  list:   the shapes.

  python3 scripts/profile_short_k.py diag [--only TEXT;TEXT] [--bits 0,1,2,4,6] [--block-n 128] [--reps N]
  python3 scripts/profile_short_k.py ksweep [--mn 4096,4096] [--ks 512,1024,2048,4096,8192] [--block-n 128]
                                            [--out bf16|fp32] [--reps N]
  python3 scripts/profile_short_k.py splits [--mn 2048,7168] [--ks 32,64,128,256,384,512,1024,2048]
                                            [--blocks 4,5,6] [--out bf16|fp32] [--reps N]
  python3 scripts/profile_short_k.py ncu NAME
  python3 scripts/profile_short_k.py list

The grouped shapes are the weight gradients of `python -m wgrad bench --layers`' expert layers: 16384 tokens
split unevenly (its `uneven_split`) and padded to multiples of 32 (the padded segments cast), contiguous-K.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

TOKENS = 16384
PAD = 32
BLOCK_M = 128
BLOCK_K = 128


def padded(sizes: Sequence[int], pad: int = PAD) -> List[int]:
    return [(s + pad - 1) // pad * pad for s in sizes]


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs (at least two distinct xs)."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError(f"a line needs at least two distinct x values, got {list(xs)}")
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def waves(m: int, n: int, block_n: int, num_sms: int, groups: int = 1) -> int:
    """Waves of output tiles of a persistent launch on num_sms SMs (one CTA per SM)."""
    tiles = math.ceil(m / BLOCK_M) * math.ceil(n / block_n) * groups
    return math.ceil(tiles / num_sms)


def uneven_split_of(groups: int) -> List[int]:
    """The uneven split of the grouped shapes (grouped_specs, splits)."""
    from wgrad.bench.layers import uneven_split

    return uneven_split(TOKENS, groups, 0)


def grouped_specs() -> Dict[str, Tuple[int, int, List[int], bool]]:
    """name -> (M, N, token counts per expert, bf16 out)."""
    specs = {}
    for experts in (8, 32):
        ks = padded(uneven_split_of(experts))
        for m, n in ((2048, 7168), (7168, 2048)):
            for bf16 in (True, False):
                out = "bf16" if bf16 else "fp32"
                specs[f"{out} {experts}x{m}x{n} ~{TOKENS // experts}"] = (m, n, ks, bf16)
    specs[f"bf16 32x2048x7168 ={TOKENS // 32}"] = (2048, 7168, [TOKENS // 32] * 32, True)
    return specs


DENSE_SPECS = {  # name -> (M, N, K, bf16 out)
    "fp32 dense 4096x4096x1024": (4096, 4096, 1024, False),
    "fp32 dense 4096x4096x2048": (4096, 4096, 2048, False),
    "bf16 dense 4096x4096x512": (4096, 4096, 512, True),
    "bf16 dense 4096x4096x8192": (4096, 4096, 8192, True),  # long K: the reference the short ones are read against
}


def shape_names() -> List[str]:
    return list(grouped_specs()) + list(DENSE_SPECS)


def make_call(name: str, gen) -> Tuple[Callable[[], object], float]:
    """(the call, its FLOPs) of shape `name`, on fresh random operands."""
    from wgrad.bench.problems import contiguous_wgrad_call, dense_wgrad_call

    grouped = grouped_specs()
    if name in grouped:
        m, n, ks, bf16 = grouped[name]
        return contiguous_wgrad_call(m, n, ks, bf16, "cuda", gen), 2.0 * m * n * sum(ks)
    if name not in DENSE_SPECS:
        raise SystemExit(f"unknown shape {name!r}; `list` names them")
    m, n, k, bf16 = DENSE_SPECS[name]
    return dense_wgrad_call(m, n, k, bf16, "cuda", gen), 2.0 * m * n * k


def with_bits(fn: Callable[[], object], bits: int) -> Callable[[], None]:
    def call():
        os.environ["WGRAD_DIAG"] = str(bits)
        fn()
    return call


def require_measurement_build() -> None:
    from wgrad import _version

    if not _version.BUILD.get("diag_variants"):
        raise SystemExit("this is a release build: WGRAD_DIAG is not read. Build the measurement build first: "
                         "WGRAD_DIAG_VARIANTS=1 ./scripts/build.sh")


def run_diag(args) -> None:
    import torch

    from wgrad.bench.layers import time_interleaved

    require_measurement_build()
    if args.block_n:
        os.environ["WGRAD_BLOCK_N"] = str(args.block_n)
    bits = [int(b) for b in args.bits.split(",")]
    if 0 not in bits:
        bits.insert(0, 0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    names = [s for s in shape_names() if not args.only or any(t in s for t in args.only.split(";"))]
    print(f"{'shape':30s} " + " ".join(f"{f'bits {b}':>22s}" for b in bits))
    for name in names:
        fn, flops = make_call(name, gen)
        t = time_interleaved({b: with_bits(fn, b) for b in bits}, args.reps, flush, host=False)
        base = t[0].gpu_ms
        cells = [f"{t[b].gpu_ms:7.4f} {flops / t[b].gpu_ms / 1e9:5.0f} {100 * (base - t[b].gpu_ms) / base:+5.1f}%"
                 for b in bits]
        print(f"{name:30s} " + " ".join(f"{c:>22s}" for c in cells), flush=True)
        del fn
    print("cells: ms, TFLOPS, share of the bits-0 time the bits remove")


def run_ksweep(args) -> None:
    import torch

    from wgrad.bench.layers import time_interleaved
    from wgrad.bench.problems import dense_wgrad_call

    require_measurement_build()
    m, n = (int(v) for v in args.mn.split(","))
    ks = [int(v) for v in args.ks.split(",")]
    os.environ["WGRAD_BLOCK_N"] = str(args.block_n)
    if args.out == "fp32":
        os.environ["WGRAD_FP32_EPILOGUE"] = "reduce-add"  # bit 4 drops only the reduce-add epilogue
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = waves(m, n, args.block_n, num_sms)
    per_wave: Dict[int, List[float]] = {0: [], 4: []}
    blocks = [math.ceil(k / BLOCK_K) for k in ks]
    print(f"{m} x {n}, BLOCK_N {args.block_n}, {args.out} out, {w} waves of tiles on {num_sms} SMs")
    print(f"{'K':>6s} {'blocks':>6s} {'ms':>9s} {'no epilogue':>11s} {'us/wave':>8s} {'no epi':>8s}")
    for k, kb in zip(ks, blocks):
        fn = dense_wgrad_call(m, n, k, args.out == "bf16", "cuda", gen)
        t = time_interleaved({b: with_bits(fn, b) for b in per_wave}, args.reps, flush, host=False)
        for b in per_wave:
            per_wave[b].append(1e3 * t[b].gpu_ms / w)
        print(f"{k:6d} {kb:6d} {t[0].gpu_ms:9.4f} {t[4].gpu_ms:11.4f} {per_wave[0][-1]:8.2f} {per_wave[4][-1]:8.2f}",
              flush=True)
        del fn
    for b, label in ((0, "whole call"), (4, "no epilogue")):
        intercept, slope = fit_line(blocks, per_wave[b])
        print(f"{label:12s}: {slope:.3f} us per K block, {intercept:.3f} us per tile beside its K blocks "
              f"({intercept / slope:.2f} K blocks' worth)")


def interpolate(curve: Dict[int, float], k: int) -> float:
    """curve (K_g -> time) read at k: linear between its points, proportional to K_g past the last."""
    xs = sorted(curve)
    if k <= xs[0]:
        return curve[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if a <= k <= b:
            return curve[a] + (curve[b] - curve[a]) * (k - a) / (b - a)
    return curve[xs[-1]] * k / xs[-1]


SPLIT_GROUPS = 32


def split_variants(ks_equal: Sequence[int], blocks: Sequence[int]) -> List[Tuple[str, List[int], bool]]:
    """(label, group sizes, on the equal-groups curve) of every split `splits` times: first the equal splits, then
    the uneven split, rounded up to 128, and the alignment pairs of `blocks` whole K blocks per group."""
    g = SPLIT_GROUPS
    out = [(f"{g} x {k}", [k] * g, True) for k in ks_equal]
    uneven = padded(uneven_split_of(g))
    out.append(("uneven (the grouped shapes', padded to 32)", uneven, False))
    out.append(("uneven, every group rounded up to 128", padded(uneven, BLOCK_K), False))
    for kb in blocks:
        k = kb * BLOCK_K
        out.append((f"{g - 1} x {k} + 32: starts on 128-token boundaries", [k] * (g - 1) + [32], False))
        out.append((f"32 + {g - 1} x {k}: starts 32 tokens past them", [32] + [k] * (g - 1), False))
    return out


def split_lines(variants: Sequence[Tuple[str, List[int], bool]],
                timed: Callable[[List[int]], float]) -> Iterator[str]:
    """One line per split, as it is timed: its tokens, K blocks and time (ms, from `timed`); an equal split adds
    its time per group, every other split the time predicted from the equal splits before it (interpolate)."""
    curve: Dict[int, float] = {}
    for label, ks, equal in variants:
        t = timed(ks)
        blocks = sum(math.ceil(k / BLOCK_K) for k in ks)
        if equal:
            curve[ks[0]] = 1e3 * t / len(ks)
            extra = f"  {curve[ks[0]]:7.2f} us per group"
        elif curve:
            extra = f"  predicted from equal groups {sum(interpolate(curve, k) for k in ks) / 1e3:.4f} ms"
        else:
            extra = ""
        yield f"{label:52s} {sum(ks):6d} tokens {blocks:4d} blocks {t:8.4f} ms{extra}"


def run_splits(args) -> None:
    import torch

    from wgrad.bench.layers import time_interleaved
    from wgrad.bench.problems import contiguous_wgrad_call

    m, n = (int(v) for v in args.mn.split(","))
    bf16 = args.out == "bf16"
    gen = torch.Generator(device="cuda").manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def timed(ks: List[int]) -> float:
        fn = contiguous_wgrad_call(m, n, ks, bf16, "cuda", gen)
        t = time_interleaved({0: fn}, args.reps, flush, host=False)[0].gpu_ms
        del fn
        return t

    print(f"contiguous-K {m} x {n}, {args.out} out, {SPLIT_GROUPS} groups", flush=True)
    variants = split_variants([int(v) for v in args.ks.split(",")], [int(v) for v in args.blocks.split(",")])
    for line in split_lines(variants, timed):
        print(line, flush=True)


def run_ncu(args) -> None:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    fn, _ = make_call(args.name, gen)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    diag = sub.add_parser("diag")
    diag.add_argument("--only", default=None, help="';'-separated substrings of the shape names to run")
    diag.add_argument("--bits", default="0,1,2,4,6")
    diag.add_argument("--block-n", type=int, default=0, choices=(0, 128, 144, 160),
                      help="force the tile width of every call (0: the heuristic's)")
    diag.add_argument("--reps", type=int, default=15)
    ksweep = sub.add_parser("ksweep")
    ksweep.add_argument("--mn", default="4096,4096")
    ksweep.add_argument("--ks", default="512,1024,2048,4096,8192")
    ksweep.add_argument("--block-n", type=int, default=128, choices=(128, 144, 160))
    ksweep.add_argument("--out", default="bf16", choices=("bf16", "fp32"))
    ksweep.add_argument("--reps", type=int, default=15)
    splits = sub.add_parser("splits")
    splits.add_argument("--mn", default="2048,7168")
    splits.add_argument("--ks", default="32,64,128,256,384,512,1024,2048")
    splits.add_argument("--blocks", default="4,5,6", help="whole K blocks per group of the alignment pairs")
    splits.add_argument("--out", default="bf16", choices=("bf16", "fp32"))
    splits.add_argument("--reps", type=int, default=10)
    ncu = sub.add_parser("ncu")
    ncu.add_argument("name")
    sub.add_parser("list")
    args = parser.parse_args(argv)
    if args.mode == "list":
        print("\n".join(shape_names()))
    elif args.mode == "diag":
        run_diag(args)
    elif args.mode == "ksweep":
        run_ksweep(args)
    elif args.mode == "splits":
        run_splits(args)
    else:
        run_ncu(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
