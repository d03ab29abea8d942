"""Seed sweeps behind notebooks/05_head_redundancy.ipynb, too long to run inside the notebook.

Run from the repository root:

    python experiments/05_head_redundancy_sweeps.py            # everything (40 min on 2 cores shared with other jobs)
    python experiments/05_head_redundancy_sweeps.py pruning    # one experiment (names: see EXPERIMENTS)

Each experiment is a function ``fn(seed) -> dict`` run over its seeds with
:func:`helpers.sweep` (``seed_everything(seed)`` before each call, forked workers). The
results, with the seeds, torch version, CPU capability and machine, are merged into
``experiments/results/05_head_redundancy_sweeps.json``; the notebook loads that file.
``model`` saves the trained model that the notebook analyses
(``experiments/results/05_mixed_model.pt``, seed 0, the notebook's section-1 settings);
``saved_random_curves`` prunes it in 10 random orders (the notebook re-checks one live).
``tests/test_experiments_05.py`` re-runs two seeds of the short experiments and checks
that they land inside the committed spread.

Experiments (the notebook section in brackets):

* ``pruning`` [3]: a 2-layer, 8-head model on the mixed task per seed; head importance
  estimated on training data, pruning accuracy on a held-out test set; importance order
  (fixed, layer-normalised: Michel et al.'s released default), recomputed after each step,
  and 10 random orders.
* ``two_layer`` [5a]: TwoPositionTask, 2 layers, d_model 16, 1 vs 4 heads, 300 steps.
* ``one_layer`` [5b]: one layer; d_model 16 with 1 or 2 heads, d_model 64 with 1 head;
  learning rates 1e-3, 2e-3, 5e-3; up to 2000 steps.
* ``gqa`` [6]: mixed task, MHA / GQA (4 K/V heads) / MQA (1 K/V head), 600 steps, and
  Ainslie et al.'s uptraining: the trained MHA model's K/V heads mean-pooled into 4 and 1
  groups, then 30 more training steps.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import helpers  # noqa: E402
from helpers import TinyTransformer, TwoPositionTask, evaluate, first_step_reaching, make_task, sweep, train  # noqa: E402
from helpers import heads as hd  # noqa: E402
from helpers.viz.heads import spearman  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "05_head_redundancy_sweeps.json"
MODEL_PATH = ROOT / "experiments" / "results" / "05_mixed_model.pt"

# ---------------------------------------------------------------- shared settings
MIXED = dict(d_model=64, num_heads=8, num_layers=2, d_ff=128, pos="rope")
N_RANDOM_ORDERS = 10
TWO_POS = dict(num_symbols=8, seq_len=12, offsets=(1, 3))
LRS = (1e-3, 2e-3, 5e-3)
ONE_LAYER_ARMS = {"d16 1 head": (16, 1), "d16 2 heads": (16, 2), "d64 1 head": (64, 1)}
GQA_STEPS, UPTRAIN_STEPS = 600, 30
ONE_LAYER_STEPS, TWO_LAYER_STEPS = 2000, 300

SEEDS = {
    "pruning": list(range(8)),
    "two_layer": list(range(10)),
    "one_layer": list(range(5)),
    "gqa": list(range(5)),
}


def mixed_data(seed: int):
    """Train/validation split of the mixed task (seed 0 = the notebook's) and a held-out test set."""
    task = make_task("mixed")
    split = task.split(2048, 512, seed=seed)
    test = task.make(512, seed=10_000 + seed)
    return task, split, test


def train_mixed(seed: int, num_kv_heads=None, steps: int = 400, stop: bool = True):
    task, split, test = mixed_data(seed)
    model = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=seed, num_kv_heads=num_kv_heads, **MIXED)
    result = train(model, split, steps=steps, seed=seed, eval_every=25, stop_at_acc=0.995 if stop else None,
                   forward_kwargs={"need_weights": False})
    return model, result, split, test




# ------------------------------------------------------------------- experiments
def run_pruning(seed: int) -> dict:
    model, result, split, test = train_mixed(seed)
    imp_data = (split.train[0][:1024], split.train[1][:1024])
    imp_norm = hd.head_importance(model, imp_data, normalize=True)
    abl = hd.ablation_importance(model, test)
    fixed = hd.pruning_curve(model, test, imp_norm)                      # scores -> fixed order
    recomp = hd.pruning_curve(model, test, "importance", recompute=True, normalize=True,
                              importance_batches=imp_data)
    raw = hd.pruning_curve(model, test, hd.head_importance(model, imp_data))
    rand = [hd.pruning_curve(model, test, "random", seed=s).max_prunable(0.01) for s in range(N_RANDOM_ORDERS)]
    return {
        "steps": result.steps, "val_acc": result.val_acc, "test_acc": float(fixed.accuracy[0]),
        "frac_fixed_norm": fixed.max_prunable(0.01), "frac_recomputed": recomp.max_prunable(0.01),
        "frac_fixed_raw": raw.max_prunable(0.01),
        "frac_random_mean": sum(rand) / len(rand), "frac_random": rand,
        "rho_importance_ablation": spearman(imp_norm, abl),
        "n_heads_cost_le_1pt": int((abl <= 0.01).sum()),
    }


def run_two_layer_heads(heads: int):
    def fn(seed: int) -> dict:
        task = TwoPositionTask(**TWO_POS)
        split = task.split(2048, 256, seed=0)
        model = TinyTransformer(task.vocab_size, 16, heads, 2, 12, pos="rope", seed=seed)
        r = train(model, split, steps=TWO_LAYER_STEPS, lr=5e-3, seed=seed, eval_every=10, forward_kwargs={"need_weights": False})
        acc = [a for _, _, a in r.history]
        w = hd.attention_maps(model, split.val[0])                 # (layers, examples, heads, query, key)
        entropy = hd.attention_entropy(w[..., 1:, :]).mean().item()  # skip query 0 (one key)
        return {"acc": acc, "entropy": entropy, "steps_to_99": first_step_reaching(r.history, 0.99),
                "steps_to_95": first_step_reaching(r.history, 0.95),
                "acc_at_80": dict((st, a) for st, _, a in r.history)[80], "final_acc": r.val_acc}
    return fn


def run_one_layer(seed: int) -> dict:
    task = TwoPositionTask(**TWO_POS)
    split = task.split(2048, 256, seed=0)
    out = {}
    for arm, (d, h) in ONE_LAYER_ARMS.items():
        for lr in LRS:
            model = TinyTransformer(task.vocab_size, d, h, 1, 12, pos="rope", seed=seed)
            r = train(model, split, steps=ONE_LAYER_STEPS, lr=lr, seed=seed, eval_every=25, stop_at_acc=0.995,
                      forward_kwargs={"need_weights": False})
            key = f"{arm} lr {lr:g}"
            out[f"{key}: steps_to_99"] = first_step_reaching(r.history, 0.99)
            out[f"{key}: best_acc"] = max(a for _, _, a in r.history)
            out[f"{key}: final_acc"] = r.val_acc
    return out


def run_gqa(seed: int) -> dict:
    out = {}
    for g, name in ((8, "MHA"), (4, "GQA"), (1, "MQA")):
        model, r, split, test = train_mixed(seed, num_kv_heads=g, steps=GQA_STEPS, stop=False)
        out[f"{name}: acc"] = [a for _, _, a in r.history]
        out[f"{name}: steps_to_99"] = first_step_reaching(r.history, 0.99)
        out[f"{name}: final_acc"] = r.val_acc
        if g == 8:
            mha = model
    for g, name in ((4, "GQA"), (1, "MQA")):
        pooled = hd.mean_pool_kv_heads(mha, g)
        out[f"uptrain {name}: acc_pooled"] = evaluate(pooled, split.val)[1]
        r = train(pooled, split, steps=UPTRAIN_STEPS, seed=seed, eval_every=5, forward_kwargs={"need_weights": False})
        out[f"uptrain {name}: acc"] = [a for _, _, a in r.history]
        out[f"uptrain {name}: final_acc"] = r.val_acc
    return out


def save_model() -> dict:
    helpers.seed_everything(0)
    model, result, _, _ = train_mixed(0)
    MODEL_PATH.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), MODEL_PATH)
    return {"steps": result.steps, "val_acc": result.val_acc, "history": result.history,
            "bytes": MODEL_PATH.stat().st_size}


def saved_model_random_curves() -> dict:
    """The saved model's pruning curves in 10 random orders (the notebook re-checks one of them live)."""
    helpers.seed_everything(0)
    task, split, test = mixed_data(0)
    model = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=0, **MIXED)
    model.load_state_dict(torch.load(MODEL_PATH))
    model.eval()
    out = {}
    for s in range(N_RANDOM_ORDERS):
        c = hd.pruning_curve(model, test, "random", seed=s)
        out[str(s)] = {"order": [list(o) for o in c.order], "accuracy": c.accuracy.tolist(), "loss": c.loss.tolist()}
    return out


EXPERIMENTS = {
    "pruning": lambda seeds: sweep(run_pruning, seeds).runs,
    "two_layer": lambda seeds: {f"{h} head(s)": sweep(run_two_layer_heads(h), seeds).runs for h in (1, 4)},
    "one_layer": lambda seeds: sweep(run_one_layer, seeds).runs,
    "gqa": lambda seeds: sweep(run_gqa, seeds).runs,
}


def _clean(x):
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def main(names) -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data["meta"] = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "script": "experiments/05_head_redundancy_sweeps.py"}
    for name in names:
        t0 = time.time()
        if name == "model":
            data["model"] = _clean(save_model())
        elif name == "saved_random_curves":
            data[name] = saved_model_random_curves()
        else:
            data[name] = {"seeds": SEEDS[name], "runs": _clean(EXPERIMENTS[name](SEEDS[name]))}
        data.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(data, indent=1))
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["model", "saved_random_curves", "pruning", "two_layer", "gqa", "one_layer"])
