r"""Diagnosing checker for the causal scaled dot-product attention exercise (notebook 03).

:func:`check_causal_sdpa` runs the learner's ``attention(q, k, v, causal=False)`` against
:func:`helpers.attention.scaled_dot_product_attention` (with :func:`helpers.attention.causal_mask`
when ``causal``), which the tests pin to ``torch.nn.functional.scaled_dot_product_attention``
(``is_causal=True``), and names the mistake among :data:`SDPA_MISTAKES` when they differ.
Its worked solution is :func:`causal_sdpa_solution`. The complement of
:func:`helpers.practice.mha.check_mha` (which checks the whole module): here only the core,
:math:`\operatorname{softmax}(QK^\top/\sqrt{d_k} + M)V`.

Inputs are per head, ``(batch, heads, seq, d_k)``: the "scale by d_model" mistake divides by
:math:`\sqrt{h\,d_k}`. The causal inputs have ``Lq == Lk``; with ``Lq != Lk`` (cross-attention)
only the non-causal path is tested, since which queries a rectangular causal mask aligns to is
a convention (``F.scaled_dot_product_attention(is_causal=True)`` aligns it top-left,
``tril`` of an ``(Lq, Lk)`` matrix; a KV-cache step needs it bottom-right, see
:func:`helpers.practice.kvcache.check_kv_decode_step`).

Paper: Vaswani et al. (2017), sec. 3.2.1 and 3.2.3.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..attention import causal_mask, scaled_dot_product_attention
from .engine import CheckResult, Reject, TestInput, as_tensor_result, clone_args, run_check

__all__ = ["check_causal_sdpa", "causal_sdpa_solution", "SDPA_MISTAKES", "SDPA_ADVICE"]


def causal_sdpa_solution(q, k, v, causal=False):
    """Worked solution: ``softmax(q k^T / sqrt(d_k), blocked -> -inf) v``.

    ``q`` ``(B, h, Lq, d_k)``, ``k`` ``(B, h, Lk, d_k)``, ``v`` ``(B, h, Lk, d_v)``; with ``causal``,
    query ``i`` sees keys ``j <= i``. Returns ``(B, h, Lq, d_v)``.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        Lq, Lk = scores.shape[-2:]
        allowed = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _sdpa(q, k, v, causal, *, scale=None, mask_rule="tril", fill=float("-inf"), softmax_dim=-1):
    """The solution with one knob turned (used by the planted mistakes)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if causal:
        Lq, Lk = scores.shape[-2:]
        ones = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device)
        if mask_rule == "tril":
            scores = scores.masked_fill(~ones.tril(), fill)
        elif mask_rule == "inverted":  # -inf where the mask is True: the past blocked, the future allowed
            scores = scores.masked_fill(ones.tril(), fill)
        elif mask_rule == "diagonal":  # tril(-1): j < i only, a token cannot see itself
            scores = scores.masked_fill(~ones.tril(-1), fill)
    return torch.softmax(scores, dim=softmax_dim) @ v


def _mask_inverted(q, k, v, causal=False):
    return _sdpa(q, k, v, causal, mask_rule="inverted")


def _diagonal_masked(q, k, v, causal=False):
    return _sdpa(q, k, v, causal, mask_rule="diagonal")


def _scale_by_d_model(q, k, v, causal=False):
    return _sdpa(q, k, v, causal, scale=1 / math.sqrt(q.shape[1] * q.shape[-1]))  # sqrt(h * d_k)


def _scale_by_d_k(q, k, v, causal=False):
    return _sdpa(q, k, v, causal, scale=1 / q.shape[-1])


def _missing_scale(q, k, v, causal=False):
    return _sdpa(q, k, v, causal, scale=1.0)


def _softmax_over_queries(q, k, v, causal=False):
    return _sdpa(q, k, v, causal, softmax_dim=-2)


SDPA_MISTAKES: dict[str, Callable] = {
    "mask_inverted": _mask_inverted,
    "diagonal_masked": _diagonal_masked,
    "scale_by_d_model": _scale_by_d_model,
    "scale_by_d_k": _scale_by_d_k,
    "missing_scale": _missing_scale,
    "softmax_over_queries": _softmax_over_queries,
}

SDPA_ADVICE: dict[str, str] = {
    "mask_inverted": (
        "Causal mask inverted (mask_inverted): -inf went where the mask is True, so each query sees the "
        "future and not the past (the last query sees nothing: NaN). Block j > i: "
        "scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float('-inf')) "
        "(or masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -inf): the mask must be bool)."
    ),
    "diagonal_masked": (
        "Diagonal masked (diagonal_masked): query i may see keys j <= i, itself included; you kept only "
        "j < i (tril(-1), or triu(ones) without diagonal=1), so the first query sees nothing (NaN) and "
        "every other misses its own token. Use tril() (diagonal=0), or block "
        "torch.ones(L, L, dtype=torch.bool).triu(diagonal=1)."
    ),
    "scale_by_d_model": (
        "Wrong scale (scale_by_d_model): the scores are divided by sqrt(d_model) = sqrt(heads * d_k). "
        "Each head's dot product has d_k = q.shape[-1] terms: divide by math.sqrt(q.shape[-1])."
    ),
    "scale_by_d_k": (
        "Wrong scale (scale_by_d_k): the scores are divided by d_k, not sqrt(d_k). q.k has variance d_k "
        "for unit-variance entries, so its standard deviation is sqrt(d_k)."
    ),
    "missing_scale": (
        "Missing scale (missing_scale): the scores are q k^T without 1/sqrt(d_k), so the softmax saturates "
        "as d_k grows (Vaswani et al. 2017, sec. 3.2.1)."
    ),
    "softmax_over_queries": (
        "Softmax over the wrong axis (softmax_over_queries): dim=-2 normalises over the queries. Each "
        "query's weights over the keys must sum to 1: torch.softmax(scores, dim=-1)."
    ),
}


def _finite_fill(mask_rule: str) -> Callable:
    def sdpa(q, k, v, causal=False):
        return _sdpa(q, k, v, causal, mask_rule=mask_rule, fill=-1e9)  # a fully blocked row: uniform, not NaN

    return sdpa


#: The two mask mistakes written with a large finite fill (-1e9) instead of -inf.
_SDPA_VARIANTS = [("mask_inverted", _finite_fill("inverted")), ("diagonal_masked", _finite_fill("diagonal"))]


def _sdpa_call(f: Callable) -> Callable:
    def run(q, k, v, causal):
        args = clone_args([q, k, v])
        out = f(*args, causal=True) if causal else f(*args)
        if isinstance(out, (tuple, list)):  # (output, weights) is accepted: the output is compared
            if not out:
                raise Reject("interface", "your function returned an empty tuple; return the output tensor", float("inf"))
            out = out[0]
        return as_tensor_result(out, f"the output, a tensor of shape {tuple(q.shape[:-1]) + (v.shape[-1],)}")

    return run


def _sdpa_reference(q, k, v, causal):
    mask = causal_mask(q.shape[-2]) if causal else None
    return scaled_dot_product_attention(q, k, v, mask=mask)[0]


def _sdpa_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):  # scaled up so that a wrong scale changes the softmax visibly
        return torch.randn(*shape, generator=g) * 2

    cases = [
        ("causal, (B, h, L, d_k) = (2, 3, 5, 8)", (2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), True),
        ("causal, a batch of 1, one head, L = 7, d_k = 4", (1, 1, 7, 4), (1, 1, 7, 4), (1, 1, 7, 4), True),
        ("without a mask, Lq = 3, Lk = 7, d_v = 5 != d_k = 8", (2, 2, 3, 8), (2, 2, 7, 8), (2, 2, 7, 5), False),
        ("causal, (2, 4, 6, 6)", (2, 4, 6, 6), (2, 4, 6, 6), (2, 4, 6, 6), True),
    ]
    out = []
    for label, qs, ks, vs, causal in cases:
        out.append(TestInput(label, (draw(*qs), draw(*ks), draw(*vs), causal),
                             "attention(q, k, v, causal=True)" if causal else "attention(q, k, v)"))
    return out


def check_causal_sdpa(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's causal scaled dot-product attention against the reference.

    ``fn(q, k, v)`` and ``fn(q, k, v, causal=True)``: ``q`` ``(B, h, Lq, d_k)``, ``k``
    ``(B, h, Lk, d_k)``, ``v`` ``(B, h, Lk, d_v)``; returns
    :math:`\operatorname{softmax}(QK^\top/\sqrt{d_k} + M)V` ``(B, h, Lq, d_v)`` (or a tuple
    whose first item is it), :math:`M_{ij} = -\infty` for :math:`j > i` when ``causal``.
    Inputs: causal ``(2, 3, 5, 8)``; causal, batch of 1, one head, ``L = 7``; **non-causal
    cross-attention** ``Lq = 3``, ``Lk = 7``, ``d_v = 5``; causal ``(2, 4, 6, 6)``. Planted
    mistakes: :data:`SDPA_MISTAKES` (the two mask mistakes are recognised with ``-inf`` or a
    finite fill such as ``-1e9``).

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    return run_check(
        fn, _sdpa_call, _sdpa_reference, SDPA_MISTAKES, SDPA_ADVICE, _sdpa_inputs(seed), variants=_SDPA_VARIANTS,
        unknown_hint="Check in order: scores = q @ k.transpose(-2, -1) / sqrt(d_k); causal: -inf where j > i; "
                     "softmax(dim=-1); @ v.",
        pass_message="PASS: your attention equals helpers.scaled_dot_product_attention (= F.scaled_dot_product_"
                     "attention) on 4 inputs: causal L = 5, 6, 7 (a batch of 1), and Lq = 3 != Lk = 7 without a mask.",
    )
