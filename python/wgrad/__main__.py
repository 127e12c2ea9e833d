"""`python -m wgrad <command>`: the package's command line. One command today: `bench`."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .bench import cli as bench_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wgrad",
                                     description="wgrad: FP8 weight-gradient GEMMs for Hopper (SM90).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench_parser = commands.add_parser("bench", help="validate and time the GEMMs against cuBLAS and bf16",
                                       description=bench_cli.DESCRIPTION, epilog=bench_cli.EPILOG,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_cli.add_arguments(bench_parser)
    bench_parser.set_defaults(handler=bench_cli.run_cli)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
