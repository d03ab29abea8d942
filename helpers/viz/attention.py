"""Figures and the explorer of notebook 03 (multi-head attention from scratch).

* :func:`attention_grid` -- every layer x head attention map of one example, tokens as
  tick labels (a static figure; notebook 05 can reuse it for its heads).
* :func:`plot_split_merge` -- the split/merge reshape of MHA as a labelled diagram:
  ``(B, L, d_model) -> (B, L, h, d_k) -> (B, h, L, d_k)`` and back.
* :func:`attention_explorer_state` -- the pure function behind the explorer: one head's
  map, the selected query's row of weights and what to read from it.
* :func:`attention_explorer` -- sliders for layer, head and query position over a trained
  model's attention maps: the heatmap (fixed colour limits 0..1) with the selected row
  outlined, and that row as bars over the keys.

The weights come from :class:`helpers.model.TinyTransformer` (``model.attention_weights``,
one ``(batch, heads, seq, seq)`` tensor per layer) for **one** example: the tick labels
are that example's tokens and are drawn once, so the explorer can redraw by blitting.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .explorer import Explorer

__all__ = ["stack_attention", "attention_explorer_state", "attention_explorer", "attention_grid", "plot_split_merge"]

WeightsLike = Union[torch.Tensor, Sequence[torch.Tensor]]


def stack_attention(weights: WeightsLike, example: int = 0) -> torch.Tensor:
    """One example's attention maps as a ``(num_layers, num_heads, seq_q, seq_k)`` float tensor.

    Args:
        weights: either a tensor ``(num_layers, num_heads, seq_q, seq_k)`` (returned as is,
            detached, on the CPU), or a sequence with one tensor per layer, each
            ``(batch, heads, seq_q, seq_k)`` (``TinyTransformer.attention_weights``) or
            ``(heads, seq_q, seq_k)``.
        example: the batch row to take from 4-D per-layer tensors.

    Returns:
        A float32 CPU tensor ``(num_layers, num_heads, seq_q, seq_k)``.
    """
    if isinstance(weights, torch.Tensor):
        if weights.dim() != 4:
            raise ValueError(
                f"weights must have shape (num_layers, num_heads, seq_q, seq_k), got {tuple(weights.shape)}"
            )
        out = weights
    else:
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) == 0:
            raise TypeError(
                "weights must be a tensor (num_layers, num_heads, seq_q, seq_k) or a non-empty list of "
                f"per-layer tensors, got {type(weights).__name__}"
            )
        layers = []
        for i, w in enumerate(weights):
            if not isinstance(w, torch.Tensor):
                raise TypeError(f"weights[{i}] must be a torch.Tensor, got {type(w).__name__}")
            if w.dim() == 4:
                if not (0 <= example < w.shape[0]):
                    raise ValueError(f"example must be in [0, batch) = [0, {w.shape[0]}), got {example}")
                w = w[example]
            if w.dim() != 3:
                raise ValueError(
                    f"weights[{i}] must have shape (batch, heads, seq_q, seq_k) or (heads, seq_q, seq_k), "
                    f"got {tuple(w.shape)}"
                )
            layers.append(w)
        if len({tuple(w.shape) for w in layers}) != 1:
            raise ValueError(f"every layer must have the same shape, got {[tuple(w.shape) for w in layers]}")
        out = torch.stack(layers)
    return out.detach().to(device="cpu", dtype=torch.float32)


def _check_index(value, name: str, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if not (0 <= value < size):
        raise ValueError(f"{name} must be in [0, {size}), got {value}")
    return int(value)


def _check_tokens(tokens, seq: int) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(seq)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != seq:
        raise ValueError(f"tokens must have one label per position (seq = {seq}), got {len(tokens)}")
    return tokens


def attention_explorer_state(
    weights: WeightsLike,
    layer: int,
    head: int,
    query: int,
    tokens: Optional[Sequence[str]] = None,
) -> dict:
    r"""What the attention explorer shows for ``(layer, head, query)`` (pure: no widgets, no figure).

    With :math:`A^{(l,h)}` the softmax weights of head :math:`h` in layer :math:`l`
    (rows = queries, columns = keys, each row summing to 1) and :math:`a = A^{(l,h)}_{t,:}`
    the selected query's row:

    .. math:: \text{top} = \arg\max_j a_j, \qquad H(a) = -\sum_j a_j \ln a_j \;\text{(nats)},
              \qquad \text{allowed} = \#\{j : a_j > 0\}.

    Args:
        weights: see :func:`stack_attention` (one example; ``(layers, heads, seq, seq)``).
        layer, head, query: indices.
        tokens: one label per position (default ``"0" .. "seq-1"``).

    Returns:
        A dict with ``layer``, ``head``, ``query`` (ints), ``map`` ``(seq_q, seq_k)`` and
        ``row`` ``(seq_k,)`` (float64 numpy), ``tokens``, ``query_token``, ``top``
        (key index), ``top_token``, ``top_weight``, ``entropy`` (nats), ``max_entropy``
        (:math:`\ln` allowed), ``allowed`` (keys with weight > 0), ``row_sum``.
    """
    w = stack_attention(weights)
    n_layers, n_heads, n_q, n_k = w.shape
    layer = _check_index(layer, "layer", n_layers)
    head = _check_index(head, "head", n_heads)
    query = _check_index(query, "query", n_q)
    if n_q != n_k:
        raise ValueError(f"the explorer shows self-attention maps (seq_q == seq_k), got {n_q} x {n_k}")
    tokens = _check_tokens(tokens, n_k)
    amap = w[layer, head].to(torch.float64).numpy()
    row = amap[query].copy()
    top = int(np.argmax(row))
    pos = row[row > 0]
    allowed = int(pos.size)
    return {
        "layer": layer,
        "head": head,
        "query": query,
        "map": amap,
        "row": row,
        "tokens": tokens,
        "query_token": tokens[query],
        "top": top,
        "top_token": tokens[top],
        "top_weight": float(row[top]),
        "entropy": float(-(pos * np.log(pos)).sum()),
        "max_entropy": math.log(allowed) if allowed else 0.0,
        "allowed": allowed,
        "row_sum": float(row.sum()),
    }


def _track_layout(n_values: int):
    """A slider layout whose track is about 35 px per step (at most the default ~125 px).

    A default slider spreads 2 values over a ~125 px track, so a short drag (under half a
    step, ~60 px) snaps back and nothing happens; a track sized to the number of values
    moves one step per short drag, like the sliders with many values.
    """
    import ipywidgets as widgets

    track = min(125, 35 * max(n_values - 1, 1))
    return widgets.Layout(width=f"{300 - 125 + track}px")  # 300 px: ipywidgets' default slider width


def attention_explorer(
    weights: WeightsLike,
    tokens: Optional[Sequence[str]] = None,
    layer: int = 0,
    head: int = 0,
    query: Optional[int] = None,
    title: str = "attention",
) -> Explorer:
    """Sliders for layer, head and query position over one example's attention maps.

    Left: the selected head's map (queries down, keys across, colour limits fixed to
    0..1 so colours compare between heads) with the selected query's row outlined.
    Right: that row as bars over the keys, the largest in red. The tokens label both
    axes; they are drawn once, so only the image, the outline, the bars and the titles
    are redrawn on a slider move (blitting).

    Args:
        weights: see :func:`stack_attention` (``(layers, heads, seq, seq)`` or
            ``model.attention_weights`` after a forward pass on one example).
        tokens: one label per position.
        layer, head: initial slider values.
        query: initial query position (default: the last).
        title: the figure's title (e.g. the task's name).

    Returns:
        An :class:`~helpers.viz.explorer.Explorer`; display it as a cell's last value.
    """
    import ipywidgets as widgets

    w = stack_attention(weights)
    n_layers, n_heads, n_q, n_k = w.shape
    tokens = _check_tokens(tokens, n_k)
    if query is None:
        query = n_q - 1
    first = attention_explorer_state(w, layer, head, query, tokens)  # validates the indices

    controls = {
        "layer": widgets.IntSlider(value=layer, min=0, max=n_layers - 1, step=1, description="layer",
                                   layout=_track_layout(n_layers)),
        "head": widgets.IntSlider(value=head, min=0, max=n_heads - 1, step=1, description="head",
                                  layout=_track_layout(n_heads)),
        "query": widgets.IntSlider(value=query, min=0, max=n_q - 1, step=1, description="query position",
                                   style={"description_width": "initial"}),
    }

    fig = Figure(figsize=(9.0, 3.6))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.2, top=0.83, wspace=0.35)
    ax_m, ax_b = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.35]})
    img = ax_m.imshow(first["map"], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(img, ax=ax_m, fraction=0.046, pad=0.03, label="attention weight")
    ticks = np.arange(n_k)
    fontsize = 7 if n_k <= 24 else 5
    ax_m.set_xticks(ticks, tokens, rotation=90, fontsize=fontsize)
    ax_m.set_yticks(ticks, tokens, fontsize=fontsize)
    ax_m.set_xlabel("key (attended to)")
    ax_m.set_ylabel("query (attending)")
    outline = Rectangle((-0.5, query - 0.5), n_k, 1.0, fill=False, edgecolor="C3", lw=1.5)
    ax_m.add_patch(outline)
    title_m = ax_m.set_title(" ", fontsize=9)

    bars = ax_b.bar(ticks, first["row"], width=0.8, color="C0")
    ax_b.set_xlim(-0.6, n_k - 0.4)
    ax_b.set_ylim(0.0, 1.3)  # weights <= 1; the strip above 1.1 holds the marker and the legend
    ax_b.set_yticks(np.linspace(0.0, 1.0, 6))
    ax_b.set_xticks(ticks, tokens, rotation=90, fontsize=fontsize)
    ax_b.set_xlabel("key (attended to)")
    ax_b.set_ylabel("attention weight")
    (query_mark,) = ax_b.plot([query], [1.06], "v", color="C3", ms=6)
    title_b = ax_b.set_title(" ", fontsize=9)
    suptitle = fig.suptitle(title, fontsize=10)
    handles = [Rectangle((0, 0), 1, 1, color="C0"), Rectangle((0, 0), 1, 1, color="C3"), query_mark]
    leg = ax_b.legend(handles, ["weight on key", "largest weight", "query position"], loc="upper center",
                      ncol=3, fontsize=7, framealpha=0.9)

    def compute(layer: int, head: int, query: int) -> dict:
        return attention_explorer_state(w, layer, head, query, tokens)

    def draw(s: dict) -> None:
        img.set_data(s["map"])
        outline.set_y(s["query"] - 0.5)
        for j, (bar, h) in enumerate(zip(bars, s["row"])):
            bar.set_height(h)
            bar.set_color("C3" if j == s["top"] else "C0")
        query_mark.set_data([s["query"]], [1.06])
        title_m.set_text(f"layer {s['layer']}, head {s['head']}: all queries")
        title_b.set_text(f"query {s['query']} ({s['query_token']}): top key {s['top']} ({s['top_token']}), "
                         f"weight {s['top_weight']:.2f}")

    def summary(s: dict) -> str:
        return (
            f"layer {s['layer']}, head {s['head']}, query position {s['query']} "
            f"(token {s['query_token']}): top key {s['top']} (token {s['top_token']}) with weight "
            f"{s['top_weight']:.3f}; entropy {s['entropy']:.3f} nats of at most {s['max_entropy']:.3f} "
            f"over {s['allowed']} visible keys"
        )

    animated = [img, outline, *bars.patches, query_mark, title_m, title_b, suptitle]
    # the legend never changes: drawn once and pasted over the moving bars
    return Explorer(controls, compute, draw, fig, summary, animated=animated, overlays=[leg])


def attention_grid(
    weights: WeightsLike,
    tokens: Optional[Sequence[str]] = None,
    title: str = "attention maps",
    panel_size: float = 2.6,
    indices: bool = False,
    highlight_rows: Optional[dict] = None,
):
    """Every layer (rows) x head (columns) attention map of one example, with token tick labels.

    Colour limits are fixed to 0..1 in every panel (one shared colour bar), queries down,
    keys across. ``indices=True`` labels each tick ``"position token"`` (e.g. ``"3 v5"``) so
    that prose can name rows by position. ``highlight_rows`` maps a layer to the query rows
    to outline in red in every head of that layer (e.g. ``{0: [1, 3], 1: [8]}``).
    Returns the ``matplotlib.pyplot`` figure (end the cell with ``plt.show()``).
    """
    import matplotlib.pyplot as plt

    w = stack_attention(weights)
    n_layers, n_heads, n_q, n_k = w.shape
    tokens = _check_tokens(tokens, n_k)
    highlight_rows = {} if highlight_rows is None else highlight_rows
    if not isinstance(highlight_rows, dict):
        raise TypeError(f"highlight_rows must be a dict {{layer: [query rows]}}, got {type(highlight_rows).__name__}")
    for layer_, rows_ in highlight_rows.items():
        _check_index(layer_, "highlight_rows layer", n_layers)
        for r_ in rows_:
            _check_index(r_, f"highlight_rows[{layer_}] row", n_q)
    if indices:
        tokens = [f"{i} {t}" for i, t in enumerate(tokens)]
    fig, axes = plt.subplots(
        n_layers, n_heads, figsize=(panel_size * n_heads + 1.2, panel_size * n_layers + 0.4), squeeze=False,
        layout="constrained",
    )
    fontsize = 7 if n_k <= 16 else (6 if n_k <= 24 else 4)
    ticks = np.arange(n_k)
    for layer in range(n_layers):
        for h in range(n_heads):
            ax = axes[layer, h]
            im = ax.imshow(w[layer, h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks(ticks, tokens, rotation=90, fontsize=fontsize)
            ax.set_yticks(ticks, tokens if n_q == n_k else [str(i) for i in range(n_q)], fontsize=fontsize)
            ax.set_title(f"layer {layer}, head {h}", fontsize=9)
            for r_ in highlight_rows.get(layer, []):
                ax.add_patch(Rectangle((-0.5, r_ - 0.5), n_k, 1, fill=False, edgecolor="red", lw=1.2))
            if layer == n_layers - 1:
                ax.set_xlabel("key (attended to)", fontsize=8)
            if h == 0:
                ax.set_ylabel("query (attending)", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title, fontsize=10)
    return fig


def plot_split_merge(seq: int = 4, num_heads: int = 3, head_dim: int = 2):
    r"""The split/merge reshape of multi-head attention for one sequence of the batch, as a diagram.

    Left: ``linear_q(x)`` of shape ``(B, L, d_model)`` (one row per token, ``d_model = h * d_k``
    columns, coloured by the head they will belong to). Middle: ``view(B, L, h, d_k)`` cuts each
    row into ``h`` pieces of ``d_k`` (no number moves in memory). Right: ``transpose(1, 2)`` gives
    ``(B, h, L, d_k)``: one ``L x d_k`` matrix per head, on which attention runs. The merge is the
    way back: ``transpose(1, 2).contiguous().view(B, L, d_model)``. Each cell is labelled
    ``token,column`` so that the reader can follow one number through the steps.
    Returns the ``matplotlib.pyplot`` figure.
    """
    import matplotlib.pyplot as plt

    for name, value in (("seq", seq), ("num_heads", num_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= 8:
            raise ValueError(f"{name} must be in [1, 8] to stay readable, got {value}")
    d_model = num_heads * head_dim
    colours = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(10, 3.8), layout="constrained")

    def cell(x0, y0, head, label):
        ax.add_patch(Rectangle((x0, y0), 1, 1, facecolor=colours[head % 10], alpha=0.45, edgecolor="black", lw=0.6))
        ax.text(x0 + 0.5, y0 + 0.5, label, ha="center", va="center", fontsize=6)

    gap, x_mid = 0.35, d_model + 3.0
    x_right = x_mid + d_model + (num_heads - 1) * gap + 3.0
    for t in range(seq):
        y = seq - 1 - t                                        # token 0 on top
        ax.text(-0.3, y + 0.5, f"token {t}", ha="right", va="center", fontsize=7)
        for c in range(d_model):
            head = c // head_dim
            cell(c, y, head, f"{t},{c}")                       # (L, d_model)
            cell(x_mid + c + head * gap, y, head, f"{t},{c}")  # (L, h, d_k): the same row, cut
    for head in range(num_heads):                              # (h, L, d_k): one block per head
        y0 = (num_heads - 1 - head) * (seq + 0.5) - (num_heads - 1) * (seq + 0.5) / 2 + 0.0
        for t in range(seq):
            for j in range(head_dim):
                cell(x_right + j, y0 + seq - 1 - t, head, f"{t},{head * head_dim + j}")
        ax.text(x_right + head_dim + 0.3, y0 + seq / 2, f"head {head}: (L, d_k)", va="center", fontsize=7)
    top = seq + 0.4
    ax.text(d_model / 2, top, "(B, L, d_model)\nlinear_q(x)", ha="center", va="bottom", fontsize=8)
    ax.text(x_mid + (d_model + (num_heads - 1) * gap) / 2, top, "(B, L, h, d_k)\nview: each row cut in h pieces",
            ha="center", va="bottom", fontsize=8)
    y_top_right = (num_heads - 1) * (seq + 0.5) / 2 + seq
    ax.text(x_right + head_dim / 2, y_top_right + 0.4, "(B, h, L, d_k)\ntranspose(1, 2)", ha="center", va="bottom",
            fontsize=8)
    arrow = dict(arrowstyle="->", lw=1.2)
    ax.annotate("", xy=(x_mid - 0.4, seq / 2), xytext=(d_model + 0.4, seq / 2), arrowprops=arrow)
    ax.annotate("", xy=(x_right - 0.4, seq / 2), xytext=(x_mid + d_model + (num_heads - 1) * gap + 0.4, seq / 2),
                arrowprops=arrow)
    y_low = -(num_heads - 1) * (seq + 0.5) / 2 - 0.6
    ax.annotate("", xy=(d_model / 2, -0.3), xytext=(x_right + head_dim / 2, y_low),
                arrowprops=dict(arrowstyle="->", lw=1.2, ls="--", connectionstyle="arc3,rad=-0.15"))
    ax.text((d_model + x_right) / 2, y_low - 0.2, "merge: transpose(1, 2).contiguous().view(B, L, d_model)",
            ha="center", va="top", fontsize=8)
    ax.set_xlim(-2.2, x_right + head_dim + 3.2)
    ax.set_ylim(y_low - 1.4, y_top_right + 1.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"split into heads and merge back (one sequence; L = {seq}, h = {num_heads}, d_k = {head_dim}, "
                 f"d_model = {d_model}; cell = token,column)", fontsize=9)
    return fig
