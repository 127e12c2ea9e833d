"""Operand factories and comparison helpers shared by the tests.

Random operands follow the contract of csrc/registration.cpp: fp8 e4m3 data from a normal distribution,
float32 1x128 scales in the TMA-aligned MN-major layout spanning several orders of magnitude. Every
byte that is NOT part of an operand (row padding of a, b; the rows ld > mn of a scale tensor; unused
trailing scale columns of the contiguous-K layout) is poisoned with NaN, so that a kernel reading it
shows up as NaN in out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch

import wgrad
from wgrad.scales import align_up, num_k_blocks

FP8 = torch.float8_e4m3fn
BLOCK_K = 128

# The checkout the tests belong to (README.md, tests/cpp): the same whichever wgrad is under test.
ROOT = Path(__file__).resolve().parent.parent


def package_env() -> Dict[str, str]:
    """The environment for a subprocess that must import the wgrad under test: the in-place tree on
    PYTHONPATH when that is what the tests import, else the environment as it is (an installed package)."""
    env = dict(os.environ)
    tree = Path(wgrad.__file__).resolve().parent.parent
    if tree == ROOT / "python":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
    return env


def _has_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


HAS_SM90 = _has_sm90()
NO_SM90_REASON = "needs an SM90 GPU (compute capability 9.0)"

# Marks of every GPU test: skipped cleanly (with the reason) unless an SM90 GPU is present.
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(not HAS_SM90, reason=NO_SM90_REASON)]


def gpu(fn):
    """Marks a test function as a GPU test (skipped cleanly without an SM90 GPU)."""
    for mark in GPU_MARKS:
        fn = mark(fn)
    return fn


def cuda_param(*values, id=None):
    return pytest.param(*values, marks=GPU_MARKS, id=id)


def record_calls(monkeypatch, owner, name: str, calls: Optional[list] = None) -> list:
    """Replaces `owner.name` (an op) by a wrapper that still runs it and appends the arguments of every call
    that ran to `calls` (a new list unless given), which it returns."""
    calls = [] if calls is None else calls
    real = getattr(owner, name)

    def record(*args):
        result = real(*args)
        calls.append(args)
        return result

    monkeypatch.setattr(owner, name, record)
    return calls


def generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ------------------------------------------------------------------ operands ------------------------


def rand_fp8(rows: int, k: int, *, device="cpu", gen: Optional[torch.Generator] = None,
             row_stride: Optional[int] = None) -> torch.Tensor:
    """[rows, k] float8_e4m3fn of N(0, 1) data (what an amax/448 cast of normal activations gives), as a
    view of a [rows, row_stride] buffer whose padding columns hold NaN. The default row stride is k
    rounded up to 16 elements (the smallest the contract allows)."""
    ld = row_stride if row_stride is not None else align_up(max(k, 1), 16)
    buf = torch.full((rows, ld), float("nan"), device=device).to(FP8)
    if rows and k:
        buf[:, :k] = torch.randn(rows, k, device=device, generator=gen).to(FP8)
    return buf[:, :k]


def rand_scale_values(shape, *, device="cpu", gen=None, lo: float = -8.0, hi: float = 2.0) -> torch.Tensor:
    """float32 powers 2**u with u ~ U(lo, hi): scales spanning several orders of magnitude."""
    u = torch.rand(shape, device=device, generator=gen, dtype=torch.float64)
    return torch.exp2(lo + (hi - lo) * u).float()


def rand_scales(mn: int, kb: int, *, device="cpu", gen=None, poison: bool = True) -> torch.Tensor:
    """[mn, kb] float32 scales in the TMA-aligned MN-major layout (wgrad.empty_mn_major_scales); the
    padding rows ld > mn of the underlying buffer hold NaN when `poison`."""
    s = wgrad.empty_mn_major_scales(mn, kb, device=device)
    if kb == 0:
        return s
    ld = s.stride(1)
    if poison:
        s.as_strided((kb, ld), (ld, 1)).fill_(float("nan"))
    if mn:
        s.copy_(rand_scale_values((mn, kb), device=device, gen=gen))
    return s


def poisoned_out(shape: Sequence[int], *, device="cpu", fill: float = 0.0):
    """A float32 view of `shape` (last two dims [M, N]) inside a larger NaN-filled buffer: row stride
    > N and a multiple of 4, one NaN row above and below, four NaN columns to the left, a 16-byte
    aligned start. Returns (buffer, window); the window holds `fill`."""
    *lead, m, n = shape
    ld = align_up(n, 4) + 8
    buf = torch.full((*lead, m + 2, ld), float("nan"), device=device)
    window = buf[..., 1 : 1 + m, 4 : 4 + n]
    window.fill_(fill)
    return buf, window


def poisoned_window_mask(buf: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """True on the elements of poisoned_out's window inside its buffer: `bits(buf)[~mask]` is what a call
    must leave as it was."""
    m, n = window.shape[-2:]
    mask = torch.zeros_like(buf, dtype=torch.bool)
    mask[..., 1 : 1 + m, 4 : 4 + n] = True
    return mask


def new_out(*shape: int, device="cpu", fill: float = 0.0, randn: bool = False, gen=None) -> torch.Tensor:
    """float32 out of `shape` (last two dims [M, N]) whose row stride is N rounded up to 4 elements: the
    contract wants 16-byte rows (TMA), so a contiguous [M, N] only qualifies when N % 4 == 0."""
    *lead, m, n = shape
    buf = torch.empty((*lead, m, align_up(max(n, 1), 4)), device=device)
    out = buf[..., :n]
    if randn:
        out.copy_(torch.randn(out.shape, device=device, generator=gen))
    else:
        out.fill_(fill)
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    """A bitwise image of t (NaN == NaN, -0.0 != 0.0), for 'left untouched' checks."""
    int_type = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(int_type).clone()


@dataclass
class Dense:
    a: torch.Tensor
    sa: torch.Tensor
    b: torch.Tensor
    sb: torch.Tensor

    def args(self):
        return self.a, self.sa, self.b, self.sb


def make_dense(m: int, n: int, k: int, *, device="cpu", seed: int = 0, **fp8_kwargs) -> Dense:
    gen = generator(device, seed)
    kb = num_k_blocks(k)
    return Dense(
        a=rand_fp8(m, k, device=device, gen=gen, **fp8_kwargs),
        sa=rand_scales(m, kb, device=device, gen=gen),
        b=rand_fp8(n, k, device=device, gen=gen, **fp8_kwargs),
        sb=rand_scales(n, kb, device=device, gen=gen),
    )


@dataclass
class Grouped:
    """Operands of one k-grouped call; `ks` the group sizes."""

    a: torch.Tensor
    sa: torch.Tensor
    b: torch.Tensor
    sb: torch.Tensor
    ks: List[int]

    def args(self):
        return self.a, self.sa, self.b, self.sb


def group_block_starts(ks: Sequence[int]) -> List[int]:
    """First scale column of every group (blocks restart at every group)."""
    starts, col = [], 0
    for k in ks:
        starts.append(col)
        col += num_k_blocks(k)
    return starts


def make_packed(m: int, n: int, ks: Sequence[int], *, device="cpu", seed: int = 0) -> Grouped:
    """DeepGEMM's packed layout: flat a, b holding the row-major [M, K_g] / [N, K_g] blocks in turn."""
    gen = generator(device, seed)
    k_total = sum(ks)
    kb = sum(num_k_blocks(k) for k in ks)
    a = torch.randn(m * k_total, device=device, generator=gen).to(FP8)
    b = torch.randn(n * k_total, device=device, generator=gen).to(FP8)
    return Grouped(a, rand_scales(m, kb, device=device, gen=gen), b, rand_scales(n, kb, device=device, gen=gen),
                   list(ks))


def make_contiguous(m: int, n: int, ks: Sequence[int], *, device="cpu", seed: int = 0) -> Grouped:
    """Contiguous-K layout: a [M, K_total], b [N, K_total] (rows padded to 16 elements with NaN), scales
    with k_block_capacity columns whose unused trailing columns hold NaN."""
    gen = generator(device, seed)
    k_total = sum(ks)
    cap = wgrad.k_block_capacity(k_total, len(ks))
    used = sum(num_k_blocks(k) for k in ks)
    a = rand_fp8(m, k_total, device=device, gen=gen)
    b = rand_fp8(n, k_total, device=device, gen=gen)
    sa = rand_scales(m, cap, device=device, gen=gen)
    sb = rand_scales(n, cap, device=device, gen=gen)
    sa[:, used:] = float("nan")
    sb[:, used:] = float("nan")
    return Grouped(a, sa, b, sb, list(ks))


def ks_tensor(ks: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(list(ks), dtype=torch.int32, device=device)


# ------------------------------------------------------------------ references ----------------------


def blockwise_reference(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """float64 [M, N] straight from the contract's formula,
    sum_kb sa[m, kb] * sb[n, kb] * sum_{k in kb} a[m, k] * b[n, k]
    (written independently of wgrad.reference, whose dequantize-then-multiply form the CPU kernels use)."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.zeros(m, n, dtype=torch.float64, device=a.device)
    for kb in range(num_k_blocks(k)):
        lo, hi = kb * BLOCK_K, min(k, (kb + 1) * BLOCK_K)
        partial = a[:, lo:hi].double() @ b[:, lo:hi].double().t()
        out += sa[:, kb].double()[:, None] * sb[:, kb].double()[None, :] * partial
    return out


def packed_group_references(op: Grouped, m: int, n: int, ref=blockwise_reference) -> List[torch.Tensor]:
    """Per-group float64 products of the packed layout."""
    outs, off_a, off_b = [], 0, 0
    for k, col in zip(op.ks, group_block_starts(op.ks)):
        kb = num_k_blocks(k)
        a_g = op.a[off_a : off_a + m * k].view(m, k)
        b_g = op.b[off_b : off_b + n * k].view(n, k)
        outs.append(ref(a_g, op.sa[:, col : col + kb], b_g, op.sb[:, col : col + kb]))
        off_a += m * k
        off_b += n * k
    return outs


def contiguous_group_references(op: Grouped, ref=blockwise_reference) -> List[torch.Tensor]:
    """Per-group float64 products of the contiguous-K layout."""
    outs, off = [], 0
    for k, col in zip(op.ks, group_block_starts(op.ks)):
        kb = num_k_blocks(k)
        outs.append(ref(op.a[:, off : off + k], op.sa[:, col : col + kb], op.b[:, off : off + k],
                        op.sb[:, col : col + kb]))
        off += k
    return outs


def rel_frobenius(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref||_F / ||ref||_F in float64 (the absolute error when ref is all zero)."""
    x, ref = x.double(), ref.double()
    err = torch.linalg.vector_norm(x - ref).item()
    den = torch.linalg.vector_norm(ref).item()
    return err / den if den > 0 else err


def assert_fp32_of(out: torch.Tensor, expected64: torch.Tensor) -> None:
    """out equals expected64 rounded once to float32, up to one ulp: the CPU kernels and the references
    sum in float64 in different orders (relative differences ~1e-15), so the single rounding to float32
    may pick the other neighbour."""
    expected = expected64.to(torch.float32)
    scale = expected64.abs().max().item() if expected64.numel() else 0.0
    torch.testing.assert_close(out, expected, rtol=2.0**-23, atol=1e-12 * scale, equal_nan=False)


# MoE segment splits (rows, sizes) for the segments casts: one segment, empty ones first, last and in
# between, starts inside 16-byte chunks and 32-byte sectors, R == 0, many empty segments, many small ones.
SEGMENT_CASES = [
    (300, [300]),
    (300, [0, 300]),
    (300, [300, 0, 0]),
    (300, [5, 0, 123, 0, 172]),
    (1000, [1, 127, 129, 3, 0, 740]),
    (4097, [128, 256, 17, 1000, 2696]),
    (4097, [16, 32, 48, 4001]),
    (0, [0, 0, 0]),
    (129, [0] * 40 + [129]),
    (2048, [64] * 32),
]


POISON_BYTE = 0xA5  # a valid e4m3 value the tests' data never quantizes to in bulk; as fp32 scale bits, -2.9e-16


def on_poisoned_outputs(call, attempts: int = 4):
    """Runs call() (an op returning new CUDA tensors) until its outputs land on poisoned memory: every byte
    of a run's outputs' storage (a q_t's row padding too) is set to POISON_BYTE and freed, and the next run,
    whose allocations repeat the last's from the same allocator state, usually gets those bytes back, so that
    a byte its kernel does not write shows up. Usually, not always: a freed block merges with free neighbours,
    and best fit may then prefer a smaller free block elsewhere, so a run that misses is poisoned in turn and
    the call repeated (at most `attempts` runs after the first). Returns the last run's outputs and, per
    output, whether it landed on the previous run's storage (test_quant_gpu.py::test_gpu_outputs_land_on_the_poison
    checks that it does)."""
    outs = call()
    for _ in range(attempts):
        ptrs = []
        for t in outs:
            storage = t.untyped_storage()
            ptrs.append(storage.data_ptr())
            torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage).fill_(POISON_BYTE)
            del storage
        del outs, t
        outs = call()
        landed = [o.untyped_storage().data_ptr() == p for o, p in zip(outs, ptrs)]
        if all(landed):
            break
    return outs, landed


def capture_graph(fn, warmup: int = 1) -> Tuple["torch.cuda.CUDAGraph", object]:
    """fn() run `warmup` times on a side stream (lazy initialisation, autograd's and the allocator's first
    calls stay outside the graph), then captured: (the graph, what the captured call returned, whose tensors
    every replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


# ------------------------------------------------------------------ multi-process (gloo) ----------------


def spawn_ranks(worker, world: int, tmp: Path, *args) -> List[object]:
    """Runs `worker(rank, init_file, out_dir, *args)` in `world` spawned processes and returns what each rank
    saved with `finish_rank`, in rank order."""
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(str(tmp / "init"), str(tmp), *args), nprocs=world, join=True)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(world)]


def finish_rank(rank: int, out_dir: str, result: object) -> None:
    """The end of a `spawn_ranks` worker: saves `result`, waits until every rank is done with its collectives
    (before any tears its connections down), and leaves without the interpreter's teardown, where gloo's and
    autograd's threads now and then abort a finished worker ("terminate called without an active
    exception"). The results are on disk; the parent checks them."""
    import torch.distributed as dist

    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def value_error_messages(calls) -> Dict[str, Optional[str]]:
    """name -> the message of the ValueError that calling `calls[name]()` raised, or None when it raised none
    (for checks that run inside a spawned rank, whose results go back to the parent as data)."""
    messages: Dict[str, Optional[str]] = {}
    for name, call in calls.items():
        try:
            call()
            messages[name] = None
        except ValueError as e:
            messages[name] = str(e)
    return messages
