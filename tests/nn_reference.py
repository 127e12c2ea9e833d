"""float64 emulations of the FP8 layers' recipe, independent of the layers' code paths: the casts by the
reference rules of wgrad.reference, every product in float64 on the dequantized operands."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from wgrad import reference as R


def _dq_rows(t: torch.Tensor) -> torch.Tensor:
    """t [M, K] cast 1x128 along K, dequantized in float64."""
    q, s = R.quantize_fp8_1x128_rowwise_reference(t)
    return R.dequantize_1x128(q, s)


def _dq_cols(t: torch.Tensor) -> torch.Tensor:
    """t [T, C] cast 1x128 along T (the tokens), dequantized in float64 and transposed back: [T, C]."""
    q_t, s_t = R.quantize_fp8_1x128_colwise_reference(t)
    return R.dequantize_1x128(q_t, s_t).t()


def _dq_weight(w: torch.Tensor) -> torch.Tensor:
    q, s = R.quantize_fp8_128x128_reference(w)
    return R.dequantize_128x128(q, s)


def linear(x2: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], dy: torch.Tensor):
    """(y, dx, dw, db) of the dense layer for x [T, in], w [out, in], dy [T, out]; y and dx rounded to x's dtype
    as the layer returns them, dw and db in float64."""
    wd = _dq_weight(w)
    y = (_dq_rows(x2) @ wd.t()).to(x2.dtype)
    if b is not None:
        y = y + b.to(y.dtype)
    dx = (_dq_rows(dy) @ wd).to(x2.dtype)
    dw = _dq_cols(dy).t() @ _dq_cols(x2)
    db = dy.double().sum(0)
    return y, dx, dw, db


def grouped(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], sizes: Sequence[int], dy: torch.Tensor):
    """(y, dx, dw, db) of the grouped layer: fprop and dgrad per expert from the row-wise casts of x and dY and
    the expert's 128x128 weight cast, rounded to bf16 (the expert GEMM's output) and then to x's dtype; dw per
    expert from the column-wise casts of the expert's rows (blocks restart at every expert), float64."""
    y = torch.zeros((x.shape[0], w.shape[1]), dtype=x.dtype)
    dx = torch.zeros_like(x)
    dw = torch.zeros(w.shape, dtype=torch.float64)
    db = torch.zeros((w.shape[0], w.shape[1]), dtype=torch.float64)
    start = 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + size)
        start += size
        if size == 0:
            continue
        wd = _dq_weight(w[g])
        y[rows] = (_dq_rows(x[rows]) @ wd.t()).to(torch.bfloat16).to(x.dtype)
        if b is not None:
            y[rows] = y[rows] + b[g].to(x.dtype)
        dx[rows] = (_dq_rows(dy[rows]) @ wd).to(torch.bfloat16).to(x.dtype)
        dw[g] = _dq_cols(dy[rows]).t() @ _dq_cols(x[rows])
        db[g] = dy[rows].double().sum(0)
    return y, dx, dw, db


def train_losses(model, data, steps: int, lr: float = 1e-3):
    """The loss of every step of `steps` AdamW steps over `data` (pairs of input and target, taken in turn),
    MSE in fp32: what the training tests compare between an FP8 model and its bf16 twin."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for step in range(steps):
        x, target = data[step % len(data)]
        loss = torch.nn.functional.mse_loss(model(x).float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
