"""The committed sweeps under experiments/ still describe what the code computes.

A trained model's last digits differ between CPUs, so a re-run is not compared digit for digit. Two seeds
are re-run here (the slow tier) and checked seed by seed (``tests/_rerun.py``): each reaches the verdicts
the notebook draws for that seed from its committed record, and each number lands within a band of that
seed's own committed value.
"""
from __future__ import annotations

import json

import pytest
from _rerun import check_near, check_verdict, floor_of, rerun


@pytest.fixture(scope="module")
def ablation(experiment_script):
    return experiment_script("regularization_ablation")


def test_ablation_results_file_matches_the_script(ablation):
    data = json.loads(ablation.RESULTS.read_text())
    assert data["seeds"] == ablation.SEEDS and data["settings"] == ablation.SETTINGS
    assert list(data["runs"]) == list(ablation.ARMS)
    n_curve = len(data["curve_steps"])
    for arm, runs in data["runs"].items():
        assert len(runs) == len(ablation.SEEDS), arm
        for r in runs:
            assert 0 <= r["val_acc"] <= 1 and len(r["curve"]) == n_curve
            assert {"train_ce", "val_ce", "prev_token", "induction", "wrong_conf", "val_acc_by_query"} <= set(r)
            # accuracy per query position: 4 queries of 512 sequences each, averaging to the overall accuracy
            assert len(r["val_acc_by_query"]) == 4
            assert abs(sum(r["val_acc_by_query"]) / 4 - r["val_acc"]) < 1e-6


# Seeds 0 and 3 (as before): in both arms every verdict below sits further from its threshold than its
# floor (checked by check_verdict). Seeds 1 and 2 would not do: "none" at seed 2 (val acc 0.82) is half-way
# through learning the task and moves 0.04 in val acc between CPUs; at seed 1 the last-minus-first-query
# verdict sits 0.07 from its threshold.
SEEDS = (0, 3)
ARMS = ("none", "dropout 0.1")
# Largest move of each key at seeds 0 and 3, per arm (tests/_rerun.py says between what), measured 2026-12-02;
# the floor is twice it. A model that generalizes moves far less than one that stays near the guessing level.
MOVES = {
    "none": {"val_acc": 0.0156, "train_acc": 0.0146, "val_ce": 0.128, "prev_token": 0.0299, "induction": 0.0088,
             "val_acc_by_query": 0.0371, "curve": 0.0342, "wrong_conf": 0.0081, "ce_share_confident_wrong": 0.037,
             "last_minus_first_query": 0.0508},
    "dropout 0.1": {"val_acc": 0.0034, "train_acc": 0.0, "val_ce": 0.006, "prev_token": 0.0303, "induction": 0.0051,
                    "val_acc_by_query": 0.0039, "curve": 0.0405, "last_minus_first_query": 0.002},
    "paired": {"dropout_minus_none": 0.0156},
}
FLOOR = {arm: {k: floor_of(v) for k, v in m.items()} for arm, m in MOVES.items()}
# Numbers checked against the band. wrong_conf and ce_share_confident_wrong only for "none": in a model that
# generalizes they are means over a handful of wrong tokens (NaN when there are none) and move 0.1-0.37.
KEYS = {arm: [k for k in MOVES[arm] if k != "last_minus_first_query"] for arm in ARMS}


@pytest.fixture(scope="module")
def fresh(ablation):
    """Both arms re-run at SEEDS: {arm: {seed: record}}."""
    return {arm: dict(zip(SEEDS, rerun(lambda seed, arm=arm: ablation.run(seed, arm), SEEDS))) for arm in ARMS}


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_two_seeds_rerun_to_their_own_committed_verdicts_and_values(ablation, fresh):
    runs = json.loads(ablation.RESULTS.read_text())["runs"]
    for arm in ARMS:
        for seed in SEEDS:
            got, want, what, floor = fresh[arm][seed], runs[arm][seed], f"{arm}, seed {seed}", FLOOR[arm]
            # the verdicts notebook 04 §5 and appendix 04a §1 and §4 draw per run
            check_verdict(f"{what}: generalizes (val acc > 0.95)", got["val_acc"], want["val_acc"], 0.95, floor["val_acc"])
            check_verdict(f"{what}: val acc above 0.5", got["val_acc"], want["val_acc"], 0.5, floor["val_acc"])
            check_verdict(f"{what}: fits its training set (train acc > 0.95)", got["train_acc"], want["train_acc"], 0.95,
                          floor["train_acc"])
            for key in ("prev_token", "induction"):   # the circuit is built: both scores > 0.9
                check_verdict(f"{what}: {key} > 0.9", got[key], want[key], 0.9, floor[key])
            check_verdict(f"{what}: last query answered more than 0.1 better than the first (elimination)",
                          *[r["val_acc_by_query"][3] - r["val_acc_by_query"][0] for r in (got, want)], 0.1,
                          floor["last_minus_first_query"])
            for key in KEYS[arm]:   # each number within the band of this seed's own committed value
                check_near(f"{what}: {key}", got[key], want[key], [r[key] for r in runs[arm]], floor[key])
    for seed in SEEDS:   # paired by seed: dropout ahead of none at step 300 (notebook 04 §5: in every seed)
        check_verdict(f"seed {seed}: dropout 0.1 minus none, val acc",
                      *[r["dropout 0.1"][seed]["val_acc"] - r["none"][seed]["val_acc"] for r in (fresh, runs)], 0.0,
                      FLOOR["paired"]["dropout_minus_none"])
