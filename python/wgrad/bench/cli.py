"""`python -m wgrad bench`: the command line over the registered suites (see `suite`).

The options common to every suite (--reps, --warmup, --seed, --json) live here; each suite adds its
own. Exit status: 0 when every check passed, 1 when one failed or the run stopped, 2 without an SM90 GPU
or with bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Dict, List, Optional, Sequence

import torch

from . import experts, gemm, layers, quant
from .common import first_line, is_cuda_fault, json_safe, sm90_problem, stderr_progress
from .suite import Suite, SuiteRun
from .timing import DEFAULT_REPS, DEFAULT_WARMUP, L2_FLUSH_BYTES

# Every suite the command line knows, in the order of the report and of the JSON document.
SUITES: List[Suite] = [gemm.SUITE, quant.SUITE, layers.SUITE, experts.SUITE]

DESCRIPTION = """\
Validate, then time, wgrad's FP8 1x128-scaled weight-gradient GEMMs (out += a @ b^T, fp32 out) against
DeepGEMM (where `import deep_gemm` works), cuBLAS (torch._scaled_mm with 1x128 scales + out.add_) and a
bf16 GEMM into fp32, on an SM90 GPU, all in one process: every ratio is between rows of the same run.
Default: the 12 dense DeepSeek-V3 seed shapes (docs/performance.md)."""

EPILOG = """\
Every implementation is checked against the float64 reference (full shape, on the GPU) before it is
timed: relative Frobenius error <= 2e-4 for FP8, <= 1e-2 for bf16; a failed check prints FAIL and the
exit status is 1. Timing: median of --reps CUDA-event timings of single calls after --warmup calls,
L2 flushed (256 MiB zeroed) before each call. Exit status 2: no SM90 GPU, or bad arguments.

examples:
  python -m wgrad bench
  python -m wgrad bench --shape 4096,4096,8192 --impl ours,deepgemm --json bench.json
  python -m wgrad bench --grouped
  python -m wgrad bench --grouped-shape 16,2048,7168,1024 --reps 50
  python -m wgrad bench --short-k
  python -m wgrad bench --quant
  python -m wgrad bench --layers
  python -m wgrad bench --m-grouped"""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for suite in SUITES:
        suite.add_arguments(parser)
    parser.add_argument("--reps", metavar="N", type=positive_int, default=DEFAULT_REPS,
                        help=f"timed calls per row; the median is reported (default {DEFAULT_REPS})")
    parser.add_argument("--warmup", metavar="N", type=non_negative_int, default=DEFAULT_WARMUP,
                        help=f"untimed calls before timing (default {DEFAULT_WARMUP})")
    parser.add_argument("--seed", metavar="N", type=int, default=0, help="seed of the random operands (default 0)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="write every row, the geometric means, the device and torch version as JSON")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wgrad bench", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_arguments(parser)


def plan_from_args(args: argparse.Namespace) -> Dict[str, SuiteRun]:
    """Every suite's run for a command line (suite name -> run; `run.wanted` says whether it runs). A
    command line that names no suite runs the default: the dense seed shapes."""
    by_default = not any(suite.asked(args) for suite in SUITES)
    return {suite.name: suite.plan(args, by_default) for suite in SUITES}


def _environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": None, "sm_count": None}
    try:
        from .. import __version__ as wgrad_version
        env["wgrad"] = wgrad_version
    except ImportError:
        env["wgrad"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["device"] = props.name
        env["sm_count"] = props.multi_processor_count
    return env


def run_cli(args: argparse.Namespace) -> int:
    problem = sm90_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    runs = list(plan_from_args(args).values())
    env = _environment()
    progress = stderr_progress
    progress(f"wgrad bench on {env['device']} ({env['sm_count']} SMs), torch {env['torch']}, "
             f"{args.reps} reps after {args.warmup} warm-up, L2 flushed")
    fault = ""
    try:
        for run in runs:
            if run.wanted:
                run.run(args, progress)
    except Exception as exc:
        # A sticky CUDA error (nothing after it can run on this context) or a bug of this script: report
        # what was measured before it, and fail.
        if is_cuda_fault(exc):
            fault = f"CUDA fault, run stopped: {first_line(exc, 300)}"
        else:
            traceback.print_exc()
            fault = f"benchmark error, run stopped: {first_line(exc, 300)}"
        progress(fault)

    report: List[str] = []
    for run in runs:
        report += run.report()
    print("\n".join(report).lstrip("\n"))

    failed = sum(run.failed_count() for run in runs)
    if args.json:
        doc = dict(env, reps=args.reps, warmup=args.warmup, l2_flush_bytes=L2_FLUSH_BYTES)
        for run in runs:
            doc.update(run.json())
        doc.update(stopped_by=fault or None, failed=failed)
        with open(args.json, "w") as f:
            json.dump(json_safe(doc), f, indent=2, allow_nan=False)
        progress(f"wrote {args.json}")
    for run in runs:
        for line in run.failure_lines():
            print(line, file=sys.stderr)
    if failed or fault or any(run.incomplete() for run in runs):
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m wgrad.bench [options]` (the same as `python -m wgrad bench [options]`)."""
    return run_cli(build_parser().parse_args(argv))
