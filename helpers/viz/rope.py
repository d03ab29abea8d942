"""Figures and the explorer of notebook 01 (RoPE from the rotation matrix).

* :func:`long_term_decay` -- RoFormer's relative upper bound and the all-ones score against distance.
* :func:`plot_clock_dials` -- the "clock dials": :math:`\\cos m\\theta_i` over positions and pairs.
* :func:`rope_explorer_state`, :func:`rope_explorer` -- the slider explorer.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.figure import Figure

from .. import rope as _rope
from .explorer import Explorer

__all__ = ["long_term_decay", "plot_clock_dials", "rope_explorer_state", "rope_explorer"]


def long_term_decay(head_dim: int, base: float, max_distance: int) -> dict:
    r"""RoFormer §3.4.3: the relative upper bound of :math:`|q^\top R_{n-m} k|` and a real score.

    With the partial sums :math:`C_j = \sum_{l<j} e^{\mathrm{i}(m-n)\theta_l}` (RoFormer calls
    them :math:`S_j`) the bound is proportional to :math:`\frac{1}{d/2}\sum_{j=1}^{d/2} |C_j|`
    (the paper's Figure 2). The "all-ones"
    score is :math:`q^\top R_{n-m} k` for :math:`q = k = \mathbf{1}`, i.e.
    :math:`\sum_i 2\cos((n-m)\theta_i)`.

    Returns ``{"distance": (D,), "bound": (D,), "ones_score": (D,)}`` as float64 numpy arrays
    for distances ``0 .. max_distance``.
    """
    theta = _rope.rope_frequencies(head_dim, base, dtype=torch.float64).numpy()
    r = np.arange(max_distance + 1, dtype=np.float64)
    phase = np.exp(1j * r[:, None] * theta[None, :])  # (D, d/2)
    C = np.cumsum(phase, axis=1)  # C_j for j = 1..d/2
    bound = np.abs(C).mean(axis=1)
    ones = 2.0 * np.cos(r[:, None] * theta[None, :]).sum(axis=1)
    return {"distance": r, "bound": bound, "ones_score": ones}


def plot_clock_dials(
    head_dim: int = 128,
    base: float = 10000.0,
    max_position: int = 2**17,
    contexts: dict | None = None,
    n_positions: int = 600,
):
    """The "clock dials": :math:`\\cos m\\theta_i` for pair ``i`` (across) and position ``m`` (down, log scale).

    Positions are ``n_positions`` log-spaced integers in ``[1, max_position]``. The dashed
    curve is each pair's wavelength :math:`2\\pi/\\theta_i`, the position where it completes
    its first full turn: left of the curve (fast pairs) the dial has wrapped around, and at
    this sampling its colour is aliased noise; right of it the dial has not yet done one turn.
    ``contexts`` maps labels to context lengths drawn as horizontal lines.
    Returns the pyplot figure (call ``plt.show()``).
    """
    import matplotlib.pyplot as plt

    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 2:
        raise ValueError(f"max_position must be an int >= 2, got {max_position!r}")
    if isinstance(n_positions, bool) or not isinstance(n_positions, int) or n_positions < 2:
        raise ValueError(f"n_positions must be an int >= 2, got {n_positions!r}")
    theta = _rope.rope_frequencies(head_dim, base, dtype=torch.float64).numpy()
    m = np.unique(np.round(np.geomspace(1, max_position, n_positions)))
    dial = np.cos(m[:, None] * theta[None, :])  # (positions, d/2)
    pairs = np.arange(head_dim // 2)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    m_edges = np.concatenate([[m[0] / 1.05], np.sqrt(m[:-1] * m[1:]), [m[-1] * 1.05]])
    mesh = ax.pcolormesh(np.arange(head_dim // 2 + 1) - 0.5, m_edges, dial, cmap="RdBu_r", vmin=-1, vmax=1, shading="flat")
    fig.colorbar(mesh, ax=ax, label=r"$\cos m\theta_i$")
    ax.plot(pairs, 2 * np.pi / theta, color="gold", ls="--", lw=2.2, label=r"first full turn: $m = 2\pi/\theta_i$")
    for k, (label, length) in enumerate((contexts or {}).items()):
        ax.axhline(length, color="k", ls=":", lw=1)
        ax.annotate(label, (head_dim // 2 - 0.5, length), xytext=(-3, 2), textcoords="offset points",
                    ha="right", va="bottom", fontsize=8, bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    ax.set_yscale("log")
    ax.set_ylim(m_edges[0], m_edges[-1])
    ax.invert_yaxis()
    ax.set_xlabel("pair index i (fast → slow)")
    ax.set_ylabel("position m (log scale)")
    ax.set_title(rf"clock dials $\cos m\theta_i$, d = {head_dim}, base = {base:g}", fontsize=10)
    ax.legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    return fig


def rope_explorer_state(m: int, pair: int, log10_base: float, head_dim: int = 64, max_distance: int = 256) -> dict:
    """Everything the RoPE explorer of notebook 01 shows, for position ``m``, pair ``pair``
    and base ``10**log10_base`` (pure: no widgets, no figure).

    Returns a dict with ``base``, ``theta`` (d/2,), ``angles`` = m*theta (d/2,), the
    selected pair's ``angle`` (radians, unwrapped) and ``angle_wrapped`` in [0, 2pi),
    ``wavelength`` = 2pi/theta_pair (positions per turn), the pair's unit vector
    ``point`` = (cos, sin) (the pair (1, 0) rotated by m*theta_i), and the long-term decay
    curves (see :func:`long_term_decay`); the figure marks the distance m (query at m, key at 0).
    """
    if not (0 <= pair < head_dim // 2):
        raise ValueError(f"pair must be in [0, head_dim/2) = [0, {head_dim // 2}), got {pair}")
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    base = float(10.0 ** log10_base)
    theta = _rope.rope_frequencies(head_dim, base, dtype=torch.float64)
    angles = (m * theta).numpy()
    ang = float(angles[pair])
    decay = long_term_decay(head_dim, base, max_distance)
    return {
        "m": int(m),
        "pair": int(pair),
        "base": base,
        "head_dim": head_dim,
        "theta": theta.numpy(),
        "angles": angles,
        "angle": ang,
        "angle_wrapped": ang % (2 * math.pi),
        "turns": ang / (2 * math.pi),
        "wavelength": float(2 * math.pi / theta[pair]),
        "point": (math.cos(ang), math.sin(ang)),
        **decay,
    }


def rope_explorer(head_dim: int = 64, max_distance: int = 256, m: int = 5, pair: int = 0, log10_base: float = 4.0) -> Explorer:
    """Notebook 01's explorer: position ``m``, pair index ``i`` and base (log10 scale).

    Left: the selected pair as a unit vector rotated by :math:`m\\theta_i` (the arc shows
    the angle). Middle: every pair's angle :math:`m\\theta_i \\bmod 2\\pi` (fast pairs wrap,
    slow pairs barely move). Right: the long-term decay bound and the all-ones score
    against relative distance, the distance ``m`` (query at ``m``, key at 0) marked.

    Every axis limit is fixed (the bound starts at (d/2+1)/2 and the all-ones score at d
    for every base), so the explorer redraws only the moving artists (blitting).
    """
    import ipywidgets as widgets

    # m on a row of its own, as wide as the figure: at ipywidgets' default width (300 px, a track of about 150 px)
    # one pixel of a drag moved m by about 2 positions, 2 rad for the fastest pair; at 720 px the track is about
    # 570 px, so for max_distance = 256 a pixel moves m by about 0.45 positions
    controls = {
        "m": widgets.IntSlider(value=m, min=0, max=max_distance, step=1, description="position m", continuous_update=True,
                               layout=widgets.Layout(width="720px", max_width="100%")),
        "pair": widgets.IntSlider(value=pair, min=0, max=head_dim // 2 - 1, step=1, description="pair i"),
        "log10_base": widgets.FloatSlider(value=log10_base, min=2.0, max=6.0, step=0.25, description="log10 base", readout_format=".2f"),
    }
    fig = Figure(figsize=(9.0, 3.2))
    fig.subplots_adjust(left=0.075, right=0.925, bottom=0.16, top=0.83, wspace=0.5)
    ax_c, ax_a, ax_d = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1.3, 1.6]})
    t = np.linspace(0, 2 * np.pi, 200)
    ax_c.plot(np.cos(t), np.sin(t), color="0.8", lw=1)
    ax_c.annotate("", xy=(1, 0), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="0.6"))
    arrow = ax_c.annotate("", xy=(1, 0), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="C3", lw=2))
    (arc,) = ax_c.plot([], [], color="C3", lw=1)
    title_c = ax_c.set_title(" ", fontsize=9)
    suptitle = fig.suptitle(" ", fontsize=10)
    ax_c.set_xlim(-1.25, 1.25)
    ax_c.set_ylim(-1.25, 1.25)
    ax_c.set_aspect("equal")
    ax_c.set_xlabel("dimension 2i")
    ax_c.set_ylabel("dimension 2i+1")
    pairs = np.arange(head_dim // 2)
    (dots,) = ax_a.plot(pairs, np.zeros_like(pairs, dtype=float), "o", ms=3, color="C0", label="all pairs")
    (sel,) = ax_a.plot([0], [0], "o", ms=7, color="C3", label="selected pair")
    ax_a.set_xlim(-1, head_dim // 2)
    ax_a.set_ylim(-0.2, 2 * np.pi + 0.2)
    ax_a.set_xlabel("pair index i")
    ax_a.set_ylabel(r"$m\theta_i$ mod $2\pi$ (rad)")
    ax_a.set_title("angle of every pair")
    leg_a = ax_a.legend(loc="upper right", fontsize=7, framealpha=0.9)
    (bound_line,) = ax_d.plot([], [], color="C0", label="relative upper bound")
    ax_d2 = ax_d.twinx()
    (ones_line,) = ax_d2.plot([], [], color="C2", lw=0.8, alpha=0.8, label=r"score, $q=k=\mathbf{1}$")
    vline = ax_d.axvline(0, color="C3", ls="--", lw=1, label="distance m (key at 0)")
    ax_d.set_ylim(0, 1.05 * (head_dim / 2 + 1) / 2)  # the bound's maximum, at distance 0, for every base
    ax_d2.set_ylim(-0.45 * head_dim, 1.05 * head_dim)  # the all-ones score starts at d
    ax_d.set_xlim(0, max_distance)
    ax_d.set_xlabel("relative distance |n - m| (positions)")
    ax_d.set_ylabel("bound")
    ax_d2.set_ylabel("score")
    ax_d.set_title("long-term decay")
    h1, l1 = ax_d.get_legend_handles_labels()
    h2, l2 = ax_d2.get_legend_handles_labels()
    leg_d = ax_d.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=7, framealpha=0.9)

    def compute(m: int, pair: int, log10_base: float) -> dict:
        return rope_explorer_state(m, pair, log10_base, head_dim=head_dim, max_distance=max_distance)

    def draw(s: dict) -> None:
        x, y = s["point"]
        arrow.xy = (x, y)
        tt = np.linspace(0, s["angle_wrapped"], 60)
        arc.set_data(0.35 * np.cos(tt), 0.35 * np.sin(tt))
        title_c.set_text(f"pair {s['pair']}: m={s['m']}, angle {s['angle_wrapped']:.2f} rad")
        wrapped = np.mod(s["angles"], 2 * np.pi)
        dots.set_ydata(wrapped)
        sel.set_data([s["pair"]], [wrapped[s["pair"]]])
        bound_line.set_data(s["distance"], s["bound"])
        ones_line.set_data(s["distance"], s["ones_score"])
        vline.set_xdata([s["m"], s["m"]])
        suptitle.set_text(f"RoPE, d={s['head_dim']}, base={s['base']:.3g}")

    def summary(s: dict) -> str:
        return (
            f"m = {s['m']}, pair i = {s['pair']}, base = {s['base']:.4g}: "
            f"&theta;<sub>i</sub> = {s['theta'][s['pair']]:.4g} rad/position, "
            f"angle m&theta;<sub>i</sub> = {s['angle']:.3f} rad ({s['turns']:.2f} turns), "
            f"wavelength = {s['wavelength']:.1f} positions"
        )

    animated = [arrow, arc, title_c, dots, sel, bound_line, ones_line, vline, suptitle]
    # the legends never change: drawn once and pasted over the moving lines
    return Explorer(controls, compute, draw, fig, summary, animated=animated, overlays=[leg_a, leg_d],
                    rows=[["m"], ["pair", "log10_base"]])
