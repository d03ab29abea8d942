"""The explorer of notebook 06 (positional encodings compared): scheme, offset and length.

* :func:`shift_length_state` -- the pure function: what the explorer shows for one
  positional scheme, one position offset and one sequence length, read from a
  precomputed :class:`~helpers.positional.ShiftLengthGrid` (nothing is trained or
  evaluated on a slider move).
* :func:`shift_length_explorer` -- three selection sliders; left, the attention map of one
  head on one example; right, accuracy against the offset at each length for the chosen
  scheme, the current cell marked. Redrawn by blitting (fixed limits, ``set_data``).
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..positional import ShiftLengthGrid
from .explorer import Explorer

__all__ = ["shift_length_state", "shift_length_explorer"]


def _check_grid(grid) -> ShiftLengthGrid:
    if not isinstance(grid, ShiftLengthGrid):
        raise TypeError(f"grid must be a helpers.positional.ShiftLengthGrid, got {type(grid).__name__}")
    return grid


def shift_length_state(grid: ShiftLengthGrid, scheme: str, offset: int, length: int, lookback: int = 3) -> dict:
    """What the explorer shows for ``scheme`` at position ``offset`` and sequence ``length`` (pure).

    Args:
        grid: precomputed results (:func:`helpers.positional.shift_length_grid`).
        scheme: one of ``grid.schemes``.
        offset: one of ``grid.offsets``.
        length: one of ``grid.lengths``.
        lookback: the task's offset ``k``: ``weight_at_k`` is the mean weight a query puts
            on the key ``k`` positions back.

    Returns:
        dict with ``scheme``, ``offset``, ``length``, ``accuracy`` (mean over the scheme's
        models), ``acc_min`` / ``acc_max`` (over models), ``curves`` ``(len(lengths),
        len(offsets))`` (mean accuracy against offset, one row per length), ``i_offset``,
        ``i_length``, ``map`` (``(n_max, n_max)`` attention weights of the shown head, NaN
        outside ``length``), ``head``, ``weight_at_k`` and ``tokens``.
    """
    grid = _check_grid(grid)
    if scheme not in grid.schemes:
        raise ValueError(f"scheme must be one of {grid.schemes}, got {scheme!r}")
    if offset not in grid.offsets:
        raise ValueError(f"offset must be one of {grid.offsets}, got {offset!r}")
    if length not in grid.lengths:
        raise ValueError(f"length must be one of {grid.lengths}, got {length!r}")
    i, j = grid.offsets.index(offset), grid.lengths.index(length)
    per_model = grid.accuracy[scheme][:, i, j]
    w = grid.maps[scheme][i, j]
    n = int(length)
    diag = np.array([w[t, t - lookback] for t in range(lookback, n)]) if 0 < lookback < n else np.array([np.nan])
    return {
        "scheme": scheme,
        "offset": int(offset),
        "length": n,
        "i_offset": i,
        "i_length": j,
        "accuracy": float(np.mean(per_model)),
        "acc_min": float(np.min(per_model)),
        "acc_max": float(np.max(per_model)),
        "curves": grid.mean_accuracy(scheme).T.copy(),
        "map": w.copy(),
        "head": grid.head[scheme],
        "weight_at_k": float(np.mean(diag)),
        "lookback": int(lookback),
        "tokens": grid.tokens[n],
    }


def shift_length_explorer(grid: ShiftLengthGrid, scheme: str = "rope", offset: int = 0, length: int = None,
                          lookback: int = 3) -> Explorer:
    """Sliders for the scheme, the position offset and the sequence length (see module docstring)."""
    import ipywidgets as widgets

    grid = _check_grid(grid)
    length = grid.lengths[0] if length is None else length
    first = shift_length_state(grid, scheme, offset, length, lookback)
    n_max = max(grid.lengths)
    controls = {
        "scheme": widgets.SelectionSlider(options=grid.schemes, value=scheme, description="scheme"),
        "offset": widgets.SelectionSlider(options=grid.offsets, value=offset, description="offset"),
        "length": widgets.SelectionSlider(options=grid.lengths, value=length, description="length"),
    }
    fig = Figure(figsize=(9.5, 3.9))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.15, top=0.84, wspace=0.35)
    ax_m, ax_c = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.15]})
    img = ax_m.imshow(first["map"], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(img, ax=ax_m, label="attention weight", fraction=0.046, pad=0.04)
    ax_m.set_xlabel("key position (index)")
    ax_m.set_ylabel("query position (index)")
    for n in grid.lengths[:-1]:
        ax_m.axhline(n - 0.5, color="0.6", lw=0.6, ls=":")
        ax_m.axvline(n - 0.5, color="0.6", lw=0.6, ls=":")
    ax_m.set_xlim(-0.5, n_max - 0.5)
    ax_m.set_ylim(n_max - 0.5, -0.5)
    title_m = ax_m.set_title(" ", fontsize=9)
    x = np.arange(len(grid.offsets))
    lines = []
    for j, n in enumerate(grid.lengths):
        (ln,) = ax_c.plot(x, first["curves"][j], "o-", ms=3, color=f"C{j}", label=f"length {n}")
        lines.append(ln)
    (pt,) = ax_c.plot([], [], "s", ms=10, mfc="none", mec="k", mew=1.5, label="current")
    ax_c.set_xticks(x)
    ax_c.set_xticklabels([str(o) for o in grid.offsets], fontsize=8)
    ax_c.set_xlim(-0.3, len(x) - 0.7)
    ax_c.set_ylim(0.0, 1.03)
    ax_c.set_xlabel("position offset (first position; categories, not to scale)")
    ax_c.set_ylabel("validation accuracy (mean of seeds)")
    title_c = ax_c.set_title(" ", fontsize=9)
    leg = ax_c.legend(loc="lower left", fontsize=7, framealpha=0.9)
    suptitle = fig.suptitle(" ", fontsize=10)

    def compute(scheme: str, offset: int, length: int) -> dict:
        return shift_length_state(grid, scheme, offset, length, lookback)

    def draw(s: dict) -> None:
        img.set_data(s["map"])
        title_m.set_text(f"head {s['head']}, one example, positions {s['offset']}..{s['offset'] + s['length'] - 1}")
        for j, ln in enumerate(lines):
            ln.set_ydata(s["curves"][j])
        pt.set_data([s["i_offset"]], [s["accuracy"]])
        pt.set_markeredgecolor(f"C{s['i_length']}")
        title_c.set_text(f"{s['scheme']}: accuracy against offset")
        suptitle.set_text(f"{s['scheme']}, offset {s['offset']}, length {s['length']}: accuracy {s['accuracy']:.3f}")

    def summary(s: dict) -> str:
        return (f"<b>{s['scheme']}</b>, offset {s['offset']}, length {s['length']}: accuracy {s['accuracy']:.3f} "
                f"(seeds {s['acc_min']:.3f} to {s['acc_max']:.3f}); head {s['head']} puts {s['weight_at_k']:.2f} "
                f"of its weight on the token {s['lookback']} back")

    animated = [img, title_m, *lines, pt, title_c, suptitle]
    return Explorer(controls, compute, draw, fig, summary, animated=animated, overlays=[leg])
