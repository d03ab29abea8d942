"""Figures and the explorer of notebook 02 (efficient RoPE: layouts, precision, cost).

* :func:`rope_cache_state` -- the pure function behind the explorer: the cos/sin cache for
  a range of positions and a fixed vector rotated by it.
* :func:`rope_cache_explorer` -- sliders for ``head_dim``, base and the position range.
* :func:`plot_pairing` -- which dimensions pair up in the interleaved and the half layout.
* :func:`plot_angle_precision` -- angle and rotation error against position (bf16 vs fp32).
* :func:`plot_rope_benchmark` -- time against ``head_dim`` and against ``seq`` (log2-log2, reference slopes).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .. import rope as _rope
from .explorer import Explorer

__all__ = ["rope_cache_state", "rope_cache_explorer", "layout_pairs", "plot_pairing", "plot_angle_precision", "plot_rope_benchmark"]


def _fixed_vector(head_dim: int) -> torch.Tensor:
    r"""The vector the explorer rotates: all ones, so every pair is ``(1, 1)`` and each rotated
    component :math:`\cos m\theta_i \mp \sin m\theta_i` stays within :math:`\pm\sqrt 2` for any ``head_dim``."""
    return torch.ones(head_dim, dtype=torch.float64)


def rope_cache_state(
    head_dim: int = 64,
    log10_base: float = 4.0,
    positions: Sequence[int] = (0, 512),
    max_rows: int = 256,
) -> dict:
    r"""What notebook 02's explorer shows (pure: no widgets, no figure).

    The cos/sin cache is the ``(n_positions, head_dim/2)`` table of :math:`\cos m\theta_i`
    and :math:`\sin m\theta_i` that Meta's Llama and vLLM precompute once (``helpers.rope``
    memoises it; Hugging Face ``transformers`` 5.24 recomputes it at every forward). The fixed vector :math:`\mathbf q = (1, \dots, 1)` is rotated at
    every displayed position with :func:`helpers.rope.apply_rope` (interleaved layout).

    Args:
        head_dim: even, >= 2.
        log10_base: the base is ``10 ** log10_base``.
        positions: ``(start, end)``, inclusive, ``0 <= start <= end``.
        max_rows: at most this many positions are displayed (evenly spaced integers).

    Returns:
        dict with ``head_dim``, ``base``, ``positions`` (P,) int64 numpy, ``theta`` (d/2,),
        ``wavelength`` (d/2,) in positions, ``cos`` and ``sin`` (P, d/2), ``q`` (d,),
        ``rotated`` (P, d), ``pairs`` (the three pairs drawn: fastest, middle, slowest),
        ``norm_error`` (max | ||R_m q|| - ||q|| |), ``full_turn_pairs`` (pairs whose
        wavelength fits in the range), ``cache_bytes_fp32`` (the cos + sin table for
        positions ``0 .. end`` in float32) and ``matrix_bytes_fp32`` (the dense ``R_m``
        for the same positions).
    """
    if isinstance(positions, (int, float)) or len(positions) != 2:
        raise ValueError(f"positions must be a (start, end) pair, got {positions!r}")
    start, end = int(positions[0]), int(positions[1])
    if not 0 <= start <= end:
        raise ValueError(f"positions must satisfy 0 <= start <= end, got ({start}, {end})")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 2:
        raise ValueError(f"max_rows must be an int >= 2, got {max_rows!r}")
    base = float(10.0 ** log10_base)
    step = max(1, math.ceil((end - start + 1) / max_rows))
    pos = torch.arange(start, end + 1, step, dtype=torch.int64)
    theta = _rope.rope_frequencies(head_dim, base, dtype=torch.float64)
    angles = _rope.rope_angles(pos, head_dim, base, dtype=torch.float64)  # (P, d/2)
    q = _fixed_vector(head_dim)
    rotated = _rope.apply_rope(q.expand(len(pos), head_dim), positions=pos, base=base)
    wavelength = 2 * math.pi / theta
    half = head_dim // 2
    n_cached = end + 1
    return {
        "head_dim": int(head_dim),
        "base": base,
        "start": start,
        "end": end,
        "positions": pos.numpy(),
        "theta": theta.numpy(),
        "wavelength": wavelength.numpy(),
        "cos": torch.cos(angles).numpy(),
        "sin": torch.sin(angles).numpy(),
        "q": q.numpy(),
        "rotated": rotated.numpy(),
        "step": int(step),
        "pairs": (0, half // 2, half - 1),
        "norm_error": float((rotated.norm(dim=-1) - q.norm()).abs().max()),
        "full_turn_pairs": int((wavelength <= (end - start)).sum()),
        "cache_bytes_fp32": 2 * n_cached * half * 4,
        "matrix_bytes_fp32": n_cached * head_dim * head_dim * 4,
    }


def rope_cache_explorer(
    head_dim: int = 64, log10_base: float = 4.0, positions: Sequence[int] = (0, 512), max_position: int = 16384
) -> Explorer:
    """Notebook 02's explorer: sliders for ``head_dim``, base (log10) and the position range.

    Left and middle: the cos and sin cache as heatmaps (pair index across, position down).
    Right: the first component :math:`(R_m\\mathbf q)_{2i}` of the fixed vector
    :math:`\\mathbf q = (1, \\dots, 1)` for the fastest, a middle and the slowest pair.
    """
    import ipywidgets as widgets

    controls = {
        "head_dim": widgets.IntSlider(value=head_dim, min=8, max=256, step=8, description="head_dim"),
        "log10_base": widgets.FloatSlider(value=log10_base, min=2.0, max=6.0, step=0.25, description="log10 base", readout_format=".2f"),
        "positions": widgets.IntRangeSlider(value=tuple(positions), min=0, max=max_position, step=16, description="positions"),
    }
    fig = Figure(figsize=(9.5, 3.4))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.9, wspace=0.5)
    ax_c, ax_s, ax_r = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.4]})
    blank = np.zeros((2, 2))
    im_c = ax_c.imshow(blank, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest", origin="upper")
    im_s = ax_s.imshow(blank, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest", origin="upper")
    # Plain-text labels (no mathtext): mathtext is re-parsed on every render and would
    # take a quarter of the redraw budget.
    for ax, name in [(ax_c, "cos(m·θ_i)"), (ax_s, "sin(m·θ_i)")]:
        ax.set_xlabel("pair index i")
        ax.set_ylabel("position m")
        ax.set_title(f"cache: {name}", fontsize=9)
    fig.colorbar(im_s, ax=[ax_c, ax_s], fraction=0.05, pad=0.03, ticks=[-1, 0, 1]).set_label("cache value", labelpad=-4)
    lines = [ax_r.plot([], [], lw=1, color=f"C{j}", label=lab)[0] for j, lab in enumerate(["fastest pair", "middle pair", "slowest pair"])]
    ax_r.set_ylim(-1.6, 2.7)  # |component| <= sqrt 2; room above for the legend
    ax_r.set_xlabel("position m")
    ax_r.set_ylabel("component 2i of R_m q")
    title_r = ax_r.set_title("rotated q = (1, ..., 1)", fontsize=9)
    legend = ax_r.legend(loc="upper left", fontsize=7)
    # Few tick labels: rendering text is most of the redraw time.
    for ax in (ax_c, ax_s, ax_r):
        ax.xaxis.set_major_locator(MaxNLocator(4, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(4))

    def compute(head_dim: int, log10_base: float, positions: Sequence[int]) -> dict:
        return rope_cache_state(head_dim, log10_base, positions)

    def draw(s: dict) -> None:
        lo, hi = s["positions"][0], s["positions"][-1]
        extent = (-0.5, s["head_dim"] // 2 - 0.5, hi + 0.5, lo - 0.5)
        for im, key in [(im_c, "cos"), (im_s, "sin")]:
            im.set_data(s[key])
            im.set_extent(extent)
        for line, text, i in zip(lines, legend.get_texts(), s["pairs"]):
            line.set_data(s["positions"], s["rotated"][:, 2 * i])
            text.set_text(f"pair {i} (wavelength {s['wavelength'][i]:.3g})")
        ax_r.set_xlim(lo, max(hi, lo + 1))
        # the exact slider values, also when the sampled rows do not change (wide ranges)
        title_r.set_text(f"rotated q = (1, ..., 1), m = {s['start']}..{s['end']}, d = {s['head_dim']}")

    def summary(s: dict) -> str:
        return (
            f"d = {s['head_dim']}, base = {s['base']:.4g}, positions {s['start']}..{s['end']} "
            f"(one row per {s['step']} position{'s' if s['step'] > 1 else ''}): "
            f"{s['full_turn_pairs']} of {s['head_dim'] // 2} pairs complete a full turn in the range; "
            f"cos+sin cache {s['cache_bytes_fp32'] / 2**20:.2f} MiB vs dense R<sub>m</sub> "
            f"{s['matrix_bytes_fp32'] / 2**20:.1f} MiB (float32); max |&#8214;R<sub>m</sub>q&#8214; - &#8214;q&#8214;| = {s['norm_error']:.1e}"
        )

    # the heat maps' extents and the curve's x range follow head_dim and the positions: those axes move with the
    # artists (drawn over the rest of the figure, which is rendered once), so no move needs a full draw; the
    # legend's labels change, so it is animated
    moving_axes = [ax_c.xaxis, ax_c.yaxis, ax_s.xaxis, ax_s.yaxis, ax_r.xaxis]
    return Explorer(controls, compute, draw, fig, summary, animated=[im_c, im_s, *moving_axes, *lines, title_r, legend])


def layout_pairs(head_dim: int) -> dict:
    """Which two dimensions form pair ``i`` in each layout, derived from
    :func:`helpers.rope.interleaved_to_half_index` (pure, no figure).

    Returns ``{"interleaved": [(2i, 2i+1), ...], "half": [(a_i, b_i), ...]}``: in the half
    layout, dimension ``p`` holds interleaved coordinate ``perm[p]``, so pair ``i`` (interleaved
    coordinates ``2i, 2i+1``) sits at the dimensions where ``perm`` equals ``2i`` and ``2i+1``.
    """
    perm = _rope.interleaved_to_half_index(head_dim).tolist()
    where = {coord: p for p, coord in enumerate(perm)}
    half = head_dim // 2
    return {
        "interleaved": [(2 * i, 2 * i + 1) for i in range(half)],
        "half": [(where[2 * i], where[2 * i + 1]) for i in range(half)],
    }


def plot_pairing(head_dim: int = 8):
    """Diagram: the ``head_dim`` dimensions of a head as boxes, one row per layout, each pair
    in its own colour and joined by an arc (see :func:`layout_pairs`).
    Returns the pyplot figure (call ``plt.show()``)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Arc, Rectangle

    pairs = layout_pairs(head_dim)
    fig, axes = plt.subplots(2, 1, figsize=(6.4, 3.4), gridspec_kw={"height_ratios": [1, 1.5]})
    titles = {"interleaved": "interleaved (RoFormer, GPT-J, Meta Llama): pair i = dims (2i, 2i+1)",
              "half": "half-split (GPT-NeoX, HF Llama rotate_half): pair i = dims (i, i + d/2)"}
    for ax, (layout, plist) in zip(axes, pairs.items()):
        for i, (a, b) in enumerate(plist):
            color = f"C{i % 10}"
            for dim in (a, b):
                ax.add_patch(Rectangle((dim, 0), 0.9, 0.9, facecolor=color, alpha=0.35, edgecolor=color))
                ax.text(dim + 0.45, 0.45, f"{dim}", ha="center", va="center", fontsize=8)
            centre, width = (a + b) / 2 + 0.45, abs(b - a)
            height = 0.5 + 0.25 * width + (0.35 * i if layout == "half" else 0.0)  # stagger the crossing arcs
            ax.add_patch(Arc((centre, 0.9), width, height, theta1=0, theta2=180, color=color, lw=1.5))
            ax.text(centre, 0.9 + height / 2 + 0.05, f"pair {i}", ha="center", va="bottom", fontsize=7, color=color)
        ax.set_xlim(-0.2, head_dim + 0.1)
        ax.set_ylim(-0.2, 0.9 + (0.5 + 0.25 * head_dim / 2 + 0.35 * head_dim / 2) / 2 + 0.4)
        ax.set_title(titles[layout], fontsize=8.5)
        ax.axis("off")
    fig.suptitle(f"which dimensions rotate together, head_dim = {head_dim} (boxes: dimension index)", fontsize=9)
    fig.tight_layout()
    return fig


def plot_angle_precision(
    positions: np.ndarray,
    angle_error: Mapping[str, np.ndarray],
    rotation_error: Mapping[str, np.ndarray],
    title: str = "",
    marks: Mapping[str, float] | None = None,
):
    """Two panels against position: the max angle error :math:`|\\widehat{m\\theta_i} - m\\theta_i|`
    over pairs (rad) and the relative rotation error :math:`\\lVert \\hat R_m q - R_m q\\rVert / \\lVert q\\rVert`.

    One line per dtype (keys of the mappings). Both axes are logarithmic (position in powers
    of 2), so short contexts, where bfloat16 already fails, get as much room as long ones.
    ``marks`` maps a label to a position drawn as a dotted vertical line (e.g. 256: every
    integer up to 256 is exact in bfloat16, 257 is the first that is not). Returns the pyplot figure (call ``plt.show()``).
    """
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.5))
    for j, (name, err) in enumerate(angle_error.items()):
        ax1.plot(positions, np.maximum(err, 1e-12), lw=1, color=f"C{j}", label=name)
    for j, (name, err) in enumerate(rotation_error.items()):
        ax2.plot(positions, np.maximum(err, 1e-12), lw=1, color=f"C{j}", label=name)
    for ax in (ax1, ax2):
        ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("position m (log2 scale)")
        for label, where in (marks or {}).items():
            ax.axvline(where, color="0.5", ls=":", lw=1, label=label)
    ax1.set_ylabel("max angle error over pairs (rad)")
    ax2.set_ylabel(r"$\|\hat R_m q - R_m q\| / \|q\|$")
    ax1.set_title("angle $m\\theta_i$ vs float64", fontsize=10)
    ax2.set_title("resulting rotation error", fontsize=10)
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_rope_benchmark(
    sweeps: Mapping[str, Mapping],
    title: str = "",
    references: Mapping[str, Sequence[tuple[str, float]]] | None = None,
):
    """Time against each swept size, both axes in powers of 2 (so a slope is an exponent).

    ``sweeps`` maps the swept parameter (e.g. ``"head_dim"``) to
    ``{"values": [...], "fixed": "seq=1024", "ms": {implementation: [ms, ...]}}``.
    ``references`` maps a swept parameter to ``[(implementation, slope), ...]``: a dotted
    grey line :math:`t = t_0 (v / v_0)^{\text{slope}}` through that implementation's first
    point, labelled with its slope (slope 1: linear growth, 2: quadratic).
    Returns the pyplot figure (call ``plt.show()``).
    """
    import matplotlib.pyplot as plt

    references = dict(references or {})
    for param, refs in references.items():
        if param not in sweeps:
            raise ValueError(f"references: {param!r} is not a swept parameter (have {sorted(sweeps)})")
        for name, _slope in refs:
            if name not in sweeps[param]["ms"]:
                raise ValueError(f"references[{param!r}]: {name!r} is not an implementation of that sweep (have {sorted(sweeps[param]['ms'])})")
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4.6 * len(sweeps), 3.6), squeeze=False)
    for ax, (param, sw) in zip(axes[0], sweeps.items()):
        for j, (name, ms) in enumerate(sw["ms"].items()):
            style = "k--" if "floor" in name else "o-"
            kw = {} if "floor" in name else {"color": f"C{j}"}
            ax.plot(sw["values"], ms, style, ms=3, lw=1, label=name, **kw)
        v = np.asarray(sw["values"], dtype=float)
        for k, (name, slope) in enumerate(references.get(param, [])):
            t0 = float(sw["ms"][name][0])
            ax.plot(v, t0 * (v / v[0]) ** slope, ls=":", color="0.45", lw=1.2)
            ax.annotate(f"slope {slope:g}", (v[-1], t0 * (v[-1] / v[0]) ** slope), fontsize=7, color="0.35",
                        xytext=(3, 0), textcoords="offset points", va="center")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel(f"{param} ({sw.get('fixed', '')}), log2 scale")
        ax.set_ylabel("median time per call (ms), log2 scale")
        ax.set_title(f"time vs {param}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
