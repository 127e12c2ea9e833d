"""pytest set-up shared by every test file: which wgrad is under test, the markers, the SM90 fixture.

Which wgrad: the in-place build of this checkout when it holds one (python/wgrad/_C with this
interpreter's extension suffix, what scripts/build.sh makes): <repo>/python is then put first on
sys.path. Otherwise <repo>/python stays off sys.path and the tests import the wgrad Python finds, a
package installed with pip (a wheel, `pip install .`). The in-place build wins when both exist because
the tests of a checkout belong to its sources. The report header names the package under test (and an
installed one that the in-place build hides). Tests that read files of the repository (README.md, the
C++ tests) find them next to this file in both cases.
"""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_PLACE = ROOT / "python"


def _has_in_place_build() -> bool:
    package = IN_PLACE / "wgrad"
    return any((package / f"_C{suffix}").is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _installed_origin():
    """Where `import wgrad` would load from without the in-place tree (None: nowhere)."""
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != IN_PLACE]
        spec = importlib.util.find_spec("wgrad")
    finally:
        sys.path[:] = saved
    return spec.origin if spec is not None and spec.origin else None


IN_PLACE_BUILD = _has_in_place_build()
INSTALLED = _installed_origin()
if IN_PLACE_BUILD and str(IN_PLACE) not in sys.path:
    sys.path.insert(0, str(IN_PLACE))
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import wgrad  # noqa: F401,E402
except ImportError as exc:
    raise pytest.UsageError(
        f"no usable wgrad to test: {exc}. Build it in place (./scripts/build.sh, which makes "
        f"{IN_PLACE / 'wgrad'}/_C*.so) or install it (pip install .)."
    ) from exc

import helpers  # noqa: E402  (imports wgrad: after the path set-up above)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an SM90 GPU (skipped cleanly without one)")
    config.addinivalue_line("markers", "large_memory: allocates several GB on the GPU (64-bit offset cases)")


def pytest_report_header(config):
    package = Path(wgrad.__file__).resolve().parent
    where = "in-place build" if package == IN_PLACE / "wgrad" else "installed package"
    lines = [f"wgrad under test: {package} ({where}, version {wgrad.__version__})"]
    if INSTALLED and Path(INSTALLED).resolve().parent != package:
        lines.append(f"wgrad installed at {Path(INSTALLED).resolve().parent} is not used (the in-place build wins)")
    lines.append(f"wgrad tests: SM90 GPU {'found' if helpers.HAS_SM90 else 'absent: GPU tests are skipped'}")
    return lines


@pytest.fixture
def sm90():
    """Skips the test unless an SM90 GPU is present; returns that device."""
    if not helpers.HAS_SM90:
        pytest.skip(helpers.NO_SM90_REASON)
    import torch

    return torch.device("cuda", torch.cuda.current_device())
