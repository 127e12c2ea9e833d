"""A smoke check of the GPU-only quantization tests' Python on a machine without a GPU: CUDA is faked (the
factory functions' device="cuda", .cuda() and .to("cuda") give CPU tensors, is_available() is True, the
capability (9, 0)), so the tests run their bodies against the CPU implementations (the references). It
catches mistakes in the test code itself (a name, an argument, a helper) before device time is spent on it;
it says nothing about the kernels.

    python3 scripts/gpu_tests_on_cpu.py [-k EXPR]      (default: the quantization tests; ~7 min on 2 cores)

Expected failures, by what the CPU does differently: invalid sizes raise on the CPU (the GPU gives NaN
scales), CUDA generators and streams need a driver, and test_gpu_outputs_land_on_the_poison (the CPU has no
caching allocator). Any other failure, e.g. a NameError or TypeError in a test, is the test's own.
"""

import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _fake_cuda():
    def on_cpu(kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"

    for name in ("tensor", "full", "empty", "zeros", "ones", "randn", "rand", "randint", "arange", "full_like"):
        def factory(*args, _f=getattr(torch, name), **kwargs):
            on_cpu(kwargs)
            return _f(*args, **kwargs)
        setattr(torch, name, factory)
    to = torch.Tensor.to

    def tensor_to(self, *args, **kwargs):
        args = tuple("cpu" if isinstance(a, str) and a.startswith("cuda") else a for a in args)
        on_cpu(kwargs)
        return to(self, *args, **kwargs)

    torch.Tensor.to = tensor_to
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda *args, **kwargs: None
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *args: (9, 0)


if __name__ == "__main__":
    import pytest

    sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests")]
    _fake_cuda()
    k = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else (
        "gpu and not graph and not stream and not large and not sync and not repeated")
    files = sorted(str(f) for f in (ROOT / "tests").glob("test_quant*.py"))
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rf", "--tb=line", "-k", k, *files]))
