"""Tests of helpers.viz.heads: the pure state functions of notebook 05's explorers, and the explorers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import heads as hd
from helpers.model import TinyTransformer
from helpers.tasks import LookbackTask
from helpers.viz.heads import head_explorer, head_explorer_state, prune_explorer, prune_explorer_state


@pytest.fixture(scope="module")
def setup():
    model = TinyTransformer(10, 16, 2, 2, 12, pos="rope", seed=0).eval()
    data = LookbackTask(num_symbols=10, seq_len=12, k=2).make(16, seed=0)
    curves = {"importance": hd.pruning_curve(model, data), "random": hd.pruning_curve(model, data, "random", seed=1)}
    maps = hd.attention_maps(model, data[0])
    return model, data, curves, maps


def test_prune_state_follows_the_curve(setup):
    _, _, curves, _ = setup
    c = curves["random"]
    s = prune_explorer_state(curves, "random", 3)
    assert s["n_pruned"] == 3 and s["num_heads_total"] == 4 and s["fraction"] == pytest.approx(0.75)
    assert s["removed"] == c.order[:3]
    np.testing.assert_array_equal(s["mask"], c.masks[3].numpy())
    assert int((s["mask"] == 0).sum()) == 3
    assert s["accuracy"] == pytest.approx(float(c.accuracy[3]))
    assert s["drop"] == pytest.approx(100 * float(c.accuracy[0] - c.accuracy[3]))
    assert prune_explorer_state(curves, "importance", 0)["removed"] == []


def test_head_state(setup):
    _, data, _, maps = setup
    labels = [["a", "b"], ["c", "d"]]
    s = head_explorer_state(maps, data[0], 1, 0, 5, labels, [f"t{i}" for i in range(10)])
    np.testing.assert_allclose(s["weights"], maps[1, 5, 0].double().numpy())
    np.testing.assert_allclose(s["weights"].sum(-1), 1.0, atol=1e-6)
    assert s["role"] == "c" and s["tokens"][0] == f"t{int(data[0][5, 0])}" and len(s["tokens"]) == 12
    assert np.array_equal(s["argmax"], maps[1, 5, 0].argmax(-1).numpy())
    # a previous-token map has mean offset (n-1)/n
    prev = torch.zeros(1, 1, 1, 4, 4)
    prev[0, 0, 0, 0, 0] = 1
    prev[0, 0, 0, [1, 2, 3], [0, 1, 2]] = 1
    assert head_explorer_state(prev, torch.zeros(1, 4, dtype=torch.long), 0, 0, 0)["mean_offset"] == pytest.approx(0.75)


def test_explorers_update_figure_and_summary(setup):
    _, data, curves, maps = setup
    ex = prune_explorer(curves, n_pruned=1)
    before, label = ex.image.value, ex.label.value
    s = ex.set(n_pruned=2)
    assert s["n_pruned"] == 2 and ex.image.value != before and ex.label.value != label
    label = ex.label.value
    ex.set(order="random")
    assert ex.label.value != label and "random" in ex.label.value
    hx = head_explorer(maps, data[0])
    before, label = hx.image.value, hx.label.value
    hx.set(layer=1, head=1)
    assert hx.image.value != before and hx.label.value != label
    assert len(hx.times_ms) == 2 and len(ex.times_ms) == 3


def test_prune_explorer_accuracy_label(setup):
    _, _, curves, _ = setup
    ex = prune_explorer(curves, n_pruned=1, accuracy_label="held-out test accuracy")
    figs = [v for v in vars(ex).values() if hasattr(v, "axes") and hasattr(v, "savefig")]
    if figs:
        assert "held-out test accuracy" in [a.get_ylabel() for a in figs[0].axes]
    with pytest.raises(ValueError, match=r"accuracy_label must be a non-empty string, got ''"):
        prune_explorer(curves, accuracy_label="")


def test_errors(setup):
    _, data, curves, maps = setup
    with pytest.raises(ValueError, match=r"curves must be a non-empty dict of name -> PruningCurve, got list"):
        prune_explorer_state([], "x", 0)
    with pytest.raises(ValueError, match=r"order must be one of \['importance', 'random'\], got 'magnitude'"):
        prune_explorer_state(curves, "magnitude", 0)
    with pytest.raises(ValueError, match=r"n_pruned must be an int in \[0, 4\], got 5"):
        prune_explorer_state(curves, "random", 5)
    model, data2 = setup[0], setup[1]
    coarse = {"c": hd.pruning_curve(model, data2, "random", heads_per_step=2)}
    with pytest.raises(ValueError, match=r"curve 'c' must prune one head per step \(5 points\), got 3 points"):
        prune_explorer_state(coarse, "c", 0)
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 2\), got 2"):
        head_explorer_state(maps, data[0], 0, 2, 0)
    with pytest.raises(ValueError, match=r"inputs must have shape \(batch, seq\) = \(16, 12\), got \(2, 12\)"):
        head_explorer_state(maps, data[0][:2], 0, 0, 0)
    with pytest.raises(ValueError, match=r"maps must be a \(num_layers, batch, num_heads, seq, seq\) tensor, got \(2, 2\)"):
        head_explorer_state(torch.ones(2, 2), data[0], 0, 0, 0)


def test_spearman_equals_the_textbook_formula_without_ties():
    from helpers.viz.heads import spearman

    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        a, b = torch.randn(2, 8, generator=g), torch.randn(2, 8, generator=g)
        ra = a.flatten().argsort().argsort().double()
        rb = b.flatten().argsort().argsort().double()
        n = 16
        textbook = 1 - 6 * float(((ra - rb) ** 2).sum()) / (n * (n * n - 1))
        assert spearman(a, b) == pytest.approx(textbook, abs=1e-12)
    assert spearman(a, 3 * a + 1) == pytest.approx(1.0) and spearman(a, -a) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match=r"a and b must be tensors of the same shape with >= 2 entries"):
        spearman(torch.ones(3), torch.ones(4))


def test_plot_score_scatter_labels_every_head_and_returns_rho():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.viz.heads import plot_score_scatter, spearman

    x = torch.tensor([[0.1, 0.5, 0.2], [0.9, 0.3, 0.05]])
    y = torch.tensor([[1.0, 4.0, 0.0], [6.0, 2.0, 0.5]])
    fig, ax = plt.subplots()
    rho = plot_score_scatter(ax, x, y, xlabel="importance", ylabel="points", title="t", highlight=[(1, 0)], logx=True)
    assert rho == pytest.approx(spearman(x, y))
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(f"{l}.{h}" for l in range(2) for h in range(3))
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "importance" and f"{rho:.2f}" in ax.get_title()
    with pytest.raises(ValueError, match=r"x and y must be \(num_layers, num_heads\) tensors of the same shape"):
        plot_score_scatter(ax, x, y[:1], xlabel="a", ylabel="b")
    plt.close(fig)


def test_plot_attention_map_labels_both_axes_with_the_tokens():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.viz.heads import plot_attention_map

    w = torch.softmax(torch.randn(5, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
    tokens = ["T1", "3", "13", "5", "3"]
    fig, (ax, ax2) = plt.subplots(1, 2)
    img = plot_attention_map(ax, w, tokens, title="head 1.6")
    np.testing.assert_allclose(img.get_array(), w.double().numpy())
    assert img.get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    assert [t.get_text() for t in ax.get_yticklabels()] == tokens
    assert ax.get_title() == "head 1.6" and ax.get_xlabel() == "key token" and ax.get_ylabel() == "query token"
    plot_attention_map(ax2, w.numpy(), tokens, show_query_labels=False)
    assert all(t.get_text() == "" for t in ax2.get_yticklabels()) and ax2.get_ylabel() == ""
    with pytest.raises(ValueError, match=r"weights must be a square \(seq, seq\) matrix, got shape \(5, 4\)"):
        plot_attention_map(ax, w[:, :4], tokens)
    with pytest.raises(ValueError, match="tokens must be a sequence of 5 token names"):
        plot_attention_map(ax, w, tokens[:4])
    plt.close(fig)
