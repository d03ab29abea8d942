"""Notebook 04, section 5: the regularization ablation on the tiny transformer, over seeds.

Five arms (none, residual dropout 0.1, label smoothing 0.1, both, AdamW weight decay 0.1),
each trained with the same 8 seeds. Seed ``s`` fixes the data (256 training and 512
validation sequences of associative recall), the initialisation, the batch order and the
dropout masks, and is the same for every arm: each seed is a paired comparison.

The sweep takes about 2 minutes on two cores, too long for a notebook that must run in
under a minute, so this script computes it once and writes
``experiments/results/04_regularization_ablation.json``; notebook 04 loads that file, and
``tests/test_experiments.py`` re-runs two seeds and checks that each reproduces its own
committed verdicts, within a band of its own values measured against another CPU kernel level
and the perturbed-arithmetic pass (a trained model's last digits differ between CPUs).

Each run also records its validation accuracy at each of the four query positions
(``val_acc_by_query``): the last query is where a key-blind "answer a context value not yet
used" rule would score 1 (notebook 03 §6).

Run from the repository root:  ``python experiments/regularization_ablation.py``
"""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import torch

import helpers
from helpers import (
    AssociativeRecallTask,
    TinyTransformer,
    attention_at_offset,
    attention_maps,
    evaluate,
    induction_score,
    train,
)
from helpers.lab import sweep
from helpers.regularization import label_smoothing_cross_entropy

RESULTS = Path(__file__).resolve().parent / "results" / "04_regularization_ablation.json"
SEEDS = list(range(8))
ARMS = {
    "none": {},
    "dropout 0.1": {"dropout": 0.1},
    "label smoothing 0.1": {"smoothing": 0.1},
    "dropout + smoothing": {"dropout": 0.1, "smoothing": 0.1},
    "weight decay 0.1": {"weight_decay": 0.1},
}
SETTINGS = dict(n_train=256, n_val=512, d_model=32, num_heads=4, num_layers=2, steps=300, batch_size=64, lr=5e-3,
                eval_every=25)
TASK = AssociativeRecallTask()          # 8 keys, 8 values, 4 pairs, 4 queries (notebook 03's task)


def smoothed_loss(eps: float):
    def loss(logits, targets):
        return label_smoothing_cross_entropy(logits.flatten(0, -2), targets.flatten(), eps)
    return loss


def run(seed: int, arm: str) -> dict:
    """Train one arm at one seed; return its metrics, its validation curve and its circuit scores."""
    return run_config(seed, ARMS[arm])


def run_config(seed: int, cfg: dict) -> dict:
    """Train one configuration (keys ``dropout``, ``attn_dropout``, ``smoothing``, ``weight_decay``, all optional)
    at one seed; ``experiments/04_attention_dropout.py`` reuses it with attention dropout."""
    s = SETTINGS
    split = TASK.split(s["n_train"], s["n_val"], seed=seed)
    model = TinyTransformer(TASK.vocab_size, s["d_model"], s["num_heads"], s["num_layers"], TASK.seq_len, pos="rope",
                            dropout=cfg.get("dropout", 0.0), attn_dropout=cfg.get("attn_dropout", 0.0), seed=seed)
    loss_fn = smoothed_loss(cfg["smoothing"]) if "smoothing" in cfg else helpers.cross_entropy_loss
    res = train(model, split, steps=s["steps"], batch_size=s["batch_size"], lr=s["lr"],
                weight_decay=cfg.get("weight_decay", 0.0), loss_fn=loss_fn, seed=seed, eval_every=s["eval_every"],
                forward_kwargs={"need_weights": False})
    train_ce, train_acc = evaluate(model, split.train)          # plain cross-entropy for every arm
    val_ce, val_acc = evaluate(model, split.val)
    x_val, y_val = split.val
    scored = y_val != helpers.IGNORE_INDEX
    with torch.no_grad():
        probs = model(x_val, need_weights=False)[scored].softmax(-1)
    conf, pred = probs.max(-1)
    wrong = pred != y_val[scored]
    # accuracy at each of the 4 query positions: every key is queried once, so a key-blind rule that
    # answers a context value not yet used would be right at the last query every time (notebook 03 §6)
    query_pos = torch.arange(2 * TASK.num_pairs, TASK.seq_len, 2)
    with torch.no_grad():
        pred_all = model(x_val, need_weights=False).argmax(-1)
    acc_by_query = (pred_all[:, query_pos] == y_val[:, query_pos]).float().mean(0)
    nll = -probs.gather(1, y_val[scored][:, None]).squeeze(1).log()
    # the circuit of notebook 03: layer 0 looks back one step at the values, layer 1 finds the matching value
    P = TASK.num_pairs
    value_rows = torch.zeros_like(x_val, dtype=torch.bool)
    value_rows[:, 1:2 * P:2] = True
    maps = attention_maps(model, x_val)
    prev = attention_at_offset(maps, 1, value_rows)[0]
    induct = induction_score(maps, x_val, scored)[1]
    return {
        "train_ce": train_ce, "train_acc": train_acc, "val_ce": val_ce, "val_acc": val_acc,
        "wrong_conf": float(conf[wrong].mean()) if wrong.any() else float("nan"),
        "ce_share_confident_wrong": float(nll[wrong & (conf > 0.9)].sum() / nll.sum()),
        "prev_token": float(prev.max()), "induction": float(induct.max()),
        "val_acc_by_query": [float(a) for a in acc_by_query],
        "curve": [acc for _, _, acc in res.history],
    }


def measure_arms(run, seeds, arms) -> dict:
    """``{arm: [the metrics of run(seed, arm) for each seed]}``, each arm's seeds in one ``helpers.lab.sweep``."""
    return {arm: sweep(lambda seed, arm=arm: run(seed, arm), seeds).runs for arm in arms}


def machine() -> dict:
    """What a committed result was computed on (torch, its CPU kernel level, Python, platform)."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": sys.version.split()[0], "platform": platform.platform(), "processor": platform.machine()}


def measure(seeds=SEEDS, arms=tuple(ARMS)) -> dict:
    return measure_arms(run, seeds, arms)


def main() -> None:
    t0 = time.perf_counter()
    runs = measure()
    out = {
        "what": "notebook 04 section 5: regularization ablation on associative recall, 256 training sequences",
        "script": "experiments/regularization_ablation.py",
        "seeds": SEEDS, "settings": SETTINGS, "arms": ARMS,
        "curve_steps": list(range(SETTINGS["eval_every"], SETTINGS["steps"] + 1, SETTINGS["eval_every"])),
        "machine": machine(),
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS} "
          f"in {time.perf_counter() - t0:.0f} s")
    for arm, rs in runs.items():
        print(f"{arm:22s} val acc " + " ".join(f"{r['val_acc']:.3f}" for r in rs))


if __name__ == "__main__":
    main()
