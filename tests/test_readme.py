"""The README's quantize-then-GEMM block (Usage), run as written on the CPU: the casts and the GEMMs wired the
way the README says compute the weight gradients (dense and per expert) within FP8's error of the float64
product of the bf16 inputs, and leave an empty expert's gradient untouched; and the same block compiled as
one graph by torch.compile (the Python functions trace: no host-only calls such as data_ptr)."""

import pathlib
import re

import torch

import wgrad

from helpers import rel_frobenius

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _readme_block(marker):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"one python block of the README holds {marker!r}, found {len(found)}"
    return found[0]


def _check_recipe(run):
    """run(env) executes the block with env's names; checks what it leaves in main_grad, out and k."""
    g = torch.Generator().manual_seed(5)
    t, n_out, n_in = 1024, 256, 384
    dy = torch.randn(t, n_out, generator=g).to(torch.bfloat16)
    x = torch.randn(t, n_in, generator=g).to(torch.bfloat16)
    main_grad0 = torch.randn(n_out, n_in, generator=g)
    counts = [300, 0, 17, 707]
    out0 = torch.randn(len(counts), n_out, n_in, generator=g)
    env = {"torch": torch, "wgrad": wgrad, "x": x, "dy": dy, "main_grad": main_grad0.clone(),
           "sizes": torch.tensor(counts, dtype=torch.int32), "out": out0.clone()}
    run(env)

    assert rel_frobenius(env["main_grad"] - main_grad0, dy.double().T @ x.double()) < 0.06
    start = 0
    for e, count in enumerate(counts):
        grad = env["out"][e] - out0[e]
        if count == 0:
            assert torch.equal(env["out"][e], out0[e]), "an empty expert's gradient is left as it was"
        else:
            rows = slice(start, start + count)
            assert rel_frobenius(grad, dy[rows].double().T @ x[rows].double()) < 0.06, f"expert {e}"
        start += count
    # The padded sizes: each count rounded up to a multiple of 32 (K = floor((T + G 31) / 32) 32 = 1120 columns
    # hold them; the GEMM does not read the zero columns past their sum).
    assert env["k"].tolist() == [320, 0, 32, 736]


def test_readme_quantize_then_gemm_block():
    code = compile(_readme_block("quantize_fp8_1x128_colwise(dy)"), str(README), "exec")
    _check_recipe(lambda env: exec(code, env))


def test_readme_block_compiles_to_one_graph():
    body = "".join(f"    {line}\n" for line in _readme_block("quantize_fp8_1x128_colwise(dy)").splitlines())
    source = f"def step(x, dy, main_grad, sizes, out):\n{body}    return k\n"
    namespace = {"torch": torch, "wgrad": wgrad}
    exec(compile(source, str(README), "exec"), namespace)
    step = torch.compile(namespace["step"], backend="aot_eager", fullgraph=True)

    def run(env):
        env["k"] = step(env["x"], env["dy"], env["main_grad"], env["sizes"], env["out"])

    _check_recipe(run)


def _standalone_blocks():
    """The README's python blocks that stand on their own (they import what they use)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if b.startswith("import ")]


def test_readme_standalone_blocks_run():
    blocks = _standalone_blocks()
    assert len(blocks) >= 2, "the GEMM quickstart and the layers' block"
    for block in blocks:
        env = {}
        exec(compile(block, str(README), "exec"), env)
    # The layers' block: main_grad received the weight gradient, the experts' weights theirs.
    assert env["layer"].weight.grad is None and env["layer"].weight.main_grad.abs().sum() > 0
    assert env["experts"].weight.grad.shape == (8, 128, 256) and torch.all(env["experts"].weight.grad[1] == 0)
    linears = [m for m in env["model"].modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 2 and all(type(m) is wgrad.nn.Fp8Linear and m.weight.grad is not None for m in linears)
