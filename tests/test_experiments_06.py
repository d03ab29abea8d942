"""The committed results of ``experiments/06_positional_sweeps.py`` (loaded by notebook 06)
are reproducible, and the file records what produced it. The slow tests re-run a few seeds of
parts of the sweep and check them seed by seed (``tests/_rerun.py``): each reaches the verdicts
notebook 06 and appendix 06a draw for that seed, and each number lands within a band of that
seed's own committed value (float32 training differs slightly across CPU kernels)."""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from _rerun import check_crossing, check_near, check_verdict, floor_of, rerun

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


# Part "schemes", pair recall, learned-0.01 and RoPE, seeds 0 and 5 (as before). Largest move over seeds 0-5,
# measured 2026-12-02 (tests/_rerun.py says between what): curve 0.002, grid 0.0014, final accuracy 0 (a
# one-layer model, 100 steps: the perturbation barely moves it). The floor, twice that: 0.005. Both seeds are
# clear of every threshold below by more (closest: seed 0's learned-0.01 curve, 0.957 where it first reaches 0.95).
SCHEME_FLOOR = floor_of(0.002)


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_two_seeds_rerun_to_their_own_committed_verdicts_and_values(exp, results):
    fresh = rerun(functools.partial(exp.schemes_run, schemes=["learned-0.01", "rope"], tasks=["recall"]), [0, 5])
    committed = results["schemes"]["runs"]
    at = lambda rec, scheme, length, offset: rec[f"recall/{scheme}/grid"][exp.LENGTHS.index(length)][  # noqa: E731
        exp.OFFSETS.index(offset)]
    for seed, got in zip((0, 5), fresh):
        want = committed[seed]
        for scheme in ("learned-0.01", "rope"):
            key, what = f"recall/{scheme}", f"seed {seed}, recall, {scheme}"
            # speed (notebook 06 §2): the evaluation where it first reaches 0.95; no later than learned-1 (§2: slowest or tied for slowest)
            check_crossing(f"{what}: first evaluation at 0.95", got[f"{key}/curve"], want[f"{key}/curve"], 0.95, SCHEME_FLOOR)
            assert got[f"{key}/steps95"] == want[f"{key}/steps95"] <= want["recall/learned-1/steps95"], what
            for part in ("acc", "curve", "grid"):
                check_near(f"{what}: {part}", got[f"{key}/{part}"], want[f"{key}/{part}"],
                           [r[f"{key}/{part}"] for r in committed], SCHEME_FLOOR)
        # 06a: learned-0.01 ahead of RoPE on recall at 4L_train (every seed), learned-0.01 > 0.9 after a shift of 100
        check_verdict(f"seed {seed}: learned-0.01 minus RoPE, recall at 4L_train", *[
            at(r, "learned-0.01", 4 * exp.L, 0) - at(r, "rope", 4 * exp.L, 0) for r in (got, want)], 0.0, 2 * SCHEME_FLOOR)
        check_verdict(f"seed {seed}: learned-0.01, recall at +100", at(got, "learned-0.01", exp.L, 100),
                      at(want, "learned-0.01", exp.L, 100), 0.9, SCHEME_FLOOR)


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


# Part "alias", seeds 0 and 5 (as before; seed 2 would not do: its fast pairs moved by 10 and by 100 tie). Largest
# move over seeds 0-5, measured 2026-12-02: 0.0048 (seed 0, "offset 10: fast"); seed 5 did not move. Floor 0.01.
ALIAS_FLOOR = floor_of(0.0048)


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_alias_two_seeds_rerun_to_their_own_committed_verdicts_and_values(exp, results):
    committed = results["alias"]["runs"]
    for seed, got in zip((0, 5), rerun(exp.alias_run, [0, 5])):
        want, what = committed[seed], f"alias, seed {seed}"
        for c in exp.ALIAS_SHIFTS:   # moving all pairs by hand is evaluating at offset c (notebook 06 §4)
            assert got[f"offset {c}: all"] == pytest.approx(got[f"offset {c}: offset arg"]), (what, c)
        # notebook 06 §4, paired by seed: at c = 100 moving the fast pairs costs less than moving the slow ones,
        # and less than moving the fast pairs by 10
        fast = lambda r, c: r[f"offset {c}: fast"]  # noqa: E731
        check_verdict(f"{what}: fast minus slow pairs at 100", *[fast(r, 100) - r["offset 100: slow"] for r in (got, want)],
                      0.0, 2 * ALIAS_FLOOR)
        check_verdict(f"{what}: fast pairs at 100 minus at 10", *[fast(r, 100) - fast(r, 10) for r in (got, want)], 0.0,
                      2 * ALIAS_FLOOR)
        for key in got:
            check_near(f"{what}: {key}", got[key], want[key], [r[key] for r in committed], ALIAS_FLOOR)


# Part "nope_probe", "2 layers + start token", seed 2 only. Its numbers move between CPUs about as much as they
# differ between seeds: largest moves at seeds 0, 1, 2 (measured 2026-12-02) up to 0.05-0.09 in accuracy and
# attention weight, against committed across-seed ranges of 0.03-0.09. So a per-seed band is no sharper than the
# spread here; what this seed adds is its verdicts (notebook 06 §6). Seeds 0 and 1 are fragile for the
# anchor verdict (removing attention to the start token in layer 1 drops accuracy below the one-layer model
# without positions, 0.314): their committed 0.249 and 0.283 sit within the floor (0.14, 0.115) of it; seed 2's
# 0.193 does not (floor 0.105). Floors: twice seed 2's largest moves.
NOPE_SEED, SK = 2, "2 layers + start token"
NOPE_MOVES = {"acc": 0.0319, "acc at 16": 0.0258, "acc at 32": 0.0105, "acc at 64": 0.0272, "probe r2": 0.0004,
              "layer0 corr with 1/(t+1)": 0.0001, "layer0 weight on start": 0.0165, "layer1 weight on start": 0.0134,
              "acc without start in layer 0": 0.0502, "acc without start in layer 1": 0.0334, "weight / (1/(t+1))": 0.04}
NOPE_FLOOR = {k: floor_of(v) for k, v in NOPE_MOVES.items()}
# the old test's margin around the committed range, kept where it is narrower than the floor: it is above
# every move measured there (at most 0.034 at seed 2)
NOPE_OUTER = 0.05


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_nope_probe_one_seed_reruns_to_its_own_committed_verdicts(exp, results):
    got = rerun(functools.partial(exp.nope_probe_run, configs=(SK,)), [NOPE_SEED])[0]
    committed = results["nope_probe"]["runs"]
    want, what, floor = committed[NOPE_SEED], f"nope probe, seed {NOPE_SEED}", NOPE_FLOOR

    def uniform_head(rec):   # the first layer's head whose weight on the start token tracks 1/(t+1) best
        corr = np.array(rec[f"{SK}/layer0 corr with 1/(t+1)"])
        w = np.array(rec[f"{SK}/layer0 weight on start"])[corr.argmax()]
        return corr.max(), w * (np.arange(1, len(w) + 1) + 1)

    (c_got, ratio_got), (c_want, ratio_want) = uniform_head(got), uniform_head(want)
    check_verdict(f"{what}: correlation with 1/(t+1)", c_got, c_want, 0.95, floor["layer0 corr with 1/(t+1)"])
    for bound in (0.9, 2.0):   # weight on the start token between 0.9 and 2 times 1/(t+1) at every t
        for end in (min, max):
            check_verdict(f"{what}: {end.__name__} over t of weight / (1/(t+1)) against {bound}", end(ratio_got),
                          end(ratio_want), bound, floor["weight / (1/(t+1))"])
    no_start_r2 = max(r["2 layers/probe r2"] for r in committed)
    check_verdict(f"{what}: position probe R^2 above the no-start-token models'", got[f"{SK}/probe r2"],
                  want[f"{SK}/probe r2"], no_start_r2, floor["probe r2"])
    one_layer_none = float(np.mean([r["lookback/none/grid"][0][0] for r in results["schemes"]["runs"]]))
    check_verdict(f"{what}: without the start token in layer 1, below one layer without positions",
                  got[f"{SK}/acc without start in layer 0"], want[f"{SK}/acc without start in layer 0"], one_layer_none,
                  floor["acc without start in layer 0"])
    rope_2l = min(r["lookback/rope/grid"][1][0] for r in results["schemes"]["runs"])
    check_verdict(f"{what}: at 2L_train, below RoPE's lowest seed", got[f"{SK}/acc at 32"], want[f"{SK}/acc at 32"], rope_2l,
                  floor["acc at 32"])
    for key, f in floor.items():
        if key.startswith("weight /"):
            continue
        k = f"{SK}/{key}"
        check_near(f"{what}: {key}", got[k], want[k], [r[k] for r in committed], f, min(f, NOPE_OUTER))


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


# Part "t5", look-back, seed 3 (as before): it first reaches 0.95 at step 50 (0.858 at 40, 0.962 at 50), the same
# step as its sinusoidal model (a tie in notebook 06 §2's count). Largest move over seeds 0-5, measured
# 2026-12-02: curve 0.0018, grid 0.0005, accuracy and far weight 0. Floor 0.005.
T5_SEED, T5_FLOOR = 3, floor_of(0.0018)


@pytest.mark.slow  # re-trains: the full check (.ci/run), not the README's command
def test_t5_one_seed_reruns_to_its_own_committed_verdicts_and_values(exp, results):
    got = rerun(functools.partial(exp.t5_run, schemes=("t5",), tasks=("lookback",)), [T5_SEED])[0]
    committed, schemes = results["t5"]["runs"], results["schemes"]["runs"][T5_SEED]
    want, what = committed[T5_SEED], f"t5, seed {T5_SEED}"
    check_crossing(f"{what}: first evaluation at 0.95", got["lookback/t5/curve"], want["lookback/t5/curve"], 0.95, T5_FLOOR)
    # notebook 06 §2: t5 minus sinusoidal, steps to 0.95 (a tie for this seed)
    assert got["lookback/t5/steps95"] - schemes["lookback/sinusoidal/steps95"] == (
        want["lookback/t5/steps95"] - schemes["lookback/sinusoidal/steps95"]), what
    for j, n in ((1, "2L_train"), (2, "4L_train")):   # 06a: t5 ahead of RoPE on look-back at 2L and 4L_train
        check_verdict(f"{what}: t5 minus RoPE at {n}", *[r["lookback/t5/grid"][j][0] - schemes["lookback/rope/grid"][j][0]
                                                        for r in (got, want)], 0.0, T5_FLOOR)
    for part in ("acc", "curve", "grid", "far"):
        key = f"lookback/t5/{part}"
        check_near(f"{what}: {part}", got[key], want[key], [r[key] for r in committed], T5_FLOOR)
