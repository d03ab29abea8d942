"""Printing a rounding error so that it reads the same on every CPU's test run.

Used by every notebook that shows the size of a float error (01, 02, 03, 06, 07).

A difference of two float computations, a determinant minus one, a norm error: its size is
worth showing (how far from exact is float32 here?), but its digits are not a property of the
mathematics. Another CPU sums in another order (another SIMD width, another BLAS blocking) and
gets another last bit; even the decade moves when a value sits near a power of ten, and a
difference that is exactly 0 on one machine is 1e-7 on another. So the series prints every
such size through :func:`roundoff`, whose output has one fixed shape, ``2.4e-07 [round-off]``,
and ``tests/nbval_sanitize.cfg`` masks exactly that shape when nbval compares a re-run with the
committed notebook. What nbval compares digit for digit is the asserted bound printed beside
it (``asserted <= 1e-5``), which holds on every CPU.

Rule for a cell that shows a round-off size: ``assert err <= bound`` (never an assert on where
``err`` falls below the bound), then ``print(f"... {roundoff(err)} (asserted <= {bound})")``.
"""
from __future__ import annotations

import math
from typing import Union

import torch

__all__ = ["ROUNDOFF_TAG", "roundoff"]

ROUNDOFF_TAG = "[round-off]"


def roundoff(err: Union[float, int, torch.Tensor]) -> str:
    """The size of a rounding error as ``'2.4e-07 [round-off]'`` (two significant digits).

    Args:
        err: a finite number, or a tensor with one element (e.g. ``(a - b).abs().max()``).
            Exactly zero prints as ``'0 [round-off]'``: on another CPU the same
            difference may not be zero, so it is masked like any other size.

    Returns:
        A string of the fixed shape ``<number> [round-off]`` that ``tests/nbval_sanitize.cfg``
        masks; the number is ``f"{err:.1e}"`` or ``0``.

    Raises:
        TypeError: ``err`` is not a real number or a one-element real tensor.
        ValueError: ``err`` is NaN or infinite (that is a bug, not a rounding error).
    """
    if isinstance(err, torch.Tensor):
        if err.numel() != 1 or err.is_complex():
            raise TypeError(f"err must be a number or a one-element real tensor, got a tensor of shape "
                            f"{tuple(err.shape)} and dtype {err.dtype}")
        err = err.item()
    if isinstance(err, bool) or not isinstance(err, (int, float)):
        raise TypeError(f"err must be a real number, got {type(err).__name__} ({err!r})")
    if not math.isfinite(err):
        raise ValueError(f"err must be finite (a NaN or infinite error is a bug, not a rounding error), got {err}")
    return f"0 {ROUNDOFF_TAG}" if err == 0 else f"{err:.1e} {ROUNDOFF_TAG}"
