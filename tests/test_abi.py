"""The build under test is the one wheel: its library reaches torch only through torch's stable C shim (so it
loads in every torch from the build's target on) and Python only through the limited API, it carries a PEP 440
version from git, and `python -m wgrad info` reports it. Read without a GPU; nm and readelf (binutils) read
the library."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.version import Version

import wgrad
import wgrad._C
from wgrad import _version

from helpers import ROOT, package_env

LIBRARY = Path(wgrad._C.__file__)


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found (binutils): it reads the library's symbols")
    return path


def _undefined_symbols():
    out = subprocess.run([_tool("nm"), "-D", "--undefined-only", str(LIBRARY)], capture_output=True, text=True,
                         check=True).stdout
    return [line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()]


def test_library_is_a_limited_api_module():
    assert LIBRARY.name == "_C.abi3.so", LIBRARY


def test_library_calls_torch_only_through_the_stable_shim():
    symbols = _undefined_symbols()
    # Mangled C++ names of ATen, c10, torch (libtorch's C++ ABI) or pybind11: none may be needed.
    cpp = [s for s in symbols if re.match(r"_ZN\d*(K)?(2at|3c10|5torch|8pybind11)", s)]
    assert not cpp, f"{LIBRARY.name} needs torch's C++ ABI: {cpp[:10]}"
    shim = [s for s in symbols if s.startswith(("aoti_torch_", "torch_"))]
    assert shim, "the library registers its ops through the stable shim (aoti_torch_*, torch_*)"


def test_library_needs_no_libtorch_python():
    out = subprocess.run([_tool("readelf"), "-d", str(LIBRARY)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    assert "libtorch_python.so" not in needed, needed
    assert not [n for n in needed if n.startswith("libpython")], needed


def test_version_is_pep440_and_the_build_is_recorded():
    assert str(Version(wgrad.__version__)) == wgrad.__version__
    build = _version.BUILD
    assert build["torch_target"] == "2.11"
    assert build["python_limited_api"] == "cp310"
    assert "sm_90a" in build["cuda_archs"]
    assert Version(torch.__version__).release[:2] >= tuple(map(int, build["torch_target"].split(".")))


def test_info_command_reports_the_build_and_the_machine():
    proc = subprocess.run([sys.executable, "-m", "wgrad", "info"], capture_output=True, text=True,
                          env=package_env(), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"wgrad   {wgrad.__version__}" in out
    assert f"torch   {torch.__version__}" in out
    assert "loads in torch >= 2.11" in out and "cp310-abi3" in out
    assert "-gencode=arch=compute_90a,code=sm_90a" in out
    assert re.search(r"^GPU", out, flags=re.M), out
