r"""Head analysis: which attention heads a trained model needs, and which are redundant.

Taught in ``notebooks/05_head_redundancy.ipynb``. Everything here works on a
:class:`~helpers.model.TinyTransformer` through its ``head_mask`` argument (a multiplier
:math:`\xi_{l,h}` on each head's output, Michel et al. 2019) and its recorded
``attention_weights``:

* :func:`head_importance` -- the gradient importance :math:`I_h = \mathbb E_x |\partial
  \mathcal L(x) / \partial \xi_h|` of Michel, Levy and Neubig, "Are Sixteen Heads Really
  Better than One?" (NeurIPS 2019), eq. (2) / sec. 4.1.
* :func:`ablation_importance` -- what the metric loses when one head alone is masked.
* :func:`pruning_curve` -- accuracy and loss as heads are removed one by one (importance
  order, recomputed or fixed; random order; any given order).
* :func:`attention_maps`, :func:`head_outputs`, :func:`head_similarity`,
  :func:`similarity_clusters` -- how alike two heads are (Jensen-Shannon similarity of
  their attention patterns, cosine similarity of what they write to the residual stream).
* :func:`attention_at_offset`, :func:`induction_score`, :func:`label_heads` -- computed
  criteria for the roles heads play (previous-token, fixed offset, induction; Olsson et
  al. 2022).
* :func:`attention_entropy` -- how spread out attention is (collapse shows as low entropy).
* :func:`mean_pool_kv_heads` -- turn a multi-head model into a grouped-query one by
  mean-pooling the key and value heads of each group (Ainslie et al. 2023's uptraining).

Heads are numbered ``(layer, head)``; flattened, head ``(l, h)`` is index ``l * num_heads + h``.
Data are given as ``batches``: one ``(inputs, targets)`` pair of long tensors
``(batch, seq)`` (targets ``-100`` where not scored, as :mod:`helpers.tasks` makes them)
or a list of such pairs.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from .tasks import IGNORE_INDEX
from .train import evaluate, model_device, to_device
from .validate import check_int

__all__ = [
    "head_importance",
    "ablation_importance",
    "PruningCurve",
    "pruning_curve",
    "attention_maps",
    "head_outputs",
    "head_similarity",
    "similarity_clusters",
    "attention_at_offset",
    "induction_score",
    "label_heads",
    "attention_entropy",
    "mean_pool_kv_heads",
]

Pair = tuple[torch.Tensor, torch.Tensor]
Batches = Union[Pair, Sequence[Pair]]


# --------------------------------------------------------------------------- checks
def _check_model(model) -> nn.Module:
    if not isinstance(model, nn.Module) or not all(hasattr(model, a) for a in ("num_layers", "num_heads", "blocks")):
        raise TypeError(
            f"model must be a helpers.model.TinyTransformer (an nn.Module with num_layers, num_heads and "
            f"blocks), got {type(model).__name__}"
        )
    return model


def _as_batches(batches) -> list[Pair]:
    """One ``(inputs, targets)`` pair or a sequence of pairs -> a list of pairs (checked)."""
    if (isinstance(batches, (tuple, list)) and len(batches) == 2 and all(isinstance(t, torch.Tensor) for t in batches)):
        batches = [batches]
    if not isinstance(batches, (tuple, list)) or not batches:
        raise TypeError(
            f"batches must be an (inputs, targets) pair of tensors or a non-empty list of such pairs, "
            f"got {type(batches).__name__}"
        )
    out = []
    for i, pair in enumerate(batches):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, torch.Tensor) for t in pair)):
            raise TypeError(f"batches[{i}] must be an (inputs, targets) pair of tensors, got {type(pair).__name__}")
        x, y = pair
        if x.dim() != 2 or x.shape != y.shape:
            raise ValueError(
                f"batches[{i}]: inputs and targets must both have shape (batch, seq), got "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
        out.append((x, y))
    return out


def _heads(model) -> tuple[int, int]:
    return model.num_layers, model.num_heads


def _check_head_index(head, L: int, H: int, name: str = "head") -> tuple[int, int]:
    if not (isinstance(head, (tuple, list)) and len(head) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) for i in head)):
        raise TypeError(f"{name} must be a (layer, head) pair of ints, got {head!r}")
    l, h = head
    if not (0 <= l < L and 0 <= h < H):
        raise ValueError(
            f"{name} {tuple(head)} is out of range: layer must be in [0, {L}) and head in [0, {H}) "
            f"(num_layers={L}, num_heads={H})"
        )
    return int(l), int(h)


def _evaluate(model, batches: list[Pair], head_mask: Optional[torch.Tensor] = None) -> tuple[float, float]:
    """Loss and accuracy over all batches, weighted by their number of scored positions."""
    tot_loss = tot_acc = 0.0
    tot_n = 0
    if head_mask is None:  # all ones: the same (explicit) attention path as a pruned model
        head_mask = torch.ones(model.num_layers, model.num_heads, device=model_device(model))
    for x, y in batches:
        n = int((y != IGNORE_INDEX).sum())
        if n == 0:
            continue
        loss, acc = evaluate(model, (x, y), head_mask=head_mask, need_weights=False)
        tot_loss += loss * n
        tot_acc += acc * n
        tot_n += n
    if tot_n == 0:
        raise ValueError("batches contain no scored position (every target is -100)")
    return tot_loss / tot_n, tot_acc / tot_n


# ----------------------------------------------------------------------- importance
def head_importance(model: nn.Module, batches: Batches, normalize: bool = False,
                    head_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""Gradient head importance of Michel et al. (2019): :math:`I_h = \mathbb E_x\,|\partial\mathcal L(x)/\partial\xi_h|`.

    Every head's output is multiplied by a mask variable :math:`\xi_h` (1 = kept). By a
    first-order Taylor expansion, removing head :math:`h` (:math:`\xi_h: 1 \to 0`) changes
    the loss of example :math:`x` by about :math:`-\partial\mathcal L(x)/\partial\xi_h`, so

    .. math:: I_h = \mathbb E_{x}\left|\frac{\partial \mathcal L(x)}{\partial \xi_h}\right|

    (the absolute value is taken per example, then averaged, as in the paper's eq. (2)).
    :math:`\mathcal L(x)` is the mean cross-entropy over the scored positions of example
    :math:`x`. One backward pass per batch gives all the per-example derivatives: the mask
    is given per example, ``(batch, num_layers, num_heads)``, and the loss differentiated is
    the sum over examples of each example's mean.

    It computes gradients even when called under ``torch.no_grad()`` (it turns them back on
    inside); under ``torch.inference_mode()`` autograd cannot run, so it refuses.

    Args:
        model: a :class:`~helpers.model.TinyTransformer` (evaluated in eval mode; its
            parameters' ``.grad`` are left untouched).
        batches: an ``(inputs, targets)`` pair or a list of pairs, ``(batch, seq)`` each.
        normalize: divide each layer's scores by their :math:`\ell_2` norm (Michel et al.
            sec. 4.1, after Molchanov et al. 2017), so layers are comparable.
        head_mask: optional ``(num_layers, num_heads)`` mask of heads already pruned (0):
            the importance of the remaining heads *given* that pruning (for iterative pruning).

    Returns:
        Tensor ``(num_layers, num_heads)`` (on the model's device, in the model's floating
        dtype or float32 if that is narrower), >= 0. The batches are moved to the model's device.
    """
    _check_model(model)
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "head_importance differentiates the loss with respect to the head gates, so it needs autograd, "
            "which torch.inference_mode() turns off: call it outside that block (under torch.no_grad() it works)"
        )
    data = _as_batches(batches)
    L, H = _heads(model)
    dev, dtype = model_device(model), _model_dtype(model)
    base = (torch.ones(L, H, device=dev, dtype=dtype) if head_mask is None
            else _check_mask_shape(head_mask, L, H).to(device=dev, dtype=dtype))
    was_training = model.training
    model.eval()
    total = None
    count = 0
    try:
        with torch.enable_grad():
            for x, y in data:
                x, y = (t.clone() if t.is_inference() else t for t in to_device((x, y), dev))
                scored = (y != IGNORE_INDEX)
                has = scored.any(dim=1)
                if not bool(has.any()):
                    continue
                xi = base.expand(x.shape[0], L, H).clone().requires_grad_(True)
                logits = model(x, head_mask=xi, need_weights=False)
                ce = F.cross_entropy(logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32)),
                                     y.flatten(), ignore_index=IGNORE_INDEX, reduction="none").view(y.shape)
                per_example = ce.sum(1) / scored.sum(1).clamp_min(1)  # L(x) for each row
                (grad,) = torch.autograd.grad(per_example.sum(), xi)
                g = grad.detach().to(ce.dtype).abs()[has].sum(0)
                total = g if total is None else total + g
                count += int(has.sum())
    finally:
        model.train(was_training)
    if total is None:
        raise ValueError("batches contain no scored position (every target is -100)")
    imp = total / count
    if normalize:
        imp = imp / imp.norm(dim=1, keepdim=True).clamp_min(1e-20)
    return imp


def _model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of ``model``'s first floating-point parameter; float32 for a model without one."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _check_mask_shape(mask, L: int, H: int) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"head_mask must be a torch.Tensor of shape (num_layers, num_heads), got {type(mask).__name__}")
    if mask.shape != (L, H):
        raise ValueError(f"head_mask must have shape (num_layers, num_heads) = ({L}, {H}), got {tuple(mask.shape)}")
    return mask


def ablation_importance(model: nn.Module, batches: Batches, metric: str = "accuracy") -> torch.Tensor:
    r"""What the model loses when one head alone is masked (all others kept).

    .. math::
        \Delta_h = \text{acc}(\text{all heads}) - \text{acc}(\xi_h = 0) \quad(\texttt{metric="accuracy"}),\qquad
        \Delta_h = \mathcal L(\xi_h = 0) - \mathcal L(\text{all heads}) \quad(\texttt{metric="loss"}).

    Positive = the head helps. This is the experiment of Michel et al. (2019), sec. 3.1
    (their Table 1 removes one head at a time from a trained model). It costs one
    evaluation per head, whereas :func:`head_importance` costs one backward pass.

    Args:
        model: a :class:`~helpers.model.TinyTransformer`.
        batches: ``(inputs, targets)`` or a list of pairs.
        metric: ``"accuracy"`` or ``"loss"``.

    Returns:
        Float tensor ``(num_layers, num_heads)``.
    """
    _check_model(model)
    data = _as_batches(batches)
    if metric not in ("accuracy", "loss"):
        raise ValueError(f"metric must be 'accuracy' or 'loss', got {metric!r}")
    L, H = _heads(model)
    base_loss, base_acc = _evaluate(model, data)
    out = torch.zeros(L, H)
    for l in range(L):
        for h in range(H):
            m = torch.ones(L, H)
            m[l, h] = 0.0
            loss, acc = _evaluate(model, data, m)
            out[l, h] = (base_acc - acc) if metric == "accuracy" else (loss - base_loss)
    return out


# -------------------------------------------------------------------------- pruning
@dataclass
class PruningCurve:
    """What :func:`pruning_curve` returns.

    Attributes:
        fractions: ``(k+1,)`` fraction of heads pruned at each point, from 0 to 1.
        accuracy, loss: ``(k+1,)`` the metrics at each point.
        order: the heads ``(layer, head)`` in the order they were pruned (each exactly once).
        masks: ``(k+1, num_layers, num_heads)`` the head mask at each point (1 = kept).
        name: how the order was chosen.
    """

    fractions: torch.Tensor
    accuracy: torch.Tensor
    loss: torch.Tensor
    order: list[tuple[int, int]]
    masks: torch.Tensor
    name: str = ""

    def max_prunable(self, tolerance: float = 0.01) -> float:
        r"""The largest pruned fraction whose accuracy is within ``tolerance`` of the unpruned
        accuracy, with every smaller fraction also within it (the first drop ends the run).

        .. math:: \max\{f_k : \text{acc}_0 - \text{acc}_j \le \text{tol}\ \ \forall j \le k\}
        """
        ok = (self.accuracy[0] - self.accuracy) <= tolerance + 1e-12
        k = 0
        while k + 1 < len(ok) and bool(ok[k + 1]):
            k += 1
        return float(self.fractions[k])


def pruning_curve(
    model: nn.Module,
    batches: Batches,
    order: Union[str, torch.Tensor, Sequence[tuple[int, int]]] = "importance",
    recompute: bool = True,
    seed: int = 0,
    heads_per_step: int = 1,
    normalize: bool = False,
    importance_batches: Optional[Batches] = None,
) -> PruningCurve:
    r"""Prune heads step by step and record accuracy and loss after each step.

    The heads pruned so far are set to 0 in ``head_mask``; the model's weights are never
    changed. Orders:

    * ``"importance"``: least important first by :func:`head_importance`. With
      ``recompute=True`` the importance of the remaining heads is recomputed after every
      step, given the heads already pruned; pruned heads stay in each layer's l2
      normalisation, as in Hugging Face's bertology example (``run_bertology.py``:
      ``head_importance /= norm_by_layer...``, then pruned heads set to +inf), which is
      adapted from Michel et al.; with ``recompute=False`` the scores of the full model fix
      the order (``normalize=True``: each layer's scores divided by their l2 norm).
    * ``"random"``: a random permutation from ``torch.Generator().manual_seed(seed)``.
    * a tensor of scores ``(num_layers, num_heads)``: lowest score pruned first (e.g. from
      :func:`ablation_importance`), ties by index.
    * a sequence of all ``(layer, head)`` pairs: that order.

    Args:
        model: a :class:`~helpers.model.TinyTransformer`.
        batches: ``(inputs, targets)`` or a list of pairs; the metrics are computed on
            them, and the importance too unless ``importance_batches`` is given.
        order: see above.
        recompute: for ``"importance"`` only.
        seed: for ``"random"`` only.
        heads_per_step: heads removed between two measurements (>= 1); the last step may
            remove fewer.
        normalize: layer-normalise the importance scores (see :func:`head_importance`).
        importance_batches: data to estimate the importance on, if not ``batches`` (Michel
            et al. estimate it on training data and report the metric on held-out data;
            pass the training data here and held-out data as ``batches``).

    Returns:
        :class:`PruningCurve` with ``ceil(N / heads_per_step) + 1`` points, ``N`` the number
        of heads; the first point is the unpruned model, the last has every head pruned.
    """
    _check_model(model)
    data = _as_batches(batches)
    imp_data = data if importance_batches is None else _as_batches(importance_batches)
    check_int(heads_per_step, "heads_per_step", 1)
    check_int(seed, "seed", 0)
    L, H = _heads(model)
    N = L * H
    fixed: Optional[list[tuple[int, int]]] = None
    if isinstance(order, str):
        if order not in ("importance", "random"):
            raise ValueError(f"order must be 'importance', 'random', a (num_layers, num_heads) score tensor or a "
                             f"sequence of (layer, head) pairs, got {order!r}")
        name = order
        if order == "random":
            perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed)).tolist()
            fixed = [(i // H, i % H) for i in perm]
            name = f"random (seed {seed})"
        elif not recompute:
            fixed = _order_by_scores(head_importance(model, imp_data, normalize=normalize).cpu(), L, H)
            name = "importance (fixed)"
        else:
            name = "importance (recomputed)"
    elif isinstance(order, torch.Tensor):
        _check_mask_shape(order, L, H)
        fixed = _order_by_scores(order.detach().float().cpu(), L, H)
        name = "scores"
    else:
        fixed = [_check_head_index(tuple(o) if isinstance(o, list) else o, L, H, f"order[{i}]") for i, o in enumerate(order)]
        if sorted(fixed) != [(l, h) for l in range(L) for h in range(H)]:
            raise ValueError(f"order must list every one of the {N} (layer, head) pairs exactly once, got {len(fixed)} "
                             f"entries with {len(set(fixed))} distinct")
        name = "given order"

    mask = torch.ones(L, H)
    pruned: list[tuple[int, int]] = []
    masks, accs, losses, fracs = [], [], [], []

    def record():
        loss, acc = _evaluate(model, data, mask.clone())
        masks.append(mask.clone())
        accs.append(acc)
        losses.append(loss)
        fracs.append(len(pruned) / N)

    record()
    while len(pruned) < N:
        for _ in range(min(heads_per_step, N - len(pruned))):
            if fixed is not None:
                nxt = fixed[len(pruned)]
            else:
                imp = head_importance(model, imp_data, normalize=normalize, head_mask=mask).cpu()
                imp = imp.masked_fill(mask == 0, float("inf"))
                i = int(torch.argmin(imp.flatten()))
                nxt = (i // H, i % H)
            mask[nxt] = 0.0
            pruned.append(nxt)
        record()
    return PruningCurve(
        fractions=torch.tensor(fracs), accuracy=torch.tensor(accs, dtype=torch.float64),
        loss=torch.tensor(losses, dtype=torch.float64), order=pruned, masks=torch.stack(masks), name=name,
    )


def _order_by_scores(scores: torch.Tensor, L: int, H: int) -> list[tuple[int, int]]:
    idx = torch.argsort(scores.flatten(), stable=True).tolist()
    return [(i // H, i % H) for i in idx]


# ------------------------------------------------------------------------ similarity
@torch.no_grad()
def attention_maps(model: nn.Module, inputs: torch.Tensor, head_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Every head's attention weights on ``inputs``: ``(num_layers, batch, num_heads, seq, seq)``.

    One forward pass in eval mode (``model.attention_weights`` stacked); rows are queries,
    columns keys, each row sums to 1. ``inputs`` are moved to the model's device, where
    the maps are returned.
    """
    _check_model(model)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2:
        raise ValueError(f"inputs must be a (batch, seq) tensor of token ids, got "
                         f"{tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__}")
    (inputs,) = to_device((inputs,), model_device(model))
    was_training = model.training
    model.eval()
    try:
        model(inputs, head_mask=head_mask, need_weights=True)
        return torch.stack(model.attention_weights)
    finally:
        model.train(was_training)


@torch.no_grad()
def head_outputs(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    r"""What each head writes into the residual stream: ``(num_layers, num_heads, batch, seq, d_model)``.

    The output projection is linear, so the attention output is a sum over heads,
    :math:`\text{out} = \sum_h \text{head}_h W^O_{[:, h]}{}^\top + b^O` with
    :math:`W^O_{[:, h]}` the ``head_dim`` columns of ``linear_out.weight`` that read head
    :math:`h`. This returns the terms :math:`\text{head}_h W^O_{[:,h]}{}^\top` (bias excluded),
    captured with a forward hook on each ``linear_out``. ``inputs`` are moved to the
    model's device, where the result is returned.
    """
    _check_model(model)
    (inputs,) = to_device((inputs,), model_device(model))
    captured: list[torch.Tensor] = []
    hooks = [b.attn.linear_out.register_forward_hook(lambda mod, inp, out: captured.append(inp[0]))
             for b in model.blocks]
    was_training = model.training
    model.eval()
    try:
        model(inputs, need_weights=False)
    finally:
        for hk in hooks:
            hk.remove()
        model.train(was_training)
    res = []
    for block, merged in zip(model.blocks, captured):
        attn = block.attn
        b, n, _ = merged.shape
        heads = merged.view(b, n, attn.num_heads, attn.head_dim)  # (b, n, H, dk)
        w = attn.linear_out.weight.view(attn.d_model, attn.num_heads, attn.head_dim)  # (d, H, dk)
        res.append(torch.einsum("bnhk,dhk->hbnd", heads, w))
    return torch.stack(res)


def head_similarity(model: nn.Module, batches: Batches, kind: str = "attention") -> torch.Tensor:
    r"""Pairwise similarity of all heads, ``(N, N)`` with ``N = num_layers * num_heads`` (index ``l * H + h``).

    * ``kind="attention"``: one minus the normalised Jensen-Shannon divergence of the two
      heads' attention distributions, averaged over every query row of every example:

      .. math::
          \text{sim}(i, j) = 1 - \frac{1}{\ln 2}\,\mathbb E_{x,t}\,\mathrm{JS}(a^i_t \,\|\, a^j_t),\qquad
          \mathrm{JS}(p\|q) = \tfrac12 \mathrm{KL}(p\|m) + \tfrac12\mathrm{KL}(q\|m),\ m = \tfrac{p+q}{2},

      in [0, 1] (JS is at most :math:`\ln 2`), 1 for identical patterns.
    * ``kind="output"``: cosine similarity of what the two heads write into the residual
      stream (:func:`head_outputs`, flattened over every example and position), in [-1, 1].

    Both are symmetric with a unit diagonal. Only the inputs of ``batches`` are used.
    """
    _check_model(model)
    data = _as_batches(batches)
    if kind not in ("attention", "output"):
        raise ValueError(f"kind must be 'attention' or 'output', got {kind!r}")
    L, H = _heads(model)
    N = L * H
    if kind == "output":
        flat = torch.cat([head_outputs(model, x).reshape(N, -1) for x, _ in data], dim=1).double()
        unit = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-30)
        sim = unit @ unit.T
        sim.fill_diagonal_(1.0)
        return sim.float()
    js = torch.zeros(N, N, dtype=torch.float64, device=model_device(model))
    rows = 0
    for x, _ in data:
        w = attention_maps(model, x).double()  # (L, b, H, n, n)
        w = w.permute(0, 2, 1, 3, 4).reshape(N, -1, w.shape[-1])  # (N, b*n, n)
        for i in range(N):
            p = w[i : i + 1]
            m = 0.5 * (p + w)
            kl_p = torch.xlogy(p, p).sum(-1) - torch.xlogy(p, m).sum(-1)
            kl_q = torch.xlogy(w, w).sum(-1) - torch.xlogy(w, m).sum(-1)
            js[i] += (0.5 * (kl_p + kl_q)).sum(-1)
        rows += w.shape[1]
    sim = 1.0 - js / rows / math.log(2.0)
    sim = 0.5 * (sim + sim.T)
    sim.fill_diagonal_(1.0)
    return sim.clamp(0.0, 1.0).float()


def similarity_clusters(similarity: torch.Tensor, threshold: float) -> list[list[int]]:
    """Groups of heads linked by similarity >= ``threshold`` (connected components, single linkage).

    Args:
        similarity: ``(N, N)`` symmetric matrix (e.g. from :func:`head_similarity`).
        threshold: heads ``i != j`` with ``similarity[i, j] >= threshold`` are in the same group.

    Returns:
        Every head in exactly one group; groups sorted by their smallest index, each sorted.
    """
    if not isinstance(similarity, torch.Tensor) or similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a square (N, N) tensor, got "
                         f"{tuple(similarity.shape) if isinstance(similarity, torch.Tensor) else type(similarity).__name__}")
    n = similarity.shape[0]
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    close = (similarity >= threshold).tolist()
    for i in range(n):
        for j in range(i + 1, n):
            if close[i][j]:
                parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


# -------------------------------------------------------------------------- roles
def _check_weights(weights) -> torch.Tensor:
    if isinstance(weights, (list, tuple)):
        weights = torch.stack(list(weights))
    if not isinstance(weights, torch.Tensor) or weights.dim() != 5 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            "weights must be attention maps of shape (num_layers, batch, num_heads, seq, seq) (or a list of "
            f"(batch, num_heads, seq, seq)), got {tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__}"
        )
    return weights


def attention_at_offset(weights: torch.Tensor, offset: int, query_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""Mean attention from each query :math:`t` to the key :math:`t - \text{offset}`, per head.

    .. math:: s_{l,h} = \operatorname{mean}_{x,\,t \ge \text{offset}}\ a^{l,h}_{t,\,t-\text{offset}}

    ``offset=1`` scores a previous-token head, ``offset=0`` a head that attends to itself.

    Args:
        weights: ``(num_layers, batch, num_heads, seq, seq)`` (see :func:`attention_maps`).
        offset: 0 <= offset < seq.
        query_mask: optional bool ``(batch, seq)``: only these queries count.

    Returns:
        ``(num_layers, num_heads)`` in [0, 1].
    """
    w = _check_weights(weights)
    n = w.shape[-1]
    if isinstance(offset, bool) or not isinstance(offset, int) or not (0 <= offset < n):
        raise ValueError(f"offset must be an int in [0, seq={n}), got {offset!r}")
    diag = torch.diagonal(w, offset=-offset, dim1=-2, dim2=-1)  # (L, b, H, n - offset): a[t, t-offset]
    valid = torch.ones(w.shape[1], n - offset, dtype=torch.bool, device=w.device)
    if query_mask is not None:
        valid = _check_query_mask(query_mask, w)[:, offset:]
    v = valid[None, :, None, :].to(w.dtype)
    return (diag * v).sum((1, 3)) / v.sum((1, 3)).clamp_min(1)


def _check_query_mask(query_mask, w) -> torch.Tensor:
    if not isinstance(query_mask, torch.Tensor) or query_mask.dtype != torch.bool or query_mask.shape != (w.shape[1], w.shape[-1]):
        raise ValueError(f"query_mask must be a bool tensor of shape (batch, seq) = ({w.shape[1]}, {w.shape[-1]}), got "
                         f"{tuple(query_mask.shape) if isinstance(query_mask, torch.Tensor) else type(query_mask).__name__}")
    return query_mask.to(w.device)


def induction_score(weights: torch.Tensor, inputs: torch.Tensor, query_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""Mean attention an induction head pays (Olsson et al. 2022): from query :math:`t` to the
    positions *right after* earlier copies of the current token.

    .. math::
        s_{l,h} = \operatorname{mean}_{x,t}\ \sum_{s+1 \le t:\ x_s = x_t,\ s < t} a^{l,h}_{t,\,s+1}

    averaged over the queries that have an earlier copy (and are in ``query_mask``).
    In associative recall (``k v .. q``), the query key's earlier copy is followed by its
    value, so an induction head reads the answer.

    Args:
        weights: ``(num_layers, batch, num_heads, seq, seq)``.
        inputs: ``(batch, seq)`` the token ids the maps were computed on.
        query_mask: optional bool ``(batch, seq)``.

    Returns:
        ``(num_layers, num_heads)`` in [0, 1] (0 when no query qualifies).
    """
    w = _check_weights(weights)
    b, n = w.shape[1], w.shape[-1]
    if not isinstance(inputs, torch.Tensor) or inputs.shape != (b, n):
        raise ValueError(f"inputs must have shape (batch, seq) = ({b}, {n}), got "
                         f"{tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__}")
    inputs = inputs.to(w.device)  # follow the maps (e.g. CUDA maps, CPU token ids)
    same = inputs[:, :, None] == inputs[:, None, :]  # (b, t, s): x_t == x_s
    earlier = torch.ones(n, n, dtype=torch.bool, device=inputs.device).tril(-1)  # s < t
    src = same & earlier
    target = torch.zeros_like(src)
    target[:, :, 1:] = src[:, :, :-1]  # key s+1 is a target when x_s == x_t, s < t (so s+1 <= t)
    q = src.any(-1)
    if query_mask is not None:
        q = q & _check_query_mask(query_mask, w)
    mass = (w * target[None, :, None].to(w.dtype)).sum(-1)  # (L, b, H, n)
    qf = q[None, :, None, :].to(w.dtype)
    return (mass * qf).sum((1, 3)) / qf.sum((1, 3)).clamp_min(1)


def label_heads(scores: dict[str, torch.Tensor], threshold: float = 0.5) -> list[list[str]]:
    """Name each head's roles: every role whose score is >= ``threshold``, highest first, joined by ``"+"``; ``"-"`` if none.

    A head can have several roles: in a model trained on a mixed task, the same head may
    attend at offset 2 in one sub-task and act as an induction head in another.

    Args:
        scores: ``{role name: (num_layers, num_heads) score tensor}`` (e.g. from
            :func:`attention_at_offset`, :func:`induction_score`); all the same shape.
        threshold: the minimum score for a label.

    Returns:
        ``labels[l][h]``, a list of lists of str.
    """
    if not isinstance(scores, dict) or not scores:
        raise ValueError(f"scores must be a non-empty dict of role name -> (num_layers, num_heads) tensor, got {scores!r}")
    names = list(scores)
    shapes = {tuple(scores[k].shape) for k in names}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"scores must all have the same shape (num_layers, num_heads), got shapes {sorted(shapes)}")
    s = torch.stack([scores[k].float() for k in names])  # (R, L, H)
    _, L, H = s.shape
    labels = []
    for l in range(L):
        row = []
        for h in range(H):
            roles = sorted(((float(s[r, l, h]), -r) for r in range(len(names)) if float(s[r, l, h]) >= threshold), reverse=True)
            row.append("+".join(names[-r] for _, r in roles) or "-")
        labels.append(row)
    return labels


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    r"""Mean entropy (nats) of the attention distributions, over the query rows.

    .. math:: H = \operatorname{mean}_t\Big(-\sum_s a_{t,s}\ln a_{t,s}\Big)

    (with :math:`0 \ln 0 = 0`). A causal query at position :math:`t` has :math:`t+1` keys,
    so its entropy is at most :math:`\ln(t+1)`; an attention that has collapsed onto one key
    has entropy 0.

    Args:
        weights: ``(..., seq_q, seq_k)``, rows summing to 1 (or 0 for fully masked rows).

    Returns:
        ``(...)``: the mean over the ``seq_q`` rows.
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() < 2:
        raise ValueError(f"weights must be a tensor (..., seq_q, seq_k), got "
                         f"{tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__}")
    return (-torch.xlogy(weights, weights).sum(-1)).mean(-1)


# ------------------------------------------------------------------ grouped-query conversion
def mean_pool_kv_heads(model: nn.Module, num_kv_heads: int) -> nn.Module:
    r"""A copy of a multi-head model whose key and value heads are mean-pooled into ``num_kv_heads`` groups.

    Ainslie et al. (2023), "GQA", sec. 2.1: a multi-head checkpoint becomes a grouped-query
    one by averaging, in every layer, the key projections (and the value projections) of
    the :math:`r = h/g` heads of each group; the model is then trained a little more
    ("uptraining"). With :math:`W^K_j` the ``(head_dim, d_model)`` block of head :math:`j`,

    .. math:: W^K_{\text{group } i} = \frac1r \sum_{j = ir}^{ir + r - 1} W^K_j \quad(\text{same for } W^V \text{ and the biases}),

    and group :math:`i` serves query heads :math:`ir, \dots, ir + r - 1`, the order of
    :meth:`helpers.attention.MultiHeadAttention.repeat_kv`. RoPE rotates every head's
    keys the same way, so pooling before it equals pooling after it. Queries, outputs,
    feed-forward layers and embeddings are copied unchanged.

    Args:
        model: a :class:`~helpers.model.TinyTransformer` with ``num_kv_heads == num_heads``.
        num_kv_heads: ``g``, a divisor of ``num_heads`` (1: multi-query attention).

    Returns:
        A new model (the input is not modified), in the input's train/eval mode.
    """
    _check_model(model)
    L, H = _heads(model)
    check_int(num_kv_heads, "num_kv_heads", 1)
    if getattr(model, "num_kv_heads", H) != H:
        raise ValueError(f"model must be multi-head (num_kv_heads == num_heads = {H}), "
                         f"got num_kv_heads={model.num_kv_heads}")
    if H % num_kv_heads != 0:
        raise ValueError(f"num_kv_heads must divide num_heads = {H}, got {num_kv_heads}")
    g, r = num_kv_heads, H // num_kv_heads
    new = copy.deepcopy(model)
    for block in new.blocks:
        attn = block.attn
        hd_ = attn.head_dim
        for name in ("linear_k", "linear_v"):
            old = getattr(attn, name)
            d_in = old.weight.shape[1]
            lin = nn.Linear(d_in, g * hd_, bias=old.bias is not None).to(old.weight.device, old.weight.dtype)
            with torch.no_grad():
                lin.weight.copy_(old.weight.view(g, r, hd_, d_in).mean(1).reshape(g * hd_, d_in))
                if old.bias is not None:
                    lin.bias.copy_(old.bias.view(g, r, hd_).mean(1).reshape(g * hd_))
            setattr(attn, name, lin)
        attn.num_kv_heads = g
    new.num_kv_heads = g
    return new
