"""Tests of helpers.regularization (notebook 04) against torch's own implementations."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.regularization import (
    calibration_bins,
    dropout,
    expected_calibration_error,
    l1_penalty,
    l2_penalty,
    label_smoothing_cross_entropy,
    optimal_logit_gap,
    smooth_labels,
    smoothed_target_entropy,
    uniform_eps_from_others,
)

FAST = settings(max_examples=25, deadline=None)


# ---------------------------------------------------------------------- dropout
def test_dropout_expectation_is_preserved():
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 3, 50)
    mean = torch.stack([dropout(x, 0.3, generator=g) for _ in range(20000)]).mean(0)
    torch.testing.assert_close(mean, x, atol=0.06, rtol=0)


def test_dropout_masks_scale_and_zero():
    g = torch.Generator().manual_seed(1)
    x = torch.ones(10000)
    y = dropout(x, 0.25, generator=g)
    kept = y != 0
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.75))
    assert abs(kept.float().mean().item() - 0.75) < 0.02


def test_dropout_is_identity_in_eval_and_at_p0():
    x = torch.randn(3, 4)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x


def test_dropout_matches_torch_statistics():
    # same law as F.dropout: fraction kept and scaling
    torch.manual_seed(0)
    ref = F.dropout(torch.ones(20000), 0.4, training=True)
    ours = dropout(torch.ones(20000), 0.4, generator=torch.Generator().manual_seed(0))
    assert set(ref.unique().tolist()) == set(ours.unique().tolist())
    assert abs((ref == 0).float().mean() - (ours == 0).float().mean()) < 0.02


# -------------------------------------------------------------- label smoothing
@FAST
@given(K=st.integers(2, 12), eps=st.floats(0, 0.99), seed=st.integers(0, 1000), conv=st.sampled_from(["uniform", "others"]))
def test_smoothed_targets_sum_to_one_and_put_most_mass_on_truth(K, eps, seed, conv):
    t = torch.randint(0, K, (7,), generator=torch.Generator().manual_seed(seed))
    q = smooth_labels(t, K, eps, conv)
    torch.testing.assert_close(q.sum(-1), torch.ones(7))
    assert (q >= 0).all()
    true = q.gather(-1, t[:, None]).squeeze(-1)
    expected = 1 - eps + eps / K if conv == "uniform" else 1 - eps
    torch.testing.assert_close(true, torch.full((7,), expected))


@FAST
@given(K=st.integers(2, 12), eps=st.floats(0, 0.9))
def test_conventions_map_onto_each_other(K, eps):
    eps_u = uniform_eps_from_others(eps, K)
    if eps_u >= 1:
        return
    t = torch.arange(K)
    torch.testing.assert_close(smooth_labels(t, K, eps, "others"), smooth_labels(t, K, eps_u, "uniform"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_uniform_convention_equals_torch_cross_entropy(reduction, eps):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 5, 3, generator=g)  # (N, K, d1)
    target = torch.randint(0, 5, (6, 3), generator=g)
    target[0, 1] = target[4, 2] = -100
    ours = label_smoothing_cross_entropy(logits, target, eps, reduction=reduction)
    ref = F.cross_entropy(logits, target, label_smoothing=eps, reduction=reduction, ignore_index=-100)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("V", [5000, 32000])
def test_float64_is_computed_in_float64(reduction, V):
    # float64 logits must not be rounded to float32 inside (the loss must match torch's float64 result)
    g = torch.Generator().manual_seed(5)
    logits = 4 * torch.randn(6, V, generator=g, dtype=torch.float64)
    target = torch.randint(0, V, (6,), generator=g)
    target[2] = -100
    ours = label_smoothing_cross_entropy(logits, target, 0.1, reduction=reduction)
    ref = F.cross_entropy(logits, target, label_smoothing=0.1, reduction=reduction, ignore_index=-100)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)   # float64 round-off only (float32 inside: ~1e-6)
    others = label_smoothing_cross_entropy(logits, target, 0.1, "others", reduction=reduction)
    ref_others = F.cross_entropy(logits, target, label_smoothing=uniform_eps_from_others(0.1, V), reduction=reduction)
    assert others.dtype == torch.float64
    torch.testing.assert_close(others, ref_others, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype(dtype):
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(8, 50, generator=g)
    target = torch.randint(0, 50, (8,), generator=g)
    ours = label_smoothing_cross_entropy(logits.to(dtype), target, 0.1)
    ref = F.cross_entropy(logits.to(dtype).float(), target, label_smoothing=0.1)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, ref.to(dtype))


def test_custom_ignore_index_and_2d_logits():
    g = torch.Generator().manual_seed(3)
    logits, target = torch.randn(8, 4, generator=g), torch.tensor([0, 1, 2, 3, 7, 7, 1, 0])
    torch.testing.assert_close(
        label_smoothing_cross_entropy(logits, target, 0.2, ignore_index=7),
        F.cross_entropy(logits, target, label_smoothing=0.2, ignore_index=7),
    )


def test_others_convention_equals_torch_with_mapped_eps():
    g = torch.Generator().manual_seed(4)
    logits, target = torch.randn(10, 6, generator=g), torch.randint(0, 6, (10,), generator=g)
    ref = F.cross_entropy(logits, target, label_smoothing=uniform_eps_from_others(0.1, 6))
    torch.testing.assert_close(label_smoothing_cross_entropy(logits, target, 0.1, "others"), ref)


@pytest.mark.parametrize("conv", ["uniform", "others"])
def test_loss_floor_and_optimal_gap_are_attained_by_the_target(conv):
    K, eps = 5, 0.1
    gap = optimal_logit_gap(eps, K, conv)
    logits = torch.zeros(1, K, dtype=torch.float64)
    logits[0, 2] = gap
    q = smooth_labels(torch.tensor([2]), K, eps, conv).double()
    torch.testing.assert_close(torch.softmax(logits, -1), q)
    loss = label_smoothing_cross_entropy(logits, torch.tensor([2]), eps, conv)
    assert loss.item() == pytest.approx(smoothed_target_entropy(eps, K, conv))
    # any other gap gives a larger loss
    for delta in (-0.5, 0.5):
        other = logits.clone()
        other[0, 2] += delta
        assert label_smoothing_cross_entropy(other, torch.tensor([2]), eps, conv) > loss


def test_optimal_gap_formulas():
    assert optimal_logit_gap(0.1, 10, "others") == pytest.approx(math.log(0.9 * 9 / 0.1))
    assert optimal_logit_gap(0.1, 10, "uniform") == pytest.approx(math.log((0.9 + 0.01) / 0.01))
    assert optimal_logit_gap(0.0, 10) == math.inf and smoothed_target_entropy(0.0, 10) == 0.0


# ------------------------------------------------------------------- penalties
def test_penalties():
    a, b = torch.tensor([1.0, -2.0]), torch.tensor([[3.0]])
    assert l1_penalty([a, b]).item() == 6.0
    assert l2_penalty([a, b]).item() == 14.0
    assert l2_penalty(a).item() == 5.0
    w = torch.tensor([0.5, -1.5], requires_grad=True)
    l1_penalty([w]).backward()
    torch.testing.assert_close(w.grad, torch.tensor([1.0, -1.0]))


# ------------------------------------------------------------------ calibration
def test_ece_perfect_and_overconfident():
    conf = torch.tensor([0.95] * 100)
    correct = torch.tensor([True] * 95 + [False] * 5)
    assert expected_calibration_error(conf, correct) == pytest.approx(0.0, abs=1e-6)
    wrong = torch.tensor([True] * 60 + [False] * 40)
    assert expected_calibration_error(conf, wrong) == pytest.approx(0.35, abs=1e-6)
    bins = calibration_bins(conf, wrong, 10)
    assert bins["count"].sum() == 100 and bins["count"][9] == 100
    assert math.isnan(bins["accuracy"][0].item())


# ----------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: dropout(torch.ones(3), 1.0), ValueError, r"p must be in \[0, 1\), got 1.0"),
        (lambda: dropout(torch.ones(3), -0.1), ValueError, r"p must be in \[0, 1\), got -0.1"),
        (lambda: smooth_labels(torch.tensor([0]), 3, 1.5), ValueError, r"eps must be in \[0, 1\), got 1.5"),
        (lambda: smooth_labels(torch.tensor([0]), 3, 0.1, "paper"), ValueError, r"convention must be one of \('uniform', 'others'\), got 'paper'"),
        (lambda: smooth_labels(torch.tensor([3]), 3, 0.1), ValueError, r"target values must be in \[0, num_classes=3\), got 3"),
        (lambda: smooth_labels(torch.tensor([0]), 1, 0.1), ValueError, r"num_classes must be an int >= 2, got 1"),
        (lambda: smooth_labels(torch.tensor([0.0]), 3, 0.1), TypeError, r"target must be an integer tensor"),
        (lambda: smooth_labels(torch.tensor([0]), 3, 0.1, dtype=torch.int64), TypeError, r"dtype must be a floating torch.dtype"),
        (lambda: label_smoothing_cross_entropy(torch.randn(2, 3), torch.tensor([0, 5]), 0.1), ValueError,
         r"target values must be in \[0, num_classes=3\), got 5"),
        (lambda: label_smoothing_cross_entropy(torch.randn(2, 3), torch.tensor([0, 1]), 0.1, reduction="avg"), ValueError, r"reduction must be one of"),
        (lambda: label_smoothing_cross_entropy(torch.randn(2, 3), torch.tensor([0, 1, 2]), 0.1), ValueError, r"target must have shape \(2,\)"),
        (lambda: label_smoothing_cross_entropy(torch.randn(2, 3), torch.tensor([0, 1]), -0.1), ValueError, r"eps must be in \[0, 1\), got -0.1"),
        (lambda: l1_penalty([]), ValueError, "parameters must contain at least one tensor"),
        (lambda: expected_calibration_error(torch.tensor([1.2]), torch.tensor([True])), ValueError, r"confidence must be in \[0, 1\]"),
        (lambda: calibration_bins(torch.tensor([0.5]), torch.tensor([True, False])), ValueError, "same number of elements"),
        (lambda: calibration_bins(torch.tensor([0.5]), torch.tensor([True]), 0), ValueError, "n_bins must be an int >= 1, got 0"),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
