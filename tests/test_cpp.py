"""The torch-free C++ tests (tests/cpp/), one pytest item per C++ test.

At collection the binary is configured and built with CMake into build/cpp (incrementally: a no-op when
it is up to date). The build tree is configured again whenever it is not complete (no CMakeCache.txt, or
no Makefile / build.ninja: what a failed configure leaves), so a failed configure never sticks. If the
configure or the build fails, or the binary lists no test, a single failing item says why, with CMake's
output: a C++ suite that cannot run is a failure, never a silent skip.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("WGRAD_CPP_BUILD_DIR", ROOT / "build" / "cpp"))
BINARY = BUILD_DIR / "wgrad_cpp_tests"
# What each CMake generator writes once a configure has succeeded (Unix Makefiles, Ninja).
GENERATED = ("Makefile", "build.ninja")


# ------------------------------------------------------------------ the binary's interface ----------
# The only place that knows the test binary's flags and output format (tests/cpp/harness.h: GoogleTest's).


def list_command(binary: Path) -> List[str]:
    return [str(binary), "--gtest_list_tests"]


def parse_test_list(stdout: str) -> List[str]:
    """Names of every test the binary holds, from its listing (`Suite.` lines, then indented
    `Name  # GetParam() = ...` lines; typed/parametrized names included)."""
    names, suite = [], None
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("Running main()"):
            continue
        entry = line.split("#")[0].rstrip()
        if not line.startswith(" "):
            suite = entry
        elif suite:
            names.append(suite + entry.strip())
    return names


def run_command(binary: Path, name: str) -> List[str]:
    return [str(binary), f"--gtest_filter={name}", "--gtest_color=no"]


def ran_one_test(stdout: str) -> bool:
    """True when the run executed exactly one test (a filter that matches nothing also exits 0)."""
    return "[  PASSED  ] 1 test." in stdout


# ------------------------------------------------------------------ build ---------------------------


def _run(cmd, **kwargs):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kwargs)


def needs_configure(build_dir: Path) -> bool:
    """True unless `build_dir` holds a configured tree: a cache and a generator's build file."""
    return not (build_dir / "CMakeCache.txt").is_file() or not any((build_dir / f).is_file() for f in GENERATED)


def _output(result: subprocess.CompletedProcess, limit: int = 6000) -> str:
    return f"{result.stdout[-limit:]}\n{result.stderr[-limit:]}".strip()


def build(source_dir: Path = ROOT, build_dir: Path = BUILD_DIR) -> Optional[str]:
    """Configures (when the tree is not complete) and builds the test binary; returns an error text
    naming the failed step with its output, or None."""
    build_dir.mkdir(parents=True, exist_ok=True)
    # Serialised: several shells may collect the tests of one tree at the same time.
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        steps = []
        if needs_configure(build_dir):
            steps.append(("configure", ["cmake", "-S", str(source_dir), "-B", str(build_dir),
                                        f"-DWGRAD_PYTHON={sys.executable}"]))
        steps.append(("build", ["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 1)]))
        for step, cmd in steps:
            try:
                result = _run(cmd, timeout=1800)
            except FileNotFoundError:
                return "cmake not found: the C++ tests need CMake (>= 3.18) on PATH"
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"`{' '.join(cmd)}` could not run: {e}"
            if result.returncode != 0:
                return (f"CMake could not {step} the C++ tests: `{' '.join(cmd)}` exited with "
                        f"{result.returncode}; its output:\n{_output(result)}")
    return None


def _discover():
    error = build()
    if error is not None:
        return [], error
    try:
        result = _run(list_command(BINARY), timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"{BINARY} could not list its tests: {e}"
    if result.returncode != 0:
        return [], f"{BINARY} could not list its tests (exit {result.returncode}):\n{_output(result)}"
    names = parse_test_list(result.stdout)
    if not names:
        return [], f"{BINARY} lists no tests"
    return names, None


CPP_TESTS, CPP_ERROR = _discover()


@pytest.mark.parametrize("name", CPP_TESTS or ["<the C++ tests could not be built or listed>"])
def test_cpp(name):
    assert CPP_ERROR is None, CPP_ERROR
    result = _run(run_command(BINARY, name), timeout=600)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-8000:]}\n{result.stderr[-4000:]}"
    assert ran_one_test(result.stdout), result.stdout[-4000:]


# ------------------------------------------------------------------ the build steps themselves -------


def test_an_incomplete_build_tree_is_configured_again(tmp_path):
    assert needs_configure(tmp_path)
    (tmp_path / "CMakeCache.txt").write_text("")  # what a failed configure leaves behind
    assert needs_configure(tmp_path)
    for name in GENERATED:
        (tmp_path / name).write_text("")
        assert not needs_configure(tmp_path)
        (tmp_path / name).unlink()


def test_a_failed_configure_names_cmake_and_its_output_and_does_not_stick(tmp_path):
    source, build_dir = tmp_path / "src", tmp_path / "build"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(probe NONE)\n"
                                           "message(FATAL_ERROR \"wgrad probe: configure fails here\")\n")
    error = build(source, build_dir)
    assert error is not None and error.startswith("CMake could not configure the C++ tests: `cmake -S")
    assert "wgrad probe: configure fails here" in error
    assert needs_configure(build_dir)  # the next collection configures again
    (source / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(probe NONE)\n")
    assert build(source, build_dir) is None and not needs_configure(build_dir)
