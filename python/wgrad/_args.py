"""Checks of plain Python arguments shared by the entry points: an argument that is not what the op
takes raises ValueError naming it, the expected and the actual value, instead of being converted into
something else (`int(128.9)` is 128, `int(True)` is 1, an int64 2^32 + 100 cast to int32 is 100)."""

from __future__ import annotations

import operator
from typing import List

import torch

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def as_int(value, name: str, expected: str = "an integer") -> int:
    """`value` as a Python int when it is an integer (int, NumPy integer, integer 0-d tensor); a float,
    a bool or anything else raises ValueError."""
    if not isinstance(value, bool) and not (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ValueError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")


def as_ints(values, name: str) -> List[int]:
    """`[as_int(v, f"{name}[i]") for i, v in enumerate(values)]`: a list of plain ints passes as it is (no name
    is formatted per element: a call with 64 group sizes stays a few microseconds); anything else goes element
    by element, the first non-integer named."""
    values = list(values)
    if set(map(type, values)) <= {int}:  # (bool is not int here: type(True) is bool)
        return values
    return [as_int(v, f"{name}[{i}]") for i, v in enumerate(values)]


def check_int32(value: int, name: str) -> None:
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{name} must fit in int32 (-2^31 .. 2^31 - 1), got {value}")


def check_non_negative(value, name: str) -> None:
    """Raises for a negative plain integer. Symbolic sizes (torch.compile) are left alone: they come from
    tensor shapes, and a comparison would add a guard to the compiled graph."""
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
