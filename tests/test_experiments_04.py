"""Notebook 04's two newer sweeps still describe what their scripts compute.

``experiments/04_attention_dropout.py`` and ``experiments/04_layernorm_warmup.py`` write the
JSON files that appendix notebook 04a (§2, §3) loads. A trained model's last digits differ between
CPUs, so a re-run is not compared digit for digit: the slow tests re-run a few seeds and check them
seed by seed (``tests/_rerun.py``): each reaches the verdicts 04a draws for that seed from its
committed record, and each number lands within a band of that seed's own committed value.
"""
from __future__ import annotations

import json
import math

import pytest
from _rerun import check_crossing, check_near, check_verdict, floor_of, rerun


@pytest.fixture(scope="module")
def attn(experiment_script):
    return experiment_script("04_attention_dropout")


@pytest.fixture(scope="module")
def ln(experiment_script):
    return experiment_script("04_layernorm_warmup")


def test_attention_dropout_file_matches_the_script(attn, experiment_script):
    data = json.loads(attn.RESULTS.read_text())
    assert data["seeds"] == attn.SEEDS and data["settings"] == attn.SETTINGS and data["arms"] == attn.ARMS
    assert list(data["runs"]) == list(attn.ARMS)
    # the same training code and settings as the committed ablation of section 5
    ablation = experiment_script("regularization_ablation")
    assert attn.SETTINGS == ablation.SETTINGS and attn.SEEDS == ablation.SEEDS
    for arm, runs in data["runs"].items():
        assert len(runs) == len(attn.SEEDS), arm
        for r in runs:
            assert 0 <= r["val_acc"] <= 1 and 0 <= r["train_acc"] <= 1
            assert abs(sum(r["val_acc_by_query"]) / 4 - r["val_acc"]) < 1e-6


# Appendix 04a §2, "attention dropout 0.1". Seeds 0 (reaches 0.95, 1.000 at step 300) and 1 (never: 0.558).
# The step at which a seed first reaches 0.95 is checked on seed 1 only: every seed that reaches it crosses
# within 0.05 of 0.95 (seed 0: 0.941 then 0.976; seeds 2, 3, 5, 6: 0.973, 0.927 / 0.983, 0.946, 0.972) while its
# curve moves up to 0.026 between CPUs, so that step is fragile on every such seed; for seed 0 the check is
# that it is above 0.95 at step 300, that is, reached it within the budget.
ATTN_ARM, ATTN_SEEDS = "attention dropout 0.1", (0, 1)
# Largest move at seeds 0 and 1 (tests/_rerun.py says between what), measured 2026-12-02; the floor is twice it.
# "area" is the mean of the curve (12 evaluations), which 04a pairs by seed. wrong_conf and
# ce_share_confident_wrong are left out: means over a handful of wrong tokens, they moved 0.36 and 0.62.
ATTN_MOVES = {"val_acc": 0.0088, "train_acc": 0.0039, "val_ce": 0.083, "prev_token": 0.046, "induction": 0.011,
              "val_acc_by_query": 0.0371, "curve": 0.0181, "area": 0.0038}
ATTN_FLOOR = {k: floor_of(v) for k, v in ATTN_MOVES.items()}


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_attention_dropout_two_seeds_rerun_to_their_own_committed_verdicts_and_values(attn):
    data = json.loads(attn.RESULTS.read_text())
    runs, floor = data["runs"], ATTN_FLOOR
    area = lambda r: sum(r["curve"]) / len(r["curve"])  # noqa: E731
    fresh = dict(zip(ATTN_SEEDS, rerun(lambda seed: attn.run(seed, ATTN_ARM), ATTN_SEEDS)))
    for seed in ATTN_SEEDS:
        got, want, what = fresh[seed], runs[ATTN_ARM][seed], f"{ATTN_ARM}, seed {seed}"
        check_verdict(f"{what}: above 0.95 at step 300", got["val_acc"], want["val_acc"], 0.95, floor["val_acc"])
        if seed == 1:   # never reached 0.95 (see above)
            check_crossing(f"{what}: first evaluation at 0.95", got["curve"], want["curve"], 0.95, floor["curve"])
        # paired by seed with the committed arms (04a §2): ahead of none (curve mean and step 300), of residual
        # dropout (curve mean; at step 300 where neither reached 0.95, as for seed 1)
        for other in ("none", "dropout 0.1"):
            check_verdict(f"{what}: curve mean minus {other}'s", area(got) - area(runs[other][seed]),
                          area(want) - area(runs[other][seed]), 0.0, floor["area"])
        check_verdict(f"{what}: val acc minus none's", got["val_acc"] - runs["none"][seed]["val_acc"],
                      want["val_acc"] - runs["none"][seed]["val_acc"], 0.0, floor["val_acc"])
        if seed == 1:
            check_verdict(f"{what}: val acc minus residual dropout's", got["val_acc"] - runs["dropout 0.1"][seed]["val_acc"],
                          want["val_acc"] - runs["dropout 0.1"][seed]["val_acc"], 0.0, floor["val_acc"])
        for key in ATTN_MOVES:
            if key == "area":
                check_near(f"{what}: {key}", area(got), area(want), [area(r) for r in runs[ATTN_ARM]], floor[key])
            else:
                check_near(f"{what}: {key}", got[key], want[key], [r[key] for r in runs[ATTN_ARM]], floor[key])


def test_layernorm_file_matches_the_script(ln):
    data = json.loads(ln.RESULTS.read_text())
    assert data["seeds"] == ln.SEEDS and data["settings"] == ln.SETTINGS and data["arms"] == ln.ARMS
    s = ln.SETTINGS
    for arm, runs in data["runs"].items():
        assert len(runs) == len(ln.SEEDS), arm
        for r in runs:
            assert r["reached"] == (max(r["curve"]) >= s["threshold"])
            if r["reached"]:          # stopped at the first evaluation at or above the threshold
                assert r["steps_to_threshold"] == r["steps_run"] == s["eval_every"] * len(r["curve"])
            else:                     # censored at the budget
                assert r["steps_to_threshold"] is None and r["steps_run"] == s["steps"]


def test_lr_factor_is_the_rescaled_transformer_schedule(ln):
    W = 50
    # Vaswani et al. eq. 3: d^-0.5 min(t^-0.5, t W^-1.5); divided by its peak d^-0.5 W^-0.5 (at t = W)
    for t in [1, 7, 49, 50, 51, 200, 300]:
        paper = min(t ** -0.5, t * W ** -1.5) / W ** -0.5
        assert math.isclose(ln.lr_factor(t, W, True), paper, rel_tol=1e-12)
        assert math.isclose(ln.lr_factor(t, W, False), 1.0 if t <= W else paper, rel_tol=1e-12)
    with pytest.raises(ValueError, match="step must be >= 1"):
        ln.lr_factor(0, W, True)


# Appendix 04a §3. Post-LN with warm-up, seed 6: it first reaches 0.95 at step 40 (0.884 at step 30, 0.995 at
# step 40). Seed 0, re-run here before, is fragile: 0.942 at step 40 and 0.940 at step 60; re-run on an AVX-512
# machine it reached 0.95 at step 90, with AVX2 kernels at step 80, and under perturbed arithmetic never within
# the 300 steps. Seeds 1, 4 and 7 cross within 0.03-0.04 of 0.95 with moves up to 0.027 (seed 4).
# Post-LN without warm-up, seed 0: stuck at the uniform guess (accuracy ~1/8); its first 100 steps are the
# same steps as in the 300-step run (the schedule depends on the step only), so only those are re-run.
LN_WARM, LN_FLAT = ("post-LN, warm-up", 6), ("post-LN, no warm-up", 0)
# Largest move (tests/_rerun.py says between what), measured 2026-12-02; the floor is twice it. Seed 6: curve
# 0.0122 (at step 40; steps 10-30 moved 0.001), train_loss_last 0.068 (the last mini-batch's loss), the first
# loss 0 (the untrained model). Seed 0 without warm-up: curve and first loss exactly 0 (seeds 1 and 2 too).
LN_FLOOR = {LN_WARM[0]: {"curve": floor_of(0.0122), "final_val_acc": floor_of(0.0122), "train_loss_last": floor_of(0.068),
                         "train_loss_first": floor_of(0.0)},
            LN_FLAT[0]: {"curve": floor_of(0.0), "train_loss_first": floor_of(0.0)}}


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_layernorm_two_runs_rerun_to_their_own_committed_verdicts_and_values(ln):
    data = json.loads(ln.RESULTS.read_text())
    s = ln.SETTINGS
    n = 100 // s["eval_every"]
    # one sweep, the two runs side by side (their seeds differ)
    both = rerun(lambda seed: ln.run(seed, LN_WARM[0]) if seed == LN_WARM[1] else ln.run(seed, LN_FLAT[0], steps=100),
                 [LN_WARM[1], LN_FLAT[1]])
    fresh = dict(zip((LN_WARM, LN_FLAT), both))
    for (arm, seed), got in fresh.items():
        runs, floor, what = data["runs"][arm], LN_FLOOR[arm], f"{arm}, seed {seed}"
        want = runs[seed]
        # the verdict 04a draws per run: reached 0.95, and at which evaluation (its time to threshold)
        check_crossing(f"{what}: first evaluation at {s['threshold']}", got["curve"], want["curve"], s["threshold"],
                       floor["curve"])
        if arm == LN_WARM[0]:
            assert got["reached"] and got["steps_to_threshold"] == want["steps_to_threshold"], (what, got["steps_to_threshold"])
            keys = ("curve", "final_val_acc", "train_loss_last", "train_loss_first")
            values = {k: [r[k] for r in runs] for k in keys}
            # the stopped runs have curves of different lengths: the band of each evaluation over the seeds that got there
            values["curve"] = [[r["curve"][i] for r in runs if len(r["curve"]) > i] for i in range(len(want["curve"]))]
            for key in keys:
                if key == "curve":
                    for i, (g, c) in enumerate(zip(got["curve"], want["curve"])):
                        check_near(f"{what}: curve[{i}]", g, c, values["curve"][i], floor["curve"])
                else:
                    check_near(f"{what}: {key}", got[key], want[key], values[key], floor[key])
        else:   # censored at 300 steps in the record, at the uniform guess all along; the re-run's 100 steps too
            assert not want["reached"] and max(want["curve"]) < 0.2, want["curve"]
            assert not got["reached"] and got["steps_run"] == 100 and max(got["curve"]) < 0.2, got["curve"]
            check_near(f"{what}: curve (first 100 steps)", got["curve"], want["curve"][:n], [r["curve"][:n] for r in runs],
                       floor["curve"])
            check_near(f"{what}: train_loss_first", got["train_loss_first"], want["train_loss_first"],
                       [r["train_loss_first"] for r in runs], floor["train_loss_first"])
