r"""Diagnosing checker for the head-importance exercise of notebook 05 ("write it from memory").

:func:`check_head_importance` runs the learner's ``importance(model, inputs, targets)`` against
:func:`helpers.heads.head_importance`: the gradient importance of Michel, Levy and Neubig,
"Are Sixteen Heads Really Better than One?" (NeurIPS 2019), eq. (2),

.. math:: I_h = \mathbb E_x \left|\frac{\partial \mathcal L(x)}{\partial \xi_h}\right|,

where :math:`\xi_h` is the gate multiplying head :math:`h`'s output (``head_mask`` of a
:class:`~helpers.model.TinyTransformer`, all ones), :math:`\mathcal L(x)` the mean cross-entropy
over the scored positions of example :math:`x` (targets ``-100`` are not scored), the
absolute value taken **per example**, then averaged over the examples that have a scored
position. The worked solution is :func:`head_importance_solution` (one backward pass per
example); the planted mistakes are :data:`HEAD_IMPORTANCE_MISTAKES`.

The learner's function gets a freshly built, seeded model for every call (nothing it does to
the model, its gradients or its mode carries over) and cloned data.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..heads import head_importance
from ..model import TinyTransformer
from ..tasks import IGNORE_INDEX
from .engine import CheckResult, TestInput, as_tensor_result, clone_args, run_check

__all__ = ["check_head_importance", "head_importance_solution", "HEAD_IMPORTANCE_MISTAKES", "HEAD_IMPORTANCE_ADVICE"]


def _per_example_grads(model, inputs, targets):
    """Yield ``d L(x) / d xi`` ``(num_layers, num_heads)`` for each example with a scored target."""
    L, H = model.num_layers, model.num_heads
    for x, y in zip(inputs, targets):
        if (y == IGNORE_INDEX).all():
            continue  # nothing scored: no loss for this example
        xi = torch.ones(L, H, requires_grad=True)
        logits = model(x[None], head_mask=xi)[0]
        loss = F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX)
        (g,) = torch.autograd.grad(loss, xi)
        yield g


def head_importance_solution(model, inputs, targets):
    """Worked solution: ``mean over examples of |dL(x)/d xi|``, one backward pass per example.

    ``model`` a TinyTransformer, ``inputs``/``targets`` ``(batch, seq)`` (``-100`` = not scored).
    Returns ``(num_layers, num_heads)``.
    """
    model.eval()
    L, H = model.num_layers, model.num_heads
    total, n = torch.zeros(L, H), 0
    for x, y in zip(inputs, targets):
        if (y == -100).all():
            continue
        xi = torch.ones(L, H, requires_grad=True)              # the gates, one per head
        logits = model(x[None], head_mask=xi)[0]                # (seq, vocab)
        loss = F.cross_entropy(logits, y, ignore_index=-100)    # L(x): mean over the scored positions
        (g,) = torch.autograd.grad(loss, xi)
        total += g.abs()                                        # |.| per example ...
        n += 1
    return total / n                                            # ... then the mean


def _sign_kept(model, inputs, targets):
    model.eval()
    grads = list(_per_example_grads(model, inputs, targets))
    return sum(grads) / len(grads)


def _averaged_before_abs(model, inputs, targets):
    """One backward pass on the batch loss (the mean over every scored position), then |.|."""
    model.eval()
    xi = torch.ones(model.num_layers, model.num_heads, requires_grad=True)
    logits = model(inputs, head_mask=xi)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    (g,) = torch.autograd.grad(loss, xi)
    return g.abs()


def _averaged_over_examples_before_abs(model, inputs, targets):
    model.eval()
    grads = list(_per_example_grads(model, inputs, targets))
    return (sum(grads) / len(grads)).abs()  # = |d mean_x L(x) / d xi|


def _divided_by_all_rows(model, inputs, targets):
    """Rows without a scored target skipped in the sum, but still counted in the mean (divided by the batch)."""
    model.eval()
    grads = list(_per_example_grads(model, inputs, targets))
    return sum(g.abs() for g in grads) / len(inputs)


def _weight_gradients(model, inputs, targets):
    """|dL(x)/dW^O_h| summed over the head's columns of the output projection, instead of the gate's."""
    model.eval()
    L, H = model.num_layers, model.num_heads
    weights = [block.attn.linear_out.weight for block in model.blocks]  # (d_model, d_model) each
    dk = weights[0].shape[1] // H
    total, n = torch.zeros(L, H), 0
    for x, y in zip(inputs, targets):
        if (y == -100).all():
            continue
        loss = F.cross_entropy(model(x[None])[0], y, ignore_index=-100)
        grads = torch.autograd.grad(loss, weights)
        for l, g in enumerate(grads):
            total[l] += g.abs().reshape(-1, H, dk).sum(dim=(0, 2))
        n += 1
    return total / n


def _summed_over_positions(model, inputs, targets):
    """A per-example gate and the batch loss with ``reduction="sum"``: example x weighs n_x L(x), not L(x)."""
    model.eval()
    xi = torch.ones(inputs.shape[0], model.num_layers, model.num_heads, requires_grad=True)
    logits = model(inputs, head_mask=xi)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    (g,) = torch.autograd.grad(loss, xi)
    has = (targets != -100).any(dim=1)
    return g.abs()[has].mean(0)


def _over_all_rows(mistake: Callable) -> Callable:
    """``mistake``'s mean over the scored rows turned into a mean over every row (mean_over_all_rows as well)."""
    def both(model, inputs, targets):
        n_scored = int((targets != -100).any(dim=1).sum())
        return mistake(model, inputs, targets) * n_scored / len(inputs)

    return both


HEAD_IMPORTANCE_MISTAKES: dict[str, Callable] = {
    "sign_kept": _sign_kept,
    "averaged_before_abs": _averaged_before_abs,
    "weight_gradients_not_gate": _weight_gradients,
    "mean_over_all_rows": _divided_by_all_rows,
    "summed_over_positions": _summed_over_positions,
}

HEAD_IMPORTANCE_ADVICE: dict[str, str] = {
    "mean_over_all_rows": (
        "Mean over every row (mean_over_all_rows): you divide by the batch size, so rows without a scored "
        "target count in the mean (they add nothing to the sum, whether you skip them or not). Importance is "
        "the mean over the examples that have a scored target: divide by their number."
    ),
    "sign_kept": (
        "Sign kept (sign_kept): you average dL(x)/d xi_h without the absolute value, so a head whose "
        "removal raises the loss on some examples and lowers it on others scores near 0. Michel et al. "
        "(2019, eq. 2) take |dL(x)/d xi_h| per example: importance is the size of the expected change."
    ),
    "averaged_before_abs": (
        "Averaged before the absolute value (averaged_before_abs): |mean_x dL(x)/d xi_h| (one backward pass "
        "on the batch loss) lets opposite signs cancel across examples. Take |.| per example, then average: "
        "one backward pass per example, or one per batch with a per-example gate of shape "
        "(batch, num_layers, num_heads) and the loss = the sum over examples of each example's mean L(x)."
    ),
    "weight_gradients_not_gate": (
        "Gradients of the weights instead of the gate (weight_gradients_not_gate): |dL/dW^O| over the head's "
        "columns measures how fast the loss moves with each weight, not what removing the head does. Pass a "
        "gate xi = torch.ones(num_layers, num_heads, requires_grad=True) as head_mask and differentiate with "
        "respect to it (dL/d xi_h = <W^O_h, dL/dW^O_h>, one number per head, signed)."
    ),
    "summed_over_positions": (
        "Summed over positions (summed_over_positions): with reduction=\"sum\" example x contributes the sum of "
        "its cross-entropies, n_x L(x), so its |dL/d xi| is weighted by its number of scored positions n_x. "
        "With a per-example gate (batch, num_layers, num_heads), differentiate the sum over examples of each "
        "example's mean L(x): reduction=\"none\", then each row's sum divided by its number of scored targets."
    ),
}

#: Two mistakes at once: each mistake that averages over the scored rows, averaged over every row instead.
_COMBINED = {"sign_kept": _sign_kept, "averaged_before_abs": _averaged_over_examples_before_abs,
             "summed_over_positions": _summed_over_positions, "weight_gradients_not_gate": _weight_gradients}
HEAD_IMPORTANCE_ADVICE.update({
    f"{name}+mean_over_all_rows": (f"Two mistakes at once ({name}+mean_over_all_rows). 1. {HEAD_IMPORTANCE_ADVICE[name]} "
                                   f"2. {HEAD_IMPORTANCE_ADVICE['mean_over_all_rows']}")
    for name in _COMBINED})

#: The same mistake with the batch loss taken as the mean of the per-example losses, then the pairs of mistakes.
_HEAD_IMPORTANCE_VARIANTS = [("averaged_before_abs", _averaged_over_examples_before_abs)] + [
    (f"{name}+mean_over_all_rows", _over_all_rows(f)) for name, f in _COMBINED.items()]

#: The models of the test inputs: (vocab, d_model, heads, layers, seed).
_MODELS = {"2x2": (11, 16, 2, 2, 0), "1x3": (9, 12, 3, 1, 1), "2x4": (13, 16, 4, 2, 2)}


def _build(name: str) -> TinyTransformer:
    vocab, d, h, layers, seed = _MODELS[name]
    return TinyTransformer(vocab, d, h, layers, max_len=16, seed=seed)


def _hi_call(f: Callable) -> Callable:
    def run(model_name, inputs, targets):
        inputs, targets = clone_args([inputs, targets])
        with torch.enable_grad():  # the engine runs without autograd; this exercise needs it
            out = f(_build(model_name), inputs, targets)
        return as_tensor_result(out, "a (num_layers, num_heads) tensor").detach()

    return run


def _hi_reference(model_name, inputs, targets):
    with torch.enable_grad():
        return head_importance(_build(model_name), (inputs, targets))


def _hi_inputs(seed: int) -> list[TestInput]:
    g = torch.Generator().manual_seed(seed)
    out = []
    cases = [  # model, batch, seq, the targets' unscored pattern
        ("2x2", 3, 7, "varied"),
        ("1x3", 1, 5, "varied"),
        ("2x4", 4, 6, "one row unscored"),
    ]
    for name, b, n, pattern in cases:
        vocab, d, h, layers, _ = _MODELS[name]
        x = torch.randint(0, vocab, (b, n), generator=g)
        y = torch.randint(0, vocab, (b, n), generator=g)
        for i in range(b):
            y[i, : i + 1] = IGNORE_INDEX  # row i scores n - i - 1 positions: examples weigh differently
        if pattern == "one row unscored":
            y[-1] = IGNORE_INDEX
        label = (f"a {layers}-layer, {h}-head TinyTransformer (d_model={d}) on a batch of {b}, seq {n}"
                 + (", the last row with no scored target" if pattern == "one row unscored" else ""))
        out.append(TestInput(f"on {label}", (name, x, y), "importance(model, inputs, targets)"))
    return out


def check_head_importance(fn: Callable, seed: int = 0) -> CheckResult:
    r"""Check the learner's Michel et al. head importance against :func:`helpers.heads.head_importance`.

    ``fn(model, inputs, targets)``: ``model`` a :class:`~helpers.model.TinyTransformer` whose
    ``forward(tokens, head_mask=xi)`` multiplies head ``(l, h)``'s output by ``xi[l, h]``;
    ``inputs``, ``targets`` ``(batch, seq)`` long (``-100`` = not scored). Returns
    :math:`I = \mathbb E_x|\partial\mathcal L(x)/\partial\xi|` ``(num_layers, num_heads)``
    (module docstring). Inputs: a 2-layer 2-head model on a batch of 3, a 1-layer 3-head model
    on a batch of 1, a 2-layer 4-head model on a batch of 4 whose last row has no scored
    target (it does not count). Planted mistakes: :data:`HEAD_IMPORTANCE_MISTAKES`.

    Returns:
        :class:`~helpers.practice.engine.CheckResult`; ``print`` it. Never raises on the learner's errors.
    """
    return run_check(
        fn, _hi_call, _hi_reference, HEAD_IMPORTANCE_MISTAKES, HEAD_IMPORTANCE_ADVICE, _hi_inputs(seed),
        variants=_HEAD_IMPORTANCE_VARIANTS, atol=1e-7, rtol=1e-4,  # importances are ~1e-3 to 1e-1: compare relatively
        unknown_hint="Check: gate xi = ones(num_layers, num_heads, requires_grad=True) as head_mask; per example L(x) = mean "
                     "cross-entropy over its scored positions; |dL(x)/d xi| per example; mean over the examples "
                     "with a scored target. With a per-example gate (batch, num_layers, num_heads) and one backward "
                     "pass, the loss = the sum over examples of each example's mean L(x).",
        pass_message="PASS: your importance equals helpers.heads.head_importance on 3 models and batches "
                     "(1 to 2 layers, 2 to 4 heads, a batch of 1, a row with no scored target).",
    )
