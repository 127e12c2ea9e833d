"""`python -m wgrad <command>`: the package's command line: `bench` (validate and time the GEMMs), `info` (this
build and the machine it runs on)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from . import _info
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
    info_parser = commands.add_parser("info", help="this build of wgrad (version, torch, CUDA, arch) and the GPU",
                                      description="Prints the wgrad version and its build (the torch and CUDA it "
                                      "was built with, the torch it loads in, the architectures), the torch it "
                                      "runs in and the GPUs found.")
    info_parser.set_defaults(handler=_info.run_cli)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
