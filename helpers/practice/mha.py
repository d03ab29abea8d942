r"""The MHA exercise (Exercise 2) of ``notebooks/03_mha_from_scratch.ipynb``, and its diagnosing checker.

The learner fills in a class with the interface of :data:`SCAFFOLD`, then ``check_mha(MyMHA)``
runs it against the reference :class:`helpers.attention.MultiHeadAttention` with the same
weights, through the engine :func:`helpers.practice.engine.diagnose`, and names the mistake
among :data:`PLANTED_BUGS` when they differ. :class:`NotesMHA` is the worked solution;
:func:`planted_bug_symptoms` tabulates what the checker reports for each planted bug.

The interface the MHA checker expects (the one of the study notes):

* ``cls(d_model, num_heads)`` builds the module;
* attributes ``linear_q``, ``linear_k``, ``linear_v``, ``linear_out``, each
  ``nn.Linear(d_model, d_model)`` (with or without bias);
* ``forward(query, key, value, mask=None)`` with batch-first inputs, ``query``
  ``(batch, seq_q, d_model)`` and ``key``/``value`` ``(batch, seq_k, d_model)``
  (cross-attention when ``seq_q != seq_k``), and a bool ``mask`` that is **True where
  attention is allowed**, broadcastable to the scores ``(batch, heads, seq_q, seq_k)``:
  a causal ``(seq_q, seq_k)`` mask or a key-padding ``(batch, 1, 1, seq_k)`` mask;
* it returns ``(output, weights)``: ``output`` ``(batch, seq_q, d_model)`` and the
  per-head attention weights ``(batch, heads, seq_q, seq_k)``, as
  ``nn.MultiheadAttention(..., average_attn_weights=False)`` returns them. A bare output
  tensor, or ``None`` for the weights, is diagnosed as weights not returned.

Paper: Vaswani et al. (2017), sec. 3.2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..attention import MultiHeadAttention, causal_mask
from .engine import CheckResult, PlantedMistake, Reject, TestInput, diagnose, mistake_symptoms

__all__ = ["SCAFFOLD", "NotesMHA", "PLANTED_BUGS", "BUG_MESSAGES", "MHACheck", "check_mha", "planted_bug_symptoms"]

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
        """query (B, Lq, d_model), key/value (B, Lk, d_model); mask (Lq, Lk) or (B, 1, 1, Lk), True = allowed."""
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
    method so that the planted bugs (:data:`PLANTED_BUGS`) override exactly one of them
    (``kv_inputs``, ``split_kv`` and ``returned_weights`` exist only for that).
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

    def kv_inputs(self, query, key, value):
        """What ``linear_k`` and ``linear_v`` read: ``key`` and ``value``."""
        return key, value

    def split_kv(self, x: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Keys and values are split like the queries, with their own length ``Lk``."""
        return self.split(x)

    def returned_weights(self, weights: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The weights ``forward`` returns: the softmax probabilities, per head."""
        return weights

    def forward(self, query, key, value, mask=None):
        key, value = self.kv_inputs(query, key, value)
        q = self.split(self.linear_q(query))
        k = self.split_kv(self.linear_k(key), query)
        v = self.split_kv(self.linear_v(value), query)
        scores = self.scores(q, k)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        weights = self.softmax(scores)
        out = self.merge(weights @ v)
        return self.project(out), self.returned_weights(weights, scores)


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


class SplitNotTransposed(NotesMHA):
    """Bug: ``view(B, L, h, d_k)`` without the ``.transpose(1, 2)``: the notes' split with the transpose forgotten."""

    # The tensors stay (B, L, h, d_k), so Q K^T is taken between the heads of one position, (B, L, h, h),
    # and a (Lq, Lk) or (B, 1, 1, Lk) mask, or Lq != Lk, no longer broadcasts (a RuntimeError).

    def split(self, x):
        B = x.size(0)
        return x.view(B, -1, self.h, self.d_k)


class NoTransposes(SplitNotTransposed):
    """Bug: both transposes forgotten, the split's and the merge's: ``view(B, L, h, d_k)`` in, ``view(B, L, d_model)`` out."""

    def merge(self, x):
        B = x.size(0)
        return x.contiguous().view(B, -1, self.d_model)


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


class KVSplitWithQueryLength(NotesMHA):
    """Bug: keys and values split with the query's length, ``view(B, Lq, h, d_k)``: right only when ``Lq == Lk``."""

    def split_kv(self, x, query):
        B, Lq = query.shape[:2]
        return x.view(B, Lq, self.h, self.d_k).transpose(1, 2)


class KeysValuesFromQuery(NotesMHA):
    """Bug: ``linear_k`` and ``linear_v`` applied to the query (self-attention only), not to ``key``/``value``."""

    def kv_inputs(self, query, key, value):
        return query, query


class WeightsNotReturned(NotesMHA):
    """Bug: ``forward`` returns the output alone, or ``(output, None)``, instead of ``(output, weights)``."""

    def returned_weights(self, weights, scores):
        return None


class ScoresReturnedAsWeights(NotesMHA):
    """Bug: the scaled scores (before the softmax) are returned as the attention weights."""

    def returned_weights(self, weights, scores):
        return scores


#: name -> a NotesMHA subclass with exactly that mistake (the order is the order tried).
PLANTED_BUGS: dict[str, type] = {
    "missing_scale": MissingScale,
    "scale_by_d_model": ScaleByDModel,
    "scale_by_d_k": ScaleByDk,
    "wrong_split": WrongSplit,
    "split_not_transposed": SplitNotTransposed,
    "no_transposes": NoTransposes,
    "wrong_merge": WrongMerge,
    "softmax_over_queries": SoftmaxOverQueries,
    "softmax_over_heads": SoftmaxOverHeads,
    "missing_output_projection": MissingOutputProjection,
    "mask_inverted": MaskInverted,
    "mask_ignored": MaskIgnored,
    "kv_split_with_query_length": KVSplitWithQueryLength,
    "keys_values_from_query": KeysValuesFromQuery,
    "weights_not_returned": WeightsNotReturned,
    "scores_returned_as_weights": ScoresReturnedAsWeights,
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
    "split_not_transposed": (
        "Heads split without the transpose: x.view(B, L, num_heads, d_k) is still (B, L, num_heads, d_k), "
        "so Q K^T compares the heads of one position with each other (scores (B, L, h, h), not "
        "(B, h, Lq, Lk)), and masks or Lq != Lk no longer fit. Add .transpose(1, 2) after the view: "
        "x.view(B, -1, num_heads, d_k).transpose(1, 2) is (B, num_heads, L, d_k)."
    ),
    "no_transposes": (
        "Both transposes forgotten: the heads were split with x.view(B, L, num_heads, d_k) and merged with "
        "view(B, L, d_model), without transpose(1, 2) in either, so attention runs across the heads of one "
        "position instead of across positions. Split with x.view(B, -1, num_heads, d_k).transpose(1, 2) and "
        "merge with out.transpose(1, 2).contiguous().view(B, -1, d_model)."
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
    "kv_split_with_query_length": (
        "Keys and values split with the query's length: view(B, Lq, num_heads, d_k) only works "
        "when Lq == Lk, so cross-attention (keys from another sequence) breaks. Split each tensor "
        "with its own length: x.view(B, -1, num_heads, d_k) (or key.size(1) for k and v)."
    ),
    "keys_values_from_query": (
        "Keys and values computed from the query: linear_k and linear_v must read key and value "
        "(q = linear_q(query), k = linear_k(key), v = linear_v(value)); they coincide only in "
        "self-attention, when the same tensor is passed three times."
    ),
    "weights_not_returned": (
        "Weights not returned: forward must return (output, weights), with weights the softmax "
        "probabilities per head, shape (batch, heads, seq_q, seq_k), as "
        "nn.MultiheadAttention(..., average_attn_weights=False) returns them."
    ),
    "scores_returned_as_weights": (
        "The scores are returned as weights: return the softmax probabilities (each row sums to 1 "
        "over the keys), not the scaled scores QK^T/sqrt(d_k) before the softmax."
    ),
}


#: The result of :func:`check_mha` (the engine's :class:`CheckResult`).
MHACheck = CheckResult


# ------------------------------------------------------------------ the MHA checker
_PROJECTIONS = ("linear_q", "linear_k", "linear_v", "linear_out")


@dataclass(frozen=True)
class _MHAInput:
    """Everything one MHA call needs: sizes, the four projections' weights, the tensors."""

    d_model: int
    num_heads: int
    weights: dict  # name -> (W, b)
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: Optional[torch.Tensor]


def _draw_weights(d_model: int, g: torch.Generator, bias: bool) -> dict:
    """Uniform(-1/sqrt(d), 1/sqrt(d)) weights and biases (zero biases for a bias-free learner)."""
    bound = 1.0 / math.sqrt(d_model)
    weights = {}
    for name in _PROJECTIONS:
        w = (torch.rand(d_model, d_model, generator=g) * 2 - 1) * bound
        b = (torch.rand(d_model, generator=g) * 2 - 1) * bound
        weights[name] = (w, b if bias else torch.zeros(d_model))
    return weights


def _draw(g: torch.Generator, *shape: int) -> torch.Tensor:
    # Inputs scaled up so that a missing or wrong scale changes the softmax visibly.
    return torch.randn(*shape, generator=g) * 3


def _mha_inputs(d_model: int, num_heads: int, batch: int, seq: int, seed: int, bias: bool) -> list[TestInput]:
    """The inputs of :func:`check_mha`, in order (the first two are those of the original checker).

    1-2. ``(batch, seq)`` with distinct query, key and value: without a mask, then causal.
    3. cross-attention ``Lq = max(2, seq // 2)``, ``Lk = seq + 1`` with a key-padding mask
       ``(batch, 1, 1, Lk)`` hiding the last two keys of the last example.
    4. a batch of one, odd length, causal.
    5. a second width ``num_heads * d_k'`` (``d_k' = d_k + 1``, or ``+ 2`` if that equals
       ``num_heads``), causal: tells ``/ d_k`` from ``/ sqrt(d_model)``, which coincide when
       ``d_model = d_k ** 2`` (the default 16 = 4 * 4).
    """
    g = torch.Generator().manual_seed(seed)
    w = _draw_weights(d_model, g, bias)
    q, k, v = (_draw(g, batch, seq, d_model) for _ in range(3))
    lq, lk = max(2, seq // 2), seq + 1
    cq, ck, cv = _draw(g, batch, lq, d_model), _draw(g, batch, lk, d_model), _draw(g, batch, lk, d_model)
    pad = torch.ones(batch, 1, 1, lk, dtype=torch.bool)
    pad[-1, ..., lk - 2:] = False
    odd = seq + 1 if seq % 2 == 0 else seq
    oq, ok_, ov = (_draw(g, 1, odd, d_model) for _ in range(3))
    d_k = d_model // num_heads
    d_k2 = d_k + 1 if d_k + 1 != num_heads else d_k + 2
    d2 = num_heads * d_k2
    g2 = torch.Generator().manual_seed(seed + 1)
    w2 = _draw_weights(d2, g2, bias)
    wq, wk, wv = (_draw(g2, batch, seq, d2) for _ in range(3))
    call, call_m = "forward(query, key, value)", "forward(query, key, value, mask=mask)"
    return [
        TestInput("without a mask", (_MHAInput(d_model, num_heads, w, q, k, v, None),), call),
        TestInput("with a causal mask", (_MHAInput(d_model, num_heads, w, q, k, v, causal_mask(seq)),), call_m),
        TestInput(f"in cross-attention (Lq={lq}, Lk={lk}) with a (B, 1, 1, Lk) padding mask",
                  (_MHAInput(d_model, num_heads, w, cq, ck, cv, pad),), call_m),
        TestInput(f"with a batch of 1, seq={odd} and a causal mask",
                  (_MHAInput(d_model, num_heads, w, oq, ok_, ov, causal_mask(odd)),), call_m),
        TestInput(f"at d_model={d2}, num_heads={num_heads} with a causal mask",
                  (_MHAInput(d2, num_heads, w2, wq, wk, wv, causal_mask(seq)),), call_m),
    ]


def _load(module: nn.Module, weights: dict) -> nn.Module:
    with torch.no_grad():
        for name, (w, b) in weights.items():
            lin = getattr(module, name)
            lin.weight.copy_(w.to(lin.weight))
            if lin.bias is not None:
                lin.bias.copy_(b.to(lin.bias))
    return module.eval()


def _mha_reference(x: _MHAInput) -> dict:
    """:class:`helpers.attention.MultiHeadAttention` with the same weights: output and per-head weights."""
    out, w = _load(MultiHeadAttention(x.d_model, x.num_heads), x.weights)(x.query, x.key, x.value, mask=x.mask)
    return {"output": out, "weights": w}


def _mha_runner(cls: type) -> Callable[[_MHAInput], dict]:
    """The function the engine calls for a class: build it at the input's size, load the weights, run it.

    Returns ``{"output": ..., "weights": ...}`` (``weights`` None for a bare output tensor).
    Raises :class:`Reject` for a wrong interface or a wrong output shape.
    """

    def run(x: _MHAInput) -> dict:
        module = cls(x.d_model, x.num_heads)
        for name in _PROJECTIONS:
            lin = getattr(module, name, None)
            if not isinstance(lin, nn.Linear) or tuple(lin.weight.shape) != (x.d_model, x.d_model):
                raise Reject("interface", f"{cls.__name__} needs an attribute {name} = nn.Linear(d_model, d_model) "
                                          f"(here nn.Linear({x.d_model}, {x.d_model})), got {lin!r}")
        _load(module, x.weights)
        result = module(x.query, x.key, x.value) if x.mask is None else module(x.query, x.key, x.value, mask=x.mask)
        out = result[0] if isinstance(result, (tuple, list)) else result
        weights = result[1] if isinstance(result, (tuple, list)) and len(result) > 1 else None
        if not isinstance(out, torch.Tensor):
            raise Reject("interface", f"forward must return a tensor or a tuple (output, weights), got {type(out).__name__}")
        expected = (x.query.shape[0], x.query.shape[1], x.d_model)
        if tuple(out.shape) != expected:
            raise Reject("shape", f"output shape {tuple(out.shape)}, expected (batch, seq_q, d_model) = {expected}",
                         float("inf"))
        if weights is not None and not isinstance(weights, torch.Tensor):
            raise Reject("interface", f"forward must return the weights as a tensor (batch, heads, seq_q, seq_k), "
                                      f"got {type(weights).__name__}")
        return {"output": out, "weights": weights}

    return run


_MHA_UNKNOWN_HINT = (
    "Check in order: split (view(B, L, h, d_k).transpose(1, 2)), scale 1/sqrt(d_k), mask "
    "(-inf where mask is False), softmax(dim=-1), merge (transpose(1, 2) then view), linear_out."
)


def check_mha(
    cls: type,
    d_model: int = 16,
    num_heads: int = 4,
    batch: int = 2,
    seq: int = 6,
    seed: int = 0,
) -> CheckResult:
    """Run the learner's multi-head attention class against the reference and diagnose mistakes.

    The learner's class and :class:`~helpers.attention.MultiHeadAttention` get the same
    seeded weights and biases and are compared (output *and* per-head weights, see the
    module docstring) on five inputs, through :func:`diagnose`:

    1. ``(batch, seq)`` with distinct ``query``, ``key``, ``value``, without a mask;
    2. the same with ``causal_mask(seq)`` (True = allowed);
    3. cross-attention, ``Lq != Lk`` (``max(2, seq // 2)`` and ``seq + 1``), with a
       ``(batch, 1, 1, Lk)`` key-padding mask;
    4. a batch of one of odd length, causal;
    5. a second width ``num_heads * (d_k + 1)`` (or ``+ 2``), causal, which tells apart
       mistakes that coincide at the first (``/ d_k`` and ``/ sqrt(d_model)`` when
       ``d_model = d_k**2``).

    On a mismatch the same weights are loaded into each class of :data:`PLANTED_BUGS`, and
    the bug whose results (outputs, weights, exceptions) equal the learner's on all five
    inputs is named, with :data:`BUG_MESSAGES`' advice. An exception in the learner's code
    is reported (diagnosis ``"interface"``), never raised. The global random state is the
    same afterwards.

    Args:
        cls: the learner's class (interface in the module docstring).
        d_model, num_heads, batch, seq: sizes of the test (``d_model / num_heads`` > 1 and
            ``num_heads > 1`` so that every bug shows).
        seed: seed of the weights and inputs.

    Returns:
        :class:`CheckResult` (``MHACheck``; ``print`` it).
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class (not an instance), got {type(cls).__name__}")
    if num_heads < 2 or d_model % num_heads != 0 or d_model // num_heads < 2 or seq < 2:
        raise ValueError(
            f"need num_heads >= 2, d_model divisible by num_heads with d_k >= 2, and seq >= 2 so "
            f"every mistake shows, got d_model={d_model}, num_heads={num_heads}, seq={seq}"
        )
    with torch.random.fork_rng(devices=[]):  # building modules draws random inits: keep the caller's RNG as it was
        return _check_mha(cls, d_model, num_heads, batch, seq, seed)


def _check_mha(cls: type, d_model: int, num_heads: int, batch: int, seq: int, seed: int) -> CheckResult:
    try:
        learner = cls(d_model, num_heads)
    except Exception as e:  # the learner's constructor: report, don't crash
        msg = f"FAIL: {cls.__name__}({d_model}, {num_heads}) raised {type(e).__name__}: {e}"
        return CheckResult(False, "interface", msg, 0.0, msg)
    for name in _PROJECTIONS:
        lin = getattr(learner, name, None)
        if not isinstance(lin, nn.Linear) or tuple(lin.weight.shape) != (d_model, d_model):
            msg = (f"FAIL: {cls.__name__} needs an attribute {name} = nn.Linear(d_model, d_model) "
                   f"(here nn.Linear({d_model}, {d_model})), got {lin!r}")
            return CheckResult(False, "interface", msg, 0.0, msg)
    bias = all(getattr(learner, name).bias is not None for name in _PROJECTIONS)
    mistakes = [PlantedMistake(name, _mha_runner(bug), BUG_MESSAGES[name]) for name, bug in PLANTED_BUGS.items()]
    return diagnose(
        _mha_runner(cls), _mha_reference, mistakes, _mha_inputs(d_model, num_heads, batch, seq, seed, bias),
        exception_kind="interface", unknown_hint=_MHA_UNKNOWN_HINT,
        pass_message=f"PASS: {cls.__name__} matches helpers.MultiHeadAttention (output and per-head weights, "
                     f"d_model={d_model}, num_heads={num_heads}) on 5 inputs: no mask, causal, cross-attention "
                     f"(Lq != Lk) with a key-padding mask, a batch of one of odd length, and a second width.",
    )


def planted_bug_symptoms(**check_kwargs) -> dict[str, str]:
    """For each planted MHA bug, the one-line symptom :func:`check_mha` reports for it.

    ``mistake_symptoms(check_mha, PLANTED_BUGS, **check_kwargs)``: ``{name: result.symptom}``,
    e.g. ``"FAIL without a mask (max |diff| = 0.655)"``: which input fails first and how.

    Raises:
        RuntimeError: if a planted bug is not diagnosed as itself (the checker would be wrong).
    """
    return mistake_symptoms(check_mha, PLANTED_BUGS, **check_kwargs)
