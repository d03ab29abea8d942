"""helpers.lab.sweep: seeds run in workers give exactly what they give in this process; errors name the seed."""
from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest
import torch

from helpers.lab.stats import Censored, PairedComparison, paired
from helpers.lab.sweep import SweepError, SweepResult, first_step_reaching, sweep


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
    def seed_all():
        torch.manual_seed(123)
        random.seed(5)
        np.random.seed(9)

    seed_all()
    before = (torch.rand(1).item(), random.random(), np.random.rand())
    seed_all()
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
    assert res.count("acc", lambda a: a > 0.8) == 2
    assert res.k_of_n("acc", lambda a: a > 0.8) == "2 of 4 seeds"
    assert res.by_seed("acc") == {0: 0.4, 1: 1.0, 2: 0.9, 3: 0.7}
    assert res.describe("acc") == "0.75 ± 0.26 (min 0.40, max 1.00, 4 seeds)"
    # a run that did not reach it (inf) is censored: no mean over the others, the Kaplan-Meier median instead
    assert res.describe("step", ".0f") == ("3 of 4 seeds reached it; Kaplan-Meier median 150 (fastest 100); "
                                           "censored, not reached within the run: seed 2")
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


def _steps_sweep(steps):
    return SweepResult(seeds=tuple(range(len(steps))), runs=[{"steps": s} for s in steps])


def test_describe_uncensored_output_is_unchanged():
    # the notebooks compare printed output digit for digit: the finite case must not move
    res = _steps_sweep([125.0, 450.0, 200.0, 210.0])
    assert res.describe("steps", ".0f") == "246 ± 141 (min 125, max 450, 4 seeds)"
    assert SweepResult(seeds=(5,), runs=[{"value": 2.0}]).describe() == "2.00 ± 0.00 (min 2.00, max 2.00, 1 seeds)"


def test_describe_reports_censored_runs_and_never_their_mean():
    res = _steps_sweep([290, math.inf, 125, 450, 300, 200, 240, math.inf])
    text = res.describe("steps", ".0f")
    # KM median with 2 censored after every event: S drops by 1/8 at 125, 200, 240, 290 -> 1/2 at 290
    assert text == ("6 of 8 seeds reached it; Kaplan-Meier median 290 (fastest 125); "
                    "censored, not reached within the run: seeds 1, 7")
    assert "±" not in text
    assert res.describe("steps", ".0f", budget=500) == (
        "6 of 8 seeds reached it by step 500; Kaplan-Meier median 290 (fastest 125); censored at 500: seeds 1, 7")
    few = _steps_sweep([100, math.inf, math.inf, math.inf])
    assert few.describe("steps", ".0f") == ("1 of 4 seeds reached it; Kaplan-Meier median not reached (fewer "
                                            "than half reached it) (fastest 100); censored, not reached within "
                                            "the run: seeds 1, 2, 3")
    assert "Kaplan-Meier median > 500 (fastest 100)" in few.describe("steps", ".0f", budget=500)
    none = _steps_sweep([math.inf] * 8)
    assert none.describe("steps", ".0f") == "0 of 8 seeds reached it (all censored)"
    assert none.describe("steps", ".0f", budget=400) == "0 of 8 seeds reached it by step 400 (all censored)"


@pytest.mark.parametrize("missing", [math.nan, None, math.inf])
def test_describe_counts_none_nan_and_inf_as_not_reached(missing):
    # the experiment scripts store a run that never reached the threshold as None (06) or "inf" (05)
    res = _steps_sweep([40.0, 60.0, missing, 50.0])
    assert res.describe("steps", ".0f") == ("3 of 4 seeds reached it; Kaplan-Meier median 50 (fastest 40); "
                                            "censored, not reached within the run: seed 2")


def test_describe_refuses_minus_inf():
    with pytest.raises(ValueError, match=r"describe\('steps'\): seeds \[1\] hold -inf; a value must be a number, "
                                         r"or inf / NaN / None"):
        _steps_sweep([1.0, -math.inf, 3.0]).describe("steps")


def test_describe_with_a_budget_checks_the_steps():
    with pytest.raises(ValueError, match=r"values must be <= budget \(300\) .* got \[\(1, 450\.0\)\]"):
        _steps_sweep([290, 450]).describe("steps", ".0f", budget=300)


def test_k_of_n_with_an_interval():
    res = _steps_sweep([100, 200, 300, math.inf])
    assert res.k_of_n("steps", math.isfinite) == "3 of 4 seeds"
    assert res.k_of_n("steps", math.isfinite, ci=True) == "3 of 4 seeds (75%; 95% CI 19% to 99%, Clopper-Pearson)"
    with pytest.raises(TypeError, match="ci must be a bool, got str"):
        res.k_of_n("steps", math.isfinite, ci="yes")


def test_time_to_threshold_method():
    res = SweepResult(seeds=(3, 7, 9), runs=[{"s": 50.0}, {"s": math.inf}, {"s": 80.0}])
    c = res.time_to_threshold("s", 100, threshold=0.95)
    assert isinstance(c, Censored) and c.censored_seeds == (7,) and c.median == 80.0
    assert c.line() == ("2 of 3 seeds reached 0.95 by step 100 (95% CI 9% to 99%); Kaplan-Meier median 80 "
                        "steps (censored: seed 7)")


def test_paired_with_matches_seeds_not_positions():
    a = SweepResult(seeds=(0, 1, 2, 3), runs=[{"acc": v} for v in [0.9, 0.8, 1.0, 0.7]])
    b = SweepResult(seeds=(3, 2, 1, 0), runs=[{"acc": v} for v in [0.6, 0.5, 0.7, 0.4]])
    c = a.paired_with(b, "acc", name="dropout", other_name="none")
    assert isinstance(c, PairedComparison)
    np.testing.assert_allclose(c.diffs, [0.5, 0.1, 0.5, 0.1])            # seed 0: 0.9 - 0.4, ...
    assert c.line() == paired([0.9, 0.8, 1.0, 0.7], [0.4, 0.7, 0.5, 0.6], (0, 1, 2, 3), a_name="dropout",
                              b_name="none").line()
    both = SweepResult(seeds=(0, 1), runs=[{"GQA": 1.0, "MQA": 0.5}, {"GQA": 0.9, "MQA": 0.7}])
    assert both.paired_with(both, "GQA", "MQA").label == "GQA - MQA"
    assert a.paired_with(b, "acc").label == "this - other"
    with pytest.raises(ValueError, match=r"other must hold the same seeds .* this sweep has \[0, 1, 2, 3\], "
                                         r"other has \[0, 1\]"):
        a.paired_with(both, "acc")
    with pytest.raises(TypeError, match="other must be a SweepResult, got dict"):
        a.paired_with({}, "acc")


def test_paired_and_censored_figures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.viz.sweep import plot_paired, plot_time_to_threshold

    c = paired([0.9, 0.8, 1.0, 0.7, 0.6], [0.6, 0.5, 0.7, 0.8, 0.6], [10, 11, 12, 13, 14], a_name="dropout",
               b_name="none")
    fig, (a1, a2) = plt.subplots(2, 1)
    plot_paired(c, a1, unit="accuracy")
    dots = [col for col in a1.collections if len(col.get_offsets()) == 5]
    assert len(dots) == 1
    np.testing.assert_allclose(dots[0].get_offsets()[:, 1], c.diffs)        # one dot per seed at its difference
    assert [t.get_text() for t in a1.texts] == [f"seed {s}" for s in c.seeds]
    assert any(list(line.get_ydata()) == [0.0, 0.0] for line in a1.lines)     # the zero line
    assert a1.get_ylabel().startswith("dropout - none (accuracy)") and a1.get_xlabel() == "seed"
    assert a1.get_title() and a1.get_legend() is not None

    arms = {"1 head": time_to_threshold_for([100, math.inf, 300, math.inf, math.inf], 500),
            "4 heads": time_to_threshold_for([90, 120, 140, 200], 500)}
    plot_time_to_threshold(arms, a2)
    tri = [col for col in a2.collections if col.get_label().startswith("censored")]
    assert len(tri) == 1
    np.testing.assert_allclose(tri[0].get_offsets()[:, 0], [500, 500, 500])  # censored drawn at the budget
    assert np.all(tri[0].get_facecolors()[:, 3] == 0)                          # open markers
    assert "step" in a2.get_xlabel() and a2.get_title() and a2.get_legend() is not None
    labels = [t.get_text() for t in a2.get_yticklabels()]
    assert labels[0].endswith("2 of 5; median > 500 steps") and labels[1].endswith("4 of 4; median 120 steps")
    with pytest.raises(TypeError, match="comparison must be a PairedComparison .* got dict"):
        plot_paired({}, a1)
    with pytest.raises(ValueError, match="arms must be a non-empty mapping"):
        plot_time_to_threshold({}, a2)
    with pytest.raises(TypeError, match=r"arms\['x'\] must be a Censored .* got list"):
        plot_time_to_threshold({"x": [1, 2]}, a2)
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes or None, got str"):
        plot_paired(c, "ax")
    plt.close(fig)
    ax = plot_paired(c)                                                        # makes its own figure
    plt.close(ax.figure)


def time_to_threshold_for(values, budget):
    from helpers.lab.stats import time_to_threshold
    return time_to_threshold(values, budget)


# --------------------------------------------------------------------------------------------------
# Progress (issue 23): a line a learner sees while the seeds run, and nothing nbval would compare.

import importlib  # noqa: E402

sweep_module = importlib.import_module("helpers.lab.sweep")  # the module: `helpers.lab.sweep` is also the function


def _quick(seed):
    return float(seed)


@pytest.mark.parametrize("bad", [1, 0, "yes", 1.0])
def test_progress_must_be_a_bool_or_none(bad):
    with pytest.raises(TypeError, match=r"progress must be True, False or None .*got " + repr(bad).replace(".", r"\.")):
        sweep(_quick, [0], workers=1, progress=bad)


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_outside_a_kernel(capsys, workers):
    sweep(_quick, [0, 1, 2], workers=workers)                      # default: silent outside a kernel
    sweep(_quick, [0, 1, 2], workers=workers, progress=False)
    assert capsys.readouterr() == ("", "")
    res = sweep(_quick, [0, 1, 2], workers=workers, progress=True)  # asked for: one line per seed on stderr
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 3, err
    assert [line.split(" seeds finished")[0] for line in lines] == [f"sweep: {k} of 3" for k in (1, 2, 3)]
    assert sorted(int(s) for s in lines[-1].split("(seeds ")[1].split(")")[0].split(", ")) == [0, 1, 2]
    assert res.values().tolist() == [0.0, 1.0, 2.0]                # results still in the order of the seeds


def test_progress_in_a_kernel_starts_and_ends_with_what_nbval_never_compares(monkeypatch):
    shown = []
    monkeypatch.setattr(sweep_module, "_in_jupyter_kernel", lambda: True)
    monkeypatch.setattr(sweep_module, "_display",
                        lambda bundle, display_id=None, update=False: shown.append((update, bundle)) or "handle-1")
    sweep(_quick, [4, 5], workers=1)
    updates = [b for u, b in shown]
    assert [u for u, _ in shown] == [False, True, True, True, True]   # one display, then updates in place
    assert set(updates[0]) <= sweep_module.NBVAL_UNCOMPARED and updates[-1] == updates[0]
    texts = [b["text/plain"] for b in updates[1:-1]]
    assert [t.split(",")[0] for t in texts] == ["sweep: 0 of 2 seeds finished", "sweep: 1 of 2 seeds finished (seed 4)",
                                                "sweep: 2 of 2 seeds finished (seeds 4"]
    assert '<progress value="2" max="2"' in updates[-2]["text/html"]
    shown.clear()
    with pytest.raises(SweepError):                                     # an error still removes the line
        sweep(_fails_on_two, [2], workers=1)
    assert shown[-1][1] == shown[0][1]
    shown.clear()
    sweep(_quick, [0], workers=1, progress=False)
    assert shown == []


def test_the_progress_png_is_one_transparent_pixel():
    import base64
    import io

    from PIL import Image
    img = Image.open(io.BytesIO(base64.b64decode(sweep_module._BLANK_PNG)))
    assert img.size == (1, 1) and img.convert("RGBA").getpixel((0, 0))[3] == 0


def test_in_jupyter_kernel_is_false_here():
    assert sweep_module._in_jupyter_kernel() is False


def test_a_notebook_passes_nbval_with_and_without_the_progress_output(tmp_path):
    """End to end, in real kernels: execute two sweep cells with nbclient (as `jupyter nbconvert --execute`
    does), check that what it stored of each progress line is the blank PNG (no count, no time), remove
    the second cell's progress output (a cell committed before sweeps showed progress), and run nbval
    (strict) on the notebook: both cells pass."""
    import subprocess
    import sys
    from pathlib import Path

    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("nbval")
    root = Path(__file__).resolve().parents[1]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from helpers.lab.sweep import sweep\n"
                                          "res = sweep(lambda s: s * 2.0, [0, 1, 2], workers=1)\n"
                                          "print(res.values().tolist())"),
                nbformat.v4.new_code_cell("print(sweep(lambda s: s + 0.5, [3, 4], workers=2).values().tolist())")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(root)}}).execute()
    for cell, printed in zip(nb.cells, ["[0.0, 2.0, 4.0]\n", "[3.5, 4.5]\n"]):
        displays = [o for o in cell.outputs if o.output_type == "display_data"]
        assert len(displays) == 1 and dict(displays[0].data) == {"image/png": sweep_module._BLANK_PNG}, cell.outputs
        assert [o.text for o in cell.outputs if o.output_type == "stream"] == [printed]
    nb.cells[1].outputs = [o for o in nb.cells[1].outputs if o.output_type != "display_data"]
    path = tmp_path / "sweeps.ipynb"
    nbformat.write(nb, path)
    # nbval is the one plugin this run needs; the other installed ones (about 1 s of its start) are not loaded
    env = dict(os.environ, PYTHONPATH=str(root), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "nbval", "--nbval", "--nbval-current-env",
                           "-p", "no:cacheprovider", "-o", "addopts=", "-q", str(path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
