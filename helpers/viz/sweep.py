"""Figures of seed sweeps (:mod:`helpers.lab.sweep`): every seed drawn, the mean on top.

* :func:`plot_sweep_points` -- one column per arm (e.g. "none", "dropout 0.1"), a dot per
  seed (jittered deterministically), the mean as a bar with ± one standard deviation.
* :func:`plot_sweep_curves` -- one thin line per seed and the mean as a thick line, for a
  quantity recorded during training (e.g. validation accuracy every 25 steps).
* :func:`plot_paired` -- a :class:`~helpers.lab.stats.PairedComparison`: one dot per seed at
  its difference ``a - b`` (labelled with the seed), the zero line, the mean and its t interval.
* :func:`plot_time_to_threshold` -- a :class:`~helpers.lab.stats.Censored` per arm: runs that
  reached the threshold as dots at their step, censored runs as open triangles at the
  budget pointing right ("> B"), the Kaplan-Meier median as a tick.

Used by notebooks 03-06. No numerics of their own beyond mean and standard deviation; the
statistics come from :mod:`helpers.lab.stats`.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from matplotlib.axes import Axes

from ..lab.stats import Censored, PairedComparison
from ..lab.sweep import SweepResult

__all__ = ["plot_paired", "plot_sweep_points", "plot_sweep_curves", "plot_time_to_threshold"]


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
        result: a :class:`~helpers.lab.sweep.SweepResult` whose ``key`` holds equal-length sequences.
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


def _new_axes(ax: Optional[Axes], figsize: tuple[float, float]) -> Axes:
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize)
    elif not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes or None, got {type(ax).__name__}")
    return ax


def plot_paired(
    comparison: PairedComparison,
    ax: Optional[Axes] = None,
    *,
    unit: str = "",
    title: Optional[str] = None,
    color: str = "C0",
) -> Axes:
    """The per-seed differences of a paired comparison: one dot per seed, zero line, mean and CI.

    Each seed's difference ``a - b`` is a dot labelled with the seed (in seed order along
    x); the dashed line is zero (no difference); the black bar is the mean difference with
    its t interval (:attr:`~helpers.lab.stats.PairedComparison.t_ci`). The title defaults to
    the one-line summary's counts and p-values.

    Args:
        comparison: from :func:`helpers.lab.stats.paired` or ``SweepResult.paired_with``.
        ax: the axes to draw on (default: a new figure).
        unit: the unit of the compared quantity, for the y label (e.g. "accuracy", "steps").
        title: the axes title (default: built from the comparison).
        color: colour of the seed dots.
    """
    if not isinstance(comparison, PairedComparison):
        raise TypeError(f"comparison must be a PairedComparison (helpers.lab.stats.paired), got "
                        f"{type(comparison).__name__}")
    ax = _new_axes(ax, (5.0, 3.2))
    c = comparison
    x = np.arange(c.n)
    ax.axhline(0.0, color="0.4", lw=1.0, ls="--", zorder=1, label="no difference")
    ax.scatter(x, c.diffs, s=28, color=color, zorder=3, label=f"one seed ({c.n} seeds)")
    for xi, d, s in zip(x, c.diffs, c.seeds):
        ax.annotate(f"seed {s}", (xi, d), xytext=(0, 5), textcoords="offset points", ha="center", fontsize=7)
    xm = c.n - 0.3
    lo, hi = c.t_ci
    ax.errorbar([xm], [c.mean_diff], yerr=[[c.mean_diff - lo], [hi - c.mean_diff]], fmt="s", color="k",
                ms=6, capsize=4, zorder=4, label=f"mean, {100 * c.confidence:g}% t interval")
    ax.set_xticks(list(x) + [xm])
    ax.set_xticklabels([str(s) for s in c.seeds] + ["mean"], fontsize=8)
    ax.set_xlabel("seed")
    better = "higher" if c.better == "higher" else "lower"
    ax.set_ylabel(f"{c.label}" + (f" ({unit})" if unit else "") + f"\n{better} is better for {c.a_name}")
    if title is None:
        title = (f"{c.label}: better in {c.n_better} of {c.n} seeds; Wilcoxon p "
                 f"{c.wilcoxon_p:.2g}, sign test p {c.sign_p:.2g}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return ax


def plot_time_to_threshold(
    arms: Mapping[str, Censored],
    ax: Optional[Axes] = None,
    *,
    unit: str = "steps",
    title: str = "",
    colors: Optional[Sequence[str]] = None,
) -> Axes:
    """Time to a threshold per seed, censored runs drawn as "> budget", one row per arm.

    Runs that reached the threshold are filled dots at their step; runs that did not
    (censored) are open triangles at their censoring time (the budget) pointing right,
    meaning "later than this"; the budget is a dotted vertical line; the Kaplan-Meier
    median is a black bar (absent, and written "> B" in the row label, when fewer than half
    reached it). Seeds are labelled next to their marks.

    Args:
        arms: ``{arm name: Censored}`` from :func:`helpers.lab.stats.time_to_threshold` or
            ``SweepResult.time_to_threshold``.
        ax: the axes to draw on (default: a new figure).
        unit: the time unit of the x axis.
        title: the axes title (default: the threshold and budget).
        colors: one colour per arm.
    """
    if not isinstance(arms, Mapping) or not arms:
        raise ValueError(f"arms must be a non-empty mapping of arm name to Censored, got {arms!r}")
    for name, c in arms.items():
        if not isinstance(c, Censored):
            raise TypeError(f"arms[{name!r}] must be a Censored (helpers.lab.stats.time_to_threshold), "
                            f"got {type(c).__name__}")
    ax = _new_axes(ax, (6.0, 0.9 + 0.7 * len(arms)))
    names = list(arms)
    colors = list(colors) if colors is not None else [f"C{i % 10}" for i in range(len(names))]
    first_reached = first_censored = first_median = True
    for row, name in enumerate(names):
        c = arms[name]
        offsets = (np.arange(c.n) - (c.n - 1) / 2) * (0.5 / max(c.n, 1))
        y = row + offsets
        hit = c.reached
        if hit.any():
            ax.scatter(c.times[hit], y[hit], s=26, color=colors[row], zorder=3,
                       label="reached (one seed)" if first_reached else None)
            first_reached = False
        if (~hit).any():
            ax.scatter(c.times[~hit], y[~hit], s=46, marker=">", facecolors="none", edgecolors=colors[row],
                       linewidths=1.3, zorder=3, label="censored: not reached by then (> B)" if first_censored else None)
            first_censored = False
        for t, yi, s in zip(c.times, y, c.seeds):
            ax.annotate(str(s), (t, yi), xytext=(5, 0), textcoords="offset points", va="center", fontsize=6)
        if c.median is not None:
            ax.plot([c.median, c.median], [row - 0.32, row + 0.32], color="k", lw=2, zorder=4,
                    label="Kaplan-Meier median" if first_median else None)
            first_median = False
    budgets = sorted({c.budget for c in arms.values()})
    for i, b in enumerate(budgets):
        ax.axvline(b, color="0.5", lw=0.9, ls=":",
                   label=(f"budget B = {b:g}" if len(budgets) == 1 else "budget B") if i == 0 else None)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{n}\n{arms[n].k} of {arms[n].n}; median {arms[n].median_text}" for n in names],
                       fontsize=7)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_xlim(left=0, right=max(budgets) * 1.08)
    ax.set_xlabel(f"step at which the threshold was first reached ({unit})")
    if not title:
        thr = {c.threshold for c in arms.values()}
        what = f"{thr.pop():g}" if len(thr) == 1 and None not in thr else "the threshold"
        title = f"time to reach {what}; open triangles: not reached within the budget"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return ax
