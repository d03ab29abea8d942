"""Argument checks shared by the reference modules: one copy of each rule.

Each public entry point of :mod:`helpers` validates its arguments once, here, and names the
argument and the rule in its error; the code after the checks computes. Not taught by a
notebook: read it only to see what a rule says.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

__all__ = [
    "check_int", "check_number", "check_fraction", "check_choice", "check_tensor", "check_even",
]


def check_int(n: Any, name: str, minimum: int = 1) -> int:
    """``n`` is an ``int`` (not a ``bool``) and ``n >= minimum``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__} ({n!r})")
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def check_number(x: Any, name: str, rule: str = "a finite number > 0") -> float:
    """``x`` is a real number (not a ``bool``), finite and > 0; ``rule`` words the error."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(x).__name__} ({x!r})")
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be {rule}, got {x}")
    return float(x)


def check_fraction(p: Any, name: str) -> float:
    """``p`` is a probability in ``[0, 1)`` (a dropout rate, a smoothing weight)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(p).__name__} ({p!r})")
    if not (0.0 <= p < 1.0):
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def check_choice(value: Any, name: str, choices: Sequence[Any]) -> Any:
    """``value`` is one of ``choices``."""
    if value not in tuple(choices):
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_tensor(
    x: Any, name: str, *, dim: Optional[int] = None, min_dim: Optional[int] = None, floating: bool = False
) -> torch.Tensor:
    """``x`` is a tensor; optionally exactly ``dim`` or at least ``min_dim`` dimensions, floating point."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(x.shape)}")
    if min_dim is not None and x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def check_even(n: Any, name: str, why: str = "") -> int:
    """``n`` is an even ``int`` >= 2 (a dimension split into pairs); ``why``, if given, says why in the error."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__} ({n!r})")
    if n < 2 or n % 2:
        raise ValueError(f"{name} must be {'>= 2' if n < 2 else 'even'}{f' ({why})' if why else ''}, got {n}")
    return n
