"""The built extension's machine code, checked without a GPU (issue 3): every GEMM kernel issues FP8
warpgroup MMAs (QGMMA) and touches no local memory (LDL/STL: register spills or stack arrays, which
would cost the mainloop dearly).

Needs cuobjdump and nvdisasm: from the CUDA toolkit, or `pip install nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm` (what .ci/run does). A missing tool fails the test with that hint.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import wgrad._C


def _tool_dir():
    """A folder holding both cuobjdump and nvdisasm (cuobjdump -sass runs nvdisasm)."""
    candidates = []
    found = shutil.which("cuobjdump")
    if found:
        candidates.append(Path(found).parent)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin")
    candidates.append(Path("/usr/local/cuda/bin"))
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += [Path(root) / "cu13" / "bin", Path(root) / "cuda_cuobjdump" / "bin"]
    for d in candidates:
        if (d / "cuobjdump").is_file() and (d / "nvdisasm").is_file():
            return d
    return None


@pytest.fixture(scope="module")
def sass():
    """{(source file, kernel name): SASS text} of every kernel in the extension; the source file as
    "family/file.cu" (e.g. "gemm/dense.cu")."""
    tools = _tool_dir()
    assert tools is not None, ("cuobjdump and nvdisasm not found (CUDA toolkit bin/ or "
                               "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`)")
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run([str(tools / "cuobjdump"), "-sass", wgrad._C.__file__], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    kernels, source, name = {}, None, None
    for line in result.stdout.splitlines():
        if m := re.match(r"\s*identifier = (.*)", line):
            source, name = "/".join(Path(m.group(1)).parts[-2:]), None
        elif m := re.match(r"\s*Function : (\S+)", line):
            name = m.group(1)
            kernels[(source, name)] = []
        elif name is not None:
            kernels[(source, name)].append(line)
    return {key: "\n".join(lines) for key, lines in kernels.items()}


def _gemm_kernels(sass):
    gemm = {key: text for key, text in sass.items() if key[0].startswith("gemm/")}
    assert gemm, f"no kernel compiled from csrc/gemm/*.cu in {wgrad._C.__file__}: {sorted(sass)}"
    return gemm


def test_every_gemm_source_holds_fp8_wgmma_kernels(sass):
    gemm = _gemm_kernels(sass)
    sources = {src for src, _ in gemm}
    for src in sources:
        qgmma = [name for (s, name), text in gemm.items() if s == src and re.search(r"\bQGMMA\b", text)]
        assert qgmma, f"{src}: no kernel issues QGMMA (FP8 wgmma): {[n for s, n in gemm if s == src]}"


def test_gemm_kernels_use_no_local_memory(sass):
    offenders = {}
    for (src, name), text in _gemm_kernels(sass).items():
        hits = re.findall(r"\b(?:LDL|STL)\b[^;]*;", text)
        if hits:
            offenders[f"{src}:{name}"] = hits[:4]
    assert not offenders, f"local memory (spills?) in GEMM kernels: {offenders}"
