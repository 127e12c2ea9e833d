"""The torch-free C++ tests (GoogleTest, tests/cpp/), one pytest item per C++ test.

At collection the binary is configured and built with CMake into build/cpp (incrementally: a no-op when
it is up to date). If that fails, or the binary lists no test, a single failing item says why: a C++
suite that cannot run is a failure, never a silent skip.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("WGRAD_CPP_BUILD_DIR", ROOT / "build" / "cpp"))
BINARY = BUILD_DIR / "wgrad_cpp_tests"


def _run(cmd, **kwargs):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kwargs)


def _build():
    """Configures (once) and builds the test binary; returns an error text, or None."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # Serialised: several shells may collect the tests of one tree at the same time.
    with open(BUILD_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        steps = []
        if not (BUILD_DIR / "CMakeCache.txt").exists():
            steps.append(["cmake", "-S", str(ROOT), "-B", str(BUILD_DIR), f"-DWGRAD_PYTHON={sys.executable}"])
        steps.append(["cmake", "--build", str(BUILD_DIR), "-j", str(os.cpu_count() or 1)])
        for cmd in steps:
            try:
                result = _run(cmd, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"`{' '.join(cmd)}` could not run: {e}"
            if result.returncode != 0:
                return f"`{' '.join(cmd)}` failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return None


def _list_tests(binary):
    """Suite.Name of every test the binary holds (typed/parametrized names included)."""
    result = _run([str(binary), "--gtest_list_tests"], timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{binary} --gtest_list_tests failed:\n{result.stdout}\n{result.stderr}")
    names, suite = [], None
    for line in result.stdout.splitlines():
        if not line.strip() or line.startswith("Running main()"):
            continue
        entry = line.split("#")[0].rstrip()  # "  Name  # GetParam() = ..." comments
        if not line.startswith(" "):
            suite = entry
        elif suite:
            names.append(suite + entry.strip())
    return names


def _discover():
    error = _build()
    if error is not None:
        return [], error
    try:
        names = _list_tests(BINARY)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return [], str(e)
    if not names:
        return [], f"{BINARY} lists no tests"
    return names, None


CPP_TESTS, CPP_ERROR = _discover()


@pytest.mark.parametrize("name", CPP_TESTS or ["<the C++ tests could not be built or listed>"])
def test_cpp(name):
    assert CPP_ERROR is None, CPP_ERROR
    result = _run([str(BINARY), f"--gtest_filter={name}", "--gtest_color=no"], timeout=600)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-8000:]}\n{result.stderr[-4000:]}"
    # A filter that matches nothing exits 0: make sure the test really ran.
    assert "[  PASSED  ] 1 test." in result.stdout, result.stdout[-4000:]
