"""Seed sweeps behind notebook 06 (positional encodings compared), precomputed.

Notebook 06 makes claims about six positional schemes (none, sinusoidal, two learned
tables, RoPE, ALiBi) on two tasks, at the training length, shifted, at 2L and 4L, and
about stretching RoPE (position interpolation, NTK-aware scaling, fine-tuning against a
model trained from scratch). Each claim is measured over 8 seeds; training all of that
takes minutes on a 2-core CPU, longer than a notebook may run, so this script runs it
once and writes ``experiments/results/06_positional_sweeps.json``; the notebook loads it
(and trains seed 0 of the look-back models live to show maps and tables).

Run from the repository root::

    python experiments/06_positional_sweeps.py            # all parts, seeds 0-7 (nope: 0-4)
    python experiments/06_positional_sweeps.py --part nope

Every experiment is a function of the seed (``schemes_run``, ``stretch_run``,
``nope_run``), called through :func:`helpers.lab.sweep.sweep` (one worker process per core,
``seed_everything(seed)`` before each call), so one seed's numbers do not depend on the
others or on the number of workers. ``tests/test_experiments_06.py`` re-runs a seed
or two of some of them and checks that each reproduces its own committed verdicts, within a band
of its own values (CONTRIBUTING.md).

Two parts were added later as new keys (the first three take about 40 min together and
were not re-run):

* ``alias`` (``alias_run``, seeds 0-7, about 1 min): the sinusoidal look-back models of
  ``schemes``, shifted by c = 10, 100, 500 in *some* pairs of the table only (the three
  fastest pairs, or the other thirteen), to test whether the fast pairs' aliasing explains
  the non-monotone shift curve.
* ``nope_probe`` (``nope_probe_run``, seeds 0-4, about 3 min): the two NoPE configurations
  of ``nope`` re-trained (same seeds, same data, same numbers), then evaluated at 2L and 4L,
  with a linear probe of the position from the first layer's output, the first layer's
  attention on position 0 against 1/(t+1), and the accuracy when attention to position 0 is
  removed in one layer (anchor or sink?).
* ``t5`` (``t5_run``, seeds 0-7, about 5 min): T5's bucketed relative position bias
  (:class:`helpers.positional.T5BiasTransformer`, two bucket settings, :data:`T5_SCHEMES`)
  trained and evaluated exactly as the arms of ``schemes`` (same seeds, data, steps,
  offsets and lengths), so it pairs with them seed by seed.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from helpers import LookbackTask, PairRecallTask, TinyTransformer, evaluate, train  # noqa: E402
from helpers.lab.sweep import first_step_reaching, sweep  # noqa: E402
from helpers.positional import (  # noqa: E402
    T5BiasTransformer,
    accuracy_by_position,
    init_position_table_,
    interpolated_positions,
    use_rope_base,
)
from helpers.rope import ntk_scaled_base  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "06_positional_sweeps.json"

SEEDS = list(range(8))
L = 16
TABLE = 1024  # rows of the learned position table
STEPS, LR, EVAL_EVERY = 100, 1e-2, 10
SCHEMES = ["none", "sinusoidal", "learned-1", "learned-0.01", "rope", "alibi"]
GPT2_WPE_STD = 0.01  # openai/gpt-2 src/model.py: wpe ~ N(0, 0.01^2) (wte: 0.02)
OFFSETS = [0, 1, 2, 5, 10, 50, 100, 500]
LENGTHS = [L, 2 * L, 4 * L]
TASK_NAMES = ["lookback", "recall"]

# stretching RoPE at 2L: fine-tuning (plain, PI, NTK) against training from scratch
FT_LRS = [1e-3, 3e-3, 1e-2]
FT_STEPS = 100  # evaluated every 10 steps
VARIANTS = ["plain", "PI", "NTK", "scratch"]

# a causal model without positions on a task that needs them (Kazemnejad et al. 2023)
NOPE_CONFIGS = {
    # name: (layers, learning rate, steps, with a start token)
    "2 layers": (2, 1e-2, 1500, False),
    "2 layers + start token": (2, 1e-2, 1500, True),
}
NOPE_SEEDS = list(range(5))
NOPE_EVAL_EVERY = 100

# T5's bucketed relative bias (Raffel et al. 2020), added later as part ``t5`` (same seeds, same
# training, same evaluations as ``schemes``): (num_buckets, max_distance), unidirectional (causal)
T5_SCHEMES = {
    "t5": (8, 12),  # distances 0-3 exact; 4-5, 6, 7-9 shared; >= 10 in the last bucket: all trained at L = 16
    "t5-hf": (32, 128),  # Hugging Face's T5Config defaults: distances 0-15 exact; >= 16 never seen at L = 16
}


def task(name: str, n: int = L):
    """The training task at length ``n``: look back 3 over 8 symbols; pair recall with 6 pairs, n - 6 queries."""
    if name == "lookback":
        return LookbackTask(num_symbols=8, seq_len=n, k=3)
    return PairRecallTask(num_keys=8, num_values=4, num_pairs=6, num_queries=n - 6)


def val_data(name: str, n: int):
    """The validation set at length ``n`` (seed 1000, the same for every model)."""
    return task(name, n).make(256, seed=1000)


def make_model(name: str, scheme: str, seed: int, max_len: int = TABLE) -> TinyTransformer:
    """One layer, d_model 32, 2 heads; ``learned-0.01`` redraws the table from N(0, 0.01^2) like GPT-2's wpe;
    ``t5``/``t5-hf``: :class:`~helpers.positional.T5BiasTransformer` with :data:`T5_SCHEMES`' buckets."""
    if scheme in T5_SCHEMES:
        nb, md = T5_SCHEMES[scheme]
        return T5BiasTransformer(task(name).vocab_size, d_model=32, num_heads=2, num_layers=1, max_len=max_len,
                                 num_buckets=nb, max_distance=md, seed=seed)
    model = TinyTransformer(task(name).vocab_size, d_model=32, num_heads=2, num_layers=1, max_len=max_len,
                            pos=scheme.split("-")[0], seed=seed)
    if scheme == "learned-0.01":
        init_position_table_(model, GPT2_WPE_STD, torch.Generator().manual_seed(seed))
    return model


def train_scheme(name: str, scheme: str, seed: int):
    model = make_model(name, scheme, seed)
    run = train(model, task(name), steps=STEPS, lr=LR, seed=seed, n_train=2048, n_val=256, eval_every=EVAL_EVERY)
    return model, run


@torch.no_grad()
def far_weight(model: TinyTransformer, n: int = 4 * L) -> float:
    """Mean weight that the furthest-looking head puts on keys >= L positions back (queries t >= L, length n)."""
    model(val_data("lookback", n)[0][:64])
    w = model.attention_weights[0]
    back = torch.stack([w[:, :, t, : t - L + 1].sum(-1) for t in range(L, n)])
    return back.mean((0, 1)).max().item()


def _nan_to_none(values):
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in values]


def schemes_run(seed: int, schemes=SCHEMES, tasks=TASK_NAMES) -> dict:
    """Every scheme on both tasks: training curve, final accuracy, shifts, lengths, accuracy by position."""
    out = {}
    for name in tasks:
        vals = {n: val_data(name, n) for n in LENGTHS}
        for scheme in schemes:
            model, run = train_scheme(name, scheme, seed)
            key = f"{name}/{scheme}"
            out[f"{key}/curve"] = [h[2] for h in run.history]
            out[f"{key}/acc"] = run.val_acc
            steps95 = first_step_reaching(run.history, 0.95)
            out[f"{key}/steps95"] = None if math.isinf(steps95) else steps95
            grid = []
            for n in LENGTHS:
                grid.append([evaluate(model, vals[n], offset=c, need_weights=False)[1] for c in OFFSETS])
            out[f"{key}/grid"] = grid  # (lengths, offsets)
            out[f"{key}/bypos"] = _nan_to_none(accuracy_by_position(model, vals[4 * L]).tolist())
            if scheme in ("rope", "alibi", *T5_SCHEMES) and name == "lookback":
                out[f"{key}/far"] = far_weight(model)
    return out


def t5_run(seed: int, schemes=tuple(T5_SCHEMES), tasks=TASK_NAMES) -> dict:
    """:func:`schemes_run` for T5's relative bias (same keys, ``{task}/t5/...``); the other arms are not re-run."""
    return schemes_run(seed, schemes=list(schemes), tasks=tasks)


def stretch_run(seed: int, lrs=FT_LRS, variants=VARIANTS) -> dict:
    """RoPE look-back models at 2L: fine-tuned as trained, with PI, with NTK, and a fresh model from scratch."""
    base, _ = train_scheme("lookback", "rope", seed)
    task2 = task("lookback", 2 * L)
    val2 = val_data("lookback", 2 * L)
    pi = interpolated_positions(2 * L, 2.0)
    ntk = ntk_scaled_base(10000.0, 2.0, 16)
    out = {}
    for variant in variants:
        for lr in lrs:
            model = make_model("lookback", "rope", seed) if variant == "scratch" else copy.deepcopy(base)
            fkw = {"positions": pi} if variant == "PI" else {}
            with use_rope_base(model, ntk if variant == "NTK" else 10000.0):
                acc0 = evaluate(model, val2, **fkw)[1]
                run = train(model, (task2.make(1024, seed=seed), val2), steps=FT_STEPS, lr=lr, seed=seed,
                            eval_every=10, forward_kwargs=fkw)
            out[f"{variant}/lr{lr:g}"] = [acc0] + [h[2] for h in run.history]
    return out


class WithStart:
    """Prepend a start token (id ``vocab_size`` of the wrapped task) to every sequence; it is not scored."""

    def __init__(self, base):
        self.base, self.vocab_size = base, base.vocab_size + 1

    def add(self, data):
        x, y = data
        s = torch.full((x.shape[0], 1), self.base.vocab_size, dtype=x.dtype)
        return torch.cat([s, x], 1), torch.cat([torch.full_like(s, -100), y], 1)


def nope_run(seed: int, configs=None) -> dict:
    """Causal models without positional encoding on look-back 3, by configuration (curves every 100 steps)."""
    configs = NOPE_CONFIGS if configs is None else configs
    base = task("lookback")
    split = base.split(2048, 256, seed)
    out = {}
    for cname, (layers, lr, steps, start) in configs.items():
        wrap = WithStart(base) if start else None
        tr, va = (wrap.add(split.train), wrap.add(split.val)) if start else (split.train, split.val)
        model = TinyTransformer(wrap.vocab_size if start else base.vocab_size, 32, 2, layers, max_len=64,
                                pos="none", seed=seed)
        run = train(model, (tr, va), steps=steps, lr=lr, seed=seed, eval_every=NOPE_EVAL_EVERY)
        out[f"{cname}/curve"] = [h[2] for h in run.history]
        out[f"{cname}/acc"] = run.val_acc
        out[f"{cname}/shuffle"] = shuffle_sensitivity(model, va[0], first=1 if start else 0)
    return out


@torch.no_grad()
def shuffle_sensitivity(model, x, first: int = 0) -> float:
    """Max change of the logits at the last position when tokens ``first .. t-1`` before it are permuted."""
    t = x.shape[1] - 1
    perm = torch.randperm(t - first, generator=torch.Generator().manual_seed(0)) + first
    xs = x.clone()
    xs[:, first:t] = x[:, perm]
    model.eval()
    return (model(x)[:, t] - model(xs)[:, t]).abs().max().item()


FAST_PAIRS = 3  # pairs 0..2 of the 16 (dimensions 0..5) of the d_model = 32 sinusoidal table
ALIAS_SHIFTS = [10, 100, 500]


def _sinusoidal(n: int, d: int, positions: torch.Tensor) -> torch.Tensor:
    angle = positions.double()[:, None] / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe


@torch.no_grad()
def partial_shift_accuracy(model: TinyTransformer, data, c: int, pairs) -> float:
    """Accuracy when only the table's ``pairs`` are moved by ``c`` positions (the others stay at 0 .. n-1)."""
    x, _ = data
    n, d = x.shape[1], model.d_model
    m = torch.arange(n)
    dims = torch.tensor([2 * i + j for i in pairs for j in (0, 1)], dtype=torch.long)
    delta = torch.zeros(n, d, dtype=torch.float64)
    delta[:, dims] = (_sinusoidal(n, d, m + c) - _sinusoidal(n, d, m))[:, dims]
    hook = model.blocks[0].register_forward_pre_hook(lambda mod, args: (args[0] + delta.to(args[0].dtype),) + args[1:])
    try:
        return evaluate(model, data, need_weights=False)[1]
    finally:
        hook.remove()


def alias_run(seed: int) -> dict:
    """Sinusoidal look-back model of ``schemes``: shift all pairs, only the fast ones, or only the slow ones."""
    model, _ = train_scheme("lookback", "sinusoidal", seed)
    val = val_data("lookback", L)
    n_pairs = model.d_model // 2
    groups = {"all": range(n_pairs), "fast": range(FAST_PAIRS), "slow": range(FAST_PAIRS, n_pairs)}
    out = {"acc": evaluate(model, val)[1]}
    for c in ALIAS_SHIFTS:
        out[f"offset {c}: offset arg"] = evaluate(model, val, offset=c, need_weights=False)[1]
        for g, pairs in groups.items():
            out[f"offset {c}: {g}"] = partial_shift_accuracy(model, val, c, list(pairs))
    return out


def _with_start(name: str, n: int):
    return WithStart(task(name, n)).add(val_data(name, n))


@torch.no_grad()
def _acc_without_start(model, data, layer: int) -> float:
    """Accuracy when queries t >= 1 of ``layer`` may not attend to position 0 (it still attends to itself)."""
    def hook(mod, args, kwargs):
        mask = kwargs["mask"]
        n = args[0].shape[1]
        cut = torch.zeros(n, n, dtype=torch.bool)
        cut[1:, 0] = True
        if mask.dtype == torch.bool:
            kwargs["mask"] = mask & ~cut
        else:
            kwargs["mask"] = mask.masked_fill(cut, float("-inf"))
        return args, kwargs
    h = model.blocks[layer].attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        return evaluate(model, data, need_weights=False)[1]
    finally:
        h.remove()


@torch.no_grad()
def position_probe_r2(model, train_x, val_x, first: int) -> float:
    """R^2 on ``val_x`` of a least-squares linear probe of the position t from the first block's output."""
    feats = []
    for x in (train_x, val_x):
        seen = []
        hook = model.blocks[0].register_forward_hook(lambda mod, args, out: seen.append(out[0]))
        model(x, need_weights=False)
        hook.remove()
        h = seen[0][:, first:]  # (batch, positions, d)
        t = torch.arange(h.shape[1], dtype=torch.float64).expand(h.shape[0], -1)
        feats.append((torch.cat([h.reshape(-1, h.shape[-1]).double(), torch.ones(h.numel() // h.shape[-1], 1,
                                                                                 dtype=torch.float64)], 1),
                      t.reshape(-1)))
    (a, ta), (b, tb) = feats
    coef = torch.linalg.lstsq(a, ta[:, None]).solution
    resid = tb - (b @ coef)[:, 0]
    return float(1 - resid.pow(2).sum() / (tb - tb.mean()).pow(2).sum())


def nope_probe_run(seed: int, configs: tuple = tuple(NOPE_CONFIGS)) -> dict:
    """The ``nope`` models again (same seeds and data), then: 2L/4L, a position probe, anchor or sink.
    ``configs``: which of :data:`NOPE_CONFIGS` to run (all by default; the re-run test runs one)."""
    base = task("lookback")
    split = base.split(2048, 256, seed)
    out = {}
    for cname in configs:
        layers, lr, steps, start = NOPE_CONFIGS[cname]
        wrap = WithStart(base) if start else None
        tr, va = (wrap.add(split.train), wrap.add(split.val)) if start else (split.train, split.val)
        model = TinyTransformer(wrap.vocab_size if start else base.vocab_size, 32, 2, layers, max_len=80,
                                pos="none", seed=seed)
        run = train(model, (tr, va), steps=steps, lr=lr, seed=seed, eval_every=NOPE_EVAL_EVERY)
        out[f"{cname}/acc"] = run.val_acc
        for n in LENGTHS:
            data = _with_start("lookback", n) if start else val_data("lookback", n)
            out[f"{cname}/acc at {n}"] = evaluate(model, data, need_weights=False)[1]
        first = 1 if start else 0
        out[f"{cname}/probe r2"] = position_probe_r2(model, tr[0][:512], va[0], first)
        if start:
            model(va[0])
            w0 = model.attention_weights[0]  # (batch, heads, n, n)
            on_start = w0[:, :, 1:, 0].mean(0)  # (heads, queries 1..n-1)
            t = torch.arange(1, va[0].shape[1], dtype=torch.float64)
            out[f"{cname}/layer0 weight on start"] = on_start.tolist()
            out[f"{cname}/layer0 corr with 1/(t+1)"] = [float(np.corrcoef(on_start[h].double(), 1 / (t + 1))[0, 1])
                                                        for h in range(on_start.shape[0])]
            out[f"{cname}/layer1 weight on start"] = model.attention_weights[1][:, :, 1:, 0].mean((0, 2)).tolist()
            for layer in range(layers):
                out[f"{cname}/acc without start in layer {layer}"] = _acc_without_start(model, va, layer)
    return out


def meta() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "processor": platform.processor(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


PARTS = {"schemes": schemes_run, "stretch": stretch_run, "nope": nope_run, "alias": alias_run,
         "nope_probe": nope_probe_run, "t5": t5_run}
PART_SEEDS = {"nope": NOPE_SEEDS, "nope_probe": NOPE_SEEDS}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=sorted(PARTS), action="append", help="run only these parts (default: all)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="default: 0-7 (nope: 0-4)")
    args = ap.parse_args(argv)
    new = {}
    for part in args.part or ["schemes", "stretch", "nope", "alias", "nope_probe", "t5"]:
        t0 = time.time()
        res = sweep(PARTS[part], args.seeds if args.seeds is not None else PART_SEEDS.get(part, SEEDS))
        new[part] = {"seeds": list(res.seeds), "runs": res.runs, "meta": meta(), "seconds": round(time.time() - t0)}
        print(f"{part}: {len(res.seeds)} seeds in {time.time() - t0:.0f} s", flush=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # read late: keep parts run meanwhile
    results.update(new)
    results["config"] = {"L": L, "table": TABLE, "steps": STEPS, "lr": LR, "eval_every": EVAL_EVERY,
                         "schemes": SCHEMES, "offsets": OFFSETS, "lengths": LENGTHS, "gpt2_wpe_std": GPT2_WPE_STD,
                         "ft_lrs": FT_LRS, "ft_steps": FT_STEPS, "variants": VARIANTS,
                         "nope_configs": {k: list(v) for k, v in NOPE_CONFIGS.items()},
                         "nope_eval_every": NOPE_EVAL_EVERY, "nope_seeds": NOPE_SEEDS,
                         "fast_pairs": FAST_PAIRS, "alias_shifts": ALIAS_SHIFTS,
                         "t5_schemes": {k: list(v) for k, v in T5_SCHEMES.items()}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
