"""Figures of seed sweeps (:mod:`helpers.sweep`): every seed drawn, the mean on top.

* :func:`plot_sweep_points` -- one column per arm (e.g. "none", "dropout 0.1"), a dot per
  seed (jittered deterministically), the mean as a bar with ± one standard deviation.
* :func:`plot_sweep_curves` -- one thin line per seed and the mean as a thick line, for a
  quantity recorded during training (e.g. validation accuracy every 25 steps).

Used by notebooks 03-06. No numerics of their own beyond mean and standard deviation.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from matplotlib.axes import Axes

from ..sweep import SweepResult

__all__ = ["plot_sweep_points", "plot_sweep_curves"]


def plot_sweep_points(
    ax: Axes,
    arms: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    title: str = "",
    colors: Optional[Sequence[str]] = None,
    hlines: Optional[Mapping[str, float]] = None,
    annotate_mean: str = ".2f",
) -> Axes:
    """Per-seed dots for each arm, with the mean ± sd.

    Args:
        ax: the axes to draw on.
        arms: ``{arm name: per-seed values}`` (e.g. ``SweepResult.values("val_acc")``).
        ylabel: the y-axis label (with units).
        title: the axes title.
        colors: one colour per arm (default: matplotlib's cycle).
        hlines: ``{label: y}`` reference levels drawn as dotted lines (e.g. chance).
        annotate_mean: format of the mean written above each arm ('' for none).
    """
    if not arms:
        raise ValueError("arms must hold at least one arm")
    names = list(arms)
    colors = list(colors) if colors is not None else [f"C{i % 10}" for i in range(len(names))]
    for i, name in enumerate(names):
        v = np.asarray(arms[name], dtype=float)
        finite = v[np.isfinite(v)]
        offsets = (np.arange(len(v)) - (len(v) - 1) / 2) * (0.5 / max(len(v), 1))
        ax.scatter(i + offsets, v, s=18, color=colors[i], alpha=0.8, zorder=3,
                   label="one seed" if i == 0 else None)
        if len(finite):
            m = finite.mean()
            sd = finite.std(ddof=1) if len(finite) > 1 else 0.0
            ax.errorbar(i + 0.36, m, yerr=sd, fmt="_", color="k", ms=14, capsize=3, zorder=4,
                        label="mean ± sd" if i == 0 else None)
            if annotate_mean:
                ax.annotate(f"{m:{annotate_mean}}", (i + 0.36, m), xytext=(6, 0), textcoords="offset points",
                            va="center", fontsize=7)
    for label, y in (hlines or {}).items():
        ax.axhline(y, color="0.5", lw=0.8, ls=":")
        ax.annotate(label, (len(names) - 0.5, y), xytext=(0, 2), textcoords="offset points",
                    ha="right", va="bottom", fontsize=7, color="0.35")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return ax


def plot_sweep_curves(
    ax: Axes,
    result: SweepResult,
    key: str,
    steps: Sequence[float],
    *,
    label: str,
    color: str = "C0",
    ylabel: str = "",
    title: str = "",
) -> Axes:
    """One thin line per seed of the sequence result ``key`` against ``steps``, and their mean.

    Args:
        ax: the axes to draw on.
        result: a :class:`~helpers.sweep.SweepResult` whose ``key`` holds equal-length sequences.
        key: the sequence result to draw.
        steps: the x values (same length as each sequence).
        label: legend label of the mean line (the seed count is appended).
    """
    curves = result.curves(key)
    steps = np.asarray(steps, dtype=float)
    if curves.shape[1] != len(steps):
        raise ValueError(f"steps has {len(steps)} values but {key!r} has {curves.shape[1]} per seed")
    for row in curves:
        ax.plot(steps, row, color=color, lw=0.7, alpha=0.35)
    ax.plot(steps, curves.mean(0), color=color, lw=2.2, label=f"{label} (mean of {len(result)} seeds; thin: each seed)")
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    return ax
