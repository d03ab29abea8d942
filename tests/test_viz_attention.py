"""Tests of notebook 03's figures and explorer (helpers.viz.attention), and of the notebook's
inline derivation and exercise scaffold (they must not drift from helpers)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from helpers import MultiHeadAttention, TinyTransformer, causal_mask
from helpers.practice.mha import SCAFFOLD
from helpers.viz.attention import (
    attention_explorer,
    attention_explorer_state,
    attention_grid,
    plot_split_merge,
    stack_attention,
)
from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

NB03 = Path(__file__).resolve().parents[1] / "notebooks" / "03_mha_from_scratch.ipynb"


def _weights(layers=2, heads=3, seq=6, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, heads, seq, seq, generator=g)
    return torch.softmax(scores.masked_fill(~causal_mask(seq), float("-inf")), dim=-1)


# ------------------------------------------------------------------ stack_attention
def test_stack_attention_from_model_weights():
    model = TinyTransformer(10, 16, 2, 3, 7, pos="rope", seed=0)
    tokens = torch.randint(0, 10, (4, 7), generator=torch.Generator().manual_seed(1))
    model(tokens)
    w = stack_attention(model.attention_weights, example=2)
    assert w.shape == (3, 2, 7, 7) and w.dtype == torch.float32
    for layer in range(3):
        torch.testing.assert_close(w[layer], model.attention_weights[layer][2])
    # a (layers, heads, seq, seq) tensor and a list of (heads, seq, seq) give the same thing
    torch.testing.assert_close(stack_attention(w), w)
    torch.testing.assert_close(stack_attention([w[0], w[1], w[2]]), w)


@pytest.mark.parametrize(
    "weights, kwargs, exc, match",
    [
        (torch.zeros(2, 3, 4), {}, ValueError, r"weights must have shape \(num_layers, num_heads, seq_q, seq_k\), got \(2, 3, 4\)"),
        ([], {}, TypeError, "weights must be a tensor .* or a non-empty list of per-layer tensors, got list"),
        ("abc", {}, TypeError, "got str"),
        ([torch.zeros(2, 4, 4), "x"], {}, TypeError, r"weights\[1\] must be a torch.Tensor, got str"),
        ([torch.zeros(4, 4)], {}, ValueError, r"weights\[0\] must have shape \(batch, heads, seq_q, seq_k\) or \(heads, seq_q, seq_k\), got \(4, 4\)"),
        ([torch.zeros(2, 2, 4, 4)], {"example": 2}, ValueError, r"example must be in \[0, batch\) = \[0, 2\), got 2"),
        ([torch.zeros(2, 4, 4), torch.zeros(2, 5, 5)], {}, ValueError, "every layer must have the same shape"),
    ],
)
def test_stack_attention_errors(weights, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        stack_attention(weights, **kwargs)


# ------------------------------------------------------------------ the pure state
def test_state_reads_the_selected_row():
    w = _weights()
    s = attention_explorer_state(w, 1, 2, 4, tokens=list("abcdef"))
    row = w[1, 2, 4].double().numpy()
    np.testing.assert_allclose(s["row"], row)
    np.testing.assert_allclose(s["map"], w[1, 2].double().numpy())
    assert s["top"] == int(row.argmax()) and s["top_token"] == "abcdef"[s["top"]]
    assert s["query_token"] == "e" and s["top_weight"] == pytest.approx(row.max())
    assert s["allowed"] == 5  # causal: query 4 sees keys 0..4
    assert s["max_entropy"] == pytest.approx(math.log(5))
    assert s["entropy"] == pytest.approx(float(-(row[:5] * np.log(row[:5])).sum()))
    assert s["row_sum"] == pytest.approx(1.0)
    assert attention_explorer_state(w, 0, 0, 0)["tokens"] == ["0", "1", "2", "3", "4", "5"]


@settings(max_examples=25, deadline=None)
@given(layer=st.integers(0, 1), head=st.integers(0, 2), query=st.integers(0, 5), seed=st.integers(0, 10_000))
def test_state_properties(layer, head, query, seed):
    """Causal rows see query+1 keys; the entropy lies in [0, ln(allowed)]; the top weight is
    at least uniform; the same input gives the same state (pure)."""
    w = _weights(seed=seed)
    s = attention_explorer_state(w, layer, head, query)
    assert s["allowed"] == query + 1 and s["top"] <= query
    assert -1e-12 <= s["entropy"] <= s["max_entropy"] + 1e-9
    assert s["top_weight"] >= 1 / (query + 1) - 1e-6
    again = attention_explorer_state(w, layer, head, query)
    assert again["top"] == s["top"] and np.array_equal(again["row"], s["row"])


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((2, 0, 0), ValueError, r"layer must be in \[0, 2\), got 2"),
        ((0, 3, 0), ValueError, r"head must be in \[0, 3\), got 3"),
        ((0, 0, -1), ValueError, r"query must be in \[0, 6\), got -1"),
        ((0, 0.5, 0), TypeError, r"head must be an int, got float \(0.5\)"),
    ],
)
def test_state_index_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        attention_explorer_state(_weights(), *args)


def test_state_tokens_and_shape_errors():
    with pytest.raises(ValueError, match=r"tokens must have one label per position \(seq = 6\), got 5"):
        attention_explorer_state(_weights(), 0, 0, 0, tokens=list("abcde"))
    with pytest.raises(ValueError, match=r"self-attention maps \(seq_q == seq_k\), got 3 x 5"):
        attention_explorer_state(torch.zeros(1, 1, 3, 5), 0, 0, 0)


# ------------------------------------------------------------------ the explorer
def test_explorer_sliders_drive_state_figure_and_label():
    w = _weights()
    ex = attention_explorer(w, tokens=list("abcdef"), query=3)
    assert list(ex.controls) == ["layer", "head", "query"]
    assert ex.controls["query"].max == 5 and ex.controls["head"].max == 2 and ex.controls["layer"].max == 1
    png0, label0 = ex.image.value, ex.label.value
    state = ex.set(layer=1, head=2, query=4)
    assert (state["layer"], state["head"], state["query"]) == (1, 2, 4)
    assert ex.image.value != png0 and ex.image.value[:4] == b"\x89PNG"
    assert "layer 1, head 2, query position 4 (token e)" in ex.label.value and ex.label.value != label0
    # every slider alone changes the picture and the summary (what the browser test requires)
    for name, value in (("layer", 0), ("head", 1), ("query", 2)):
        png, label = ex.image.value, ex.label.value
        n = len(ex.times_ms)
        ex.controls[name].value = value  # what a drag does
        assert len(ex.times_ms) == n + 1 and ex.state[name] == value
        assert ex.image.value != png and ex.label.value != label
    with pytest.raises(ValueError, match="unknown control 'x'"):
        ex.set(x=1)


def test_explorer_redraws_only_artists_and_defaults():
    ex = attention_explorer(_weights(), title="t")
    assert ex.state["query"] == 5  # default: the last position
    ax_m = ex.figure.axes[0]
    xlim, ylim = ax_m.get_xlim(), ax_m.get_ylim()
    ex.set(query=0, head=1)
    assert ax_m.get_xlim() == xlim and ax_m.get_ylim() == ylim  # fixed limits: blitting is valid
    assert ex.animated and ex.figure.axes[0].images[0].get_clim() == (0.0, 1.0)


def test_explorer_validates_initial_values():
    with pytest.raises(ValueError, match=r"query must be in \[0, 6\), got 6"):
        attention_explorer(_weights(), query=6)
    with pytest.raises(ValueError, match=r"tokens must have one label per position"):
        attention_explorer(_weights(), tokens=["a"])


def test_attention_grid_has_one_panel_per_layer_and_head():
    import matplotlib.pyplot as plt

    fig = attention_grid(_weights(layers=2, heads=3), tokens=list("abcdef"), title="x")
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) == 6
    assert [t.get_text() for t in maps[0].get_xticklabels()] == list("abcdef")
    assert all(ax.images[0].get_clim() == (0.0, 1.0) for ax in maps)
    plt.close(fig)


def test_attention_grid_index_labels_and_highlighted_rows():
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig = attention_grid(_weights(layers=2, heads=3), tokens=list("abcdef"), indices=True,
                         highlight_rows={0: [1, 3], 1: [5]})
    maps = [ax for ax in fig.axes if ax.images]
    assert [t.get_text() for t in maps[0].get_yticklabels()] == ["0 a", "1 b", "2 c", "3 d", "4 e", "5 f"]
    outlined = [[p.get_y() + 0.5 for p in ax.patches if isinstance(p, Rectangle)] for ax in maps]
    assert outlined[:3] == [[1.0, 3.0]] * 3 and outlined[3:] == [[5.0]] * 3   # layer 0 = first 3 heads
    plt.close(fig)
    with pytest.raises(ValueError, match=r"highlight_rows\[0\] row must be in \[0, 6\), got 6"):
        attention_grid(_weights(), highlight_rows={0: [6]})
    with pytest.raises(ValueError, match=r"highlight_rows layer must be in \[0, 2\), got 2"):
        attention_grid(_weights(), highlight_rows={2: [0]})
    with pytest.raises(TypeError, match=r"highlight_rows must be a dict"):
        attention_grid(_weights(), highlight_rows=[0, 1])


def test_split_merge_diagram_follows_the_real_reshape():
    """Each number (token t, column c) is drawn three times; in the per-head blocks, the cells of head i
    are exactly what torch's view(B, L, h, d_k).transpose(1, 2) puts in head i, in the same row order."""
    import matplotlib.pyplot as plt

    L, h, d_k = 4, 3, 2
    fig = plot_split_merge(L, h, d_k)
    ax = fig.axes[0]
    cells = [(t.get_position(), t.get_text()) for t in ax.texts if "," in t.get_text() and " " not in t.get_text()]
    labels = [lab for _, lab in cells]
    assert len(labels) == 3 * L * h * d_k and all(labels.count(lab) == 3 for lab in set(labels))
    x_right = max(pos[0] for pos, _ in cells) - (d_k - 1)
    x = (torch.arange(L)[:, None] * 100 + torch.arange(h * d_k)[None, :]).reshape(1, L, h * d_k)
    heads = x.view(1, L, h, d_k).transpose(1, 2)[0]                       # (h, L, d_k)
    right = sorted([(-pos[1], pos[0], lab) for pos, lab in cells if pos[0] >= x_right - 1e-9])
    drawn = [int(lab.split(",")[0]) * 100 + int(lab.split(",")[1]) for _, _, lab in right]
    assert drawn == heads.reshape(-1).tolist()
    plt.close(fig)
    with pytest.raises(ValueError, match=r"num_heads must be in \[1, 8\] to stay readable, got 9"):
        plot_split_merge(num_heads=9)
    with pytest.raises(TypeError, match=r"seq must be an int, got float"):
        plot_split_merge(seq=2.0)


# ------------------------------------------- notebook 03: inline code and scaffold
def _tagged_cell(tag: str) -> str:
    nb = json.loads(pristine(NB03).read_text(encoding="utf-8"))
    found = [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
    assert len(found) == 1, f"{NB03.name} must have exactly one cell tagged {tag!r}"
    return "".join(found[0]["source"])


@pytest.mark.parametrize("use_mask", [False, True])
def test_notebook_inline_mha_agrees_with_helpers(use_mask):
    """Notebook 03 writes MHA inline (every shape traced); helpers must compute the same."""
    namespace = {"math": math, "torch": torch, "nn": nn}
    exec(_tagged_cell("inline-mha"), namespace)
    mha_inline = namespace["mha_inline"]
    torch.manual_seed(0)
    ref = MultiHeadAttention(12, 3)
    linears = {name: getattr(ref, name) for name in ("linear_q", "linear_k", "linear_v", "linear_out")}
    x = torch.randn(2, 5, 12)
    mask = causal_mask(5) if use_mask else None
    trace: list = []
    out, weights = mha_inline(x, linears, 3, mask=mask, trace=trace)
    out_ref, w_ref = ref(x, mask=mask)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(weights, w_ref)
    shapes = dict(trace)
    assert tuple(shapes["scores = q @ k^T"]) == (2, 3, 5, 5) and tuple(out.shape) == (2, 5, 12)


def test_notebook_scaffold_cell_is_helpers_scaffold():
    """The exercise cell the learner edits starts as helpers.practice.SCAFFOLD (same interface as check_mha's)."""
    assert _tagged_cell("mha-scaffold").strip() == SCAFFOLD.strip()
