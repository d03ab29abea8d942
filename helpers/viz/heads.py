"""The explorers of notebook 05 (head redundancy): pruning heads, and one head's attention map.

* :func:`prune_explorer` -- a slider for the number of heads pruned and one for the pruning
  order: the layer x head grid shows which heads are gone, the curve the accuracy left.
  Its numbers come from :func:`prune_explorer_state` on precomputed
  :class:`~helpers.heads.PruningCurve` objects (nothing is re-evaluated on a slider move).
* :func:`head_explorer` -- sliders for layer, head and example: that head's attention map,
  with its computed role. Numbers from :func:`head_explorer_state`.
* :func:`plot_score_scatter` -- two per-head scores against each other (e.g. gradient
  importance vs ablation), one labelled dot per head, with their Spearman rank correlation.
* :func:`plot_attention_map` -- one head's attention on one example, keys and queries
  labelled with their tokens (a static figure, large enough to read).

Both redraw by blitting (fixed axis limits, ``AxesImage.set_data`` with a fixed colour range).
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure

from ..heads import PruningCurve
from .explorer import Explorer

__all__ = ["prune_explorer_state", "prune_explorer", "head_explorer_state", "head_explorer", "spearman",
           "plot_score_scatter", "plot_attention_map"]


def _check_curves(curves) -> dict:
    if not isinstance(curves, Mapping) or not curves or not all(isinstance(c, PruningCurve) for c in curves.values()):
        raise ValueError(f"curves must be a non-empty dict of name -> PruningCurve, got {type(curves).__name__}")
    shapes = {tuple(c.masks.shape) for c in curves.values()}
    if len(shapes) != 1:
        raise ValueError(f"curves must all have masks of the same shape (points, num_layers, num_heads), got {sorted(shapes)}")
    return dict(curves)


def prune_explorer_state(curves: Mapping[str, PruningCurve], order: str, n_pruned: int) -> dict:
    """What the pruning explorer shows after ``n_pruned`` heads were removed in the order ``order`` (pure).

    Args:
        curves: ``{name: PruningCurve}`` with one head pruned per step (``len(masks) == N + 1``).
        order: a key of ``curves``.
        n_pruned: ``0 .. N``.

    Returns:
        dict with ``order``, ``n_pruned``, ``num_heads_total`` (N), ``fraction``, ``mask``
        ``(num_layers, num_heads)`` numpy (1 kept, 0 pruned), ``removed`` (list of
        ``(layer, head)`` in pruning order), ``accuracy``, ``loss``, ``drop`` (accuracy lost
        in percentage points), and the selected curve's ``fractions`` / ``accuracies``.
    """
    curves = _check_curves(curves)
    if order not in curves:
        raise ValueError(f"order must be one of {list(curves)}, got {order!r}")
    c = curves[order]
    N = int(c.masks.shape[1] * c.masks.shape[2])
    if len(c.masks) != N + 1:
        raise ValueError(f"curve {order!r} must prune one head per step ({N + 1} points), got {len(c.masks)} points")
    if isinstance(n_pruned, bool) or not isinstance(n_pruned, (int, np.integer)) or not (0 <= n_pruned <= N):
        raise ValueError(f"n_pruned must be an int in [0, {N}], got {n_pruned!r}")
    k = int(n_pruned)
    return {
        "order": order,
        "n_pruned": k,
        "num_heads_total": N,
        "fraction": float(c.fractions[k]),
        "mask": c.masks[k].numpy().copy(),
        "removed": list(c.order[:k]),
        "accuracy": float(c.accuracy[k]),
        "loss": float(c.loss[k]),
        "drop": 100.0 * float(c.accuracy[0] - c.accuracy[k]),
        "fractions": c.fractions.numpy(),
        "accuracies": c.accuracy.numpy(),
    }


def prune_explorer(curves: Mapping[str, PruningCurve], order: Optional[str] = None, n_pruned: int = 4,
                   accuracy_label: str = "accuracy") -> Explorer:
    """Sliders: heads pruned (0 .. N) and pruning order (one per curve).

    ``accuracy_label`` is the right panel's y-axis label: say which data the curves were measured
    on (notebook 05 passes "held-out test accuracy").

    Left: the layer x head grid (dark = pruned, numbers = step at which the head went).
    Right: accuracy against the fraction of heads pruned for every order (thin), the
    selected order bold, the current point marked.
    """
    import ipywidgets as widgets

    curves = _check_curves(curves)
    if not isinstance(accuracy_label, str) or not accuracy_label:
        raise ValueError(f"accuracy_label must be a non-empty string, got {accuracy_label!r}")
    names = list(curves)
    order = names[0] if order is None else order
    first = prune_explorer_state(curves, order, n_pruned)
    L, H = first["mask"].shape
    N = first["num_heads_total"]
    controls = {
        "n_pruned": widgets.IntSlider(value=n_pruned, min=0, max=N, step=1, description="n pruned"),
        # keep the options few and the slider default-sized: each option then spans a few tens of pixels
        "order": widgets.SelectionSlider(options=names, value=order, description="order"),
    }
    fig = Figure(figsize=(9.0, 3.4))
    fig.subplots_adjust(left=0.07, right=0.97, bottom=0.16, top=0.84, wspace=0.3)
    ax_g, ax_c = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
    img = ax_g.imshow(first["mask"], cmap="Greens", vmin=0.0, vmax=1.4, aspect="auto")
    ax_g.set_xticks(range(H))
    ax_g.set_yticks(range(L))
    ax_g.set_xlabel("head")
    ax_g.set_ylabel("layer")
    ax_g.set_title("green = kept, white = pruned (n = pruning step)", fontsize=9)
    texts = [[ax_g.text(h, l, "", ha="center", va="center", fontsize=8, color="0.2") for h in range(H)] for l in range(L)]
    for c in curves.values():
        ax_c.plot(c.fractions.numpy(), c.accuracy.numpy(), color="0.75", lw=0.8)
    (sel_line,) = ax_c.plot([], [], color="C3", lw=2, label="selected order")
    (pt,) = ax_c.plot([], [], "o", color="C3", ms=7, label="current")
    ax_c.plot([], [], color="0.75", lw=0.8, label="other orders")
    ax_c.set_xlim(-0.02, 1.02)
    ax_c.set_ylim(0.0, 1.02)
    ax_c.set_xlabel("fraction of heads pruned")
    ax_c.set_ylabel(accuracy_label)
    ax_c.set_title("accuracy left", fontsize=9)
    leg = ax_c.legend(loc="lower left", fontsize=7, framealpha=0.9)
    suptitle = fig.suptitle(" ", fontsize=10)

    def compute(n_pruned: int, order: str) -> dict:
        return prune_explorer_state(curves, order, n_pruned)

    def draw(s: dict) -> None:
        img.set_data(s["mask"])
        step = {lh: i + 1 for i, lh in enumerate(s["removed"])}
        for l in range(L):
            for h in range(H):
                texts[l][h].set_text(str(step[(l, h)]) if (l, h) in step else "")
        sel_line.set_data(s["fractions"], s["accuracies"])
        pt.set_data([s["fraction"]], [s["accuracy"]])
        suptitle.set_text(f"{s['order']}: {s['n_pruned']}/{s['num_heads_total']} heads pruned, accuracy {s['accuracy']:.3f}")

    def summary(s: dict) -> str:
        gone = ", ".join(f"{l}.{h}" for l, h in s["removed"]) or "none"
        return (f"order <b>{s['order']}</b>, {s['n_pruned']} heads pruned ({100 * s['fraction']:.0f}%): "
                f"accuracy {s['accuracy']:.3f} ({s['drop']:+.1f} points lost); pruned (layer.head): {gone}")

    animated = [img] + [t for row in texts for t in row] + [sel_line, pt, suptitle]
    return Explorer(controls, compute, draw, fig, summary, animated=animated, overlays=[leg])


def head_explorer_state(maps: torch.Tensor, inputs: torch.Tensor, layer: int, head: int, example: int,
                        labels: Optional[Sequence[Sequence[str]]] = None,
                        token_names: Optional[Sequence[str]] = None) -> dict:
    """One head's attention map on one example (pure).

    Args:
        maps: ``(num_layers, batch, num_heads, seq, seq)`` (:func:`helpers.heads.attention_maps`).
        inputs: ``(batch, seq)`` token ids the maps were computed on.
        layer, head, example: indices.
        labels: optional ``labels[layer][head]`` role names (:func:`helpers.heads.label_heads`).
        token_names: optional names of the token ids (``task.token_names()``).

    Returns:
        dict with ``layer``, ``head``, ``example``, ``weights`` ``(seq, seq)`` numpy,
        ``tokens`` (list of str), ``role``, ``argmax`` (the key each query attends to most),
        ``mean_offset`` (mean of query - key position under the weights) and ``max_weight``.
    """
    if not isinstance(maps, torch.Tensor) or maps.dim() != 5:
        raise ValueError(f"maps must be a (num_layers, batch, num_heads, seq, seq) tensor, got "
                         f"{tuple(maps.shape) if isinstance(maps, torch.Tensor) else type(maps).__name__}")
    L, B, H, n, _ = maps.shape
    for name, val, hi in (("layer", layer, L), ("head", head, H), ("example", example, B)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or not (0 <= val < hi):
            raise ValueError(f"{name} must be an int in [0, {hi}), got {val!r}")
    if not isinstance(inputs, torch.Tensor) or inputs.shape != (B, n):
        raise ValueError(f"inputs must have shape (batch, seq) = ({B}, {n}), got "
                         f"{tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__}")
    w = maps[layer, example, head].double().numpy()
    ids = inputs[example].tolist()
    tokens = [token_names[i] for i in ids] if token_names is not None else [str(i) for i in ids]
    pos = np.arange(n)
    return {
        "layer": int(layer), "head": int(head), "example": int(example),
        "weights": w.copy(),
        "tokens": tokens,
        "role": labels[layer][head] if labels is not None else "",
        "argmax": w.argmax(-1),
        "mean_offset": float((w * (pos[:, None] - pos[None, :])).sum(-1).mean()),
        "max_weight": float(w.max(-1).mean()),
    }


def head_explorer(maps: torch.Tensor, inputs: torch.Tensor, labels: Optional[Sequence[Sequence[str]]] = None,
                  token_names: Optional[Sequence[str]] = None, layer: int = 0, head: int = 0, example: int = 0) -> Explorer:
    """Sliders: layer, head and example; the heat map of that head's attention (rows = queries)."""
    import ipywidgets as widgets

    first = head_explorer_state(maps, inputs, layer, head, example, labels, token_names)
    L, B, H, n, _ = maps.shape
    controls = {
        "layer": widgets.IntSlider(value=layer, min=0, max=L - 1, description="layer"),
        "head": widgets.IntSlider(value=head, min=0, max=H - 1, description="head"),
        "example": widgets.IntSlider(value=example, min=0, max=B - 1, description="example"),
    }
    fig = Figure(figsize=(6.0, 4.6))
    fig.subplots_adjust(left=0.1, right=0.9, bottom=0.2, top=0.86)
    ax = fig.subplots()
    img = ax.imshow(first["weights"], cmap="viridis", vmin=0.0, vmax=1.0)
    fig.colorbar(img, ax=ax, label="attention weight")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.tick_params(labelsize=7)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    title = ax.set_title(" ", fontsize=9)
    tok_text = fig.text(0.5, 0.03, " ", ha="center", fontsize=8, family="monospace")

    def compute(layer: int, head: int, example: int) -> dict:
        return head_explorer_state(maps, inputs, layer, head, example, labels, token_names)

    def draw(s: dict) -> None:
        img.set_data(s["weights"])
        title.set_text(f"head {s['layer']}.{s['head']} (role: {s['role'] or '?'}), example {s['example']}")
        tok_text.set_text("tokens: " + " ".join(s["tokens"]))

    def summary(s: dict) -> str:
        return (f"layer {s['layer']}, head {s['head']}, example {s['example']}: role <b>{s['role'] or '?'}</b>; "
                f"mean query-key offset {s['mean_offset']:.2f} positions, mean top weight {s['max_weight']:.2f}")

    return Explorer(controls, compute, draw, fig, summary, animated=[img, title, tok_text])


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    r"""Spearman's rank correlation of two score tensors of the same shape (flattened).

    .. math:: \rho = \operatorname{corr}(\operatorname{rank}(a), \operatorname{rank}(b)),

    ranks 0 .. n-1 with ties broken by position (``argsort(stable=True)``). Equals
    ``scipy.stats.spearmanr`` when there are no ties.
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape or a.numel() < 2:
        raise ValueError(f"a and b must be tensors of the same shape with >= 2 entries, got "
                         f"{getattr(a, 'shape', type(a).__name__)} and {getattr(b, 'shape', type(b).__name__)}")

    def ranks(v):
        r = torch.empty(v.numel(), dtype=torch.float64)
        r[v.flatten().argsort(stable=True)] = torch.arange(v.numel(), dtype=torch.float64)
        return r

    return float(torch.corrcoef(torch.stack([ranks(a), ranks(b)]))[0, 1])


def plot_score_scatter(ax, x: torch.Tensor, y: torch.Tensor, *, xlabel: str, ylabel: str, title: str = "",
                       highlight: Sequence[tuple[int, int]] = (), logx: bool = False):
    """One dot per head ``(layer, head)`` at ``(x[l, h], y[l, h])``, labelled ``"l.h"``, colour = layer.

    Args:
        ax: matplotlib axes.
        x, y: ``(num_layers, num_heads)`` scores of the same heads.
        xlabel, ylabel: axis labels with units.
        title: the Spearman rank correlation is appended.
        highlight: heads drawn with a black ring (e.g. the two that matter most).
        logx: logarithmic x axis (gradient importances span orders of magnitude).

    Returns:
        Spearman's rho (float), also shown in the title.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.dim() != 2 or x.shape != y.shape:
        raise ValueError(f"x and y must be (num_layers, num_heads) tensors of the same shape, got "
                         f"{getattr(x, 'shape', type(x).__name__)} and {getattr(y, 'shape', type(y).__name__)}")
    rho = spearman(x, y)
    L, H = x.shape
    for l in range(L):
        ax.scatter(x[l].tolist(), y[l].tolist(), s=28, color=f"C{l}", label=f"layer {l}", zorder=3)
        for h in range(H):
            ax.annotate(f"{l}.{h}", (float(x[l, h]), float(y[l, h])), xytext=(3, 3), textcoords="offset points",
                        fontsize=7)
    for l, h in highlight:
        ax.scatter([float(x[l, h])], [float(y[l, h])], s=110, facecolors="none", edgecolors="k", zorder=4)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (Spearman rank correlation {rho:.2f})" if title else f"Spearman rank correlation {rho:.2f}",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return rho


def plot_attention_map(ax, weights, tokens: Sequence[str], *, title: str = "", fontsize: float = 6,
                       show_query_labels: bool = True):
    """One head's attention weights on one example as a heat map, both axes labelled with the tokens.

    Args:
        ax: matplotlib axes.
        weights: ``(seq, seq)`` attention weights (rows = queries, columns = keys), tensor or array;
            drawn on the fixed colour range [0, 1].
        tokens: the ``seq`` token names of the example (e.g. ``[task.token_names()[i] for i in x]``).
        title: axes title.
        fontsize: size of the tick labels.
        show_query_labels: label the query axis (turn off for maps placed right of another).

    Returns:
        The ``AxesImage`` (for a shared colour bar).
    """
    w = weights.detach().double().cpu().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights, float)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"weights must be a square (seq, seq) matrix, got shape {tuple(w.shape)}")
    if isinstance(tokens, str) or len(tokens) != w.shape[0]:
        raise ValueError(f"tokens must be a sequence of {w.shape[0]} token names (one per position), got "
                         f"{len(tokens) if not isinstance(tokens, str) else 'a string'}")
    n = w.shape[0]
    img = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(n), [str(t) for t in tokens], rotation=90, fontsize=fontsize)
    ax.set_xlabel("key token", fontsize=fontsize + 2)
    if show_query_labels:
        ax.set_yticks(range(n), [str(t) for t in tokens], fontsize=fontsize)
        ax.set_ylabel("query token", fontsize=fontsize + 2)
    else:
        ax.set_yticks(range(n), [""] * n)
    if title:
        ax.set_title(title, fontsize=fontsize + 3)
    return img
