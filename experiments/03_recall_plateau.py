"""Notebook 03 §6b and §6c: how long the plateau before the induction jump lasts, over 8 seeds.

Per seed, :func:`recall_run` trains §6's model on §6's task, with this seed's data: associative
recall (``AssociativeRecallTask``: 8 keys, 8 values, 4 pairs in context, 4 queries; 2048 training
and 512 validation sequences drawn with ``seed``), a ``TinyTransformer`` with 2 layers of 2 heads,
d_model 32 and RoPE (initialised with ``seed``), AdamW at lr 3e-3, batches of 64 (shuffled with
``seed``). It evaluates every 25 steps and stops at the first evaluation with validation accuracy
>= 0.99, or at 500 steps. Every 25 steps it also probes the circuit of §6 on the validation set:
the layer-1 matching-value score of the best head and the accuracy at each of the 4 queries.

Run from the repository root:  ``python experiments/03_recall_plateau.py``  (seeds 0-7 with
:func:`helpers.lab.sweep`, one worker process per core; the committed run took 17 s on two cores shared
with other jobs: the JSON's ``seconds``). It writes ``experiments/results/03_recall_plateau.json``
(seeds, settings, torch version, CPU kernel level, machine, seconds, one record per seed; a
step-to-threshold never reached is stored as the string ``"inf"``). Notebook 03 §6b trains two
seeds live and reads the 8-seed table, figure and asserts from that file (:func:`load_sweep`);
``tests/test_experiments_03.py`` checks the file against this script and re-runs two seeds.
"""
from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:           # run as a file from the repository root: make `helpers` importable
    sys.path.insert(0, str(HERE.parent))

from helpers import AssociativeRecallTask, TinyTransformer, attention_at_offset, induction_score, train  # noqa: E402
from helpers.lab import SweepResult, first_step_reaching, sweep  # noqa: E402

RESULTS = HERE / "results" / "03_recall_plateau.json"
SEEDS = list(range(8))
TASK = AssociativeRecallTask(num_keys=8, num_values=8, num_pairs=4, num_queries=4)   # §6's task
P = TASK.num_pairs
VALUE_POS = torch.arange(1, 2 * P, 2)                  # positions of the context values v_1 .. v_4
QUERY_POS = torch.arange(2 * P, TASK.seq_len, 2)       # positions of the queried keys (answers scored there)
SETTINGS = dict(task=repr(TASK), n_train=2048, n_val=512, d_model=32, num_heads=2, num_layers=2, pos="rope",
                max_steps=500, batch_size=64, lr=3e-3, eval_every=25, stop_at_acc=0.99, probe_every=25)
KEYS = ("steps_to_99", "final_acc", "acc_at_50", "curve", "curve_by_query", "prev_end", "match_end",
        "plateau_match_max")


def recall_run(seed, max_steps=500):
    """Train §6's model on this seed's data; return when it reached 0.99 and what its circuit looked like.

    Returns ``steps_to_99`` (the first evaluation with validation accuracy >= 0.99, ``inf`` if none
    within ``max_steps``), ``final_acc``, ``acc_at_50``, ``curve`` (validation accuracy every 25 steps),
    ``curve_by_query`` (the accuracy at each of the 4 queries at those steps), ``prev_end`` and
    ``match_end`` (the best layer-0 previous-key and layer-1 matching-value scores at the end) and
    ``plateau_match_max`` (the best layer-1 matching-value score on the plateau: from step 50 to the
    first accuracy >= 0.5; ``nan`` if there is none).
    """
    data = TASK.split(n_train=2048, n_val=512, seed=seed)
    xv = data.val[0]
    v_rows = torch.zeros_like(xv, dtype=torch.bool)
    v_rows[:, VALUE_POS] = True
    q_rows = torch.zeros_like(xv, dtype=torch.bool)
    q_rows[:, QUERY_POS] = True

    yv = data.val[1]

    def circuit(m):                                  # best layer-0 previous-key score, best layer-1 matching score,
        with torch.no_grad():                        # accuracy at each of the 4 queries
            pred = m(xv).argmax(-1)
        w = torch.stack(m.attention_weights)
        acc_q = (pred[:, QUERY_POS] == yv[:, QUERY_POS]).float().mean(0).tolist()
        return attention_at_offset(w, 1, v_rows)[0].max().item(), induction_score(w, xv, q_rows)[1].max().item(), acc_q

    match_at, acc_q_at = {}, {}                      # step -> layer-1 matching score / per-query accuracy, every 25 steps

    def probe(m):                                    # a zero "penalty", called before each update (as AttentionSnapshots)
        if probe.updates % 25 == 0:
            _, match_at[probe.updates], acc_q_at[probe.updates] = circuit(m)
        probe.updates += 1
        return torch.zeros(())
    probe.updates = 0

    m = TinyTransformer(TASK.vocab_size, d_model=32, num_heads=2, num_layers=2, max_len=TASK.seq_len, pos="rope", seed=seed)
    res = train(m, data, steps=max_steps, batch_size=64, lr=3e-3, seed=seed, eval_every=25, stop_at_acc=0.99,
                penalty=probe)
    prev_end, match_end, acc_q_end = circuit(m)
    first_half = next((st for st, _, acc in res.history if acc >= 0.5), math.inf)   # the plateau ends there
    on_plateau = [match_at[st] for st, _, acc in res.history if 50 <= st < first_half and st in match_at]
    return {"steps_to_99": first_step_reaching(res.history, 0.99), "final_acc": res.val_acc,
            "acc_at_50": res.history[1][2], "curve": [acc for _, _, acc in res.history],
            "curve_by_query": [acc_q_at.get(st, acc_q_end) for st, _, _ in res.history],
            "prev_end": prev_end, "match_end": match_end,
            "plateau_match_max": max(on_plateau) if on_plateau else float("nan")}


def _to_json(x):
    """inf and nan as the strings "inf" and "nan" (strict JSON has neither)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_json(v) for v in x]
    return x


def _from_json(x):
    if x in ("inf", "nan"):
        return float(x)
    if isinstance(x, dict):
        return {k: _from_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    return x


def load_sweep(path: Path = RESULTS) -> SweepResult:
    """The committed sweep as a ``SweepResult`` (``"inf"``/``"nan"`` read back as floats)."""
    data = json.loads(Path(path).read_text())
    return SweepResult(seeds=tuple(data["seeds"]), runs=[_from_json(r) for r in data["runs"]])


def machine() -> dict:
    """What the committed result was computed on (torch, its CPU kernel level, Python, platform)."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": sys.version.split()[0], "platform": platform.platform(), "processor": platform.machine()}


def main() -> None:
    t0 = time.perf_counter()
    res = sweep(recall_run, SEEDS)
    out = {
        "what": "notebook 03 sections 6b and 6c: steps to 0.99 on associative recall and the circuit, 2 layers x 2 heads",
        "script": "experiments/03_recall_plateau.py",
        "seeds": list(res.seeds), "settings": SETTINGS,
        "machine": machine(),
        "seconds": round(time.perf_counter() - t0, 1),
        "runs": _to_json(res.runs),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")
    print(f"wrote {RESULTS} in {out['seconds']} s")
    print(res.table(["steps_to_99", "acc_at_50", "final_acc", "plateau_match_max", "prev_end", "match_end"], fmt=".2f"))


if __name__ == "__main__":
    main()
