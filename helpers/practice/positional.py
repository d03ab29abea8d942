r"""Diagnosing checkers for the positional-encoding exercises of notebook 06 ("write it from memory").

* :func:`check_sinusoidal` -- the learner's ``sinusoidal(n, d_model)`` table against
  :func:`helpers.model.sinusoidal_encoding` (Vaswani et al. 2017, sec. 3.5):
  :math:`PE_{(p, 2i)} = \sin(p/10000^{2i/d})`, :math:`PE_{(p, 2i+1)} = \cos(p/10000^{2i/d})`.
* :func:`check_alibi_slopes` -- the learner's ``slopes(num_heads)`` against
  :func:`helpers.model.alibi_slopes` (Press, Smith & Lewis, ICLR 2022, sec. 3, and the
  authors' ``get_slopes``): :math:`s_h = 2^{-8h/n}`, :math:`h = 1..n`, for a power of two
  :math:`n`; otherwise the slopes of the largest power of two :math:`p < n`, then every second
  slope of :math:`2p` heads.

Worked solutions: :func:`sinusoidal_solution`, :func:`alibi_slopes_solution`. Planted
mistakes: :data:`SINUSOIDAL_MISTAKES`, :data:`ALIBI_SLOPES_MISTAKES` (advice in
:data:`SINUSOIDAL_ADVICE`, :data:`ALIBI_SLOPES_ADVICE`).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..model import alibi_slopes, sinusoidal_encoding
from .engine import CheckResult, TestInput, as_tensor_result, run_check

__all__ = [
    "check_sinusoidal", "sinusoidal_solution", "SINUSOIDAL_MISTAKES", "SINUSOIDAL_ADVICE",
    "check_alibi_slopes", "alibi_slopes_solution", "ALIBI_SLOPES_MISTAKES", "ALIBI_SLOPES_ADVICE",
]


# ==================================================================== sinusoidal table
def sinusoidal_solution(n, d_model):
    """Worked solution: ``(n, d_model)``, sin on the even columns ``2i``, cos on the odd ``2i+1``,
    both of ``p / 10000**(2i/d_model)``."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]           # (n, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64)           # pair index
    angle = pos / 10000 ** (2 * i / d_model)                      # (n, d/2)
    pe = torch.zeros(n, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe


def _table(n, d_model, *, exponent=2, swapped=False, concatenated=False):
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(d_model // 2, dtype=torch.float64)
    angle = pos / 10000 ** (exponent * i / d_model)
    first, second = (torch.cos(angle), torch.sin(angle)) if swapped else (torch.sin(angle), torch.cos(angle))
    if concatenated:
        return torch.cat([first, second], dim=-1)
    return torch.stack([first, second], dim=-1).flatten(-2)


def _sin_cos_swapped(n, d_model):
    return _table(n, d_model, swapped=True)


def _exponent_i(n, d_model):
    return _table(n, d_model, exponent=1)


def _concatenated(n, d_model):
    return _table(n, d_model, concatenated=True)


def _exponent_column(n, d_model):
    return _table(n, d_model, exponent=4)  # arange(0, d, 2) (the column 2i) put into 2i/d: 10000**(4i/d)


SINUSOIDAL_MISTAKES: dict[str, Callable] = {
    "sin_cos_swapped": _sin_cos_swapped,
    "exponent_i_not_2i": _exponent_i,
    "concatenated_not_interleaved": _concatenated,
    "exponent_uses_column_index": _exponent_column,
}

SINUSOIDAL_ADVICE: dict[str, str] = {
    "exponent_uses_column_index": (
        "Column index in the exponent (exponent_uses_column_index): your i runs over the even columns "
        "(arange(0, d, 2), i.e. 2 x the pair index) and you still write 2i/d, so the exponent is 4 x pair/d and "
        "every pair after the first turns too slowly. With j = arange(0, d, 2) write 10000**(j/d); with the pair "
        "index i, 10000**(2i/d)."
    ),
    "sin_cos_swapped": (
        "sin and cos swapped (sin_cos_swapped): the paper puts sin on the even columns 2i and cos on the odd "
        "columns 2i+1: PE[p, 2i] = sin(p / 10000**(2i/d)), PE[p, 2i+1] = cos(...). Row 0 must read "
        "(0, 1, 0, 1, ...)."
    ),
    "exponent_i_not_2i": (
        "Wrong exponent (exponent_i_not_2i): you divide by 10000**(i/d) with i the pair index. The exponent is "
        "2i/d (equivalently j/d for the even column j = 2i), so the wavelengths run from 2*pi to about "
        "10000*2*pi over the d/2 pairs."
    ),
    "concatenated_not_interleaved": (
        "Halves instead of interleaved (concatenated_not_interleaved): [sin | cos] in two blocks is the "
        "tensor2tensor layout, the same numbers arranged differently; the paper (and this series) interleave "
        "them: sin in column 2i, cos in column 2i+1."
    ),
}


def _sin_call(f: Callable) -> Callable:
    def run(n, d_model):
        return as_tensor_result(f(n, d_model), f"a ({n}, {d_model}) tensor")

    return run


def _sin_reference(n, d_model):
    return sinusoidal_encoding(n, d_model)


def check_sinusoidal(fn: Callable) -> CheckResult:
    r"""Check the learner's ``sinusoidal(n, d_model)`` against :func:`helpers.model.sinusoidal_encoding`.

    ``fn(n, d_model)`` returns the ``(n, d_model)`` table for positions ``0 .. n-1`` (module
    docstring). Compared (``atol`` 1e-4, so a float32 computation passes) at ``(n, d_model)`` =
    (5, 8), (1, 2), (9, 6), (64, 16). Planted mistakes: :data:`SINUSOIDAL_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    inputs = [TestInput(f"at n={n}, d_model={d}", (n, d), f"sinusoidal({n}, {d})")
              for n, d in [(5, 8), (1, 2), (9, 6), (64, 16)]]
    return run_check(
        fn, _sin_call, _sin_reference, SINUSOIDAL_MISTAKES, SINUSOIDAL_ADVICE, inputs, atol=1e-4,
        unknown_hint="Check: angle[p, i] = p / 10000**(2i/d_model); sin in column 2i, cos in column 2i+1.",
        pass_message="PASS: your table equals helpers.model.sinusoidal_encoding at 4 sizes (n = 1 to 64, "
                     "d_model = 2 to 16).",
    )


# ======================================================================== ALiBi slopes
def alibi_slopes_solution(num_heads):
    """Worked solution (the authors' ``get_slopes``): a list of ``num_heads`` slopes."""
    def power_of_2(n):
        return [2 ** (-8 * k / n) for k in range(1, n + 1)]        # 2^(-8/n), 2^(-16/n), ..., 2^-8

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    p = 2 ** math.floor(math.log2(num_heads))                     # the largest power of two below
    return power_of_2(p) + power_of_2(2 * p)[0::2][: num_heads - p]


def _slopes(num_heads, *, all_as_power=False, every_second=True, k0=0, reverse=False):
    def power_of_2(n):
        return [2 ** (-8 * k / n) for k in range(1 - k0, n + 1 - k0)]

    if all_as_power or math.log2(num_heads).is_integer():
        s = power_of_2(num_heads)
    else:
        p = 2 ** math.floor(math.log2(num_heads))
        extra = power_of_2(2 * p)
        s = power_of_2(p) + (extra[0::2] if every_second else extra)[: num_heads - p]
    return s[::-1] if reverse else s


def _as_if_power_of_two(num_heads):
    return _slopes(num_heads, all_as_power=True)


def _reversed(num_heads):
    return _slopes(num_heads, reverse=True)


def _not_every_second(num_heads):
    return _slopes(num_heads, every_second=False)


def _k_from_0(num_heads):
    return _slopes(num_heads, k0=1)


def _sorted_descending(num_heads):
    return sorted(_slopes(num_heads), reverse=True)


ALIBI_SLOPES_MISTAKES: dict[str, Callable] = {
    "non_power_of_two_as_power": _as_if_power_of_two,
    "reversed_order": _reversed,
    "extra_slopes_not_every_second": _not_every_second,
    "k_starts_at_0": _k_from_0,
    "sorted_descending": _sorted_descending,
}

ALIBI_SLOPES_ADVICE: dict[str, str] = {
    "sorted_descending": (
        "Slopes sorted (sorted_descending): for a head count that is not a power of two the extra slopes are "
        "appended after the first p, not merged into a sorted list (Press et al.'s get_slopes returns "
        "slopes(p) + slopes(2p)[0::2][:n - p] as they come)."
    ),
    "non_power_of_two_as_power": (
        "A non-power-of-two head count computed as a power of two (non_power_of_two_as_power): 2^(-8k/n) for "
        "n = 6 is not ALiBi's rule. With p the largest power of two below n, take the p slopes of p heads, then "
        "the slopes 1, 3, 5, ... (every second) of 2p heads for the n - p others (Press et al., get_slopes)."
    ),
    "reversed_order": (
        "Reversed order (reversed_order): head 0 gets the steepest slope, 2^(-8/n) (1/2 for 8 heads), and the "
        "slopes decrease to 2^-8 for the last head of a power-of-two count."
    ),
    "extra_slopes_not_every_second": (
        "Extra slopes not interleaved (extra_slopes_not_every_second): for n not a power of two, the n - p "
        "extra slopes are every SECOND slope of 2p heads (get_slopes(2p)[0::2]): 2^(-4/p), 2^(-12/p), ..., "
        "one steeper than all of the first p and the others between them (appended after them, not sorted); "
        "you took the first n - p of them."
    ),
    "k_starts_at_0": (
        "Exponents start at 0 (k_starts_at_0): the first slope is 2^(-8/n), not 2^0 = 1: s_h = 2^(-8h/n) for "
        "h = 1 .. n, so the last of a power-of-two count is 2^-8."
    ),
}


def _alibi_call(f: Callable) -> Callable:
    def run(num_heads):
        return as_tensor_result(f(num_heads), f"{num_heads} slopes (a list or a tensor)")

    return run


def check_alibi_slopes(fn: Callable) -> CheckResult:
    r"""Check the learner's ALiBi ``slopes(num_heads)`` against :func:`helpers.model.alibi_slopes`.

    ``fn(num_heads)`` returns the ``num_heads`` slopes :math:`s_h` (a list of numbers or a
    tensor). Compared at 8, 2 (powers of two), 6, 12 and 5 heads. Planted mistakes:
    :data:`ALIBI_SLOPES_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    inputs = [TestInput(f"at num_heads={n}", (n,), f"slopes({n})") for n in (8, 2, 6, 12, 5)]
    return run_check(
        fn, _alibi_call, alibi_slopes, ALIBI_SLOPES_MISTAKES, ALIBI_SLOPES_ADVICE, inputs,
        unknown_hint="Check the power-of-two case first (8 and 2 heads): s_h = 2**(-8h/n) for h = 1 .. n. Then the "
                     "other counts (6, 12, 5): they reuse the slopes of the largest power of two below n and some "
                     "of twice that count (the exercise's hint says which).",
        pass_message="PASS: your slopes equal helpers.model.alibi_slopes for 8, 2, 6, 12 and 5 heads.",
    )
