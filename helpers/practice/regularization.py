r"""Diagnosing checkers for the regularization exercises of notebook 04 ("write it from memory").

* :func:`check_dropout` -- the learner's inverted dropout ``dropout(x, p, training=True,
  generator=None)`` (the signature of :func:`helpers.regularization.dropout`) against it.
  Dropout is random, so the comparison is made exact by the generator: the checker passes a
  freshly seeded ``torch.Generator`` and the learner draws the mask with it, **by the
  reference's rule** ``keep = torch.rand(x.shape, generator=generator) >= p`` (one uniform
  number per element, kept where it is at least ``p``). Another rule that is right in
  distribution (``rand < 1 - p``) is recognised and reported as such.
* :func:`check_label_smoothing` -- the learner's label-smoothed cross-entropy
  ``loss(logits, target, eps, ignore_index=-100)`` (mean over the rows not ignored) in either
  convention, against :func:`helpers.regularization.label_smoothing_cross_entropy` (which the
  tests pin to ``F.cross_entropy(label_smoothing=eps)`` for ``"uniform"``):

  * ``"uniform"`` (Szegedy et al. 2016, torch): :math:`q = (1-\varepsilon)\,\text{onehot} + \varepsilon/V`;
  * ``"others"`` (the study notes): :math:`q_y = 1-\varepsilon`, :math:`q_{k\ne y} = \varepsilon/(V-1)`.

Worked solutions: :func:`dropout_solution`, :data:`LABEL_SMOOTHING_SOLUTIONS` (one per
convention). Planted mistakes: :data:`DROPOUT_MISTAKES`, :data:`LABEL_SMOOTHING_MISTAKES`
(``{convention: {name: function}}``; ``"others"`` has one more, ``eps_over_V_in_others``);
advice in :data:`DROPOUT_ADVICE`, :data:`LABEL_SMOOTHING_ADVICE`. A learner's ``F.one_hot``
(or index by class) applied before the ignored rows are filtered raises inside torch; the
label-smoothing checker recognises that error and names it ``indexed_before_filtering``.

Papers: Srivastava et al., "Dropout" (JMLR 2014); Szegedy et al., "Rethinking the Inception
Architecture" (2016), sec. 7.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..regularization import CONVENTIONS, dropout, label_smoothing_cross_entropy
from ..validate import check_choice
from .engine import CheckResult, Reject, TestInput, as_tensor_result, clone_args, run_check

__all__ = [
    "check_dropout", "dropout_solution", "DROPOUT_MISTAKES", "DROPOUT_ADVICE",
    "check_label_smoothing", "LABEL_SMOOTHING_SOLUTIONS", "LABEL_SMOOTHING_MISTAKES", "LABEL_SMOOTHING_ADVICE",
]


# ==================================================================== inverted dropout
def dropout_solution(x, p, training=True, generator=None):
    """Worked solution: zero each element with probability ``p``, scale the kept ones by ``1/(1-p)``;
    identity at evaluation. The mask: ``torch.rand(x.shape, generator=generator) >= p``."""
    if not training or p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) >= p
    return x * keep / (1 - p)


def _no_rescaling(x, p, training=True, generator=None):
    if not training or p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) >= p
    return x * keep


def _rescaling_at_eval(x, p, training=True, generator=None):
    if not training:
        return x / (1 - p)
    if p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) >= p
    return x * keep / (1 - p)


def _classic_dropout(x, p, training=True, generator=None):
    """Srivastava et al.'s original: no scaling in training, weights scaled by (1 - p) at test time."""
    if not training:
        return x * (1 - p)
    if p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) >= p
    return x * keep


def _keep_prob_as_drop_prob(x, p, training=True, generator=None):
    if not training or p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) < p  # p read as the keep probability
    return x * keep / p


def _dropout_at_eval(x, p, training=True, generator=None):
    if p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) >= p
    return x * keep / (1 - p)


def _eval_scaled_by_keep_prob(x, p, training=True, generator=None):
    """Inverted dropout in training, but the classic evaluation rule (x times 1 - p) at evaluation."""
    if not training:
        return x * (1 - p)
    if p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) >= p
    return x * keep / (1 - p)


def _other_mask_rule(x, p, training=True, generator=None):
    if not training or p == 0:
        return x
    keep = torch.rand(x.shape, generator=generator) < 1 - p  # right in distribution, another mask
    return x * keep / (1 - p)


DROPOUT_MISTAKES: dict[str, Callable] = {
    "no_rescaling": _no_rescaling,
    "rescaling_at_eval": _rescaling_at_eval,
    "classic_dropout": _classic_dropout,
    "keep_prob_as_drop_prob": _keep_prob_as_drop_prob,
    "dropout_at_eval": _dropout_at_eval,
    "eval_scaled_by_keep_prob": _eval_scaled_by_keep_prob,
    "other_mask_rule": _other_mask_rule,
}

DROPOUT_ADVICE: dict[str, str] = {
    "no_rescaling": (
        "No rescaling (no_rescaling): the kept activations are not divided by 1 - p, so in training the "
        "expected output is (1 - p) x and the next layer sees smaller inputs than at evaluation. Inverted "
        "dropout returns x * keep / (1 - p)."
    ),
    "rescaling_at_eval": (
        "Rescaling at evaluation (rescaling_at_eval): with training=False inverted dropout is the identity; "
        "you divide by 1 - p there too. The 1/(1 - p) belongs to the training branch only."
    ),
    "classic_dropout": (
        "Original (non-inverted) dropout (classic_dropout): unscaled in training, multiplied by 1 - p at "
        "evaluation (Srivastava et al. 2014). Same expectation, but the series (and torch) use inverted "
        "dropout: divide by 1 - p in training, identity at evaluation."
    ),
    "keep_prob_as_drop_prob": (
        "Keep probability used as drop probability (keep_prob_as_drop_prob): p is the probability of "
        "DROPPING an element (P_drop = 0.1 keeps 90%); you keep each with probability p and divide by p. "
        "Keep where rand >= p and divide by 1 - p."
    ),
    "dropout_at_eval": (
        "Dropout at evaluation (dropout_at_eval): with training=False the function must return x "
        "unchanged; yours still drops. Return x when not training (model.eval() sets training=False)."
    ),
    "eval_scaled_by_keep_prob": (
        "Evaluation scaled by 1 - p (eval_scaled_by_keep_prob): your training branch is inverted dropout, "
        "but at evaluation you return (1 - p) x, the rule of original dropout, whose training branch does not "
        "rescale. The 1/(1 - p) in training already keeps the expectation at x, so evaluation returns x unchanged."
    ),
    "other_mask_rule": (
        "Another mask rule (other_mask_rule): your mask keeps the right share of elements but not the ones the "
        "reference keeps (e.g. rand < 1 - p, or torch.bernoulli, which draw differently from the generator), so "
        "nothing can be compared exactly. Draw the mask as the "
        "exercise asks: keep = torch.rand(x.shape, generator=generator) >= p."
    ),
}

#: Other ways of writing the keep/drop confusion: keep where rand >= 1 - p (with 1/p or 1/(1 - p)).
_DROPOUT_VARIANTS = [
    ("keep_prob_as_drop_prob",
     lambda x, p, training=True, generator=None: x if (not training or p == 0)
     else x * (torch.rand(x.shape, generator=generator) >= 1 - p) / p),
    ("keep_prob_as_drop_prob",
     lambda x, p, training=True, generator=None: x if (not training or p == 0)
     else x * (torch.rand(x.shape, generator=generator) >= 1 - p) / (1 - p)),
]


def _dropout_call(f: Callable) -> Callable:
    def run(x, p, training, seed):
        (x,) = clone_args([x])
        g = torch.Generator().manual_seed(seed)  # a fresh generator per call: the same draws for everyone
        return as_tensor_result(f(x, p, training, g), f"a tensor of shape {tuple(x.shape)}")

    return run


def _dropout_reference(x, p, training, seed):
    return dropout(x, p, training, generator=torch.Generator().manual_seed(seed))


def _dropout_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)
    cases = [((4, 7), 0.1, True), ((2, 3, 5), 0.5, True), ((1, 9), 0.3, False), ((3, 4), 0.25, True),
             ((2, 6), 0.0, True)]
    out = []
    for i, (shape, p, training) in enumerate(cases):
        x = torch.randn(*shape, generator=g) + 0.5  # no exact zeros: a dropped element is visible
        label = f"x {shape}, p={p}, " + ("training" if training else "evaluation (training=False)")
        out.append(TestInput(f"on {label}", (x, p, training, seed * 100 + i),
                             f"dropout(x, {p}, {training}, generator)"))
    return out


def check_dropout(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's inverted dropout against :func:`helpers.regularization.dropout`.

    ``fn(x, p, training, generator)`` (positional: ``dropout(x, p, training=True, generator=None)``)
    must return :math:`x \odot m/(1-p)` with ``m = torch.rand(x.shape, generator=generator) >= p``
    in training and ``x`` at evaluation. Each call gets a generator freshly seeded the same way,
    so learner and reference draw the same numbers. Inputs: ``(4, 7)`` p=0.1, ``(2, 3, 5)``
    p=0.5, ``(1, 9)`` p=0.3 at evaluation, ``(3, 4)`` p=0.25, ``(2, 6)`` p=0. Planted
    mistakes: :data:`DROPOUT_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    return run_check(
        fn, _dropout_call, _dropout_reference, DROPOUT_MISTAKES, DROPOUT_ADVICE, _dropout_inputs(seed),
        variants=_DROPOUT_VARIANTS,
        unknown_hint="Check: training -> x * (torch.rand(x.shape, generator=generator) >= p) / (1 - p); "
                     "evaluation -> x; p = 0 -> x.",
        pass_message="PASS: your dropout equals helpers.regularization.dropout on 5 inputs (p = 0 to 0.5, "
                     "training and evaluation, the same generator draws).",
    )


# ================================================================= label smoothing
def _smoothed(logits, target, eps, ignore_index, per_class, true_class, add=False):
    """Mean over kept rows of -sum_k q_k log p_k, q = per_class everywhere, true class set (or added) to true_class."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    keep = target != ignore_index
    logp, t = logp[keep], target[keep]
    q = torch.full_like(logp, per_class)
    rows = torch.arange(len(t))
    q[rows, t] = q[rows, t] + true_class if add else true_class
    return -(q * logp).sum(-1).mean()


def _ls_uniform(logits, target, eps, ignore_index=-100):
    """Worked solution, "uniform": q = (1 - eps) onehot + eps/V, mean over the rows not ignored."""
    V = logits.shape[-1]
    logp = torch.log_softmax(logits, dim=-1)
    keep = target != ignore_index
    logp, t = logp[keep], target[keep]
    q = torch.full_like(logp, eps / V)
    q[torch.arange(len(t)), t] += 1 - eps
    return -(q * logp).sum(-1).mean()


def _ls_others(logits, target, eps, ignore_index=-100):
    """Worked solution, "others" (the notes): q_y = 1 - eps, q_k = eps/(V-1) for k != y."""
    V = logits.shape[-1]
    logp = torch.log_softmax(logits, dim=-1)
    keep = target != ignore_index
    logp, t = logp[keep], target[keep]
    q = torch.full_like(logp, eps / (V - 1))
    q[torch.arange(len(t)), t] = 1 - eps
    return -(q * logp).sum(-1).mean()


LABEL_SMOOTHING_SOLUTIONS: dict[str, Callable] = {"uniform": _ls_uniform, "others": _ls_others}


def _per_class(convention: str, eps: float, V: int) -> float:
    return eps / V if convention == "uniform" else eps / (V - 1)


def _smooths_ignored_rows(convention: str) -> Callable:
    def loss(logits, target, eps, ignore_index=-100):
        """The smoothing term summed over every row, ignored ones included (the one-hot term skips them)."""
        V = logits.shape[-1]
        logp = torch.log_softmax(logits, dim=-1)
        keep = target != ignore_index
        safe = torch.where(keep, target, torch.zeros_like(target))
        nll = -logp.gather(-1, safe[:, None])[:, 0] * keep
        c = _per_class(convention, eps, V)
        true_weight = 1 - eps if convention == "uniform" else 1 - eps - c  # q_y minus the per-class share
        smooth = -logp.sum(-1) * c                                        # on all rows
        return (true_weight * nll + smooth).sum() / keep.sum()

    loss.__name__ = f"label_smoothing_{convention}_smooths_ignored_rows"
    return loss


def _mean_over_all_rows(convention: str) -> Callable:
    def loss(logits, target, eps, ignore_index=-100):
        V = logits.shape[-1]
        logp = torch.log_softmax(logits, dim=-1)
        keep = target != ignore_index
        safe = torch.where(keep, target, torch.zeros_like(target))
        q = torch.full_like(logp, _per_class(convention, eps, V))
        rows = torch.arange(len(target))
        q[rows, safe] = q[rows, safe] + (1 - eps) if convention == "uniform" else 1 - eps
        per_row = -(q * logp).sum(-1) * keep  # 0 on ignored rows ...
        return per_row.sum() / len(target)    # ... but they are counted in the mean

    loss.__name__ = f"label_smoothing_{convention}_mean_over_all_rows"
    return loss


def _not_summing_to_one(convention: str) -> Callable:
    def loss(logits, target, eps, ignore_index=-100):
        V = logits.shape[-1]
        c = _per_class(convention, eps, V)
        # uniform: true class SET to 1 - eps (loses eps/V); others: 1 - eps ADDED to eps/(V-1)
        return _smoothed(logits, target, eps, ignore_index, c, 1 - eps, add=convention == "others")

    loss.__name__ = f"label_smoothing_{convention}_targets_do_not_sum_to_one"
    return loss


def _others_eps_over_v(logits, target, eps, ignore_index=-100):
    """"others" with the uniform convention's share: true class 1 - eps, every other class eps/V (not eps/(V-1))."""
    return _smoothed(logits, target, eps, ignore_index, eps / logits.shape[-1], 1 - eps)


LABEL_SMOOTHING_MISTAKES: dict[str, dict[str, Callable]] = {
    conv: {
        "wrong_convention": LABEL_SMOOTHING_SOLUTIONS["others" if conv == "uniform" else "uniform"],
        "smooths_ignored_rows": _smooths_ignored_rows(conv),
        "mean_over_all_rows": _mean_over_all_rows(conv),
        "targets_do_not_sum_to_one": _not_summing_to_one(conv),
    }
    for conv in CONVENTIONS
}
LABEL_SMOOTHING_MISTAKES["others"]["eps_over_V_in_others"] = _others_eps_over_v

LABEL_SMOOTHING_ADVICE: dict[str, str] = {
    "wrong_convention": (
        "The other convention (wrong_convention): eps/V and eps/(V-1) swapped. \"uniform\" (Szegedy et al., "
        "F.cross_entropy(label_smoothing=eps)): q = (1 - eps) onehot + eps/V, so the true class gets "
        "1 - eps + eps/V. \"others\" (the notes): true class 1 - eps, every other class eps/(V-1). They agree "
        "when eps_uniform = eps_others * V/(V-1) (helpers.regularization.uniform_eps_from_others)."
    ),
    "smooths_ignored_rows": (
        "Ignored rows smoothed (smooths_ignored_rows): rows whose target is ignore_index (padding, prompt "
        "tokens) must contribute nothing, but your smoothing term -sum_k q_k log p_k runs over every row. "
        "Select the kept rows first (keep = target != ignore_index) and smooth only those."
    ),
    "mean_over_all_rows": (
        "Mean over all rows (mean_over_all_rows): the ignored rows contribute 0 but are counted in the mean, "
        "so the loss shrinks with the amount of padding. Divide by the number of kept rows, "
        "(target != ignore_index).sum(), as F.cross_entropy does."
    ),
    "targets_do_not_sum_to_one": (
        "Smoothed targets that do not sum to 1 (targets_do_not_sum_to_one): the true class was set where it "
        "should be added, or added where it should be set. \"uniform\": q = eps/V everywhere, then ADD 1 - eps "
        "to the true class; \"others\": q = eps/(V-1) everywhere, then SET the true class to 1 - eps."
    ),
    "eps_over_V_in_others": (
        "eps/V in the notes' convention (eps_over_V_in_others): the true class gets 1 - eps, so the other V - 1 "
        "classes share the remaining eps: eps/(V-1) each. With eps/V each, the targets sum to 1 - eps/V."
    ),
}

#: A learner's exception recognised by :func:`check_label_smoothing`: the ignored rows' target reached a
#: function of the class index (``F.one_hot``, indexing, ``gather``) before they were filtered out.
INDEXED_BEFORE_FILTERING = "indexed_before_filtering"


def _indexed_ignored_rows(e: Exception, target: torch.Tensor, ignore_index: int) -> bool:
    """Whether ``e`` is what torch raises when a row whose target is ``ignore_index`` reaches ``F.one_hot``
    ("Class values must be non-negative.") or an index by class ("index -100 is out of bounds ...")."""
    if not isinstance(e, (RuntimeError, IndexError)) or not bool((target == ignore_index).any()):
        return False
    text = str(e)
    return "Class values must be non-negative" in text or f"index {ignore_index} is out of bounds" in text


def _ls_call(f: Callable) -> Callable:
    def run(logits, target, eps, ignore_index):
        logits, target = clone_args([logits, target])
        try:
            out = f(logits, target, eps) if ignore_index == -100 else f(logits, target, eps, ignore_index=ignore_index)
        except (RuntimeError, IndexError) as e:
            if not _indexed_ignored_rows(e, target, ignore_index):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise Reject(INDEXED_BEFORE_FILTERING,
                         f"your function raised {type(e).__name__} ({first}): the rows whose target is "
                         f"ignore_index ({ignore_index}) reached F.one_hot or an index by class "
                         f"({INDEXED_BEFORE_FILTERING}). Filter rows with target == ignore_index before one_hot: "
                         "keep = target != ignore_index, then use logits[keep] and target[keep].") from e
        return as_tensor_result(out, "the mean loss, a 0-dimensional tensor")

    return run


def _ls_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)
    cases = [  # (N, V), eps, ignore_index, rows ignored
        ((6, 5), 0.1, -100, (1, 4)),
        ((1, 4), 0.2, -100, ()),
        ((7, 3), 0.3, -1, (6,)),
        ((5, 2), 0.1, -100, (0,)),
    ]
    out = []
    for (N, V), eps, ii, ignored in cases:
        logits = torch.randn(N, V, generator=g) * 3
        target = torch.randint(0, V, (N,), generator=g)
        target[list(ignored)] = ii
        label = f"logits ({N}, {V}), eps={eps}" + (f", {len(ignored)} row(s) = ignore_index {ii}" if ignored else
                                                   ", no row ignored")
        call = "loss(logits, target, eps)" if ii == -100 else f"loss(logits, target, eps, ignore_index={ii})"
        out.append(TestInput(f"on {label}", (logits, target, eps, ii), call))
    return out


def check_label_smoothing(fn: Callable, convention: str = "uniform", seed: int = 0) -> CheckResult:
    r"""Check the learner's label-smoothed cross-entropy against the reference, in one convention.

    ``fn(logits, target, eps)`` and ``fn(logits, target, eps, ignore_index=-1)``: ``logits``
    ``(N, V)``, ``target`` ``(N,)`` class indices (``ignore_index`` = not scored); returns
    the mean over the scored rows of :math:`-\sum_k q_k \log\operatorname{softmax}(z)_k` with
    ``q`` smoothed in ``convention`` (module docstring). Inputs: ``(6, 5)`` with 2 ignored rows,
    ``(1, 4)`` with none, ``(7, 3)`` with ``ignore_index=-1``, ``(5, 2)``. Planted mistakes:
    ``LABEL_SMOOTHING_MISTAKES[convention]``. One exception is recognised by its text: torch's
    "Class values must be non-negative" (``F.one_hot``) or "index -100 is out of bounds" raised
    on an input with ignored rows is diagnosed ``"indexed_before_filtering"`` (filter those rows
    before ``one_hot``).

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.

    Raises:
        ValueError: if ``convention`` is not ``"uniform"`` or ``"others"``.
    """
    check_choice(convention, "convention", CONVENTIONS)

    def reference(logits, target, eps, ignore_index):
        return label_smoothing_cross_entropy(logits, target, eps, convention, ignore_index=ignore_index)

    what = ("q = (1 - eps) onehot + eps/V" if convention == "uniform"
            else "q_y = 1 - eps, q_k = eps/(V-1) for k != y")
    return run_check(
        fn, _ls_call, reference, LABEL_SMOOTHING_MISTAKES[convention], LABEL_SMOOTHING_ADVICE, _ls_inputs(seed),
        unknown_hint=f"Check: log_softmax(logits, dim=-1); {what}; drop rows with target == ignore_index; "
                     f"mean over the rows kept.",
        pass_message=f"PASS: your loss equals helpers.regularization.label_smoothing_cross_entropy(convention="
                     f"{convention!r})" + (" (= F.cross_entropy(label_smoothing=eps))" if convention == "uniform" else "")
                     + " on 4 inputs (V = 2 to 5, ignored rows, a batch of 1, ignore_index=-1).",
    )
