"""Tests of notebook 04's explorers (pure state functions and slider wiring) and of the
notebook's inline dropout against helpers (no drift)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.regularization import dropout, optimal_logit_gap
from helpers.viz.regularization import (
    MAX_CLASSES,
    dropout_explorer,
    dropout_state,
    label_smoothing_explorer,
    label_smoothing_state,
)
from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

NB04 = Path(__file__).resolve().parents[1] / "notebooks" / "04_regularization.ipynb"


def test_label_smoothing_state():
    s = label_smoothing_state(0.1, 5)
    assert s["targets_uniform"].sum() == pytest.approx(1) and s["targets_others"].sum() == pytest.approx(1)
    assert s["targets_uniform"][0] == pytest.approx(0.92) and s["targets_others"][1] == pytest.approx(0.025)
    assert s["gap_others"] == pytest.approx(math.log(0.9 * 4 / 0.1))
    assert s["eps_uniform_equiv"] == pytest.approx(0.125)
    assert s["gap_uniform_curve"].shape == s["eps_grid"].shape
    assert s["gap_others_curve"][0] == pytest.approx(optimal_logit_gap(float(s["eps_grid"][0]), 5, "others"))
    with pytest.raises(ValueError, match=rf"num_classes must be in \[2, {MAX_CLASSES}\], got 21"):
        label_smoothing_state(0.1, 21)


def test_dropout_state_statistics():
    s = dropout_state(0.5, 3)
    assert set(np.unique(s["sample"]).tolist()) <= {0.0, 2.0}
    assert s["mean"] == pytest.approx(1, abs=0.1) and s["var"] == pytest.approx(1, rel=0.15)
    assert dropout_state(0.5, 3)["kept_fraction"] == s["kept_fraction"]  # pure: same seed, same mask
    assert dropout_state(0.0, 0)["var"] == 0.0


def test_explorers_update_on_slider_moves():
    ls = label_smoothing_explorer()
    before = (ls.image.value, ls.label.value)
    assert ls.set(num_classes=7)["K"] == 7
    assert ls.image.value != before[0] and "K = 7" in ls.label.value
    do = dropout_explorer()
    before = do.label.value
    do.controls["p"].value = 0.5
    assert do.state["p"] == 0.5 and do.label.value != before and "p = 0.50" in do.label.value


def test_notebook_inline_dropout_agrees_with_helpers():
    nb = json.loads(pristine(NB04).read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if "inline-dropout" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1
    ns = {"torch": torch}
    exec("".join(cells[0]["source"]), ns)
    x = torch.randn(5, 7, dtype=torch.float64)
    for p in [0.0, 0.1, 0.7]:
        torch.testing.assert_close(ns["dropout_inline"](x, p, generator=torch.Generator().manual_seed(3)),
                                   dropout(x, p, generator=torch.Generator().manual_seed(3)))
    assert ns["dropout_inline"](x, 0.5, training=False) is x


def test_residual_dropout_blocks_order_and_labels():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.viz.regularization import RESIDUAL_BLOCK_STEPS, plot_residual_dropout_blocks

    # the two placements match helpers.TransformerBlock: dropout on the branch, before the addition
    assert RESIDUAL_BLOCK_STEPS["post"].index("Dropout") < RESIDUAL_BLOCK_STEPS["post"].index("+") < \
        RESIDUAL_BLOCK_STEPS["post"].index("LayerNorm")
    assert RESIDUAL_BLOCK_STEPS["pre"].index("LayerNorm") < RESIDUAL_BLOCK_STEPS["pre"].index("Sublayer") < \
        RESIDUAL_BLOCK_STEPS["pre"].index("Dropout") < RESIDUAL_BLOCK_STEPS["pre"].index("+")
    fig = plot_residual_dropout_blocks(0.1)
    try:
        for ax, norm in zip(fig.axes, ["post", "pre"]):
            assert ax.get_title(loc="left").startswith(f"{norm}-LN")
            texts = sorted((t.get_position()[0], t.get_text()) for t in ax.texts if t.get_text())
            order = [txt for _, txt in texts if txt in ("x", "+", "LayerNorm", "Dropout\np = 0.1", "out")]
            expected = [s if s != "Dropout" else "Dropout\np = 0.1" for s in RESIDUAL_BLOCK_STEPS[norm] if s != "Sublayer"]
            assert order == expected
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match=r"p_drop must be in \[0, 1\), got 1.0"):
        plot_residual_dropout_blocks(1.0)
