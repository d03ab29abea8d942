"""The committed results of ``experiments/06_positional_sweeps.py`` (loaded by notebook 06)
are reproducible: two seeds of part of the sweep, re-run here on this CPU, fall inside the
committed 8-seed spread (with a margin: float32 training differs slightly across CPU
kernels), and the file records what produced it."""
from __future__ import annotations

import json

import numpy as np
import pytest

import helpers

@pytest.fixture(scope="module")
def exp(experiment_script):
    return experiment_script("06_positional_sweeps")


@pytest.fixture(scope="module")
def results(exp):
    return json.loads(exp.RESULTS.read_text())


def test_results_file_is_complete(exp, results):
    assert set(results) >= {"schemes", "stretch", "nope", "config"}
    assert results["config"]["schemes"] == exp.SCHEMES and results["config"]["offsets"] == exp.OFFSETS
    assert results["schemes"]["seeds"] == exp.SEEDS and len(exp.SEEDS) >= 8
    assert results["stretch"]["seeds"] == exp.SEEDS
    assert len(results["nope"]["seeds"]) >= 5
    for part in ("schemes", "stretch", "nope"):
        meta = results[part]["meta"]
        assert {"torch", "cpu_capability", "machine"} <= set(meta)
    run = results["schemes"]["runs"][0]
    for name in exp.TASK_NAMES:
        for s in exp.SCHEMES:
            grid = run[f"{name}/{s}/grid"]
            assert len(grid) == len(exp.LENGTHS) and all(len(r) == len(exp.OFFSETS) for r in grid)
            assert len(run[f"{name}/{s}/bypos"]) == 4 * exp.L


@pytest.mark.parametrize("seed", [0, 5])
def test_two_seeds_fall_inside_the_committed_spread(exp, results, seed):
    helpers.seed_everything(seed)
    fresh = exp.schemes_run(seed, schemes=["learned-0.01", "rope"], tasks=["recall"])
    committed = results["schemes"]["runs"]
    for key in ["recall/learned-0.01/acc", "recall/rope/acc"]:
        vals = np.array([r[key] for r in committed])
        assert vals.min() - 0.03 <= fresh[key] <= vals.max() + 0.03, (key, fresh[key], vals)
    for key in ["recall/learned-0.01/grid", "recall/rope/grid"]:
        vals = np.array([r[key] for r in committed])  # (seeds, lengths, offsets)
        got = np.array(fresh[key])
        assert np.all(got >= vals.min(0) - 0.05) and np.all(got <= vals.max(0) + 0.05), key
