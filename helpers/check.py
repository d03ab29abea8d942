r"""The "write MHA from memory" exercise: a checker that diagnoses the usual mistakes.

Used in section 8 of ``notebooks/03_mha_from_scratch.ipynb``: the learner fills in a
class with the interface of :data:`SCAFFOLD`, then ``check_mha(MyMHA)`` runs it against
the reference :class:`helpers.attention.MultiHeadAttention` with the same weights and,
when the numbers differ, names the mistake by re-running the learner's weights through
each planted bug (:data:`PLANTED_BUGS`) and reporting the one that reproduces the
learner's output exactly.

The interface the checker expects (the one of the study notes):

* ``cls(d_model, num_heads)`` builds the module;
* attributes ``linear_q``, ``linear_k``, ``linear_v``, ``linear_out``, each
  ``nn.Linear(d_model, d_model)`` (with or without bias);
* ``forward(query, key, value, mask=None)`` with batch-first ``(batch, seq, d_model)``
  inputs and a bool ``mask`` ``(seq_q, seq_k)`` that is **True where attention is
  allowed**; it returns the output ``(batch, seq_q, d_model)`` or a tuple whose first
  element is the output.

Paper: Vaswani et al. (2017), sec. 3.2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .attention import MultiHeadAttention, causal_mask

__all__ = ["SCAFFOLD", "NotesMHA", "PLANTED_BUGS", "BUG_MESSAGES", "MHACheck", "check_mha"]

SCAFFOLD = '''\
class MyMHA(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.h, self.d_k = num_heads, d_model // num_heads
        self.linear_q = nn.Linear(d_model, d_model)
        self.linear_k = nn.Linear(d_model, d_model)
        self.linear_v = nn.Linear(d_model, d_model)
        self.linear_out = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        """query (B, Lq, d_model), key/value (B, Lk, d_model); mask (Lq, Lk), True = allowed."""
        B = query.size(0)
        # 1. project, then split into heads: (B, L, d_model) -> (B, h, L, d_k)
        q = ...
        k = ...
        v = ...
        # 2. scores (B, h, Lq, Lk), scaled; blocked entries -> -inf
        scores = ...
        # 3. weights: softmax over the keys; output: weights @ v -> (B, h, Lq, d_k)
        weights = ...
        out = ...
        # 4. merge heads back to (B, Lq, d_model), then the output projection
        out = ...
        return out, weights
'''


class NotesMHA(nn.Module):
    """The worked solution of the exercise, written as in the study notes.

    ``linear -> view(B, L, h, d_k).transpose(1, 2) -> softmax(QK^T / sqrt(d_k), masked) V
    -> transpose(1, 2).contiguous().view(B, L, d_model) -> linear_out``. Each step is a
    method so that the planted bugs (:data:`PLANTED_BUGS`) override exactly one of them.
    """

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        assert d_model % num_heads == 0
        self.d_model, self.h, self.d_k = d_model, num_heads, d_model // num_heads
        self.linear_q = nn.Linear(d_model, d_model)
        self.linear_k = nn.Linear(d_model, d_model)
        self.linear_v = nn.Linear(d_model, d_model)
        self.linear_out = nn.Linear(d_model, d_model)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B = x.size(0)
        return x.view(B, -1, self.h, self.d_k).transpose(1, 2)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        B = x.size(0)
        return x.transpose(1, 2).contiguous().view(B, -1, self.d_model)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1) / math.sqrt(self.d_k)

    def apply_mask(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(~mask, float("-inf"))

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores, dim=-1)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_out(x)

    def forward(self, query, key, value, mask=None):
        q = self.split(self.linear_q(query))
        k = self.split(self.linear_k(key))
        v = self.split(self.linear_v(value))
        scores = self.scores(q, k)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        weights = self.softmax(scores)
        out = self.merge(weights @ v)
        return self.project(out), weights


# ------------------------------------------------------------------ planted bugs
class MissingScale(NotesMHA):
    """Bug: scores ``Q K^T`` without the ``1/sqrt(d_k)``."""

    def scores(self, q, k):
        return q @ k.transpose(-2, -1)


class ScaleByDModel(NotesMHA):
    """Bug: scores divided by ``sqrt(d_model)`` instead of ``sqrt(d_k)``."""

    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / math.sqrt(self.d_model)


class ScaleByDk(NotesMHA):
    """Bug: scores divided by ``d_k`` instead of ``sqrt(d_k)``."""

    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / self.d_k


class WrongSplit(NotesMHA):
    """Bug: ``view(B, h, L, d_k)`` straight away, with no transpose: heads get slices of positions."""

    def split(self, x):
        B = x.size(0)
        return x.view(B, self.h, -1, self.d_k)


class WrongMerge(NotesMHA):
    """Bug: ``(B, h, L, d_k)`` reshaped to ``(B, L, d_model)`` without transposing back first."""

    def merge(self, x):
        B = x.size(0)
        return x.reshape(B, -1, self.d_model)


class MaskInverted(NotesMHA):
    """Bug: ``-inf`` where the mask is True (the ``nn.MultiheadAttention`` convention)."""

    def apply_mask(self, scores, mask):
        return scores.masked_fill(mask, float("-inf"))


class MaskIgnored(NotesMHA):
    """Bug: the mask is computed but never applied (e.g. ``scores.masked_fill(...)`` not assigned)."""

    def apply_mask(self, scores, mask):
        scores.masked_fill(~mask, float("-inf"))
        return scores


class SoftmaxOverQueries(NotesMHA):
    """Bug: softmax over the queries (``dim=-2``) instead of the keys."""

    def softmax(self, scores):
        return torch.softmax(scores, dim=-2)


class SoftmaxOverHeads(NotesMHA):
    """Bug: softmax over the heads (``dim=1``) instead of the keys."""

    def softmax(self, scores):
        return torch.softmax(scores, dim=1)


class MissingOutputProjection(NotesMHA):
    """Bug: the concatenated heads are returned without ``linear_out`` (``W^O``)."""

    def project(self, x):
        return x


#: name -> a NotesMHA subclass with exactly that mistake (the order is the order tried).
PLANTED_BUGS: dict[str, type] = {
    "missing_scale": MissingScale,
    "scale_by_d_model": ScaleByDModel,
    "scale_by_d_k": ScaleByDk,
    "wrong_split": WrongSplit,
    "wrong_merge": WrongMerge,
    "softmax_over_queries": SoftmaxOverQueries,
    "softmax_over_heads": SoftmaxOverHeads,
    "missing_output_projection": MissingOutputProjection,
    "mask_inverted": MaskInverted,
    "mask_ignored": MaskIgnored,
}

BUG_MESSAGES: dict[str, str] = {
    "missing_scale": (
        "Missing scale: the scores are Q K^T without the factor 1/sqrt(d_k). Divide by "
        "math.sqrt(d_k) with d_k = d_model // num_heads before the softmax; without it the "
        "softmax saturates as d_k grows (Vaswani et al. 2017, sec. 3.2.1)."
    ),
    "scale_by_d_model": (
        "Wrong scale: the scores are divided by sqrt(d_model) instead of sqrt(d_k). Each head's "
        "dot product has d_k = d_model // num_heads terms, so divide by math.sqrt(d_k)."
    ),
    "scale_by_d_k": (
        "Wrong scale: the scores are divided by d_k instead of sqrt(d_k). The dot product of two "
        "d_k-dimensional vectors with unit-variance entries has variance d_k, so its standard "
        "deviation is sqrt(d_k): divide by math.sqrt(d_k)."
    ),
    "wrong_split": (
        "Wrong reshape when splitting heads: x.view(B, num_heads, L, d_k) cuts the sequence, "
        "not the features, into heads. View as (B, L, num_heads, d_k) first, then transpose(1, 2) "
        "to get (B, num_heads, L, d_k)."
    ),
    "wrong_merge": (
        "Wrong transpose/reshape order when merging heads: (B, h, L, d_k) was reshaped to "
        "(B, L, d_model) without transposing back. Use out.transpose(1, 2).contiguous().view(B, L, d_model)."
    ),
    "softmax_over_queries": (
        "Softmax over the wrong axis: it normalises over the queries (dim=-2). Each query's "
        "weights over the keys must sum to 1: torch.softmax(scores, dim=-1)."
    ),
    "softmax_over_heads": (
        "Softmax over the wrong axis: it normalises over the heads (dim=1). Each query's "
        "weights over the keys must sum to 1: torch.softmax(scores, dim=-1)."
    ),
    "missing_output_projection": (
        "Missing output projection: the merged heads are returned as they are. Apply "
        "self.linear_out (W^O) after concatenating the heads."
    ),
    "mask_inverted": (
        "Mask direction inverted: here mask is True where attention is ALLOWED (the convention "
        "of F.scaled_dot_product_attention), so put -inf where it is False: "
        "scores.masked_fill(~mask, float('-inf')). (nn.MultiheadAttention's bool attn_mask is the "
        "opposite: True = blocked.)"
    ),
    "mask_ignored": (
        "The mask has no effect: the output equals the unmasked one. masked_fill is not in-place; "
        "assign its result: scores = scores.masked_fill(~mask, float('-inf'))."
    ),
}


@dataclass
class MHACheck:
    """Result of :func:`check_mha`.

    Attributes:
        passed: True if the outputs match the reference with and without a causal mask.
        diagnosis: the name of the planted bug that reproduces the learner's output
            (a key of :data:`PLANTED_BUGS`), ``"interface"`` for a wrong interface,
            ``"shape"`` for a wrong output shape, ``"unknown"`` when no bug matches, or None.
        message: a readable verdict (print it).
        max_abs_diff: the largest difference from the reference in the failing case.
    """

    passed: bool
    diagnosis: Optional[str]
    message: str
    max_abs_diff: float = 0.0

    def __str__(self) -> str:
        return self.message


def _out(result) -> torch.Tensor:
    return result[0] if isinstance(result, (tuple, list)) else result


def _same(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=1e-4, equal_nan=True)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    d = (a - b).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    return float(d.max())


def _seeded_case(learner: nn.Module, d_model: int, batch: int, seq: int, seed: int):
    """Seeded weights, written into ``learner``'s four projections, and seeded inputs.

    Returns ``(weights, (query, key, value))`` with ``weights[name] = (W, b)``.
    """
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(d_model)
    weights = {}
    with torch.no_grad():
        for name in ("linear_q", "linear_k", "linear_v", "linear_out"):
            lin = getattr(learner, name)
            w = (torch.rand(d_model, d_model, generator=g) * 2 - 1) * bound
            b = (torch.rand(d_model, generator=g) * 2 - 1) * bound if lin.bias is not None else torch.zeros(d_model)
            lin.weight.copy_(w.to(lin.weight))
            if lin.bias is not None:
                lin.bias.copy_(b.to(lin.bias))
            weights[name] = (w, b)
    # Inputs scaled up so that a missing or wrong scale changes the softmax visibly.
    inputs = tuple(torch.randn(batch, seq, d_model, generator=g) * 3 for _ in range(3))
    return weights, inputs


def _load(module: nn.Module, weights: dict) -> nn.Module:
    with torch.no_grad():
        for name, (w, b) in weights.items():
            getattr(module, name).weight.copy_(w)
            getattr(module, name).bias.copy_(b)
    return module.eval()


def _disambiguate(cls: type, bugs: list, d_model: int, num_heads: int, batch: int, seq: int,
                  seed: int, masked: bool) -> list:
    """The bugs in ``bugs`` that still reproduce ``cls`` at a second width.

    Two mistakes can coincide at one size: dividing by ``d_k`` equals dividing by
    ``sqrt(d_model)`` when ``d_model = d_k**2`` (the default 16 = 4 * 4). At the same
    ``num_heads`` and ``d_k' = d_k + 1`` (or ``+ 2``, so that ``d_k' != num_heads``), the
    two differ because ``d_k'**2 = num_heads * d_k'`` only for ``d_k' = num_heads``.
    """
    d_k = d_model // num_heads
    d_k2 = d_k + 1 if d_k + 1 != num_heads else d_k + 2
    d_model2 = num_heads * d_k2
    try:
        learner = cls(d_model2, num_heads).eval()
        weights, (q, k, v) = _seeded_case(learner, d_model2, batch, seq, seed + 1)
        m = causal_mask(seq) if masked else None
        with torch.no_grad():
            got = _out(learner(q, k, v) if m is None else learner(q, k, v, mask=m))
            return [bug for bug in bugs
                    if _same(got, _out(_load(PLANTED_BUGS[bug](d_model2, num_heads), weights)(q, k, v, mask=m)))]
    except Exception:  # the learner's class at another size: any failure means "cannot tell"
        return []


def check_mha(
    cls: type,
    d_model: int = 16,
    num_heads: int = 4,
    batch: int = 2,
    seq: int = 6,
    seed: int = 0,
) -> MHACheck:
    """Run the learner's multi-head attention class against the reference and diagnose mistakes.

    1. Build ``cls(d_model, num_heads)``; fill its four projections with seeded random
       weights and biases; copy them into :class:`~helpers.attention.MultiHeadAttention`.
    2. Compare outputs on distinct ``query``, ``key``, ``value`` ``(batch, seq, d_model)``:
       first without a mask, then with ``causal_mask(seq)`` (True = allowed).
    3. On a mismatch, load the same weights into each class of :data:`PLANTED_BUGS` and
       report the bug whose output equals the learner's (NaNs included). When several bugs
       coincide at this size (``/ d_k`` and ``/ sqrt(d_model)`` when ``d_model = d_k**2``),
       the tie is broken by running again at a second width, ``num_heads * (d_k + 1)``.

    Args:
        cls: the learner's class (interface in the module docstring).
        d_model, num_heads, batch, seq: sizes of the test (``d_model / num_heads`` > 1 and
            ``num_heads > 1`` so that every bug shows).
        seed: seed of the weights and inputs.

    Returns:
        :class:`MHACheck` (``print`` it).
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class (not an instance), got {type(cls).__name__}")
    if num_heads < 2 or d_model % num_heads != 0 or d_model // num_heads < 2 or seq < 2:
        raise ValueError(
            f"need num_heads >= 2, d_model divisible by num_heads with d_k >= 2, and seq >= 2 so "
            f"every mistake shows, got d_model={d_model}, num_heads={num_heads}, seq={seq}"
        )
    try:
        learner = cls(d_model, num_heads)
    except Exception as e:  # the learner's constructor: report, don't crash
        return MHACheck(False, "interface", f"FAIL: {cls.__name__}({d_model}, {num_heads}) raised {type(e).__name__}: {e}")
    for name in ("linear_q", "linear_k", "linear_v", "linear_out"):
        lin = getattr(learner, name, None)
        if not isinstance(lin, nn.Linear) or tuple(lin.weight.shape) != (d_model, d_model):
            return MHACheck(
                False, "interface",
                f"FAIL: {cls.__name__} needs an attribute {name} = nn.Linear(d_model, d_model) "
                f"(here nn.Linear({d_model}, {d_model})), got {lin!r}",
            )
    learner.eval()
    weights, (query, key, value) = _seeded_case(learner, d_model, batch, seq, seed)
    ref = _load(MultiHeadAttention(d_model, num_heads), weights)
    mask = causal_mask(seq)
    cases = [("without a mask", None), ("with a causal mask", mask)]

    for label, m in cases:
        with torch.no_grad():
            expected = ref(query, key, value, mask=m)[0]
            try:
                got = _out(learner(query, key, value) if m is None else learner(query, key, value, mask=m))
            except Exception as e:
                return MHACheck(False, "interface",
                                f"FAIL {label}: forward(query, key, value{', mask=mask' if m is not None else ''}) "
                                f"raised {type(e).__name__}: {e}")
        if not isinstance(got, torch.Tensor):
            return MHACheck(False, "interface", f"FAIL {label}: forward must return a tensor or a tuple "
                                                f"(output, weights), got {type(got).__name__}")
        if got.shape != expected.shape:
            return MHACheck(False, "shape", f"FAIL {label}: output shape {tuple(got.shape)}, expected "
                                            f"(batch, seq_q, d_model) = {tuple(expected.shape)}", float("inf"))
        if _same(got, expected):
            continue
        diff = _max_diff(got, expected)
        matches = []
        for bug, bug_cls in PLANTED_BUGS.items():
            with torch.no_grad():
                cand = _out(_load(bug_cls(d_model, num_heads), weights)(query, key, value, mask=m))
            if _same(got, cand) and not _same(cand, expected):
                matches.append(bug)
        if len(matches) > 1:
            matches = _disambiguate(cls, matches, d_model, num_heads, batch, seq, seed, m is not None) or matches
        if matches:
            bug = matches[0]
            return MHACheck(False, bug, f"FAIL {label} (max |diff| = {diff:.3g}). {BUG_MESSAGES[bug]}", diff)
        nan = " The output contains NaN: is a row of scores entirely -inf?" if torch.isnan(got).any() else ""
        return MHACheck(
            False, "unknown",
            f"FAIL {label} (max |diff| = {diff:.3g}), and no single common mistake reproduces it.{nan} "
            "Check in order: split (view(B, L, h, d_k).transpose(1, 2)), scale 1/sqrt(d_k), mask "
            "(-inf where mask is False), softmax(dim=-1), merge (transpose(1, 2) then view), linear_out.",
            diff,
        )
    return MHACheck(True, None, f"PASS: {cls.__name__} matches helpers.MultiHeadAttention "
                                f"(d_model={d_model}, num_heads={num_heads}) with and without a causal mask.")
