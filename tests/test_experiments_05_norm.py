"""The committed normalisation arms of notebook 05 §3 (experiments/05_normalisation_arms.py) are reproducible.

The slow test retrains one seed and prunes it in the three orders; a retraining on another CPU
sums floats in another order, so the seed's own numbers may move, but they must land inside the
committed spread over 16 seeds (with a margin). The fast tests check the file's bookkeeping and
that the script's "outside" order is the one appendix 05a computes on the saved model.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

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
    heads = [(l, h) for l in range(2) for h in range(8)]
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


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_one_seed_rerun_inside_the_committed_spread(ex05n, committed):
    rec = ex05n.run_arms(0)
    for arm in ARMS:
        counts = [round(16 * r[arm]["frac"]) for r in committed["runs"]]
        area = [float(np.mean(r[arm]["accuracy"])) for r in committed["runs"]]
        got_count, got_area = round(16 * rec[arm]["frac"]), float(np.mean(rec[arm]["accuracy"]))
        assert min(counts) - 1 <= got_count <= max(counts) + 1, (arm, got_count, counts)
        assert min(area) - 0.03 <= got_area <= max(area) + 0.03, (arm, got_area, area)
    assert rec["val_acc"] >= 0.99
