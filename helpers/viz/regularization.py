"""Figures and explorers of notebook 04 (regularization): label smoothing and dropout."""
from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.figure import Figure

from .. import regularization as _reg
from .explorer import Explorer

__all__ = [
    "label_smoothing_state",
    "label_smoothing_explorer",
    "dropout_state",
    "dropout_explorer",
    "RESIDUAL_BLOCK_STEPS",
    "plot_residual_dropout_blocks",
    "MAX_CLASSES",
]

#: the largest number of classes the label-smoothing explorer shows
MAX_CLASSES = 20
_EPS_GRID = np.linspace(0.01, 0.5, 99)


def label_smoothing_state(eps: float, num_classes: int) -> dict:
    """Everything the label-smoothing explorer shows for smoothing ``eps`` and ``num_classes``
    classes (true class 0), under both conventions (pure: no widgets, no figure).

    Returns a dict with the two target distributions ``targets_uniform`` / ``targets_others``
    (numpy ``(K,)``), the optimal logit gaps and loss floors (entropies) of each, the uniform
    ``eps`` that gives the notes' targets (``eps_uniform_equiv``), and the gap curves over an
    ``eps`` grid (``eps_grid``, ``gap_uniform_curve``, ``gap_others_curve``).
    """
    if not (2 <= num_classes <= MAX_CLASSES):
        raise ValueError(f"num_classes must be in [2, {MAX_CLASSES}], got {num_classes}")
    t = torch.zeros(1, dtype=torch.long)
    out = {"eps": float(eps), "K": int(num_classes)}
    for conv in _reg.CONVENTIONS:
        out[f"targets_{conv}"] = _reg.smooth_labels(t, num_classes, eps, conv)[0].double().numpy()
        out[f"gap_{conv}"] = _reg.optimal_logit_gap(eps, num_classes, conv)
        out[f"entropy_{conv}"] = _reg.smoothed_target_entropy(eps, num_classes, conv)
        out[f"gap_{conv}_curve"] = np.array([_reg.optimal_logit_gap(float(e), num_classes, conv) for e in _EPS_GRID])
    e2 = _reg.uniform_eps_from_others(eps, num_classes)
    out["eps_uniform_equiv"] = e2
    out["eps_grid"] = _EPS_GRID
    return out


def label_smoothing_explorer(eps: float = 0.1, num_classes: int = 5) -> Explorer:
    """Sliders for ε and K: the smoothed targets under both conventions (bars) and the optimal
    logit gap against ε (curves, current ε marked)."""
    import ipywidgets as widgets

    controls = {
        "eps": widgets.FloatSlider(value=eps, min=0.01, max=0.5, step=0.01, description="epsilon", readout_format=".2f"),
        "num_classes": widgets.IntSlider(value=num_classes, min=2, max=MAX_CLASSES, step=1, description="classes K"),
    }
    fig = Figure(figsize=(9.0, 3.3))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.16, top=0.82, wspace=0.3)
    ax_t, ax_g = fig.subplots(1, 2)
    x = np.arange(MAX_CLASSES)
    bars_u = ax_t.bar(x - 0.2, np.zeros(MAX_CLASSES), width=0.4, color="C0", label="uniform (torch, Szegedy)")
    bars_o = ax_t.bar(x + 0.2, np.zeros(MAX_CLASSES), width=0.4, color="C1", label="others (the notes)")
    ax_t.set_xlim(-0.7, MAX_CLASSES - 0.3)
    ax_t.set_ylim(0, 1.05)
    ax_t.set_xlabel("class k (true class = 0)")
    ax_t.set_ylabel("target probability")
    title_t = ax_t.set_title(" ", fontsize=9)
    leg_t = ax_t.legend(loc="upper right", fontsize=8)
    (curve_u,) = ax_g.plot([], [], color="C0", label="uniform")
    (curve_o,) = ax_g.plot([], [], color="C1", label="others")
    (dot_u,) = ax_g.plot([], [], "o", color="C0")
    (dot_o,) = ax_g.plot([], [], "o", color="C1")
    ax_g.set_xlim(0, 0.5)
    ax_g.set_ylim(0, math.log(1 + MAX_CLASSES * 0.99 / 0.01) * 1.05)
    ax_g.set_xlabel(r"smoothing $\varepsilon$")
    ax_g.set_ylabel(r"optimal logit gap $z_y - z_{k\neq y}$")
    title_g = ax_g.set_title(" ", fontsize=9)
    leg_g = ax_g.legend(loc="upper right", fontsize=8)
    suptitle = fig.suptitle(" ", fontsize=10)

    def draw(s: dict) -> None:
        K = s["K"]
        for k in range(MAX_CLASSES):  # the bars of classes >= K hidden: not drawn, where height 0 still cost a draw
            bars_u[k].set_height(s["targets_uniform"][k] if k < K else 0.0)
            bars_o[k].set_height(s["targets_others"][k] if k < K else 0.0)
            bars_u[k].set_visible(k < K)
            bars_o[k].set_visible(k < K)
        title_t.set_text(f"targets: true {s['targets_uniform'][0]:.3f} vs {s['targets_others'][0]:.3f}")
        curve_u.set_data(s["eps_grid"], s["gap_uniform_curve"])
        curve_o.set_data(s["eps_grid"], s["gap_others_curve"])
        dot_u.set_data([s["eps"]], [s["gap_uniform"]])
        dot_o.set_data([s["eps"]], [s["gap_others"]])
        title_g.set_text(f"gap at eps={s['eps']:.2f}: {s['gap_uniform']:.2f} (uniform), {s['gap_others']:.2f} (others)")
        suptitle.set_text(f"Label smoothing, K = {K} classes, epsilon = {s['eps']:.2f}")

    def summary(s: dict) -> str:
        return (
            f"&epsilon; = {s['eps']:.2f}, K = {s['K']}: uniform targets {s['targets_uniform'][0]:.3f} / {s['targets_uniform'][1]:.4f}, "
            f"notes' targets {s['targets_others'][0]:.3f} / {s['targets_others'][1]:.4f} "
            f"(= uniform with &epsilon;' = {s['eps_uniform_equiv']:.4f}); loss floors {s['entropy_uniform']:.3f} / {s['entropy_others']:.3f} nats"
        )

    animated = [*bars_u, *bars_o, title_t, curve_u, curve_o, dot_u, dot_o, title_g, suptitle]
    return Explorer(controls, label_smoothing_state, draw, fig, summary, animated=animated, overlays=[leg_t, leg_g])


def dropout_state(p: float, seed: int, shape: tuple[int, int] = (12, 32), n_samples: int = 4000) -> dict:
    """What the dropout explorer shows for drop probability ``p`` and mask seed ``seed`` (pure).

    One sampled output ``y = dropout(1, p)`` of ``shape`` (``sample``; its zeros are the dropped
    units, the others equal 1/(1-p)),
    and over ``n_samples`` masks of a unit activation: the empirical mean and variance of
    the output against the theory (mean 1, variance p/(1-p)).
    """
    g = torch.Generator().manual_seed(seed)
    y = _reg.dropout(torch.ones(shape, dtype=torch.float64), p, generator=g)
    many = _reg.dropout(torch.ones(n_samples, dtype=torch.float64), p, generator=g)
    return {
        "p": float(p),
        "seed": int(seed),
        "sample": y.numpy(),
        "kept_fraction": float((y != 0).double().mean()),
        "mean": float(many.mean()),
        "var": float(many.var(unbiased=False)),
        "var_theory": float(p / (1 - p)),
        "n_samples": n_samples,
    }


def dropout_explorer(p: float = 0.1, seed: int = 0) -> Explorer:
    """Sliders for the drop probability p and the mask seed: one sampled mask (left) and the
    output's mean and variance against p (right: theory curves, current empirical values)."""
    import ipywidgets as widgets

    controls = {
        "p": widgets.FloatSlider(value=p, min=0.0, max=0.9, step=0.05, description="drop prob p", readout_format=".2f"),
        "seed": widgets.IntSlider(value=seed, min=0, max=50, step=1, description="mask seed"),
    }
    fig = Figure(figsize=(9.0, 3.3))
    fig.subplots_adjust(left=0.06, right=0.97, bottom=0.16, top=0.82, wspace=0.35)
    ax_m, ax_s = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.4, 1]})
    im = ax_m.imshow(np.zeros((12, 32)), cmap="Greys_r", vmin=0, vmax=1, aspect="auto")
    cbar = fig.colorbar(im, ax=ax_m, ticks=[0, 1])
    cbar.ax.set_yticklabels(["dropped (0)", "kept"])
    ax_m.set_xlabel("unit")
    ax_m.set_ylabel("example")
    title_m = ax_m.set_title(" ", fontsize=9)
    grid = np.linspace(0, 0.9, 91)
    ax_s.plot(grid, np.ones_like(grid), color="C0", label="mean, theory (= input)")
    ax_s.plot(grid, grid / (1 - grid), color="C1", label="variance, theory p/(1-p)")
    (dot_mean,) = ax_s.plot([], [], "o", color="C0", label="mean, 4000 masks")
    (dot_var,) = ax_s.plot([], [], "s", color="C1", label="variance, 4000 masks")
    ax_s.set_xlim(0, 0.92)
    ax_s.set_ylim(0, 9.5)
    ax_s.set_xlabel("drop probability p")
    ax_s.set_ylabel("output statistic")
    leg = ax_s.legend(loc="upper left", fontsize=7)
    suptitle = fig.suptitle(" ", fontsize=10)

    def draw(s: dict) -> None:
        im.set_data((s["sample"] != 0).astype(float))
        title_m.set_text(f"one mask: {100 * s['kept_fraction']:.0f}% kept, each scaled by {1 / (1 - s['p']):.2f}")
        dot_mean.set_data([s["p"]], [s["mean"]])
        dot_var.set_data([s["p"]], [s["var"]])
        suptitle.set_text(f"Inverted dropout, p = {s['p']:.2f}, seed {s['seed']}")

    def summary(s: dict) -> str:
        return (
            f"p = {s['p']:.2f}, seed {s['seed']}: kept {100 * s['kept_fraction']:.1f}% of units; over {s['n_samples']} masks "
            f"mean {s['mean']:.3f} (theory 1), variance {s['var']:.3f} (theory {s['var_theory']:.3f})"
        )

    animated = [im, title_m, dot_mean, dot_var, suptitle]
    return Explorer(controls, lambda p, seed: dropout_state(p, seed), draw, fig, summary, animated=animated,
                    overlays=[leg])


#: The operations of one sub-layer's residual branch, in order, for each placement of the LayerNorm
#: (Vaswani et al. 2017, sec. 5.4, post-LN; GPT-2 and most later models, pre-LN). ``"+"`` is the
#: residual addition of the branch's input ``x``.
RESIDUAL_BLOCK_STEPS: dict[str, tuple[str, ...]] = {
    "post": ("x", "Sublayer", "Dropout", "+", "LayerNorm", "out"),
    "pre": ("x", "LayerNorm", "Sublayer", "Dropout", "+", "out"),
}


def plot_residual_dropout_blocks(p_drop: float = 0.1):
    r"""Block diagrams of one residual sub-layer, post-LN (top) and pre-LN (bottom), with the
    residual dropout marked.

    Post-LN: :math:`x \leftarrow \operatorname{LN}(x + \operatorname{Dropout}(\operatorname{Sublayer}(x)))`;
    pre-LN: :math:`x \leftarrow x + \operatorname{Dropout}(\operatorname{Sublayer}(\operatorname{LN}(x)))`.
    "Sublayer" is the attention or the feed-forward network (a block has one of each). Boxes
    follow :data:`RESIDUAL_BLOCK_STEPS` from left to right; the dropout boxes are red and labelled
    with ``p_drop``; the residual path from ``x`` to the addition is drawn above.

    Returns the pyplot figure (call ``plt.show()``).

    Raises:
        ValueError: if ``p_drop`` is not in [0, 1).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if not 0 <= p_drop < 1:
        raise ValueError(f"p_drop must be in [0, 1), got {p_drop!r}")
    fig, axes = plt.subplots(2, 1, figsize=(8, 3.8), layout="constrained")
    style = {"Sublayer": ("#dbe9f6", "attention or\nfeed-forward"), "Dropout": ("#f8c9c4", f"Dropout\np = {p_drop:g}"),
             "LayerNorm": ("#e3f1dc", "LayerNorm"), "+": ("white", "+"), "x": ("white", "x"), "out": ("white", "out")}
    titles = {"post": "post-LN (the paper, \u00a75.4): LN(x + Dropout(Sublayer(x)))",
              "pre": "pre-LN (GPT-2 and later): x + Dropout(Sublayer(LN(x)))"}
    for ax, (norm, steps) in zip(axes, RESIDUAL_BLOCK_STEPS.items()):
        xs = np.linspace(0.6, 9.4, len(steps))
        y = 0.0
        for i, (name, xc) in enumerate(zip(steps, xs)):
            face, text = style[name]
            if name in ("x", "out"):
                ax.text(xc, y, text, ha="center", va="center", fontsize=11, fontweight="bold")
            elif name == "+":
                ax.add_patch(plt.Circle((xc, y), 0.28, facecolor=face, edgecolor="black", lw=1.2))
                ax.text(xc, y, "+", ha="center", va="center", fontsize=13)
            else:
                ax.add_patch(FancyBboxPatch((xc - 0.62, y - 0.42), 1.24, 0.84, boxstyle="round,pad=0.05",
                                            facecolor=face, edgecolor="C3" if name == "Dropout" else "black",
                                            lw=2.0 if name == "Dropout" else 1.0))
                ax.text(xc, y, text, ha="center", va="center", fontsize=8)
            if i + 1 < len(steps):  # arrow to the next step
                gap = 0.72 if name not in ("x", "+") else 0.35
                nxt = steps[i + 1]
                end_gap = 0.72 if nxt not in ("out", "+") else 0.35
                ax.annotate("", xy=(xs[i + 1] - end_gap, y), xytext=(xc + gap, y),
                            arrowprops=dict(arrowstyle="->", lw=1.2))
        x_plus = xs[steps.index("+")]
        ax.annotate("", xy=(x_plus, y + 0.3), xytext=(xs[0], y + 0.25),
                    arrowprops=dict(arrowstyle="->", lw=1.2, color="0.35", connectionstyle="bar,fraction=-0.08",
                                    shrinkA=8, shrinkB=0))
        ax.text((xs[0] + x_plus) / 2, 1.02, "residual path (identity, never dropped)", ha="center", va="bottom",
                fontsize=8, color="0.35")
        ax.set_title(titles[norm], fontsize=9, loc="left")
        ax.set_xlim(0, 10)
        ax.set_ylim(-0.7, 1.35)
        ax.set_aspect("auto")
        ax.axis("off")
    fig.suptitle("Residual dropout (red) acts on the sub-layer's output, before the residual addition", fontsize=10)
    return fig
