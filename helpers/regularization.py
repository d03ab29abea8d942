"""Regularizers of "Attention Is All You Need" (sec. 5.4) and their classic neighbours.

Taught in ``notebooks/04_regularization.ipynb``:

* :func:`dropout` -- inverted dropout on activations (Srivastava et al. 2014), the
  residual dropout of the Transformer (P_drop = 0.1);
* :func:`smooth_labels`, :func:`label_smoothing_cross_entropy` -- label smoothing
  (Szegedy et al. 2016), in the two conventions met in practice;
* :func:`optimal_logit_gap`, :func:`smoothed_target_entropy` -- what label smoothing
  makes the model converge to;
* :func:`l1_penalty`, :func:`l2_penalty` -- explicit parameter penalties;
* :func:`calibration_bins`, :func:`expected_calibration_error` -- measuring
  over-confidence (Guo et al. 2017).

Two label-smoothing conventions (K classes, smoothing ε):

* ``"uniform"`` (Szegedy et al.; ``torch.nn.functional.cross_entropy(label_smoothing=ε)``):
  :math:`q = (1-\\varepsilon)\\,\\text{onehot} + \\varepsilon/K`: the true class gets
  :math:`1-\\varepsilon+\\varepsilon/K`, every other class :math:`\\varepsilon/K`.
* ``"others"`` (the study notes): the true class gets :math:`1-\\varepsilon`, every other class
  :math:`\\varepsilon/(K-1)`. It equals ``"uniform"`` with :math:`\\varepsilon' = \\varepsilon K/(K-1)`.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.nn.functional as F

from .validate import check_choice, check_fraction

__all__ = [
    "CONVENTIONS",
    "dropout",
    "smooth_labels",
    "uniform_eps_from_others",
    "label_smoothing_cross_entropy",
    "smoothed_target_entropy",
    "optimal_logit_gap",
    "l1_penalty",
    "l2_penalty",
    "calibration_bins",
    "expected_calibration_error",
]

CONVENTIONS = ("uniform", "others")
REDUCTIONS = ("mean", "sum", "none")


def _check_num_classes(num_classes: int) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
    return num_classes


# ---------------------------------------------------------------------- dropout
def dropout(
    x: torch.Tensor, p: float, training: bool = True, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    r"""Inverted dropout: zero each activation with probability ``p``, scale the kept ones by
    :math:`1/(1-p)`, so that :math:`\mathbb E[\text{dropout}(x)] = x`; identity when not training.

    .. math:: y = x \odot m / (1-p),\quad m_j \sim \text{Bernoulli}(1-p)

    Dropout acts on **activations** (here: a sub-layer's output), not on parameters; dropping
    weights instead is DropConnect (Wan et al. 2013).

    Args:
        x: any shape, floating point.
        p: drop probability in [0, 1).
        training: ``False`` returns ``x`` unchanged (evaluation mode).
        generator: optional ``torch.Generator`` for reproducible masks.

    Returns:
        Tensor of the shape, dtype and device of ``x``.
    """
    p = check_fraction(p, "p")
    if not training or p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


# -------------------------------------------------------------- label smoothing
def _check_target(target: torch.Tensor, num_classes: int, ignore_index: Optional[int] = None) -> None:
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.dtype == torch.bool:
        raise TypeError(f"target must be an integer tensor of class indices, got {getattr(target, 'dtype', type(target).__name__)}")
    valid = target if ignore_index is None else target[target != ignore_index]
    if valid.numel() and (valid.min() < 0 or valid.max() >= num_classes):
        bad = valid[(valid < 0) | (valid >= num_classes)][0].item()
        raise ValueError(f"target values must be in [0, num_classes={num_classes}), got {bad}")


def smooth_labels(
    target: torch.Tensor, num_classes: int, eps: float, convention: str = "uniform",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    r"""Smoothed target distributions.

    ``"uniform"``: :math:`q = (1-\varepsilon)\,\text{onehot}(y) + \varepsilon/K` (Szegedy et al. 2016, torch).
    ``"others"``: :math:`q_y = 1-\varepsilon`, :math:`q_{k\ne y} = \varepsilon/(K-1)` (the notes).

    Args:
        target: integer class indices, any shape ``(...)``.
        num_classes: :math:`K \ge 2`.
        eps: smoothing :math:`\varepsilon` in [0, 1).
        convention: ``"uniform"`` or ``"others"``.
        dtype: floating dtype of the result (default float32).

    Returns:
        tensor ``(..., num_classes)`` of ``dtype``; every row sums to 1.
    """
    num_classes = _check_num_classes(num_classes)
    eps = check_fraction(eps, "eps")
    check_choice(convention, "convention", CONVENTIONS)
    _check_target(target, num_classes)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    onehot = F.one_hot(target, num_classes).to(dtype)
    if convention == "uniform":
        return onehot * (1.0 - eps) + eps / num_classes
    return onehot * (1.0 - eps) + (1.0 - onehot) * (eps / (num_classes - 1))


def uniform_eps_from_others(eps: float, num_classes: int) -> float:
    r"""The :math:`\varepsilon'` with ``smooth_labels(.., eps', "uniform") == smooth_labels(.., eps, "others")``:
    :math:`\varepsilon' = \varepsilon K/(K-1)` (then :math:`\varepsilon'/K = \varepsilon/(K-1)`)."""
    num_classes = _check_num_classes(num_classes)
    eps = check_fraction(eps, "eps")
    return eps * num_classes / (num_classes - 1)


def label_smoothing_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    eps: float,
    convention: str = "uniform",
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    r"""Cross-entropy against smoothed targets: :math:`\ell = -\sum_k q_k \log\operatorname{softmax}(z)_k`.

    Shapes follow ``torch.nn.functional.cross_entropy``: ``logits`` ``(N, K)`` or
    ``(N, K, d1, ...)`` (classes on dim 1), ``target`` ``(N,)`` or ``(N, d1, ...)``.
    Positions whose target is ``ignore_index`` contribute nothing; ``"mean"`` divides by the
    number of the others. With ``convention="uniform"`` this equals
    ``F.cross_entropy(logits, target, label_smoothing=eps, ignore_index=ignore_index,
    reduction=reduction)`` for every reduction.

    The loss is computed in ``torch.promote_types(logits.dtype, torch.float32)`` (float16 and
    bfloat16 in float32, float64 in float64) and returned in the dtype of ``logits``.
    The targets are checked against ``[0, K)`` by value, which a ``meta`` tensor has none of:
    on the ``meta`` device the call raises ``NotImplementedError``.

    Returns:
        A scalar (``"mean"``, ``"sum"``) or the per-position losses (``"none"``, 0 where ignored).
    """
    eps = check_fraction(eps, "eps")
    check_choice(convention, "convention", CONVENTIONS)
    check_choice(reduction, "reduction", REDUCTIONS)
    if logits.dim() < 2:
        raise ValueError(f"logits must have shape (N, K) or (N, K, d1, ...), got {tuple(logits.shape)}")
    expected = logits.shape[:1] + logits.shape[2:]
    if target.shape != expected:
        raise ValueError(f"target must have shape {tuple(expected)} for logits of shape {tuple(logits.shape)}, got {tuple(target.shape)}")
    K = logits.shape[1]
    _check_target(target, K, ignore_index)
    # compute in float32 or better: half/bfloat16 are upcast, float64 stays float64
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    logp = torch.log_softmax(logits.movedim(1, -1).to(compute_dtype), dim=-1)  # (N, d1.., K)
    valid = target != ignore_index
    safe_target = torch.where(valid, target, torch.zeros_like(target))
    q = smooth_labels(safe_target, K, eps, convention, dtype=compute_dtype).to(logp.device)
    per = -(q * logp).sum(-1) * valid
    if reduction == "none":
        return per.to(logits.dtype)
    if reduction == "sum":
        return per.sum().to(logits.dtype)
    return (per.sum() / valid.sum()).to(logits.dtype)


def smoothed_target_entropy(eps: float, num_classes: int, convention: str = "uniform") -> float:
    r"""The loss floor: :math:`H(q) = -\sum_k q_k\log q_k`, the smallest possible cross-entropy
    against the smoothed target (reached when the model's softmax equals :math:`q`). 0 for ε = 0."""
    K = _check_num_classes(num_classes)
    eps = check_fraction(eps, "eps")
    check_choice(convention, "convention", CONVENTIONS)
    if eps == 0.0:
        return 0.0
    if convention == "uniform":
        p_true, p_other = 1 - eps + eps / K, eps / K
    else:
        p_true, p_other = 1 - eps, eps / (K - 1)
    return -(p_true * math.log(p_true) + (K - 1) * p_other * math.log(p_other))


def optimal_logit_gap(eps: float, num_classes: int, convention: str = "uniform") -> float:
    r"""The gap :math:`z_y - z_{k\ne y}` at the optimum of the smoothed loss: the softmax must equal
    :math:`q`, so the gap is :math:`\log(q_y/q_{k\ne y})`:

    * ``"others"``: :math:`\log\frac{(1-\varepsilon)(K-1)}{\varepsilon}`;
    * ``"uniform"``: :math:`\log\frac{1-\varepsilon+\varepsilon/K}{\varepsilon/K} = \log\big(1 + \tfrac{K(1-\varepsilon)}{\varepsilon}\big)`.

    Without smoothing (ε = 0) there is no finite optimum: ``inf``.
    """
    K = _check_num_classes(num_classes)
    eps = check_fraction(eps, "eps")
    check_choice(convention, "convention", CONVENTIONS)
    if eps == 0.0:
        return math.inf
    if convention == "others":
        return math.log((1 - eps) * (K - 1) / eps)
    return math.log(1 + K * (1 - eps) / eps)


# ------------------------------------------------------------------- penalties
def _params(parameters: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    ps = list(parameters)
    if not ps:
        raise ValueError("parameters must contain at least one tensor, got an empty iterable")
    return ps


def l1_penalty(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    r""":math:`\sum_j |w_j|` over all given tensors (its gradient :math:`\operatorname{sign}(w)` pushes
    weights to exactly 0: sparsity). Differentiable; add ``λ * l1_penalty(...)`` to the loss."""
    return sum(p.abs().sum() for p in _params(parameters))


def l2_penalty(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    r""":math:`\sum_j w_j^2` (squared L2 norm; gradient :math:`2w`: shrinks every weight in
    proportion to its size, rarely to exactly 0). With plain SGD, adding
    :math:`\tfrac\lambda2\sum w^2` to the loss equals weight decay λ; with Adam it does not
    (Loshchilov & Hutter 2019, AdamW)."""
    return sum(p.pow(2).sum() for p in _params(parameters))


# ------------------------------------------------------------------ calibration
def calibration_bins(confidence: torch.Tensor, correct: torch.Tensor, n_bins: int = 10) -> dict:
    """Equal-width confidence bins for a reliability diagram (Guo et al. 2017).

    Args:
        confidence: ``(N,)`` max softmax probability per prediction, in [0, 1].
        correct: ``(N,)`` bool (or 0/1), whether the prediction was right.
        n_bins: number of bins >= 1.

    Returns:
        dict of float64 tensors ``edges (n_bins+1,)``, ``count``, ``accuracy``,
        ``confidence`` (``(n_bins,)``; accuracy/confidence are NaN for empty bins).
    """
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be an int >= 1, got {n_bins!r}")
    confidence = confidence.detach().double().flatten()
    correct = correct.detach().double().flatten()
    if confidence.shape != correct.shape:
        raise ValueError(f"confidence and correct must have the same number of elements, got {confidence.numel()} and {correct.numel()}")
    if confidence.numel() and (confidence.min() < 0 or confidence.max() > 1):
        raise ValueError("confidence must be in [0, 1]")
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    idx = torch.clamp(torch.bucketize(confidence, edges[1:-1], right=True), 0, n_bins - 1)
    count = torch.bincount(idx, minlength=n_bins).double()
    acc_sum = torch.bincount(idx, weights=correct, minlength=n_bins)
    conf_sum = torch.bincount(idx, weights=confidence, minlength=n_bins)
    with torch.no_grad():
        accuracy = torch.where(count > 0, acc_sum / count.clamp(min=1), torch.full_like(count, float("nan")))
        conf = torch.where(count > 0, conf_sum / count.clamp(min=1), torch.full_like(count, float("nan")))
    return {"edges": edges, "count": count, "accuracy": accuracy, "confidence": conf}


def expected_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, n_bins: int = 10) -> float:
    r"""ECE :math:`= \sum_b \frac{n_b}{N}\,|\text{acc}_b - \text{conf}_b|` over equal-width bins."""
    bins = calibration_bins(confidence, correct, n_bins)
    n = bins["count"].sum()
    if n == 0:
        raise ValueError("confidence must not be empty")
    gap = (bins["accuracy"] - bins["confidence"]).abs().nan_to_num(0.0)
    return float((bins["count"] / n * gap).sum())
