"""The committed sweep results of notebook 05 (experiments/05_head_redundancy_sweeps.py) are reproducible.

Re-runs two seeds of the two-layer experiment (one head and four heads, 300 steps each) and
checks that they land inside the committed spread over 10 seeds, with a margin: another CPU
sums floats in another order, so a seed's own numbers may move a little, not out of the
distribution. Also checks the saved model the notebook analyses and the file's bookkeeping.
"""
from __future__ import annotations

import functools

import json
import math

import pytest
import torch

from helpers import sweep

@pytest.fixture(scope="module")
def ex05(experiment_script):
    return experiment_script("05_head_redundancy_sweeps")


@pytest.fixture(scope="module")
def committed(ex05):
    return json.loads(ex05.RESULTS.read_text())


def _num(v):
    return math.inf if v == "inf" else float(v)


def test_results_file_records_where_it_was_made_and_every_experiment(committed, ex05):
    meta = committed["meta"]
    assert {"torch", "cpu_capability", "machine"} <= set(meta)
    for name, seeds in ex05.SEEDS.items():
        assert committed[name]["seeds"] == seeds
    assert len(committed["two_layer"]["runs"]["1 head(s)"]) == len(ex05.SEEDS["two_layer"]) >= 10
    assert len(committed["pruning"]["runs"]) >= 8 and len(committed["gqa"]["runs"]) >= 5
    assert len(committed["saved_random_curves"]) == ex05.N_RANDOM_ORDERS


def test_saved_model_loads_and_solves_the_task(ex05):
    task, split, test = ex05.mixed_data(0)
    from helpers import TinyTransformer, evaluate

    model = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=0, **ex05.MIXED)
    model.load_state_dict(torch.load(ex05.MODEL_PATH))
    assert evaluate(model, split.val)[1] >= 0.99 and evaluate(model, test)[1] >= 0.99


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
@pytest.mark.parametrize("heads", [1, 4])
def test_two_seeds_rerun_inside_the_committed_spread(ex05, committed, heads):
    runs = committed["two_layer"]["runs"][f"{heads} head(s)"]
    steps = [_num(r["steps_to_99"]) for r in runs]
    mid = [r["acc_at_80"] for r in runs]
    res = sweep(ex05.run_two_layer_heads(heads), [0, 1])
    for seed in (0, 1):
        rec = res.runs[seed]
        assert min(steps) - 30 <= rec["steps_to_99"] <= max(steps) + 30, (seed, rec["steps_to_99"], steps)
        assert min(mid) - 0.15 <= rec["acc_at_80"] <= max(mid) + 0.15, (seed, rec["acc_at_80"], mid)
        assert rec["final_acc"] >= 0.99


def test_wide_head_equals_multi_head_attention_at_equal_width(ex05):
    from helpers import MultiHeadAttention, causal_mask

    ref = MultiHeadAttention(16, 1, rope=True)
    wide = ex05.WideHeadAttention(16, 16)
    wide.load_state_dict(ref.state_dict())
    x = torch.randn(3, 12, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        (a, wa), (b, wb) = ref(x, mask=causal_mask(12)), wide(x, mask=causal_mask(12))
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(wa, wb)
    model = ex05.head_only_model(72, 0)
    assert model.blocks[0].attn.linear_q.weight.shape == (ex05.HEAD_ONLY_WIDTH, 16)
    assert model.blocks[0].attn.linear_out.weight.shape == (16, ex05.HEAD_ONLY_WIDTH)
    assert model(torch.zeros(2, 12, dtype=torch.long)).shape == (2, 12, 72)


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_new_keys_were_added_without_rerunning_the_old_ones(committed, ex05):
    assert committed["pruning_budget"]["seeds"] == committed["pruning"]["seeds"]
    for rec in committed["pruning_budget"]["runs"]:
        assert all(f"step {s}" in rec for s in ex05.BUDGET_SNAPSHOTS)
    assert {"pruning_budget", "one_layer_head_only"} <= set(committed["seconds"])


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_pruning_budget_two_seeds_rerun_inside_the_committed_spread(ex05, committed):
    """The first 400 of the 1200 steps (constant learning rate: the same steps), pruned at step 400 by
    importance (one random order only: the random baseline is not what this checks)."""
    runs = committed["pruning_budget"]["runs"]
    early = (400,)
    res = sweep(functools.partial(ex05.run_pruning_budget, steps=400, snapshots=early, n_random=1), [0, 1])
    for seed in (0, 1):
        rec = res.runs[seed]
        assert sorted(k for k in rec if k.startswith("step ")) == [f"step {s}" for s in early]
        for step in early:
            key = f"step {step}"
            fr = [r[key]["frac_fixed_norm"] for r in runs]
            va = [r[key]["val_acc"] for r in runs]
            assert min(fr) - 0.13 <= rec[key]["frac_fixed_norm"] <= max(fr) + 0.13, (seed, step, rec[key], fr)
            assert min(va) - 0.05 <= rec[key]["val_acc"] <= max(va) + 0.05, (seed, step, rec[key]["val_acc"], va)


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_one_layer_head_only_two_seeds_rerun_inside_the_committed_spread(ex05, committed):
    runs = committed["one_layer_head_only"]["runs"]
    res = sweep(functools.partial(ex05.run_one_layer_head_only, lrs=(0.002,)), [0, 1])  # the rate where it learned once
    for seed in (0, 1):
        rec = res.runs[seed]
        for lr in (0.002,):
            key = f"d16 head 64 lr {lr:g}: best_acc"
            vals = [r[key] for r in runs]
            assert min(vals) - 0.1 <= rec[key] <= max(vals) + 0.1, (seed, key, rec[key], vals)
