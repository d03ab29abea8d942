"""Tests of notebook 01's explorer: its pure state function and the slider wiring."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers import rope_frequencies, rotation_matrix
from helpers.viz import long_term_decay, rope_explorer, rope_explorer_state


def test_long_term_decay_bound_at_zero_and_ones_score():
    d = 32
    dec = long_term_decay(d, 10000.0, 50)
    assert dec["bound"].shape == (51,)
    assert dec["bound"][0] == pytest.approx((d / 2 + 1) / 2)
    # the all-ones score is q^T R_r k with q = k = 1
    ones = torch.ones(d, dtype=torch.float64)
    for r in [0, 3, 50]:
        assert dec["ones_score"][r] == pytest.approx((ones @ rotation_matrix(r, d, dtype=torch.float64) @ ones).item())


def test_long_term_decay_is_the_definition():
    d, r = 16, 37
    theta = rope_frequencies(d, dtype=torch.float64).numpy()
    S = np.cumsum(np.exp(1j * r * theta))
    assert long_term_decay(d, 10000.0, 40)["bound"][r] == pytest.approx(np.abs(S).mean())


def test_state_is_pure_and_correct():
    s = rope_explorer_state(10, 2, 4.0, head_dim=64)
    assert s["angle"] == pytest.approx(10 * 10000 ** (-4 / 64))
    assert s["wavelength"] == pytest.approx(2 * math.pi / 10000 ** (-4 / 64))
    assert s["point"] == pytest.approx((math.cos(s["angle"]), math.sin(s["angle"])))
    assert 0 <= s["angle_wrapped"] < 2 * math.pi
    again = rope_explorer_state(10, 2, 4.0, head_dim=64)
    assert again["angle"] == s["angle"] and np.array_equal(again["bound"], s["bound"])


@pytest.mark.parametrize("kwargs, match", [
    ({"m": 0, "pair": 32, "log10_base": 4.0}, r"pair must be in \[0, head_dim/2\) = \[0, 32\), got 32"),
    ({"m": -1, "pair": 0, "log10_base": 4.0}, "m must be >= 0, got -1"),
])
def test_state_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rope_explorer_state(head_dim=64, **kwargs)


def test_explorer_sliders_drive_the_state_figure_and_label():
    ex = rope_explorer(head_dim=16, max_distance=64)
    png_before = ex.image.value
    state = ex.set(m=9, pair=3)
    assert state["m"] == 9 and state["pair"] == 3
    assert ex.controls["m"].value == 9
    assert ex.image.value != png_before and ex.image.value[:4] == b"\x89PNG"
    assert "m = 9" in ex.label.value and "pair i = 3" in ex.label.value
    # a plain slider assignment (what a drag does) runs the same update
    n_updates = len(ex.times_ms)
    ex.controls["pair"].value = 1
    assert len(ex.times_ms) == n_updates + 1 and ex.state["pair"] == 1
    with pytest.raises(ValueError, match="unknown control 'x'"):
        ex.set(x=1)


def test_plot_clock_dials_values_curve_and_errors():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.viz.rope import plot_clock_dials

    fig = plot_clock_dials(head_dim=16, base=100.0, max_position=1000, contexts={"512": 512}, n_positions=50)
    ax = fig.axes[0]
    mesh = ax.collections[0]
    values = np.asarray(mesh.get_array()).reshape(-1, 8)
    theta = rope_frequencies(16, 100.0, dtype=torch.float64).numpy()
    assert values[0] == pytest.approx(np.cos(theta))  # first row: position 1
    turn = [ln for ln in ax.get_lines() if "first full turn" in ln.get_label()][0]
    assert turn.get_ydata() == pytest.approx(2 * np.pi / theta)
    assert [t.get_text() for t in ax.texts] == ["512"]
    with pytest.raises(ValueError, match="max_position must be an int >= 2, got 1"):
        plot_clock_dials(max_position=1)
    with pytest.raises(ValueError, match="n_positions must be an int >= 2, got 1.5"):
        plot_clock_dials(n_positions=1.5)
    plt.close("all")
