"""Notebook 03 §6b's 8-seed sweep: the committed file, the script's ``recall_run`` and a re-run.

``experiments/03_recall_plateau.py`` writes ``experiments/results/03_recall_plateau.json``; notebook 03
§6b trains seeds 0 and 1 live and reads the 8-seed table, figure and asserts from that file. The fast
tests check that the file is what the script's ``recall_run`` returns, and that ``recall_run`` trains
the setting the notebook's text describes (§6's task, model and training, up to 500 steps, stopping at
0.99). The slow test re-trains two other seeds and checks each against its own committed record.
"""
from __future__ import annotations

import ast
import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

NB03 = Path(__file__).resolve().parents[1] / "notebooks" / "03_mha_from_scratch.ipynb"


@pytest.fixture(scope="module")
def exp(experiment_script):
    return experiment_script("03_recall_plateau")


@pytest.fixture(scope="module")
def data(exp):
    return json.loads(exp.RESULTS.read_text())


def _cells(kind):
    nb = json.loads(pristine(NB03).read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def _literal_kwargs(tree, func_name):
    """{keyword: literal} of the calls to ``func_name`` in ``tree`` (non-literal keywords left out)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == func_name:
            kw = {}
            for k in node.keywords:
                try:
                    kw[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    pass
            out.append(kw)
    return out


def test_committed_file_is_what_recall_run_returns(exp, data):
    s = exp.SETTINGS
    assert data["seeds"] == exp.SEEDS == list(range(8)) and data["settings"] == s
    assert data["script"] == "experiments/03_recall_plateau.py" and data["seconds"] > 0
    assert {"torch", "cpu_capability", "python", "platform", "processor"} <= set(data["machine"])
    assert len(data["runs"]) == len(exp.SEEDS)
    sw = exp.load_sweep()
    assert sw.seeds == tuple(exp.SEEDS)
    for seed, r in zip(sw.seeds, sw.runs):
        assert set(r) == set(exp.KEYS), seed
        curve, by_query = np.array(r["curve"]), np.array(r["curve_by_query"])
        # one evaluation every 25 steps, until the first at >= 0.99 or the 500-step budget
        assert by_query.shape == (len(curve), exp.TASK.num_queries), seed
        np.testing.assert_allclose(by_query.mean(1), curve, atol=1e-6)   # the 4 queries' mean is the accuracy
        hit = np.flatnonzero(curve >= s["stop_at_acc"])
        if len(hit):
            assert hit[0] == len(curve) - 1 and r["steps_to_99"] == s["eval_every"] * len(curve), seed
        else:
            assert math.isinf(r["steps_to_99"]) and len(curve) == s["max_steps"] // s["eval_every"], seed
        assert r["acc_at_50"] == curve[1] and r["final_acc"] == curve[-1]
        for key in ("prev_end", "match_end", "plateau_match_max"):
            assert 0 <= r[key] <= 1, (seed, key)
    # what notebook 03 §6b says of the committed run: 6 of 8 reach 0.99, between steps 125 and 450
    t99 = sw.values("steps_to_99")
    assert np.isfinite(t99).sum() == 6 and t99[np.isfinite(t99)].min() == 125 and t99[np.isfinite(t99)].max() == 450


def test_json_keeps_inf_and_nan(exp):
    rec = {"a": math.inf, "b": [1.0, math.nan], "c": {"d": 0.5}}
    back = exp._from_json(json.loads(json.dumps(exp._to_json(rec), allow_nan=False)))
    assert back["a"] == math.inf and back["b"][0] == 1.0 and math.isnan(back["b"][1]) and back["c"] == {"d": 0.5}


def test_recall_run_trains_section_6s_setting(exp):
    """recall_run is the run the notebook describes: §6's task, model and training, up to 500 steps, stop at 0.99."""
    s = exp.SETTINGS
    script = ast.parse(inspect.getsource(exp))
    code = _cells("code")
    sec6 = ast.parse(next(c for c in code if c.startswith("task = AssociativeRecallTask(")))
    train6 = ast.parse(next(c for c in code if c.startswith("model = TinyTransformer(")))
    # the task
    (task_nb,), (task_script,) = _literal_kwargs(sec6, "AssociativeRecallTask"), _literal_kwargs(script, "AssociativeRecallTask")
    assert task_nb == task_script and repr(exp.TASK) == s["task"]
    (split_nb,) = _literal_kwargs(sec6, "split")
    split_script = [kw for kw in _literal_kwargs(script, "split") if "n_train" in kw]
    assert split_script == [{"n_train": s["n_train"], "n_val": s["n_val"]}]
    assert {k: split_nb[k] for k in ("n_train", "n_val")} == split_script[0]
    # the model and the training
    model_keys, train_keys = ("d_model", "num_heads", "num_layers", "pos"), ("batch_size", "lr", "eval_every")
    (model_nb,), (model_script,) = _literal_kwargs(train6, "TinyTransformer"), _literal_kwargs(script, "TinyTransformer")
    (fit_nb,), (fit_script,) = _literal_kwargs(train6, "train"), _literal_kwargs(script, "train")
    for k in model_keys:
        assert model_nb[k] == model_script[k] == s[k], k
    for k in train_keys:
        assert fit_nb[k] == fit_script[k] == s[k], k
    assert fit_script["stop_at_acc"] == s["stop_at_acc"] == 0.99 and "stop_at_acc" not in fit_nb
    assert inspect.signature(exp.recall_run).parameters["max_steps"].default == s["max_steps"] == 500
    # the notebook's text and its cell: the same budget and threshold, the script's function and its file
    prose = next(c for c in _cells("markdown") if c.startswith("### 6b."))
    assert "up to 500 steps" in prose and "validation accuracy ≥ 0.99" in prose and "03_recall_plateau.py" in prose
    cell = next(c for c in code if "recall_plateau.recall_run" in c)
    assert "03_recall_plateau.py" in cell and "recall_plateau.load_sweep()" in cell


SHARE = 0.25   # as in the other slow re-runs: a re-run number may move a quarter of the committed across-seed range


def _band(values, floor: float) -> float:
    """The half-width a re-run number may move from its seed's committed value: max(floor, SHARE * range)."""
    return max(floor, SHARE * (max(values) - min(values)))


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_two_seeds_rerun_reproduce_their_own_committed_records(exp):
    """Seed 4 (accuracy 0.44 at the 500-step budget) and seed 6 (0.99 at step 250) keep their verdicts and records.

    Moves measured on this sweep, all 8 seeds, between the committed run (AVX-512) and re-runs with AVX2
    kernels, with no SIMD (``ATEN_CPU_CAPABILITY=default``) and under perturbed arithmetic
    (``tests/perturbed_arithmetic/perturb.py``): steps to 0.99 at most 25 (one evaluation: seed 1, AVX2),
    final accuracy at most 0.008 (seed 7, AVX2), step-50 accuracy at most 0.0005, the layer-0 previous-key
    score at most 0.056 and the layer-1 matching score at most 0.020 (both seed 1, AVX2). Floors: about
    twice those moves. A seed whose verdict sits within its floor of the threshold would be fragile: both
    seeds here are far from it (checked first).
    """
    from helpers.lab import sweep

    s = exp.SETTINGS
    sw = exp.load_sweep()
    floors = {"steps_to_99": 50, "final_acc": 0.02, "acc_at_50": 0.02, "prev_end": 0.12, "match_end": 0.04}
    seeds = [4, 6]
    committed = {seed: sw.runs[sw.seeds.index(seed)] for seed in seeds}
    for seed, c in committed.items():          # the verdict "reached 0.99 within 500 steps" is not borderline
        if math.isfinite(c["steps_to_99"]):
            assert s["max_steps"] - c["steps_to_99"] > floors["steps_to_99"], f"seed {seed}: near the budget"
        else:
            assert s["stop_at_acc"] - max(c["curve"]) > floors["final_acc"], f"seed {seed}: near 0.99"
    fresh = dict(zip(seeds, sweep(exp.recall_run, seeds).runs))
    for seed, c in committed.items():
        f = fresh[seed]
        assert math.isfinite(f["steps_to_99"]) == math.isfinite(c["steps_to_99"]), (
            f"seed {seed}: re-run steps to 0.99 {f['steps_to_99']}, committed {c['steps_to_99']}")
        for key, floor in floors.items():
            if key == "steps_to_99" and math.isinf(c["steps_to_99"]):
                continue                       # censored at the budget, as committed (checked above)
            values = [v for v in sw.values(key) if math.isfinite(v)]
            b = _band(values, floor)
            assert abs(f[key] - c[key]) <= b, (f"seed {seed} {key}: re-run {f[key]:.4f}, committed {c[key]:.4f}, "
                                               f"band {b:.4f} (floor {floor}, {SHARE} x range {min(values):.4f}-"
                                               f"{max(values):.4f})")
