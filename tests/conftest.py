"""pytest set-up shared by every test file: the in-place package on sys.path, the SM90 marker."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "python", Path(__file__).resolve().parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import helpers  # noqa: E402  (needs the paths above)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an SM90 GPU (skipped cleanly without one)")
    config.addinivalue_line("markers", "large_memory: allocates several GB on the GPU (64-bit offset cases)")


def pytest_report_header(config):
    return f"wgrad tests: SM90 GPU {'found' if helpers.HAS_SM90 else 'absent: GPU tests are skipped'}"


@pytest.fixture
def sm90():
    """Skips the test unless an SM90 GPU is present; returns that device."""
    if not helpers.HAS_SM90:
        pytest.skip(helpers.NO_SM90_REASON)
    import torch

    return torch.device("cuda", torch.cuda.current_device())
