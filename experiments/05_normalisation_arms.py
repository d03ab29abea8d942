"""Both normalisation choices of the recomputed importance order, on the same retrained models (notebook 05 §3, appendix 05a §2).

Run from the repository root:

    python experiments/05_normalisation_arms.py        # 16 seeds, about 4 CPU-minutes

Per seed, the ``pruning`` model of ``experiments/05_head_redundancy_sweeps.py`` is trained
again (``train_mixed(seed)``: same data, same early stop at 0.995) and pruned in three orders,
every one on the same model and the same held-out test set:

* ``fixed``: the full model's importance, each layer divided by its l2 norm, order fixed.
* ``inside``: importance recomputed after every pruning step; the pruned heads (gate 0, whose
  gradient is not zero) stay in each layer's l2 norm, as in Hugging Face's bertology example
  (``helpers.heads.pruning_curve(..., recompute=True, normalize=True)``).
* ``outside``: recomputed likewise, but the pruned heads are zeroed before the layer's l2 norm
  is taken, so only the remaining heads set the scale.

A retraining does not reproduce the models of the ``pruning`` key bit for bit (the CPU's
kernels sum in another order), so this file is a new draw of that experiment with all three
arms paired on each model; the ``pruning`` key is left as it was. Results, with the CPU
capability, go to ``experiments/results/05_normalisation_arms.json``;
``tests/test_experiments_05_norm.py`` re-runs one seed.
"""
from __future__ import annotations

import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers import heads as hd  # noqa: E402
from helpers.lab import sweep  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "05_normalisation_arms.json"
SEEDS = list(range(16))
TOLERANCE = 0.01

_spec = importlib.util.spec_from_file_location("ex05_sweeps", ROOT / "experiments" / "05_head_redundancy_sweeps.py")
ex05 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex05)


def outside_order(model, imp_data) -> list[tuple[int, int]]:
    """Recomputed importance order with the pruned heads left out of each layer's l2 norm."""
    L, H = hd._heads(model)
    mask = torch.ones(L, H)
    order: list[tuple[int, int]] = []
    while len(order) < L * H:
        imp = hd.head_importance(model, imp_data, normalize=False, head_mask=mask).cpu() * mask
        imp = imp / imp.norm(dim=1, keepdim=True).clamp_min(1e-20)
        i = int(imp.masked_fill(mask == 0, float("inf")).flatten().argmin())
        nxt = (i // H, i % H)
        mask[nxt] = 0.0
        order.append(nxt)
    return order


def run_arms(seed: int) -> dict:
    model, result, split, test = ex05.train_mixed(seed)
    imp_data = (split.train[0][:1024], split.train[1][:1024])
    curves = {
        "fixed": hd.pruning_curve(model, test, hd.head_importance(model, imp_data, normalize=True)),
        "inside": hd.pruning_curve(model, test, "importance", recompute=True, normalize=True,
                                   importance_batches=imp_data),
        "outside": hd.pruning_curve(model, test, outside_order(model, imp_data)),
    }
    out = {"steps": result.steps, "val_acc": result.val_acc, "test_acc": float(curves["fixed"].accuracy[0])}
    for arm, c in curves.items():
        out[arm] = {"frac": c.max_prunable(TOLERANCE), "accuracy": c.accuracy.tolist(),
                    "order": [list(o) for o in c.order]}
    return out


def main() -> None:
    t0 = time.time()
    runs = sweep(run_arms, SEEDS).runs
    data = {"meta": {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                     "machine": platform.machine(), "python": platform.python_version(),
                     "script": "experiments/05_normalisation_arms.py", "tolerance": TOLERANCE},
            "seeds": SEEDS, "runs": runs, "seconds": round(time.time() - t0, 1)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1))
    print(f"{len(SEEDS)} seeds: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
