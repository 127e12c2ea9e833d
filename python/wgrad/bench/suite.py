"""The registry of benchmark suites: what `python -m wgrad bench` can run.

A suite is one family of measurements with its own options, tables and JSON keys (the GEMMs, the
quantization kernels). The command line asks every registered suite, in order, to add its options,
to plan a run from the parsed arguments, to run, to print its part of the report and to add its keys
to the JSON document. A new suite plugs in by defining a `Suite` and adding it to `SUITES` (in
`wgrad.bench.cli`); nothing else in the command line changes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Dict, List

from .common import ProgressFn


class SuiteRun:
    """One suite's part of one command line. `wanted` says whether it runs; the rest is called either
    way (a suite that did not run still reports its JSON keys, empty, so documents keep one shape)."""

    wanted: bool = False

    def run(self, args: argparse.Namespace, progress: ProgressFn) -> None:
        """Measures; rows go into this object as they are made, so that a CUDA fault (raised from here)
        loses none of them."""

    def report(self) -> List[str]:
        """Lines of the printed report (each part starts with an empty line)."""
        return []

    def json(self) -> Dict[str, object]:
        """Keys of the JSON document."""
        return {}

    def failed_count(self) -> int:
        """Rows whose check failed (summed into the document's `failed`)."""
        return 0

    def failure_lines(self) -> List[str]:
        """`FAIL: ...` lines for stderr."""
        return []

    def incomplete(self) -> bool:
        """Asked for but could not run at all (the exit status is then 1)."""
        return False


@dataclass(frozen=True)
class Suite:
    name: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    # True when the command line names this suite (any of its options is given).
    asked: Callable[[argparse.Namespace], bool]
    # (args, by_default) -> the run; by_default is True when the command line names no suite at all.
    plan: Callable[[argparse.Namespace, bool], SuiteRun]
