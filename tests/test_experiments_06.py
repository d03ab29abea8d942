"""The committed results of ``experiments/06_positional_sweeps.py`` (loaded by notebook 06)
are reproducible: two seeds of part of the sweep, re-run here on this CPU, fall inside the
committed 8-seed spread (with a margin: float32 training differs slightly across CPU
kernels), and the file records what produced it."""
from __future__ import annotations

import functools

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


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
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


def test_added_parts_are_complete(exp, results):
    assert results["alias"]["seeds"] == exp.SEEDS and results["nope_probe"]["seeds"] == exp.NOPE_SEEDS
    for rec in results["alias"]["runs"]:
        assert {f"offset {c}: {g}" for c in exp.ALIAS_SHIFTS for g in ("all", "fast", "slow")} <= set(rec)
    for part in ("alias", "nope_probe"):
        assert {"torch", "cpu_capability", "machine"} <= set(results[part]["meta"])


def test_partial_shift_of_all_pairs_equals_the_offset_argument(exp):
    helpers.seed_everything(0)
    model, _ = exp.train_scheme("lookback", "sinusoidal", 0)
    val = exp.val_data("lookback", exp.L)
    from helpers import evaluate

    assert exp.partial_shift_accuracy(model, val, 10, range(16)) == evaluate(model, val, offset=10)[1]
    assert exp.partial_shift_accuracy(model, val, 10, []) == evaluate(model, val)[1]


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
@pytest.mark.parametrize("seed", [0, 5])
def test_alias_two_seeds_fall_inside_the_committed_spread(exp, results, seed):
    helpers.seed_everything(seed)
    fresh = exp.alias_run(seed)
    for key, rec in fresh.items():
        vals = np.array([r[key] for r in results["alias"]["runs"]])
        assert vals.min() - 0.05 <= rec <= vals.max() + 0.05, (key, rec, vals)


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_nope_probe_two_seeds_fall_inside_the_committed_spread(exp, results):
    res = helpers.sweep(functools.partial(exp.nope_probe_run, configs=("2 layers + start token",)), [0, 1])
    committed = results["nope_probe"]["runs"]
    for seed in (0, 1):
        rec = res.runs[seed]
        for key in [k for k, v in rec.items() if isinstance(v, float)]:
            vals = np.array([r[key] for r in committed])
            margin = 0.1 if "r2" in key or "corr" in key else 0.05
            assert vals.min() - margin <= rec[key] <= vals.max() + margin, (seed, key, rec[key], vals)


def test_t5_part_is_complete_and_the_other_arms_were_not_re_run(exp, results):
    assert results["t5"]["seeds"] == exp.SEEDS and {"torch", "cpu_capability", "machine"} <= set(results["t5"]["meta"])
    assert results["config"]["t5_schemes"] == {k: list(v) for k, v in exp.T5_SCHEMES.items()}
    for rec in results["t5"]["runs"]:
        for name in exp.TASK_NAMES:
            for s in exp.T5_SCHEMES:
                grid = rec[f"{name}/{s}/grid"]
                assert len(grid) == len(exp.LENGTHS) and all(len(r) == len(exp.OFFSETS) for r in grid)
                assert len(rec[f"{name}/{s}/bypos"]) == 4 * exp.L
        assert not any(k.split("/")[1] in exp.SCHEMES for k in rec)  # only the new arms are in this part


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
@pytest.mark.parametrize("seed", [3])
def test_t5_one_seed_falls_inside_the_committed_spread(exp, results, seed):
    helpers.seed_everything(seed)
    fresh = exp.t5_run(seed, schemes=("t5",), tasks=("lookback",))
    committed = results["t5"]["runs"]
    vals = np.array([r["lookback/t5/acc"] for r in committed])
    assert vals.min() - 0.03 <= fresh["lookback/t5/acc"] <= vals.max() + 0.03
    vals = np.array([r["lookback/t5/grid"] for r in committed])  # (seeds, lengths, offsets)
    got = np.array(fresh["lookback/t5/grid"])
    assert np.all(got >= vals.min(0) - 0.05) and np.all(got <= vals.max(0) + 0.05)
