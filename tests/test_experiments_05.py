"""The committed sweep results of notebook 05 (experiments/05_head_redundancy_sweeps.py) are reproducible.

A trained model's last digits differ between CPUs, so a re-run is not compared digit for digit. The slow
tests re-run a few seeds of the short experiments (two layers, one and four heads; the fixed-budget pruning
run, its first 400 steps; the one-layer arms that widen only the head, or all but the head) and check them
seed by seed (``tests/_rerun.py``): each reaches the verdicts notebook 05 and appendix 05a draw for that
seed from its committed record, and each number lands within a band of that seed's own committed value.
Also checks the saved model the notebook analyses and the file's bookkeeping.
"""
from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from _rerun import check_crossing, check_near, check_verdict, floor_of, rerun

from helpers.lab import sweep


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


# §5a, two layers, one head and four heads, seeds 3 and 9, both arms. In both, every committed evaluation up to
# the first at 0.99 (and at 0.95) is more than the floor from it (check_crossing), and the paired verdicts go
# both ways: four heads reach 0.99 first and lead at step 80 for seed 3 (120 / 110 steps, +0.32); one head does
# both for seed 9 (100 / 110 steps, -0.14). Every other seed crosses 0.99 within 0.006 of it in one arm: seeds
# 0 and 1, re-run here before, at 0.991 with four heads (fragile), seed 2 at 0.996 with one head, which moved 0.0056.
# Largest move at seeds 3 and 9, both arms (tests/_rerun.py says between what), measured 2026-12-02; the floor
# is twice it (0.005). Over all 10 seeds: curve 0.023 (seed 1, four heads, at its crossing of 0.95), accuracy
# at step 80 0.0017, entropy 0.0059; no seed's step to 0.99 moved.
TWO_LAYER_SEEDS = (3, 9)
TWO_LAYER_MOVES = {"acc": 0.0017, "acc_at_80": 0.0009, "entropy": 0.0003, "final_acc": 0.0}
TWO_LAYER_FLOOR = {k: floor_of(v) for k, v in TWO_LAYER_MOVES.items()}


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_two_layer_two_seeds_rerun_to_their_own_committed_verdicts_and_values(ex05, committed):
    block, floor = committed["two_layer"]["runs"], TWO_LAYER_FLOOR
    fresh = {h: dict(zip(TWO_LAYER_SEEDS, rerun(ex05.run_two_layer_heads(h), TWO_LAYER_SEEDS))) for h in (1, 4)}
    one_layer = committed["one_layer"]
    for seed in TWO_LAYER_SEEDS:
        for h in (1, 4):
            runs = block[f"{h} head(s)"]
            got, want, what = fresh[h][seed], runs[seed], f"{h} head(s), seed {seed}"
            # the verdict per seed (§5a): reached 0.99 (and 0.95) within 300 steps, at the committed evaluation
            for key, thr in (("steps_to_99", 0.99), ("steps_to_95", 0.95)):
                check_crossing(f"{what}: first evaluation at {thr}", got["acc"], want["acc"], thr, floor["acc"])
                assert got[key] == _num(want[key]), (what, key, got[key], want[key])
            check_verdict(f"{what}: final accuracy above 0.99", got["final_acc"], want["final_acc"], 0.99, floor["final_acc"])
            for key in TWO_LAYER_MOVES:
                check_near(f"{what}: {key}", got[key], want[key], [r[key] for r in runs], floor[key])
        one, four = fresh[1][seed], fresh[4][seed]
        ref1, ref4 = block["1 head(s)"][seed], block["4 head(s)"][seed]
        # paired by seed (§5a): which arm reaches 0.99 first (or a tie), and which is ahead at step 80
        assert four["steps_to_99"] - one["steps_to_99"] == _num(ref4["steps_to_99"]) - _num(ref1["steps_to_99"]), seed
        check_verdict(f"seed {seed}: four heads minus one head, accuracy at step 80", four["acc_at_80"] - one["acc_at_80"],
                      ref4["acc_at_80"] - ref1["acc_at_80"], 0.0, 2 * floor["acc_at_80"])
        # §5c, paired on the seeds one_layer ran: 2 layers x 1 head reach 0.99 before 1 layer x 2 heads (lr 5e-3)
        if seed in one_layer["seeds"]:
            wide = _num(one_layer["runs"][one_layer["seeds"].index(seed)]["d16 2 heads lr 0.005: steps_to_99"])
            assert one["steps_to_99"] < wide and _num(ref1["steps_to_99"]) < wide, (seed, one["steps_to_99"], wide)


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


def test_new_keys_were_added_without_rerunning_the_old_ones(committed, ex05):
    assert committed["pruning_budget"]["seeds"] == committed["pruning"]["seeds"]
    for rec in committed["pruning_budget"]["runs"]:
        assert all(f"step {s}" in rec for s in ex05.BUDGET_SNAPSHOTS)
    assert {"pruning_budget", "one_layer_head_only", "one_layer_narrow_head"} <= set(committed["seconds"])


# Appendix 05a §3, the fixed-budget run of seed 7: its first 400 steps (constant learning rate: the same steps
# as in the 1200-step run), pruned at step 400 by importance (one random order only). It is the only seed that
# did not reach 0.995 within 400 steps (max 0.906, 0.089 below): notebook 05 §3's "except seed 7, which used the
# 400-step budget and ended at 0.906"; the pruning sweep's model of seed 7 is this snapshot (same training).
# Not checked per seed: the pruned count at the <= 1 point criterion, as a verdict. In every seed the criterion
# is met or missed by less than 0.01 of accuracy (seed 7: 0.0013), and the count moved by 1-3 heads (up to
# 0.19) between CPUs and under perturbed arithmetic, in every seed. The step at which the other seeds reach
# 0.995 (their early stop) is fragile too: all cross it within 0.005 of it, so it is not checked either.
# Largest move at seed 7 (tests/_rerun.py says between what), measured 2026-12-02; the floor is twice it. The
# count and the random order's count are only held to that band (4 and 2 heads of 16). "area": the mean of the
# pruning curve over 0-16 heads pruned. Seed 7 costs one training: the slow file's budget allows one seed here.
BUDGET_SEED, BUDGET_SNAPSHOT = 7, 400
BUDGET_MOVES = {"history": 0.0102, "val_acc": 0.0102, "test_acc": 0.0069, "area": 0.0235, "frac_fixed_norm": 0.125,
                "frac_random": 0.0625}
BUDGET_FLOOR = {k: floor_of(v) for k, v in BUDGET_MOVES.items()}


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_pruning_budget_one_seed_reruns_to_its_own_committed_verdicts_and_values(ex05, committed):
    runs, floor, seed, snap = committed["pruning_budget"]["runs"], BUDGET_FLOOR, BUDGET_SEED, BUDGET_SNAPSHOT
    got = rerun(functools.partial(ex05.run_pruning_budget, steps=snap, snapshots=(snap,), n_random=1), [seed])[0]
    want, key, what = runs[seed], f"step {snap}", f"pruning budget, seed {seed}"
    assert sorted(k for k in got if k.startswith("step ")) == [key]
    n = snap // 25                                   # evaluations up to the snapshot (every 25 steps)
    acc = lambda r: [a for _, _, a in r["history"][:n]]  # noqa: E731
    pruned = committed["pruning"]["runs"][committed["pruning"]["seeds"].index(seed)]
    assert pruned["steps"] == snap and pruned["val_acc"] == want[key]["val_acc"]     # the same model, committed
    # the verdict: never at the early stop's 0.995 within the 400-step budget
    assert len(acc(got)) == n
    check_crossing(f"{what}: first evaluation at 0.995", acc(got), acc(want), 0.995, floor["history"])
    check_near(f"{what}: validation accuracy every 25 steps", acc(got), acc(want), [acc(r) for r in runs], floor["history"])
    for k in ("val_acc", "test_acc", "frac_fixed_norm"):
        check_near(f"{what}: {k} at step {snap}", got[key][k], want[key][k], [r[key][k] for r in runs], floor[k])
    area = lambda r: sum(r[key]["curve_fixed"]) / len(r[key]["curve_fixed"])  # noqa: E731
    check_near(f"{what}: pruning curve mean at step {snap}", area(got), area(want), [area(r) for r in runs], floor["area"])
    check_near(f"{what}: random order 0 at step {snap}", got[key]["frac_random"][0], want[key]["frac_random"][0],
               [r[key]["frac_random"][0] for r in runs], floor["frac_random"])


# §5b, only the head widened to 64, lr 2e-3, seed 3: the one run of 15 that reached 0.99 (at step 1600 of
# 2000; the notebook's head_only_reach == 1). The verdict is "reached 0.99 within the 2000-step budget": its
# step moved by 50 (1550-1625) and sits 400 steps inside the budget. Its accuracy at the stop (0.9957) is near
# 0.99 by construction: a run stops at 0.995. The bands are over the seeds with the same verdict at this rate
# (seed 3 alone): the range over all five (0.37-0.996) is the gap between the verdicts, not a spread.
# Largest move at seed 3 (tests/_rerun.py says between what), measured 2026-12-02; the floor is twice it. Seeds 0
# and 1, re-run here before, stall (best 0.51, 0.38; moves up to 0.010, final accuracy 0.014); the stalled
# kind of run is re-run in the narrow-head test below (another arm). One seed: the slow file's budget.
HEAD_ONLY_LR, HEAD_ONLY_SEED = 0.002, 3
HEAD_ONLY_MOVES = {"steps_to_99": 50, "best_acc": 0.0004, "final_acc": 0.0004}
HEAD_ONLY_FLOOR = {k: floor_of(v) for k, v in HEAD_ONLY_MOVES.items()}


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_one_layer_head_only_one_seed_reruns_to_its_own_committed_verdict_and_values(ex05, committed):
    block, floor, seed = committed["one_layer_head_only"], HEAD_ONLY_FLOOR, HEAD_ONLY_SEED
    key, what = f"d16 head 64 lr {HEAD_ONLY_LR:g}", f"head only, lr {HEAD_ONLY_LR:g}, seed {seed}"
    got = rerun(functools.partial(ex05.run_one_layer_head_only, lrs=(HEAD_ONLY_LR,)), [seed])[0]
    want = block["runs"][block["seeds"].index(seed)]
    steps = lambda r: _num(r[f"{key}: steps_to_99"])  # noqa: E731
    reached = [r for r in block["runs"] if math.isfinite(steps(r))]
    assert reached == [want]                          # the one run of the five at this rate that reached 0.99
    assert got["params"] == want["params"]
    check_verdict(f"{what}: steps to 0.99 beyond the budget", steps(got), steps(want), ex05.ONE_LAYER_STEPS,
                  floor["steps_to_99"])
    check_near(f"{what}: steps_to_99", steps(got), steps(want), [steps(r) for r in reached], floor["steps_to_99"])
    for k in ("best_acc", "final_acc"):
        check_near(f"{what}: {k}", got[f"{key}: {k}"], want[f"{key}: {k}"], [r[f"{key}: {k}"] for r in reached], floor[k])


def test_narrow_head_model_widens_everything_but_the_head(ex05):
    """``one_layer_narrow_head``'s model: residual width 64 as in the wide arm, one head of width 16."""
    from helpers import TinyTransformer

    d, dh = ex05.NARROW_HEAD_D_MODEL, ex05.NARROW_HEAD_WIDTH
    assert (d, dh) == (64, 16)
    model = ex05.head_only_model(72, 0, d_model=d, head_dim=dh)
    attn = model.blocks[0].attn
    for lin in (attn.linear_q, attn.linear_k, attn.linear_v):
        assert lin.weight.shape == (dh, d)
    assert attn.linear_out.weight.shape == (d, dh)
    # every other parameter has the wide arm's shape (one_layer's "d64 1 head": TinyTransformer(vocab, 64, 1, 1, 12))
    wide = dict(TinyTransformer(72, d, 1, 1, 12, pos="rope", seed=0).named_parameters())
    narrow = dict(model.named_parameters())
    assert set(wide) == set(narrow)
    for name, p in narrow.items():
        if not name.startswith("blocks.0.attn."):
            assert p.shape == wide[name].shape, name
    assert model(torch.zeros(2, 12, dtype=torch.long)).shape == (2, 12, 72)


# The narrow-head re-run: lr 1e-3, one seed that learned (seed 1, at step 600) and one that stalled (seed 3, at 0.68).
NARROW_RERUN_LR, NARROW_RERUN_SEEDS = 0.001, (1, 3)


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_one_layer_narrow_head_reruns_reproduce_each_seeds_own_verdict(ex05, committed):
    """Each re-run seed must reach 0.99 exactly when its committed run did, and land near its own best accuracy.

    The band: a quarter of the committed across-seed range of the best accuracy at this rate (0.32 at 1e-3, so
    0.08), never below 0.02. A quarter is narrower than the gap between the two stalled seeds' plateaus
    (0.68 and 0.79), so a re-run that stalls on another seed's plateau fails; 0.02 is above the 0.015-0.016 by
    which a change of CPU kernels moved a trained accuracy in notebook 04's re-runs, so a rate whose seeds all
    land close together does not demand more than a CPU can reproduce. Re-run with ATen at AVX2 and at no SIMD
    (same machine), all five seeds kept their verdict at 1e-3 and their best accuracy moved by at most 0.006."""
    block = committed["one_layer_narrow_head"]
    key = f"d64 head 16 lr {NARROW_RERUN_LR:g}"
    best = [r[f"{key}: best_acc"] for r in block["runs"]]
    band = max(0.02, (max(best) - min(best)) / 4)
    res = sweep(functools.partial(ex05.run_one_layer_narrow_head, lrs=(NARROW_RERUN_LR,)), NARROW_RERUN_SEEDS)
    reached = {True: 0, False: 0}
    for seed, rec in zip(NARROW_RERUN_SEEDS, res.runs):
        ref = block["runs"][block["seeds"].index(seed)]
        was, now = math.isfinite(_num(ref[f"{key}: steps_to_99"])), math.isfinite(_num(rec[f"{key}: steps_to_99"]))
        assert now == was, (seed, ref[f"{key}: steps_to_99"], rec[f"{key}: steps_to_99"])
        assert abs(rec[f"{key}: best_acc"] - ref[f"{key}: best_acc"]) <= band, (seed, rec[f"{key}: best_acc"], ref[f"{key}: best_acc"], band)
        reached[was] += 1
    assert reached == {True: 1, False: 1}  # one of each verdict re-run
