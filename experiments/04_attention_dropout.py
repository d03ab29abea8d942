"""Appendix notebook 04a, section 2 (it was notebook 04 §5b): attention dropout next to residual dropout, over the same 8 seeds.

Four arms on the setting of ``experiments/regularization_ablation.py`` (associative recall,
256 training and 512 validation sequences, a 2-layer 4-head ``TinyTransformer`` with RoPE,
300 AdamW steps at lr 5e-3): no dropout, residual (and embedding) dropout 0.1, attention
dropout 0.1 (on the softmax probabilities before they multiply V: GPT-2's ``attn_pdrop``,
BERT's ``attention_probs_dropout_prob``), and both. Seed ``s`` fixes the data, the
initialisation and the batch order for every arm, so each seed is a paired comparison (the
dropout masks cannot match across arms: arms that drop at different sites draw different
numbers of random values). The runs use ``regularization_ablation.run_config``, the same training
code as the committed ablation; the "none" and "dropout 0.1" arms are re-run here (not read
from that file) so that all four arms come from one run of one script on one machine.

Run from the repository root:  ``python experiments/04_attention_dropout.py``.
The committed run took 1269 s (about 21 minutes; the JSON's ``seconds``) on a machine shared
with other jobs; the earlier estimate of about 4 minutes on two idle cores was not re-measured.
It writes ``experiments/results/04_attention_dropout.json``;
appendix notebook 04a loads it and ``tests/test_experiments_04.py`` re-runs two seeds.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:           # run as a file from the repository root: make `helpers` importable
    sys.path.insert(0, str(HERE.parent))

RESULTS = HERE / "results" / "04_attention_dropout.json"
_spec = importlib.util.spec_from_file_location("regularization_ablation", HERE / "regularization_ablation.py")
ablation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ablation)

SEEDS = list(ablation.SEEDS)
SETTINGS = dict(ablation.SETTINGS)
ARMS = {
    "none": {},
    "dropout 0.1": {"dropout": 0.1},
    "attention dropout 0.1": {"attn_dropout": 0.1},
    "dropout + attention dropout": {"dropout": 0.1, "attn_dropout": 0.1},
}


def run(seed: int, arm: str) -> dict:
    """One arm at one seed: the metrics of ``regularization_ablation.run_config``."""
    return ablation.run_config(seed, ARMS[arm])


def measure(seeds=SEEDS, arms=tuple(ARMS)) -> dict:
    return ablation.measure_arms(run, seeds, arms)


def main() -> None:
    t0 = time.perf_counter()
    runs = measure()
    out = {
        "what": "appendix notebook 04a section 2: attention dropout vs residual dropout on associative recall, 256 training sequences",
        "script": "experiments/04_attention_dropout.py",
        "seeds": SEEDS, "settings": SETTINGS, "arms": ARMS,
        "curve_steps": list(range(SETTINGS["eval_every"], SETTINGS["steps"] + 1, SETTINGS["eval_every"])),
        "machine": ablation.machine(),
        "seconds": round(time.perf_counter() - t0),
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS} in {out['seconds']} s")
    for arm, rs in runs.items():
        print(f"{arm:28s} val acc " + " ".join(f"{r['val_acc']:.3f}" for r in rs))


if __name__ == "__main__":
    main()
