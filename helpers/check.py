r"""Diagnosing checkers for the exercises: a small shared engine, and the MHA checker built on it.

The engine (:func:`diagnose`) is what every "write it from memory" exercise of the series
uses. It takes

* the learner's function and a **reference** function, with the same signature;
* a list of **planted mistakes** (:class:`PlantedMistake`): each a copy of the reference
  with exactly one classic error, a name, and the advice to print;
* a list of **test inputs** (:class:`TestInput`) of several shapes (odd lengths, a batch of
  one, ``Lq != Lk``, a second width, ...);

and returns a :class:`CheckResult`: PASS when the learner's results equal the reference's on
every input; otherwise the planted mistake whose results the learner's reproduce on *every*
input (an exception counts as a result: raising the same exception type on the same inputs
reproduces it); otherwise the first input where they differ and by how much. An exception
raised by the learner's code is reported in a FAIL message, never raised.

The MHA exercise of section 8 of ``notebooks/03_mha_from_scratch.ipynb``: the learner fills
in a class with the interface of :data:`SCAFFOLD`, then ``check_mha(MyMHA)`` runs it
against the reference :class:`helpers.attention.MultiHeadAttention` with the same weights,
and names the mistake among :data:`PLANTED_BUGS` when they differ.

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
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from .attention import MultiHeadAttention, causal_mask

__all__ = [
    "Reject", "TestInput", "PlantedMistake", "CheckResult", "diagnose",
    "SCAFFOLD", "NotesMHA", "PLANTED_BUGS", "BUG_MESSAGES", "MHACheck", "check_mha", "planted_bug_symptoms",
]

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


# -------------------------------------------------------------------- the engine
class Reject(Exception):
    """Raised by a wrapper around the learner's code to report a precise problem.

    ``kind`` becomes the result's ``diagnosis`` (e.g. ``"interface"``, ``"shape"``) and
    ``message`` follows ``FAIL <input label>:`` in the report; ``diff`` is the result's
    ``max_abs_diff``. Like any exception, a planted mistake reproduces it by raising a
    :class:`Reject` of the same kind on the same inputs.
    """

    def __init__(self, kind: str, message: str, diff: float = 0.0) -> None:
        super().__init__(message)
        self.kind, self.message, self.diff = kind, message, diff


@dataclass(frozen=True)
class TestInput:
    """One input to check on: ``fn(*args)`` is called for the learner, the reference and each mistake.

    Attributes:
        label: how the report names this input (``"with a causal mask"``).
        args: the positional arguments.
        call: how the report names the call when the learner's code raises
            (``"forward(query, key, value)"``).
        atol, rtol: tolerances for this input only (e.g. looser for bfloat16 inputs);
            ``None`` uses those given to :func:`diagnose`.
    """

    __test__ = False  # not a pytest test class, whatever its name

    label: str
    args: tuple
    call: str = "your function"
    atol: Optional[float] = None
    rtol: Optional[float] = None


@dataclass(frozen=True)
class PlantedMistake:
    """A copy of the reference with exactly one classic mistake.

    Attributes:
        name: the diagnosis reported when the learner's results equal ``fn``'s on every input.
        fn: the mistaken function, with the reference's signature.
        advice: what to print after the symptom: the mistake and its fix.
    """

    name: str
    fn: Callable[..., Any]
    advice: str


@dataclass
class CheckResult:
    """What :func:`diagnose` (and :func:`check_mha`) return; ``print`` it.

    Attributes:
        passed: True if the results equal the reference's on every input.
        diagnosis: None when passed; else the name of the planted mistake reproduced, a
            :class:`Reject` kind (``"interface"``, ``"shape"``), the kind given for an
            exception (``"exception"``, or ``"interface"`` for :func:`check_mha`),
            ``"shape"`` for a result of the wrong shape, or ``"unknown"``.
        message: the verdict: ``PASS ...`` or ``FAIL <input> (<difference>). <advice>``.
        max_abs_diff: the largest difference from the reference on the failing input
            (``inf`` for a wrong shape or a missing result, 0 for an exception).
        symptom: the verdict's first part, one line, without the advice: what the
            checker observed (``FAIL without a mask (max |diff| = 0.655)``).
        failed_input: the label of the first input where the learner's result differs.
        inputs: the labels of every input checked.
    """

    passed: bool
    diagnosis: Optional[str]
    message: str
    max_abs_diff: float = 0.0
    symptom: str = ""
    failed_input: Optional[str] = None
    inputs: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


#: The result of :func:`check_mha` (the engine's :class:`CheckResult`).
MHACheck = CheckResult


@dataclass(frozen=True)
class _Mismatch:
    diff: float
    text: str
    kind: str  # "values", "shape" or "missing"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    d = (a.detach().to(wide) - b.detach().to(wide)).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    return float(d.max()) if d.numel() else 0.0


def _compare(got: Any, expected: Any, atol: float, rtol: float, name: Optional[str] = None) -> Optional[_Mismatch]:
    """None if ``got`` equals ``expected`` (tensors within tolerance, NaN where NaN), else the first difference.

    A dict is compared entry by entry, in order; the first entry is the main result and
    its difference reads ``max |diff| = x``, the others are named (``weights: ...``).
    """
    prefix = f"{name}: " if name else ""
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return _Mismatch(float("inf"), f"{prefix}got {type(got).__name__}, expected a dict", "missing")
        for i, (key, exp) in enumerate(expected.items()):
            m = _compare(got.get(key), exp, atol, rtol, None if i == 0 else (f"{name}.{key}" if name else key))
            if m is not None:
                return m
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return _Mismatch(float("inf"), f"{prefix}got {got!r:.60}, expected {len(expected)} results", "missing")
        for i, (g, e) in enumerate(zip(got, expected)):
            m = _compare(g, e, atol, rtol, None if (i == 0 and not name) else f"{name or 'result'}[{i}]")
            if m is not None:
                return m
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return _Mismatch(float("inf"), f"{prefix}got {'None' if got is None else type(got).__name__}, expected a "
                                           f"tensor of shape {tuple(expected.shape)}", "missing")
        if got.shape != expected.shape:
            return _Mismatch(float("inf"), f"{prefix}shape {tuple(got.shape)}, expected {tuple(expected.shape)}", "shape")
        a, e = got.detach(), expected.detach()
        if a.is_complex() or e.is_complex():
            same = torch.allclose(a.to(torch.complex128), e.to(torch.complex128), atol=atol, rtol=rtol, equal_nan=True)
        elif a.is_floating_point() or e.is_floating_point():
            same = torch.allclose(a.double(), e.double(), atol=atol, rtol=rtol, equal_nan=True)
        else:
            same = torch.equal(a, e)
        if same:
            return None
        diff = _max_diff(got, expected)
        return _Mismatch(diff, f"{prefix}max |diff| = {diff:.3g}", "values")
    if got == expected:
        return None
    return _Mismatch(float("inf"), f"{prefix}got {got!r}, expected {expected!r}", "values")


def _run(fn: Callable, args: tuple):
    """``("ok", result)`` or ``("raised", exception)``: a learner's exception is an outcome, not a crash."""
    try:
        with torch.no_grad():
            return "ok", fn(*args)
    except Exception as e:  # the learner's (or a planted mistake's) code: any exception is a result
        return "raised", e


def _same_outcome(a, b, atol: float, rtol: float) -> bool:
    (ka, va), (kb, vb) = a, b
    if ka != kb:
        return False
    if ka == "raised":
        if type(va) is not type(vb):
            return False
        return not isinstance(va, Reject) or va.kind == vb.kind
    return _compare(va, vb, atol, rtol) is None


def diagnose(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    mistakes: Sequence[PlantedMistake],
    inputs: Sequence[TestInput],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    exception_kind: str = "exception",
    unknown_hint: str = "",
    pass_message: str = "PASS: the results equal the reference's on every input.",
) -> CheckResult:
    """Run ``learner`` on every input, compare with ``reference``, and name the mistake if one is planted.

    1. For each input in order: the learner's result (or exception) against the
       reference's (tensors within ``atol``/``rtol``, NaN equal to NaN; dicts, tuples and
       lists entry by entry). The reference must not raise.
    2. All equal: PASS (``pass_message``).
    3. Otherwise the first differing input is the symptom, and every planted mistake is run
       on every input: the first (in the given order) whose outcomes equal the learner's on
       *all* inputs, and differ from the reference's on at least one, is the diagnosis
       (raising an exception of the same type, or a :class:`Reject` of the same kind, on
       the same inputs counts as equal). Mistakes that coincide on some inputs (e.g. two
       scales equal at one width) are told apart by the other inputs, so give inputs of
       several shapes.
    4. No mistake reproduces it: the symptom, ``unknown_hint``, and for an exception its
       type and text, with diagnosis ``exception_kind``.

    Args:
        learner: the learner's function (or a wrapper that builds and calls their module).
        reference: the correct function, same signature.
        mistakes: the planted mistakes, in the order they are tried.
        inputs: the inputs, in the order they are checked.
        atol, rtol: tolerances of the comparisons (also between the learner and a mistake);
            an input's own ``TestInput.atol``/``rtol`` override them for that input.
        exception_kind: the diagnosis when the learner's code raises and no mistake reproduces it.
        unknown_hint: appended to the message when no mistake reproduces a numerical difference.
        pass_message: the message of a PASS.

    Returns:
        :class:`CheckResult`. Nothing the learner's code raises propagates, and the global
        (CPU) random state is the same afterwards.
    """
    if not inputs:
        raise ValueError("inputs must list at least one TestInput, got none")
    with torch.random.fork_rng(devices=[]):  # whatever the code under test draws, the caller's RNG is untouched
        return _diagnose(learner, reference, mistakes, inputs, atol, rtol, exception_kind, unknown_hint, pass_message)


def _tolerances(t: TestInput, atol: float, rtol: float) -> tuple[float, float]:
    """The input's own tolerances where it sets them, else the call's."""
    return (atol if t.atol is None else t.atol), (rtol if t.rtol is None else t.rtol)


def _diagnose(learner, reference, mistakes, inputs, atol, rtol, exception_kind, unknown_hint, pass_message) -> CheckResult:
    labels = [t.label for t in inputs]
    outcomes, expected = [], []
    failed = None  # (index, mismatch or exception)
    for i, t in enumerate(inputs):
        with torch.no_grad():
            exp = reference(*t.args)
        expected.append(exp)
        out = _run(learner, t.args)
        outcomes.append(out)
        if failed is None:
            if out[0] == "raised":
                failed = (i, out[1])
            else:
                m = _compare(out[1], exp, *_tolerances(t, atol, rtol))
                if m is not None:
                    failed = (i, m)
    if failed is None:
        return CheckResult(True, None, pass_message, 0.0, pass_message, None, labels)

    i, problem = failed
    t = inputs[i]
    if isinstance(problem, Reject):
        symptom, detail, diff = f"FAIL {t.label}: {problem.message}", "", problem.diff
    elif isinstance(problem, Exception):
        symptom = f"FAIL {t.label}: {t.call} raised {type(problem).__name__}"
        detail, diff = f": {problem}", 0.0
    else:
        symptom, detail, diff = f"FAIL {t.label} ({problem.text})", "", problem.diff

    for mistake in mistakes:
        differs_somewhere = False
        for j, tj in enumerate(inputs):
            cand = _run(mistake.fn, tj.args)
            tol = _tolerances(tj, atol, rtol)
            if not _same_outcome(outcomes[j], cand, *tol):
                break
            differs_somewhere = differs_somewhere or not _same_outcome(cand, ("ok", expected[j]), *tol)
        else:
            if differs_somewhere:
                return CheckResult(False, mistake.name, f"{symptom}{detail}. {mistake.advice}", diff, symptom, t.label, labels)

    if isinstance(problem, Reject):
        return CheckResult(False, problem.kind, symptom, diff, symptom, t.label, labels)
    if isinstance(problem, Exception):
        return CheckResult(False, exception_kind, f"{symptom}{detail}", diff, symptom, t.label, labels)
    kind = "shape" if problem.kind == "shape" else "unknown"
    got = outcomes[i][1]
    got_main = next(iter(got.values()), None) if isinstance(got, dict) else got
    nan = (" The output contains NaN: is a row of scores entirely -inf?"
           if isinstance(got_main, torch.Tensor) and got_main.is_floating_point() and bool(torch.isnan(got_main).any()) else "")
    hint = f" {unknown_hint}" if unknown_hint else ""
    return CheckResult(False, kind, f"{symptom}, and no single common mistake reproduces it.{nan}{hint}",
                       diff, symptom, t.label, labels)


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
        pass_message=f"PASS: {cls.__name__} matches helpers.MultiHeadAttention "
                     f"(d_model={d_model}, num_heads={num_heads}) with and without a causal mask.",
    )


def mistake_symptoms(check: Callable[..., "CheckResult"], mistakes: dict, **check_kwargs) -> dict[str, str]:
    """``{name: symptom}``: the one line ``check`` reports for each planted mistake.

    E.g. ``mistake_symptoms(check_rotation_matrix, ROTATION_MATRIX_MISTAKES)``.

    Raises:
        RuntimeError: if a planted mistake is not diagnosed as itself (the checker would be wrong).
    """
    table = {}
    for name, f in mistakes.items():
        r = check(f, **check_kwargs)
        if r.diagnosis != name:
            raise RuntimeError(f"planted mistake {name!r} was diagnosed as {r.diagnosis!r}: {r.message}")
        table[name] = r.symptom
    return table


def planted_bug_symptoms(**check_kwargs) -> dict[str, str]:
    """For each planted MHA bug, the one-line symptom :func:`check_mha` reports for it.

    ``mistake_symptoms(check_mha, PLANTED_BUGS, **check_kwargs)``: ``{name: result.symptom}``,
    e.g. ``"FAIL without a mask (max |diff| = 0.655)"``: which input fails first and how.

    Raises:
        RuntimeError: if a planted bug is not diagnosed as itself (the checker would be wrong).
    """
    return mistake_symptoms(check_mha, PLANTED_BUGS, **check_kwargs)
