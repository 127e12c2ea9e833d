"""The quantization suite (`python -m wgrad bench --quant`): the FP8 1x128 casts against a copy of the
same bytes and against the plain PyTorch way.

Each kernel is timed on DeepSeek-V3-like activations `x` [tokens, features] next to
- a device-to-device copy moving the same number of bytes, rounded up to 128 KiB (the bandwidth ceiling;
  compared by bandwidth: the driver's copy runs 3-13 % slower at sizes that are not multiples of 4 KiB), and
- the plain PyTorch way: per-block amax through a view, divide, cast, `.t().contiguous()` for the
  transposed operand, and a copy of the scales into the MN-major layout the GEMMs take.
The MoE segments cast runs three times: with 8 uneven segment sizes that are not multiples of 16
(`colwise_segments`), with the same split rounded to multiples of 16 (`colwise_segments16`, the token
counts the k-grouped GEMM takes), and with the uneven split padded to 32 columns of q_t per segment
(`colwise_segments_pad32`: the padded cast, whose output the k-grouped GEMM takes for any token counts), and
with the row-wise outputs from the same read (`both_segments_pad32`: an MoE layer's activation cast).
Bytes moved = read x once + write every output (q, q_t with its zero columns, scales); the copy is timed
call by call beside each kernel.
Times are medians of CUDA-event intervals with the L2 flushed (a 256 MiB write) before every call.
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..reference import padded_segment_columns
from ..scales import empty_mn_major_scales, num_k_blocks
from .common import ProgressFn, first_line, is_cuda_fault
from .suite import Suite, SuiteRun
from .tables import generic_table
from .timing import L2_FLUSH_BYTES, median_ms, time_pair_ms

# tokens x features of DeepSeek-V3 layers (hidden 7168, q_lora/kv_lora + rope 2112, dense/expert
# intermediate sizes 18432/2048 -> shard-sized 4096 and 24576 column blocks)
DEFAULT_SHAPES: List[Tuple[int, int]] = [
    (4096, 7168),
    (8192, 2112),
    (8192, 4096),
    (16384, 7168),
    (4096, 24576),
]
SEGMENTS = 8  # experts of the segmented (MoE) cast in the benchmark
# The reference copy's size is rounded up to this. The driver's device-to-device copy runs 3-13 % slower
# when its size is not a multiple of 4 KiB (H200: 52,504,320 bytes, 8192 x 4224's segments cast, 3.26 TB/s
# read + written; the same rounded to 4 KiB 3.59 TB/s), and a copy of exactly the cast's bytes made the
# % of a copy of such shapes look up to 13 % better than they are.
COPY_ALIGN = 64 * 2**10


def reference_copy_size(nbytes: int) -> int:
    """The size of the copy that stands beside a kernel moving nbytes: half of them, rounded up to
    COPY_ALIGN (it reads and writes that much, at least nbytes in all)."""
    return -(-(nbytes // 2) // COPY_ALIGN) * COPY_ALIGN


def reference_copy(nbytes: int) -> Tuple[Callable[[], object], int]:
    """A device-to-device copy of reference_copy_size(nbytes) bytes on fresh buffers, as a call, and the
    bytes it moves (read + written). Compare bandwidths (bytes / time), not times."""
    n = reference_copy_size(nbytes)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * n


# ------------------------------------------------------------------ the PyTorch way ------------------


def _torch_rowwise(x: torch.Tensor):
    rows, cols = x.shape
    kb = num_k_blocks(cols)
    xf = x.float()
    if cols % 128 != 0:
        xf = torch.nn.functional.pad(xf, (0, kb * 128 - cols))
    xb = xf.view(rows, kb, 128)
    amax = xb.abs().amax(dim=-1).clamp(min=1e-4)
    s = amax / amax.new_full((), 448.0)  # a device tensor: IEEE division, like the kernels
    q = (xb * (1.0 / s).unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(rows, kb * 128)[:, :cols]
    scales = empty_mn_major_scales(rows, kb, device=x.device)
    scales.copy_(s)
    return q.contiguous(), scales


def _torch_colwise(x: torch.Tensor):
    return _torch_rowwise(x.t().contiguous())


def _torch_both(x: torch.Tensor):
    return (*_torch_rowwise(x), *_torch_colwise(x))


def _torch_segments(x: torch.Tensor, sizes: Sequence[int]):
    # host-side sizes: the PyTorch way needs them on the host (one launch chain per segment)
    outs, off = [], 0
    for s in sizes:
        outs.append(_torch_colwise(x[off : off + s]) if s > 0 else None)
        off += s
    return outs


# ------------------------------------------------------------------ the benchmark -------------------


def segment_sizes(rows: int, groups: int, align: int = 1) -> List[int]:
    """Uneven segment sizes summing to rows (what MoE routing produces): R / G each, moved by fixed offsets
    of 12-95 rows (at most half of R / G), the last taking the rest. align = 1: every segment but the first
    starts inside a 32-byte sector of q_t, as random sizes almost always do (each start a multiple of 32
    with odds 1 / 32); align > 1: each but the last rounded down to a multiple of align (the last takes the
    rest), e.g. 16 for token counts padded the way the k-grouped GEMM takes them. The offsets do not cancel
    in pairs: a split whose every other segment started on a multiple of 2 R / G rows would run faster than
    random sizes do."""
    offsets = [37, -58, 83, -21, 66, -95, 12]
    limit = rows // groups // 2  # (small R: offsets clipped to half a segment, no size below it)
    base = [rows // groups + max(-limit, min(limit, offsets[g % len(offsets)])) for g in range(groups - 1)]
    base.append(rows - sum(base))
    if align > 1:
        base = [s // align * align for s in base[:-1]]
        base.append(rows - sum(base))
    return base


def bytes_moved(kind: str, rows: int, cols: int, elem: int, groups: int = 1) -> int:
    """Bytes the cast `kind` must move for x [rows, cols] of `elem`-byte elements: x read once, every
    output written once."""
    x_bytes = rows * cols * elem
    q = rows * cols
    s_row = rows * num_k_blocks(cols) * 4
    if kind in ("colwise_segments_pad32", "both_segments_pad32"):
        # q_t [C, K] with its zero columns, scales [C, ceil(K/128) + G - 1]; both: q and its scales too
        k = padded_segment_columns(rows, groups, 32)
        padded = x_bytes + cols * k + cols * (num_k_blocks(k) + groups - 1) * 4
        return padded + (q + s_row if kind == "both_segments_pad32" else 0)
    s_col = cols * (num_k_blocks(rows) + (groups - 1 if kind.startswith("colwise_segments") else 0)) * 4
    return x_bytes + {
        "rowwise": q + s_row,
        "colwise": q + s_col,
        "both": 2 * q + s_row + s_col,
        "colwise_segments": q + s_col,
        "colwise_segments16": q + s_col,
    }[kind]


def run_quant_bench(shapes: Optional[Sequence[Tuple[int, int]]] = None, dtype: torch.dtype = torch.bfloat16,
                    reps: int = 20, progress: Optional[Callable[[str], None]] = print) -> List[Dict]:
    """Times every quantization kernel on `shapes` ([tokens, features]).
    Returns one dict per (kernel, shape): name, shape, dtype, bytes, ms, gbps, copy_bytes, copy_ms,
    copy_gbps, pct_of_copy (gbps / copy_gbps), torch_ms, speedup, valid (our q and scales equal the PyTorch
    way's bit for bit). The copy moves the kernel's bytes rounded up to 128 KiB (reference_copy)."""
    if not torch.cuda.is_available():
        raise RuntimeError("run_quant_bench needs a CUDA GPU")
    ops = torch.ops.wgrad
    shapes = list(shapes or DEFAULT_SHAPES)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows_out: List[Dict] = []
    for rows, cols in shapes:
        x = torch.randn(rows, cols, dtype=dtype, device="cuda")
        sizes_list = segment_sizes(rows, SEGMENTS)
        sizes = torch.tensor(sizes_list, dtype=torch.int32, device="cuda")
        sizes16_list = segment_sizes(rows, SEGMENTS, 16)
        sizes16 = torch.tensor(sizes16_list, dtype=torch.int32, device="cuda")
        kernels = {
            "rowwise": (lambda: ops.quantize_fp8_1x128_rowwise(x, False), lambda: _torch_rowwise(x)),
            "colwise": (lambda: ops.quantize_fp8_1x128_colwise(x, False), lambda: _torch_colwise(x)),
            "both": (lambda: ops.quantize_fp8_1x128_both(x, False), lambda: _torch_both(x)),
            "colwise_segments": (lambda: ops.quantize_fp8_1x128_colwise_segments(x, sizes, False),
                                 lambda: _torch_segments(x, sizes_list)),
            "colwise_segments16": (lambda: ops.quantize_fp8_1x128_colwise_segments(x, sizes16, False),
                                   lambda: _torch_segments(x, sizes16_list)),
            # The unaligned split again, each segment padded to 32 columns of q_t (what the k-grouped GEMM
            # takes for any token counts); its "PyTorch way" is the unpadded one (no padding step).
            "colwise_segments_pad32": (lambda: ops.quantize_fp8_1x128_colwise_segments_padded(x, sizes, 32, False),
                                       lambda: _torch_segments(x, sizes_list)),
            "both_segments_pad32": (lambda: ops.quantize_fp8_1x128_both_segments_padded(x, sizes, 32, False),
                                    lambda: (_torch_rowwise(x), _torch_segments(x, sizes_list))),
        }
        valid = _validate(x, ops)
        for kind, (ours, theirs) in kernels.items():
            nbytes = bytes_moved(kind, rows, cols, x.element_size(), SEGMENTS)
            copy, copy_bytes = reference_copy(nbytes)
            ms, copy_ms = time_pair_ms(ours, copy, reps, flush.zero_)
            del copy
            torch_ms = median_ms(theirs, reps, flush.zero_)
            gbps = nbytes / ms / 1e6
            copy_gbps = copy_bytes / copy_ms / 1e6
            row = {
                "name": f"quantize_fp8_1x128_{kind}",
                "shape": (rows, cols),
                "dtype": str(dtype).replace("torch.", ""),
                "bytes": nbytes,
                "ms": ms,
                "gbps": gbps,
                "copy_bytes": copy_bytes,
                "copy_ms": copy_ms,
                "copy_gbps": copy_gbps,
                "pct_of_copy": 100.0 * gbps / copy_gbps,
                "torch_ms": torch_ms,
                "speedup": torch_ms / ms,
                "valid": valid,
            }
            rows_out.append(row)
            if progress is not None:
                progress(f"{row['name']:<40} {rows:>6} x {cols:<6} {ms * 1e3:9.1f} us {gbps:8.0f} GB/s "
                         f"{row['pct_of_copy']:5.1f}% of copy  torch {torch_ms * 1e3:9.1f} us  "
                         f"x{row['speedup']:.1f}{'' if valid else '  MISMATCH'}")
        del x
        torch.cuda.empty_cache()
    return rows_out


def _validate(x: torch.Tensor, ops) -> bool:
    """Our row-wise and column-wise outputs equal the PyTorch way's bit for bit (same rule)."""
    q, s = ops.quantize_fp8_1x128_rowwise(x, False)
    tq, ts = _torch_rowwise(x)
    q_t, s_t = ops.quantize_fp8_1x128_colwise(x, False)
    tq_t, ts_t = _torch_colwise(x)
    return (torch.equal(q.view(torch.uint8), tq.view(torch.uint8)) and torch.equal(s, ts)
            and torch.equal(q_t.view(torch.uint8), tq_t.view(torch.uint8)) and torch.equal(s_t, ts_t))


# ------------------------------------------------------------------ the suite -----------------------


def run_quant(reps: int, progress: ProgressFn) -> Tuple[Optional[List[dict]], str]:
    """`run_quant_bench` as the command line runs it: (rows, "") or (None, why it could not run). A
    sticky CUDA fault propagates (nothing after it can run)."""
    try:
        rows = run_quant_bench(reps=reps, progress=progress)
    except Exception as exc:
        if is_cuda_fault(exc):
            raise
        return None, f"run_quant_bench failed: {first_line(exc)}"
    return [dict(r) for r in (rows or [])], ""


def quant_row_failed(row: dict) -> bool:
    """A row whose check failed: `valid` False (what run_quant_bench reports), or a `status`/`check` of
    FAIL, or `passed`/`ok` False."""
    status = str(row.get("status", row.get("check", "ok"))).upper()
    return (status.startswith("FAIL") or row.get("valid") is False or row.get("passed") is False
            or row.get("ok") is False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quant", action="store_true", help="the quantization kernels' bench (wgrad.bench.quant)")


class QuantRun(SuiteRun):
    def __init__(self, args: argparse.Namespace, by_default: bool):
        self.wanted = bool(args.quant)
        self.rows: Optional[List[dict]] = None
        self.missing = ""

    def run(self, args: argparse.Namespace, progress: ProgressFn) -> None:
        self.rows, self.missing = run_quant(args.reps, progress)

    def report(self) -> List[str]:
        if not self.wanted:
            return []
        if self.rows is None:
            return ["", f"quantization: not run: {self.missing}"]
        return ["", "quantization", generic_table(self.rows) if self.rows else "(no rows)"]

    def json(self):
        return dict(quant=self.rows, quant_unavailable=self.missing or None)

    def failed_count(self) -> int:
        return sum(1 for r in (self.rows or []) if quant_row_failed(r))

    def incomplete(self) -> bool:
        return self.wanted and self.rows is None


SUITE = Suite("quant", add_arguments, lambda args: bool(args.quant), QuantRun)
