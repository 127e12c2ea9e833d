"""Where does a quantization kernel's time go? Runs one kernel on one shape a few times, for ncu:

  ncu -k regex:quantize_fp8 --launch-skip 2 --launch-count 1 python3 scripts/profile_quant.py KIND R,C [dtype]

KIND is rowwise, colwise, both or segments (8 uneven segments, as `python -m wgrad bench --quant`);
segmentsA (e.g. 16, 32, 128) rounds those segment sizes down to multiples of A (the last takes the rest),
to separate the cost of segment starts inside a 16-byte chunk, a 32-byte sector or a 128-byte line of
q_t from the rest. WGRAD_SEGMENT_RUNS=0|1 forces the segments kernel's tile order.
Without ncu it prints the median time of single calls with the L2 flushed and the % of a copy.
"""

import sys

import torch

import wgrad  # noqa: F401  (loads the extension)
from wgrad import bench_quant


def main():
    kind, shape = sys.argv[1], sys.argv[2]
    dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.bfloat16
    rows, cols = (int(v) for v in shape.split(","))
    ops = torch.ops.wgrad
    x = torch.randn(rows, cols, dtype=dtype, device="cuda")
    align = int(kind[len("segments"):] or 1) if kind.startswith("segments") else 1
    sizes_list = bench_quant._segment_sizes(rows, bench_quant.SEGMENTS, align)
    kind = "segments" if kind.startswith("segments") else kind
    sizes = torch.tensor(sizes_list, dtype=torch.int32, device="cuda")
    fn = {
        "rowwise": lambda: ops.quantize_fp8_1x128_rowwise(x, False),
        "colwise": lambda: ops.quantize_fp8_1x128_colwise(x, False),
        "both": lambda: ops.quantize_fp8_1x128_both(x, False),
        "segments": lambda: ops.quantize_fp8_1x128_colwise_segments(x, sizes, False),
    }[kind]
    flush = torch.empty(bench_quant._L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    ms = bench_quant._time_ms(fn, 9, flush)
    nbytes = bench_quant._bytes("colwise_segments" if kind == "segments" else kind, rows, cols, x.element_size(),
                                bench_quant.SEGMENTS)
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = bench_quant._time_ms(lambda: dst.copy_(src), 9, flush)
    print(f"{kind} {rows}x{cols} {dtype}: {ms * 1e3:.1f} us, copy {copy_ms * 1e3:.1f} us, "
          f"{100 * copy_ms / ms:.1f} % of copy")


if __name__ == "__main__":
    main()
