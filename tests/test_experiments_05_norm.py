"""The committed normalisation arms of notebook 05 §3 (experiments/05_normalisation_arms.py) are reproducible.

The slow test retrains one seed and prunes it in the three orders; a retraining on another CPU sums
floats in another order, so it is checked seed by seed (``tests/_rerun.py``): the verdicts that
survive such a move, and each number within a band of the seed's own committed value. The fast tests
check the file's bookkeeping and that the script's "outside" order is the one appendix 05a computes on
the saved model.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _rerun import check_near, check_verdict, floor_of, rerun

ARMS = ("fixed", "inside", "outside")


@pytest.fixture(scope="module")
def ex05n(experiment_script):
    return experiment_script("05_normalisation_arms")


@pytest.fixture(scope="module")
def committed(ex05n):
    return json.loads(ex05n.RESULTS.read_text())


def test_results_file_records_where_it_was_made_and_all_three_arms(committed, ex05n):
    assert {"torch", "cpu_capability", "machine", "tolerance"} <= set(committed["meta"])
    assert committed["seeds"] == ex05n.SEEDS and len(committed["runs"]) == len(ex05n.SEEDS) >= 16
    heads = [(layer, h) for layer in range(2) for h in range(8)]
    for run in committed["runs"]:
        for arm in ARMS:
            assert len(run[arm]["accuracy"]) == 17 and sorted(map(tuple, run[arm]["order"])) == heads
            assert 0 <= run[arm]["frac"] <= 1 and run[arm]["accuracy"][0] == run["test_acc"]


def test_outside_order_on_the_saved_model_prunes_as_appendix_05a_says(ex05n):
    from helpers import TinyTransformer
    from helpers import heads as hd

    task, split, test = ex05n.ex05.mixed_data(0)
    model = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=0, **ex05n.ex05.MIXED)
    model.load_state_dict(torch.load(ex05n.ex05.MODEL_PATH))
    model.eval()
    imp_data = (split.train[0][:1024], split.train[1][:1024])
    curve = hd.pruning_curve(model, test, ex05n.outside_order(model, imp_data))
    assert round(16 * curve.max_prunable(0.01)) == 8


# Seed 0. Measured 2026-12-02 (tests/_rerun.py says how): a plain re-run on an AVX-512 machine, the kind that
# made this file, reproduces its record bit for bit. Under perturbed arithmetic the retrained model stops at
# the same step (225) but prunes differently: heads prunable with <= 1 point lost go from 7 / 5 / 6 (fixed /
# inside / outside) to 6 / 8 / 9, single points of a pruning curve move up to 0.34, the curve means 0.009 /
# 0.001 / 0.038 (seed 1: counts 2 / 4 / 4 to 3 / 4 / 5). So the counts are not checked per seed: in every seed
# and arm the <= 1 point criterion is met or missed by less than 0.01 of accuracy, inside what a CPU moves.
# (The old check, each count within the 16-seed range +- 1, fails under the perturbation: outside 9 > 7 + 1.)
# Checked: the training's verdict (stopped early, at the committed step), the curve means, and their paired
# order where it is clear of its floor: outside ahead of inside (+0.187, moved 0.037), fixed ahead of inside
# (+0.152, moved 0.008). Outside minus fixed (+0.035, moved to +0.006) is fragile on seed 0.
NORM_SEED = 0
NORM_MOVES = {"val_acc": 0.0005, "test_acc": 0.0014, "area": 0.038, "outside_minus_inside": 0.037,
              "fixed_minus_inside": 0.008}
NORM_FLOOR = {k: floor_of(v) for k, v in NORM_MOVES.items()}
STEP_FLOOR = 25          # one evaluation (the early stop is checked every 25 steps); the step did not move


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_one_seed_reruns_to_its_own_committed_verdicts_and_values(ex05n, committed):
    rec = rerun(ex05n.run_arms, [NORM_SEED])[0]
    runs, floor = committed["runs"], NORM_FLOOR
    want, what = runs[NORM_SEED], f"seed {NORM_SEED}"
    area = lambda r, arm: float(np.mean(r[arm]["accuracy"]))  # noqa: E731
    # training: stopped early at validation accuracy 0.995 (budget 400 steps), at the committed step
    assert want["steps"] < 400 and rec["steps"] < 400 and rec["val_acc"] >= 0.995, (rec["steps"], rec["val_acc"])
    check_near(f"{what}: steps", rec["steps"], want["steps"], [r["steps"] for r in runs], STEP_FLOOR)
    for key in ("val_acc", "test_acc"):
        check_near(f"{what}: {key}", rec[key], want[key], [r[key] for r in runs], floor[key])
    for arm in ARMS:
        check_near(f"{what}: {arm}, curve mean", area(rec, arm), area(want, arm), [area(r, arm) for r in runs], floor["area"])
        assert rec[arm]["accuracy"][0] == rec["test_acc"]
    for a, b in (("outside", "inside"), ("fixed", "inside")):   # notebook 05 §3: paired by seed, curve means
        check_verdict(f"{what}: {a} minus {b}, curve mean", area(rec, a) - area(rec, b), area(want, a) - area(want, b), 0.0,
                      floor[f"{a}_minus_{b}"])
