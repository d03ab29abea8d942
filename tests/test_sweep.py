"""helpers.sweep: seeds run in workers give exactly what they give in this process; errors name the seed."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from helpers.sweep import SweepError, SweepResult, first_step_reaching, sweep


def _noisy_training(seed):
    # a tiny deterministic "training": uses the global torch RNG that sweep seeds, and a matmul
    w = torch.randn(8, 8)
    x = torch.randn(32, 8)
    for _ in range(5):
        w = w - 0.01 * (x.T @ (x @ w))
    print(f"seed {seed} done")
    return {"loss": float((x @ w).pow(2).mean()), "curve": [float(w.sum()), float(w.abs().sum())], "seed_echo": seed}


def test_parallel_equals_serial_bit_for_bit():
    par = sweep(_noisy_training, [3, 0, 7], workers=2)
    ser = sweep(_noisy_training, [3, 0, 7], workers=1)
    assert par.seeds == ser.seeds == (3, 0, 7)
    assert par.runs == ser.runs
    assert [r["seed_echo"] for r in par.runs] == [3, 0, 7]          # results in the order of the seeds


def test_a_seeds_result_does_not_depend_on_the_others():
    alone = sweep(_noisy_training, [7], workers=1)
    together = sweep(_noisy_training, [1, 7, 2], workers=2)
    assert alone.runs[0] == together.runs[1]


def test_prints_are_captured_not_shown(capsys):
    res = sweep(_noisy_training, [0, 1], workers=1)
    assert capsys.readouterr().out == ""
    assert res.logs == ["seed 0 done\n", "seed 1 done\n"]


def test_callers_random_state_is_restored_in_process():
    torch.manual_seed(123); random.seed(5); np.random.seed(9)
    before = (torch.rand(1).item(), random.random(), np.random.rand())
    torch.manual_seed(123); random.seed(5); np.random.seed(9)
    sweep(_noisy_training, [0, 1], workers=1)
    assert (torch.rand(1).item(), random.random(), np.random.rand()) == before


def _fails_on_two(seed):
    if seed == 2:
        raise ZeroDivisionError("boom")
    return seed * 1.0


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_a_worker_names_its_seed(workers):
    with pytest.raises(SweepError, match=r"seed 2: ZeroDivisionError: boom") as info:
        sweep(_fails_on_two, [0, 1, 2, 3], workers=workers)
    assert info.value.seed == 2
    assert "_fails_on_two" in info.value.worker_traceback


def test_bad_arguments_name_the_rule():
    with pytest.raises(ValueError, match="at least one seed"):
        sweep(_fails_on_two, [])
    with pytest.raises(ValueError, match="non-negative ints"):
        sweep(_fails_on_two, [0, -1])
    with pytest.raises(ValueError, match="distinct"):
        sweep(_fails_on_two, [1, 1])
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        sweep(_fails_on_two, [0], workers=0)
    with pytest.raises(TypeError, match="fn must be callable"):
        sweep(3, [0])
    with pytest.raises(SweepError, match="must return a number or a dict"):
        sweep(lambda s: "text", [0], workers=1)


def test_summaries():
    res = SweepResult(seeds=(0, 1, 2, 3), runs=[{"acc": a, "step": s} for a, s in
                                               [(0.4, 100.0), (1.0, 250.0), (0.9, math.inf), (0.7, 150.0)]])
    assert res.mean("acc") == pytest.approx(0.75)
    assert res.std("acc") == pytest.approx(np.std([0.4, 1.0, 0.9, 0.7], ddof=1))
    assert res.count("acc", lambda a: a > 0.8) == 2
    assert res.k_of_n("acc", lambda a: a > 0.8) == "2 of 4 seeds"
    assert res.by_seed("acc") == {0: 0.4, 1: 1.0, 2: 0.9, 3: 0.7}
    assert res.describe("acc") == "0.75 ± 0.26 (min 0.40, max 1.00, 4 seeds)"
    assert res.describe("step", ".0f").endswith("; 1 of 4 seeds never reached it")
    assert res.table(["acc"]).splitlines()[1].split() == ["0", "0.400"]
    with pytest.raises(KeyError, match="missing"):
        res.values("loss")


def test_curves_and_first_step_reaching():
    res = sweep(_noisy_training, [0, 1], workers=1)
    assert res.curves("curve").shape == (2, 2)
    with pytest.raises(TypeError, match="sequences"):
        res.values("curve")
    hist = [(25, 1.2, 0.3), (50, 0.9, 0.6), (75, 0.1, 0.99)]
    assert first_step_reaching(hist, 0.5) == 50
    assert first_step_reaching(hist, 0.999) == math.inf
    assert first_step_reaching(hist, 1.0, index=1) == 25


def test_sweep_figures_draw_every_seed():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from helpers.viz import plot_sweep_curves, plot_sweep_points

    fig, (a1, a2) = plt.subplots(1, 2)
    plot_sweep_points(a1, {"none": [0.3, 0.4, 1.0], "dropout": [1.0, 0.35, 1.0]}, ylabel="val acc",
                      hlines={"chance": 0.34})
    assert sum(len(c.get_offsets()) for c in a1.collections if hasattr(c, "get_offsets")) >= 6
    assert [t.get_text() for t in a1.get_xticklabels()] == ["none", "dropout"]
    res = SweepResult(seeds=(0, 1), runs=[{"c": [0.1, 0.5, 1.0]}, {"c": [0.2, 0.3, 0.9]}])
    plot_sweep_curves(a2, res, "c", [25, 50, 75], label="acc")
    assert len(a2.lines) == 3                                     # two seeds and the mean
    np.testing.assert_allclose(a2.lines[-1].get_ydata(), [0.15, 0.4, 0.95])
    with pytest.raises(ValueError, match="steps has 2 values"):
        plot_sweep_curves(a2, res, "c", [1, 2], label="x")
    with pytest.raises(ValueError, match="at least one arm"):
        plot_sweep_points(a1, {}, ylabel="y")
    plt.close(fig)
