"""Seed sweeps behind notebooks/05_head_redundancy.ipynb, too long to run inside the notebook.

Run from the repository root:

    python experiments/05_head_redundancy_sweeps.py            # everything (40 min on 2 cores shared with other jobs)
    python experiments/05_head_redundancy_sweeps.py pruning    # one experiment (names: see EXPERIMENTS)

Each experiment is a function ``fn(seed) -> dict`` run over its seeds with
:func:`helpers.lab.sweep` (``seed_everything(seed)`` before each call, forked workers). The
results, with the seeds, torch version, CPU capability and machine, are merged into
``experiments/results/05_head_redundancy_sweeps.json``; the notebook loads that file.
``model`` saves the trained model that the notebook analyses
(``experiments/results/05_mixed_model.pt``, seed 0, the notebook's section-1 settings);
``saved_random_curves`` prunes it in 10 random orders (the notebook re-checks one live).
``tests/test_experiments_05.py`` re-runs seeds of the short experiments and checks that each
reproduces its own committed verdict, within a band of its own value (CONTRIBUTING.md).

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
* ``pruning_budget`` [3]: the ``pruning`` models trained for a fixed 1200 steps without
  early stopping (same seeds, same data), snapshots at steps 100, 200, 400, 800 and 1200
  pruned as in ``pruning`` (fixed layer-normalised importance order, 10 random orders):
  prunability against training step, as Michel et al.'s sec. 6 asks (about 5 min).
* ``one_layer_head_only`` [5b]: the control for ``one_layer``'s wide arm: residual width
  16 as in the small arms, only the attention head widened to 64
  (:class:`WideHeadAttention`: W^Q, W^K, W^V 16 -> 64, W^O 64 -> 16); same learning rates,
  seeds, data and budget (about 4 min).
* ``one_layer_narrow_head`` [5b]: the complement of ``one_layer_head_only``: residual width
  64 as in the wide arm, one head of width 16 (everything widens except the head;
  ``head_only_model(vocab, seed, d_model=64, head_dim=16)``); same learning rates, seeds,
  data and budget (about 4 min on busy cores).

The experiments above were run once; the last three were added later as new keys, so that
the full sweep (about 40 min) need not be re-run: ``python ... pruning_budget``. A key
merged in later records its own ``meta`` when its machine differs from the file's.
"""
from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import helpers  # noqa: E402
from helpers import TinyTransformer, TwoPositionTask, apply_rope, evaluate, make_task, train  # noqa: E402
from helpers import heads as hd  # noqa: E402
from helpers.lab import first_step_reaching, sweep  # noqa: E402
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
    "pruning_budget": list(range(8)),
    "one_layer_head_only": list(range(5)),
    "one_layer_narrow_head": list(range(5)),
}
BUDGET_STEPS, BUDGET_SNAPSHOTS = 1200, (100, 200, 400, 800, 1200)
HEAD_ONLY_WIDTH = 64
NARROW_HEAD_D_MODEL, NARROW_HEAD_WIDTH = 64, 16


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


class _SnapshotAdamW(torch.optim.AdamW):
    """AdamW that copies the parameters after the optimizer steps listed in ``at`` (same updates as AdamW)."""

    def __init__(self, params, at, **kw):
        super().__init__(params, **kw)
        self.at, self.n_steps, self.snapshots = set(at), 0, {}

    @torch.no_grad()
    def step(self, closure=None):
        out = super().step(closure)
        self.n_steps += 1
        if self.n_steps in self.at:
            self.snapshots[self.n_steps] = [p.detach().clone() for g in self.param_groups for p in g["params"]]
        return out


def run_pruning_budget(seed: int, steps: int = BUDGET_STEPS, snapshots: tuple = BUDGET_SNAPSHOTS,
                       n_random: int = N_RANDOM_ORDERS) -> dict:
    """The ``pruning`` model of this seed trained for a fixed budget; each snapshot pruned as in ``pruning``.

    ``steps``/``snapshots``/``n_random`` shorten the run for the re-run test (the learning rate is
    constant, so the first 400 steps of a 1200-step run are the same steps)."""
    task, split, test = mixed_data(seed)
    model = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=seed, **MIXED)
    holder = {}

    def make_opt(params):
        holder["opt"] = _SnapshotAdamW(params, snapshots, lr=3e-3, weight_decay=0.0)  # train()'s default
        return holder["opt"]

    result = train(model, split, steps=steps, seed=seed, eval_every=25, optimizer=make_opt,
                   forward_kwargs={"need_weights": False})
    imp_data = (split.train[0][:1024], split.train[1][:1024])
    out = {"history": result.history}
    for step, tensors in sorted(holder["opt"].snapshots.items()):
        snap = TinyTransformer(task.vocab_size, max_len=task.seq_len, seed=seed, **MIXED)
        with torch.no_grad():
            for p, t in zip(snap.parameters(), tensors):
                p.copy_(t)
        snap.eval()
        fixed = hd.pruning_curve(snap, test, hd.head_importance(snap, imp_data, normalize=True))
        rand = [hd.pruning_curve(snap, test, "random", seed=s).max_prunable(0.01) for s in range(n_random)]
        out[f"step {step}"] = {"val_acc": evaluate(snap, split.val)[1], "test_acc": float(fixed.accuracy[0]),
                               "frac_fixed_norm": fixed.max_prunable(0.01), "frac_random": rand,
                               "frac_random_mean": sum(rand) / len(rand), "curve_fixed": fixed.accuracy.tolist()}
    return out


class WideHeadAttention(nn.Module):
    r"""One attention head of width ``head_dim`` on a residual stream of width ``d_model``.

    :math:`W^Q, W^K, W^V: d_\text{model} \to d_h` and :math:`W^O: d_h \to d_\text{model}`, RoPE on
    :math:`q, k` (``helpers.apply_rope``, base 10000, :math:`d_h/2` frequencies), causal softmax:
    what ``MultiHeadAttention(d_model, 1, rope=True)`` computes when ``head_dim == d_model``
    (tests/test_experiments_05.py checks that). Only the head widens; embeddings, LayerNorms and
    the feed-forward layer keep the model's width. Input ``(batch, seq, d_model)``, output the
    same and weights ``(batch, 1, seq, seq)``.
    """

    def __init__(self, d_model: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.d_model = 1, 1, head_dim, d_model
        self.linear_q, self.linear_k, self.linear_v = (nn.Linear(d_model, head_dim) for _ in range(3))
        self.linear_out = nn.Linear(head_dim, d_model)

    def forward(self, query, key=None, value=None, mask=None, head_mask=None, need_weights=True, positions=None,
                **unused):
        q, k, v = (lin(query)[:, None] for lin in (self.linear_q, self.linear_k, self.linear_v))  # (b, 1, n, d_h)
        q, k = apply_rope(q, positions), apply_rope(k, positions)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        w = torch.softmax(scores, dim=-1)
        heads = w @ v
        if head_mask is not None:
            heads = heads * torch.as_tensor(head_mask, dtype=heads.dtype).reshape(-1, 1, 1, 1)
        return self.linear_out(heads[:, 0]), (w if need_weights else None)


def head_only_model(vocab_size: int, seed: int, d_model: int = 16, head_dim: int = HEAD_ONLY_WIDTH) -> TinyTransformer:
    """A one-layer ``TinyTransformer`` of width ``d_model`` whose only head has width ``head_dim``."""
    model = TinyTransformer(vocab_size, d_model, 1, 1, 12, pos="none", seed=seed)  # RoPE lives in the new head
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.blocks[0].attn = WideHeadAttention(d_model, head_dim)
    return model


def _run_one_head(seed: int, lrs: tuple, d_model: int, head_dim: int) -> dict:
    """One layer, residual width ``d_model``, one head of width ``head_dim``, at each learning rate."""
    task = TwoPositionTask(**TWO_POS)
    split = task.split(2048, 256, seed=0)  # the data of one_layer (shared by all seeds, as there)
    build = lambda: head_only_model(task.vocab_size, seed, d_model=d_model, head_dim=head_dim)  # noqa: E731
    out = {"params": sum(p.numel() for p in build().parameters())}
    for lr in lrs:
        model = build()
        r = train(model, split, steps=ONE_LAYER_STEPS, lr=lr, seed=seed, eval_every=25, stop_at_acc=0.995,
                  forward_kwargs={"need_weights": False})
        key = f"d{d_model} head {head_dim} lr {lr:g}"
        out[f"{key}: steps_to_99"] = first_step_reaching(r.history, 0.99)
        out[f"{key}: best_acc"] = max(a for _, _, a in r.history)
        out[f"{key}: final_acc"] = r.val_acc
    return out


def run_one_layer_head_only(seed: int, lrs: tuple = LRS) -> dict:
    """One layer, residual width 16, one head of width 64 (only the head widens), at each learning rate."""
    return _run_one_head(seed, lrs, d_model=16, head_dim=HEAD_ONLY_WIDTH)


def run_one_layer_narrow_head(seed: int, lrs: tuple = LRS) -> dict:
    """One layer, residual width 64, one head of width 16 (everything but the head widens), at each rate."""
    return _run_one_head(seed, lrs, d_model=NARROW_HEAD_D_MODEL, head_dim=NARROW_HEAD_WIDTH)


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
    "pruning_budget": lambda seeds: sweep(run_pruning_budget, seeds).runs,
    "one_layer_head_only": lambda seeds: sweep(run_one_layer_head_only, seeds).runs,
    "one_layer_narrow_head": lambda seeds: sweep(run_one_layer_narrow_head, seeds).runs,
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
    meta = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(), "script": "experiments/05_head_redundancy_sweeps.py"}
    # The top-level meta says where the file's first sweep was made; a key merged in later
    # carries its own (its CPU may differ from that of the keys it is merged beside).
    if "meta" not in data or set(names) >= set(EXPERIMENTS) | {"model", "saved_random_curves"}:
        data["meta"] = meta
    for name in names:
        t0 = time.time()
        if name == "model":
            data["model"] = _clean(save_model())
        elif name == "saved_random_curves":
            data[name] = saved_model_random_curves()
        else:
            data[name] = {"seeds": SEEDS[name], "runs": _clean(EXPERIMENTS[name](SEEDS[name]))}
            if meta != data["meta"]:
                data[name]["meta"] = meta
        data.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(data, indent=1))
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["model", "saved_random_curves", "pruning", "two_layer", "gqa", "one_layer",
                          "pruning_budget", "one_layer_head_only", "one_layer_narrow_head"])
