"""Build recipe of wgrad: the one place that lists sources and compiler flags.

CMakeLists.txt asks this file for the same lists (`python setup.py --print-cmake-config`), so nothing
here is repeated by hand.

The extension is built against torch's stable ABI (TORCH_TARGET_VERSION, csrc/common/stable.h) and Python's
limited API, so one wheel, cp310-abi3, serves every torch from TORCH_TARGET on and every CPython from 3.10
on (docs/decisions/0031-stable-abi-abi3-wheel.md). The version comes from git (`git describe`, PEP 440) and is
written with the build's facts into python/wgrad/_version.py (not in git), which `python -m wgrad info` prints.

Environment:
  CUTLASS_DIR   a CUTLASS checkout (its include/ is used) instead of the
                headers shipped in the pinned `nvidia-cutlass` wheel.
  MAX_JOBS      parallel compile jobs (read by torch's ninja build).
  NVCC_THREADS  nvcc's own --threads (default 1).
  WGRAD_DIAG_VARIANTS=1  a measurement build (-DWGRAD_DIAG_VARIANTS): the GEMM then reads the knob
                WGRAD_DIAG, whose bits drop parts of the work (wrong results; timing only, see
                csrc/kernels/common/diag.h). Never for a build that is used or shipped.
"""

import importlib.util
import json
import os
import platform
import pprint
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent

# Every translation unit of the extension. Host entries (torch's stable ABI) live in csrc/ (registration,
# checks), csrc/common/, csrc/gemm/ and csrc/quant/; device code lives in csrc/kernels/ and never includes torch.
SOURCES = [
    "csrc/registration.cpp",
    "csrc/checks.cpp",
    "csrc/common/device.cpp",
    "csrc/gemm/dense.cu",
    "csrc/gemm/grouped_packed.cu",
    "csrc/gemm/grouped_contiguous.cu",
    "csrc/gemm/m_grouped.cu",
    "csrc/quant/plan.cpp",
    "csrc/quant/rowwise.cu",
    "csrc/quant/colwise.cu",
    "csrc/quant/segments.cu",
    "csrc/quant/blockwise.cu",
]

# Torch-free C++ tests (tests/cpp: the test files and their harness), built by CMake only.
CPP_TEST_SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "cpp").glob("*.cpp"))

# The architectures compiled. The kernels use wgmma and setmaxnreg: sm_90a (the arch-specific target), not
# plain sm_90. A Blackwell build adds "100a" here once kernels for it exist; the flags and the build facts
# of python/wgrad/_version.py follow this list.
CUDA_ARCHS = ["90a"]
CUDA_ARCH_FLAGS = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]

# The oldest torch the extension loads in. The host layer calls torch only through its stable C shim
# (csrc/common/stable.h), and the headers of a newer torch hide every API this version does not have.
TORCH_TARGET = (2, 11)
# Python's limited API (3.10 on): one binary for every CPython from 3.10; the wheel's tag says cp310-abi3.
PY_LIMITED_API = "cp310"
STABLE_ABI_DEFINES = [
    f"-DTORCH_TARGET_VERSION=0x{TORCH_TARGET[0]:02x}{TORCH_TARGET[1]:02x}000000000000",
    "-DPy_LIMITED_API=0x030A0000",
    # The C shim declares its CUDA functions (the current stream) only under USE_CUDA.
    "-DUSE_CUDA",
]

# Compiled into every translation unit, device or host (the C++ tests check the same layouts the
# kernels use): CuTe's WGMMA atoms for every N that is a multiple of 8 (64x80, 64x72, ...).
DEFINES = ["-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"]

CXX_FLAGS = ["-O3", "-std=c++20", "-DNDEBUG"] + DEFINES

NVCC_FLAGS = [
    "-O3",
    "-std=c++20",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-lineinfo",
    # Register and spill report of every kernel in every build log.
    "-Xptxas=-v",
    # CUTLASS wants these so that its half/bfloat16 types do not fight torch's.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
] + DEFINES + CUDA_ARCH_FLAGS

# A toolchain that links libstdc++ statically (the device image's /opt/gcc) would otherwise export its
# own std::ostream next to torch's and crash inside a check's message formatting.
LINK_FLAGS = ["-Wl,--exclude-libs,ALL"]

# The wheel's platform tag is manylinux_X_Y for the newest glibc symbol version the built library needs
# (bdist_wheel reads it off the library: the tag is what the build is), never below 2.28, which torch's own
# wheels need. Built on Debian 12 (glibc 2.36) it is 2.34 (dlsym, which torch's stable headers call) and
# 2.32 (__libc_single_threaded, from libstdc++'s headers); a manylinux_2_28 build image gives 2.28.
MANYLINUX_FLOOR = (2, 28)


def cutlass_include_dirs():
    """CUTLASS/CuTe headers: $CUTLASS_DIR, else the pinned nvidia-cutlass wheel."""
    override = os.environ.get("CUTLASS_DIR")
    if override:
        base = Path(override)
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or spec.submodule_search_locations is None:
            raise RuntimeError(
                "CUTLASS headers not found: `pip install nvidia-cutlass==4.2.0.0` or set CUTLASS_DIR "
                "to a CUTLASS checkout (see third_party/README.md)"
            )
        base = Path(list(spec.submodule_search_locations)[0]) / "source"
    include = base / "include"
    if not (include / "cute").is_dir():
        raise RuntimeError(f"CUTLASS headers not found: {include}/cute does not exist")
    return [str(include)]


def cuda_library_include_dirs():
    """Headers of the CUDA libraries that torch's pip wheels ship under site-packages/nvidia/cu13/include (a
    minimal toolkit, compiler only, lacks cusparse.h, cublas_v2.h, ...). ATen needed them; the stable ABI
    does not, but the folder stays first on the include path: the kernels' measured machine code was built
    with the CUDA headers found there."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    dirs = []
    for base in spec.submodule_search_locations:
        for sub in ("cu13/include", "cu12/include"):
            d = Path(base) / sub
            if (d / "cusparse.h").exists():
                dirs.append(str(d))
    return dirs[:1]


INCLUDE_DIRS = [str(ROOT / "csrc")]


def cmake_config():
    return {
        "include_dirs": INCLUDE_DIRS + cutlass_include_dirs(),
        "cxx_flags": CXX_FLAGS,
        "cpp_test_sources": CPP_TEST_SOURCES,
        "extension_sources": SOURCES,
    }


def nvcc_threads_flags():
    n = os.environ.get("NVCC_THREADS", "1")
    return [f"--threads={int(n)}"]


def nvcc_keep_flags():
    """nvcc names its intermediate files tmpxft_<process id>_..., and those names reach the library (the
    static initialisers' symbols, the fatbin): two builds of one commit would differ. Kept in build/nvcc,
    they are named after their source file instead, and the library is the same bytes every time."""
    keep = ROOT / "build" / "nvcc"
    keep.mkdir(parents=True, exist_ok=True)
    return ["--keep", f"--keep-dir={keep}"]


def deterministic_nvcc():
    """Runs nvcc with address-space randomisation off (setarch -R), through PYTORCH_NVCC, unless that is set
    or setarch cannot. cicc 13.0 compiles segments.cu's kernels on float x in one of several forms (a
    shared-memory load split in two or not) depending on where its allocations land, so two builds of one
    commit differed; with fixed addresses every build gives the same machine code."""
    setarch = shutil.which("setarch")
    machine = platform.machine()
    if "PYTORCH_NVCC" in os.environ or setarch is None:
        return
    if subprocess.run([setarch, machine, "-R", "true"], capture_output=True).returncode != 0:
        return
    from torch.utils.cpp_extension import CUDA_HOME

    os.environ["PYTORCH_NVCC"] = shlex.join([setarch, machine, "-R", os.path.join(CUDA_HOME or "", "bin", "nvcc")])


def diag_flags():
    return ["-DWGRAD_DIAG_VARIANTS"] if os.environ.get("WGRAD_DIAG_VARIANTS") == "1" else []


def build_extension():
    from torch.utils.cpp_extension import CUDAExtension

    deterministic_nvcc()
    return CUDAExtension(
        name="wgrad._C",
        sources=SOURCES,
        include_dirs=INCLUDE_DIRS + cutlass_include_dirs() + cuda_library_include_dirs(),
        extra_compile_args={
            "cxx": CXX_FLAGS + STABLE_ABI_DEFINES,
            "nvcc": NVCC_FLAGS + STABLE_ABI_DEFINES + nvcc_threads_flags() + nvcc_keep_flags() + diag_flags(),
        },
        extra_link_args=LINK_FLAGS,
        # No libtorch_python: the library talks to torch through the stable C shim and to Python through
        # the limited API alone.
        py_limited_api=True,
    )


# ---- version and build facts ------------------------------------------------------------------------------

# The version of a source tree without git history (an unpacked archive). A release is a tag vX.Y.Z.
BASE_VERSION = "0.1.0"


def _git(*args):
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def git_version():
    """The PEP 440 version of this checkout, or None outside git:
    on a release tag vX.Y.Z: X.Y.Z; N commits after it: X.Y.Z.postN+g<sha>; no release tag in the history:
    BASE_VERSION.devN+g<sha> (N: the commits of the history); local changes add .dirty to the local part."""
    sha = _git("rev-parse", "--short=9", "HEAD")
    if sha is None:
        return None
    dirty = ".dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""
    described = _git("describe", "--tags", "--long", "--match", "v[0-9]*")
    m = re.fullmatch(r"v(\d+(?:\.\d+)*)-(\d+)-g[0-9a-f]+", described or "")
    if m:
        release, distance = m.group(1), int(m.group(2))
        if distance == 0 and not dirty:
            return release
        return f"{release}.post{distance}+g{sha}{dirty}"
    distance = int(_git("rev-list", "--count", "HEAD") or 0)
    return f"{BASE_VERSION}.dev{distance}+g{sha}{dirty}"


def nvcc_version():
    """The CUDA release of the nvcc that compiles the kernels ("13.0"), or None."""
    from torch.utils.cpp_extension import CUDA_HOME

    try:
        out = subprocess.run([os.path.join(CUDA_HOME or "", "bin", "nvcc"), "--version"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def write_version_file(version):
    """python/wgrad/_version.py: the version and the facts of this build (no time stamp, no path: two builds
    of one commit with one toolchain write the same file)."""
    import torch

    build = {
        "torch": torch.__version__,
        "cuda": nvcc_version(),
        "torch_target": ".".join(map(str, TORCH_TARGET)),
        "python_limited_api": PY_LIMITED_API,
        "cuda_archs": [f"sm_{a}" for a in CUDA_ARCHS],
        "cuda_arch_flags": CUDA_ARCH_FLAGS,
        "git_commit": _git("rev-parse", "HEAD"),
        "diag_variants": bool(diag_flags()),
    }
    text = (
        "# Written by setup.py at build time (not in git): what `python -m wgrad info` reports of this build.\n"
        f"__version__ = {version!r}\n"
        f"BUILD = {pprint.pformat(build, sort_dicts=False)}\n"
    )
    path = ROOT / "python" / "wgrad" / "_version.py"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def glibc_versions_needed(library):
    """The GLIBC_x.y symbol versions a shared library needs (objdump -T), as sorted tuples."""
    out = subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True).stdout
    return sorted({tuple(map(int, v.split("."))) for v in re.findall(r"\bGLIBC_(\d+\.\d+(?:\.\d+)?)\b", out)})


def manylinux_tag(libraries):
    """manylinux_X_Y_x86_64 for the newest glibc version any of `libraries` needs, at least MANYLINUX_FLOOR."""
    newest = max([MANYLINUX_FLOOR] + [v[:2] for lib in libraries for v in glibc_versions_needed(lib)])
    return "manylinux_{}_{}_x86_64".format(*newest)


def bdist_wheel_class():
    """bdist_wheel that tags the wheel cp310-abi3 (Python's limited API) and manylinux_X_Y_x86_64 (the glibc
    the built library needs)."""
    from setuptools.command.bdist_wheel import bdist_wheel

    class AbiThreeManylinuxWheel(bdist_wheel):
        def initialize_options(self):
            super().initialize_options()
            self.py_limited_api = PY_LIMITED_API

        def get_tag(self):
            # (bdist_wheel asks once the library is built and installed into its staging folder.)
            self.plat_name = manylinux_tag(self.get_finalized_command("build_ext").get_outputs())
            self.plat_name_supplied = True
            return super().get_tag()

    return AbiThreeManylinuxWheel


if __name__ == "__main__" and sys.argv[1:] == ["--print-cmake-config"]:
    print(json.dumps(cmake_config()))
    sys.exit(0)

if __name__ == "__main__":
    from torch.utils.cpp_extension import BuildExtension

    VERSION = git_version() or BASE_VERSION
    write_version_file(VERSION)
    setup(
        name="wgrad",
        version=VERSION,
        description="FP8 weight-gradient GEMMs (1x128 scaling) for NVIDIA Hopper",
        packages=find_packages("python"),
        package_dir={"": "python"},
        ext_modules=[build_extension()],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True), "bdist_wheel": bdist_wheel_class()},
        python_requires=">=3.10",
        install_requires=["torch>={}.{}".format(*TORCH_TARGET)],
        zip_safe=False,
    )
