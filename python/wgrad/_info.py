"""`python -m wgrad info`: which wgrad this is and where it runs. The build's facts come from _version.py
(written by setup.py); the rest from the torch and the GPU found at run time."""

from __future__ import annotations

from pathlib import Path

import torch

from . import _version

# The compute capability the kernels are built for (csrc/common/device.cpp checks the same).
SM90 = (9, 0)


def _gpu_lines() -> list[str]:
    if not torch.cuda.is_available():
        return ["GPU     none (the CPU kernels, the reference math, run every op)"]
    lines = []
    for i in range(torch.cuda.device_count()):
        cc = torch.cuda.get_device_capability(i)
        runs = "runs the CUDA kernels" if cc == SM90 else "not SM90: the CUDA ops reject its tensors"
        lines.append(f"GPU {i}   {torch.cuda.get_device_name(i)}, compute capability {cc[0]}.{cc[1]} ({runs})")
    return lines


def report() -> str:
    build = _version.BUILD
    package = Path(_version.__file__).resolve().parent
    lines = [
        f"wgrad   {_version.__version__} ({package})",
        f"  built with torch {build['torch']} and CUDA {build['cuda']}, for {', '.join(build['cuda_archs'])}"
        + (" (measurement build: WGRAD_DIAG variants)" if build.get("diag_variants") else ""),
        f"  stable ABI: loads in torch >= {build['torch_target']}; Python limited API: "
        f"{build['python_limited_api']}-abi3",
        f"  arch flags: {' '.join(build['cuda_arch_flags'])}",
        f"  git commit: {build['git_commit'] or 'unknown'}",
        f"torch   {torch.__version__} (CUDA {torch.version.cuda or 'none'})",
    ]
    return "\n".join(lines + _gpu_lines())


def run_cli(args) -> int:
    print(report())
    return 0
