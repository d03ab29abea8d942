r"""Seed sweeps: run one experiment over many seeds and read the distribution, not one run.

Introduced in ``notebooks/03_mha_from_scratch.ipynb`` (how long the plateau before the
induction jump lasts, over seeds) and used by 04 (the regularization ablation), 05 and 06.

Why: a tiny model's training is chaotic near a phase change. The same seed escapes a
plateau tens of steps earlier or later on another CPU (AVX2 vs AVX-512 kernels sum in a
different order), and another seed can land on the other side of a verdict. So a claim
that rests on training is measured over seeds and stated as what the distribution shows
("in 3 of 8 seeds", mean and spread), never from one run.

:func:`sweep` calls ``fn(seed)`` once per seed. Before each call it runs
:func:`helpers.seed_everything` ``(seed)`` (one torch thread, deterministic algorithms),
so each seed's result is the same whether the seeds run one after another in this
process or in parallel worker processes, in any order. Workers are forked processes
(one torch thread each), so on a machine with *c* cores eight seeds cost about
``8 / c`` runs of wall time. ``fn`` may be defined in a notebook: forked workers inherit
it. Where the platform cannot fork (Windows; macOS is allowed to fork), the seeds run
one after another in this process.

``fn(seed)`` returns a number or a dict of numbers and sequences (curves). What a worker
prints is captured (``SweepResult.logs``), not shown; an exception in any seed is
re-raised as :class:`SweepError` naming the seed and carrying the worker's traceback.

Progress (``progress=``): in a Jupyter kernel a sweep shows one line, updated in place as
each seed finishes ("sweep: 3 of 8 seeds finished (seeds 0, 1, 4), 14 s"), and removes it
when the sweep ends. The line lives in a display whose first and last contents are a 1x1
transparent PNG; only the updates in between carry text. nbval compares a cell's first
display and ignores updates (``update_display_data``), and it never compares ``image/png``,
so a notebook's strictly compared outputs are the same with or without the progress line,
and what ``jupyter nbconvert --execute`` stores (the last content) holds no time and no
count. Outside a kernel a sweep is silent unless ``progress=True``, which writes one line
per finished seed to stderr.
"""
from __future__ import annotations

import contextlib
import io
import math
import multiprocessing as mp
import os
import random
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..utils import seed_everything
from .stats import Censored, PairedComparison, k_of_n_interval, km_median, paired, time_to_threshold

__all__ = ["SweepError", "SweepResult", "available_cores", "first_step_reaching", "sweep"]

Number = Union[int, float]


class SweepError(RuntimeError):
    """An experiment raised for one seed; ``seed`` and ``worker_traceback`` say where."""

    def __init__(self, seed: int, message: str, worker_traceback: str = ""):
        super().__init__(f"seed {seed}: {message}")
        self.seed = seed
        self.worker_traceback = worker_traceback


def available_cores() -> int:
    """Cores this process may run on (``os.sched_getaffinity`` where it exists)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def first_step_reaching(history: Sequence[tuple], threshold: float, index: int = -1) -> float:
    r"""The first step whose value reaches ``threshold``, or ``inf`` if none does.

    Args:
        history: rows ``(step, ..., value)`` as in :attr:`helpers.train.TrainResult.history`
            (``(step, val_loss, val_acc)``); ``index`` picks the value column (default: last).
        threshold: the level to reach (``value >= threshold``).

    Returns:
        The step as a float, or ``math.inf`` (so that means and comparisons still work).
    """
    for row in history:
        if row[index] >= threshold:
            return float(row[0])
    return math.inf


def _as_record(out: Any, seed: int) -> dict[str, Any]:
    if isinstance(out, Mapping):
        rec = dict(out)
    elif isinstance(out, (int, float, np.floating, np.integer)) and not isinstance(out, bool):
        rec = {"value": out}
    elif isinstance(out, torch.Tensor) and out.numel() == 1:
        rec = {"value": out.item()}
    else:
        raise SweepError(seed, f"fn must return a number or a dict of numbers/sequences, got {type(out).__name__}")
    clean: dict[str, Any] = {}
    for k, v in rec.items():
        if not isinstance(k, str):
            raise SweepError(seed, f"fn's result keys must be strings, got {k!r}")
        if isinstance(v, torch.Tensor):
            v = v.item() if v.numel() == 1 else v.detach().cpu().tolist()
        elif isinstance(v, (np.floating, np.integer)):
            v = v.item()
        elif isinstance(v, np.ndarray):
            v = v.tolist()
        clean[k] = v
    return clean


def _run_one(fn: Callable[[int], Any], seed: int) -> tuple[int, Optional[dict], str, Optional[tuple[str, str]]]:
    """Seed everything, call fn(seed) with its prints captured; never raises."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            seed_everything(seed)
            out = fn(seed)
        return seed, _as_record(out, seed), buf.getvalue(), None
    except SweepError as e:
        return seed, None, buf.getvalue(), (str(e).split(": ", 1)[-1], traceback.format_exc())
    except BaseException as e:  # noqa: BLE001 - reported with its seed, re-raised in the parent
        return seed, None, buf.getvalue(), (f"{type(e).__name__}: {e}", traceback.format_exc())


def _worker_init() -> None:
    torch.set_num_threads(1)


_FN: Optional[Callable[[int], Any]] = None  # set in the parent before forking; inherited by workers


def _run_inherited(seed: int):
    assert _FN is not None
    return _run_one(_FN, seed)


# A 1x1 transparent PNG: the first and last content of the progress display (see the module docstring).
_BLANK_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNgYGBgAAAABQABeqhXUAAAAABJRU5ErkJggg==")
#: mime types nbval (0.11) never compares (without --nbdime); the progress display's first and last content use only these
NBVAL_UNCOMPARED = frozenset({"image/png", "image/jpeg"})


def _in_jupyter_kernel() -> bool:
    """True inside an IPython kernel (JupyterLab, nbclient, nbval), not in a terminal IPython or a script."""
    if "IPython" not in sys.modules:
        return False
    try:
        shell = sys.modules["IPython"].get_ipython()
    except Exception:  # noqa: BLE001 - an IPython too old or half imported: no kernel for our purpose
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _display(bundle: dict, *, display_id: Any = None, update: bool = False) -> Any:
    """IPython's display of a raw mime bundle (kept in one place so that tests can record it)."""
    from IPython.display import display, update_display
    if update:
        return update_display(bundle, raw=True, display_id=display_id)
    return display(bundle, raw=True, display_id=True)


class _Progress:
    """How a sweep reports finished seeds: ``"kernel"`` (one display line updated in place, removed at
    the end), ``"stderr"`` (one line per finished seed) or ``None`` (silent)."""

    def __init__(self, mode: Optional[str], seeds: tuple[int, ...], workers: int):
        self.mode, self.n, self.workers, self.done = mode, len(seeds), workers, []
        self.t0 = time.perf_counter()
        self.handle = None
        if mode == "kernel":
            self.handle = _display({"image/png": _BLANK_PNG}, display_id=True)
            self._show()

    def text(self) -> str:
        seeds = ", ".join(map(str, self.done))
        where = f" on {self.workers} worker processes" if self.workers > 1 else ""
        return (f"sweep: {len(self.done)} of {self.n} seeds finished{where}"
                + (f" (seed{'s' if len(self.done) > 1 else ''} {seeds})" if self.done else "")
                + f", {time.perf_counter() - self.t0:.0f} s")

    def _show(self) -> None:
        text = self.text()
        html = (f'<progress value="{len(self.done)}" max="{self.n}" style="vertical-align: middle"></progress> '
                f"<code>{text}</code>")
        _display({"text/plain": text, "text/html": html}, display_id=self._id(), update=True)

    def _id(self) -> Any:
        return getattr(self.handle, "display_id", self.handle)

    def seed_done(self, seed: int) -> None:
        self.done.append(seed)
        if self.mode == "kernel":
            self._show()
        elif self.mode == "stderr":
            print(self.text(), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.mode == "kernel" and self.handle is not None:
            _display({"image/png": _BLANK_PNG}, display_id=self._id(), update=True)
            self.handle = None


def _progress_mode(progress: Optional[bool]) -> Optional[str]:
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None (None: show progress only in a Jupyter kernel), "
                        f"got {progress!r} ({type(progress).__name__})")
    if progress is False:
        return None
    if _in_jupyter_kernel():
        return "kernel"
    return "stderr" if progress else None


@dataclass
class SweepResult:
    """Per-seed results of :func:`sweep` and summaries of their distribution.

    Attributes:
        seeds: the seeds, in the order given.
        runs: one dict per seed, what ``fn(seed)`` returned (numbers stay numbers,
            tensors and arrays become lists).
        logs: what each seed printed (captured, not shown).
    """

    seeds: tuple[int, ...]
    runs: list[dict[str, Any]]
    logs: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seeds)

    @property
    def keys(self) -> list[str]:
        """The result names ``fn`` returned (those of the first seed)."""
        return list(self.runs[0]) if self.runs else []

    def _check_key(self, key: str) -> None:
        missing = [s for s, r in zip(self.seeds, self.runs) if key not in r]
        if missing:
            raise KeyError(f"key {key!r} is missing for seeds {missing}; keys are {self.keys}")

    def values(self, key: str = "value") -> np.ndarray:
        """``(n_seeds,)`` float array of one scalar result, in seed order."""
        self._check_key(key)
        vals = [r[key] for r in self.runs]
        if any(isinstance(v, (list, tuple)) for v in vals):
            raise TypeError(f"{key!r} holds sequences: use .curves({key!r})")
        return np.asarray(vals, dtype=float)

    def curves(self, key: str) -> np.ndarray:
        """``(n_seeds, T)`` array of a sequence result (every seed must return the same length)."""
        self._check_key(key)
        lengths = {len(r[key]) for r in self.runs}
        if len(lengths) != 1:
            raise ValueError(f"{key!r} has different lengths across seeds: {sorted(lengths)}")
        return np.asarray([r[key] for r in self.runs], dtype=float)

    def by_seed(self, key: str = "value") -> dict[int, float]:
        """``{seed: value}`` of one scalar result."""
        return dict(zip(self.seeds, self.values(key).tolist()))

    def mean(self, key: str = "value") -> float:
        return float(np.mean(self.values(key)))

    def count(self, key: str, predicate: Callable[[float], bool]) -> int:
        """How many seeds satisfy ``predicate(value)``."""
        return int(sum(bool(predicate(v)) for v in self.values(key)))

    def k_of_n(self, key: str, predicate: Callable[[float], bool], *, ci: bool = False) -> str:
        """``"k of n seeds"`` for ``predicate``.

        With ``ci=True``: ``"k of n seeds (75%; 95% CI 35% to 97%, Clopper-Pearson)"``
        (:func:`helpers.lab.stats.k_of_n_interval`). A count over a threshold is a coarse
        summary; when two arms share their seeds, :meth:`paired_with` is the headline.
        """
        k = self.count(key, predicate)
        if not isinstance(ci, bool):
            raise TypeError(f"ci must be a bool, got {type(ci).__name__}")
        return k_of_n_interval(k, len(self)) if ci else f"{k} of {len(self)} seeds"

    def describe(self, key: str = "value", fmt: str = ".2f", *, budget: Optional[float] = None) -> str:
        """``"mean ± sd (min .. max, n seeds)"`` when every seed's value is finite.

        An ``inf``, ``NaN`` or ``None`` value means "did not reach it within the run" (as
        :func:`first_step_reaching` returns ``inf``, and the experiment scripts store
        ``None``): that run is *censored*, and a mean and spread over the others would
        silently leave the slowest runs out. Then the text is instead ``"6 of 8 seeds
        reached it; Kaplan-Meier median 290 (fastest 125); censored, not reached within the
        run: seeds 3, 7"`` -- the Kaplan-Meier median treats the censored runs as later than
        every run that reached it (:func:`helpers.lab.stats.km_median`). With ``budget`` the text
        says "by step B" and a median above it reads "> B"; :meth:`time_to_threshold` gives
        the full summary.

        Raises:
            ValueError: a value is ``-inf`` (not a time, and not "not reached").
        """
        v = self.values(key)
        bad = [s for s, x in zip(self.seeds, v) if x == -math.inf]
        if bad:
            raise ValueError(f"describe({key!r}): seeds {bad} hold -inf; a value must be a number, or inf / NaN / "
                             f"None for a run that did not reach a threshold")
        if budget is not None:
            return self._describe_censored(key, fmt, budget)
        if np.all(np.isfinite(v)):
            sd = float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
            return (f"{np.mean(v):{fmt}} ± {sd:{fmt}} (min {v.min():{fmt}}, max {v.max():{fmt}}, "
                    f"{len(v)} seeds)")
        return self._describe_censored(key, fmt, None)

    def _describe_censored(self, key: str, fmt: str, budget: Optional[float]) -> str:
        v = self.values(key)
        hit = np.isfinite(v)
        k, n = int(hit.sum()), len(v)
        v = np.where(hit, v, math.inf)
        by = "" if budget is None else f" by step {budget:g}"
        cens = [s for s, h in zip(self.seeds, hit) if not h]
        if budget is not None:
            c = self.time_to_threshold(key, budget, fmt=fmt)
            median = c.median_text if c.median is not None else f"> {budget:g}"
            median = median.replace(" steps", "")
        elif k:
            big = float(v[hit].max()) + 1.0  # censored runs: later than every run that reached it
            m = km_median(np.where(hit, v, big), hit)
            median = f"{m:{fmt}}" if m is not None else "not reached (fewer than half reached it)"
        if k == 0:
            return f"0 of {n} seeds reached it{by} (all censored)"
        text = f"{k} of {n} seeds reached it{by}; Kaplan-Meier median {median} (fastest {v[hit].min():{fmt}})"
        if cens:
            where = f" at {budget:g}" if budget is not None else ", not reached within the run"
            text += f"; censored{where}: seed{'s' if len(cens) > 1 else ''} {', '.join(map(str, cens))}"
        return text

    def time_to_threshold(self, key: str, budget: float, *, threshold: Optional[float] = None,
                          unit: str = "steps", fmt: str = ".0f") -> Censored:
        """:func:`helpers.lab.stats.time_to_threshold` of the scalar result ``key`` (``inf``: not reached by ``budget``)."""
        return time_to_threshold(self.values(key).tolist(), budget, seeds=self.seeds, threshold=threshold,
                                 unit=unit, fmt=fmt)

    def paired_with(self, other: "SweepResult", key: str, other_key: Optional[str] = None, *,
                    name: Optional[str] = None, other_name: Optional[str] = None, **kwargs: Any) -> PairedComparison:
        """:func:`helpers.lab.stats.paired` of ``self[key] - other[other_key]``, matched seed by seed.

        ``other`` may be ``self`` (two keys of one sweep, e.g. ``"GQA: acc"`` vs ``"MQA: acc"``).
        Both must hold the same seeds (in any order); the result follows ``self.seeds``.
        ``name`` / ``other_name`` default to the keys (or "this" / "other" when the keys are
        equal); ``kwargs`` go to :func:`helpers.lab.stats.paired` (``better``, ``fmt``, ...).
        """
        if not isinstance(other, SweepResult):
            raise TypeError(f"other must be a SweepResult, got {type(other).__name__}")
        other_key = key if other_key is None else other_key
        if set(self.seeds) != set(other.seeds):
            raise ValueError(f"other must hold the same seeds for a paired comparison: this sweep has "
                             f"{sorted(self.seeds)}, other has {sorted(other.seeds)}")
        mine = self.values(key)
        theirs = other.by_seed(other_key)
        if name is None:
            name = key if other_key != key else "this"
        if other_name is None:
            other_name = other_key if other_key != key else "other"
        return paired(mine, [theirs[s] for s in self.seeds], self.seeds, a_name=name, b_name=other_name, **kwargs)

    def table(self, keys: Optional[Sequence[str]] = None, fmt: str = ".3f") -> str:
        """One line per seed with the chosen scalar results."""
        keys = list(keys) if keys is not None else [k for k in self.keys
                                                     if not isinstance(self.runs[0][k], (list, tuple))]
        width = max([len(k) for k in keys] + [6])
        lines = ["seed  " + "  ".join(f"{k:>{width}s}" for k in keys)]
        for s, r in zip(self.seeds, self.runs):
            lines.append(f"{s:4d}  " + "  ".join(f"{float(r[k]):>{width}{fmt}}" for k in keys))
        return "\n".join(lines)


def sweep(
    fn: Callable[[int], Union[Number, Mapping[str, Any]]],
    seeds: Iterable[int],
    *,
    workers: Optional[int] = None,
    progress: Optional[bool] = None,
) -> SweepResult:
    r"""Run ``fn(seed)`` for every seed, in parallel worker processes where cores allow.

    Each call is preceded by ``seed_everything(seed)`` (one torch thread, deterministic
    algorithms), so a seed's result does not depend on ``workers`` or on the order of the
    seeds. In this process (``workers=1``) the caller's random states (``random``,
    NumPy, torch) are restored afterwards.

    Args:
        fn: ``fn(seed) -> number | dict[str, number | sequence]``. It may close over data
            made in the notebook (forked workers inherit it).
        seeds: distinct non-negative ints, at least one.
        workers: processes to use; ``None``: ``min(len(seeds), available_cores())``;
            ``1``: one after another in this process.
        progress: ``None`` (default): in a Jupyter kernel, one line updated in place as each
            seed finishes ("sweep: 3 of 8 seeds finished ..., 14 s"), removed when the sweep
            ends, so nothing of it is saved in the notebook; elsewhere silent. ``True``: the
            same in a kernel, one line per finished seed on stderr elsewhere. ``False``: silent.

    Returns:
        :class:`SweepResult` with one record per seed, in the order of ``seeds``.

    Raises:
        ValueError: for bad ``seeds`` or ``workers``.
        TypeError: ``fn`` is not callable, or ``progress`` is not ``True``, ``False`` or ``None``.
        SweepError: when ``fn`` raised for a seed (the first such seed in ``seeds`` order).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("seeds must hold at least one seed, got none")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ValueError(f"seeds must be non-negative ints, got {s!r}")
    seeds = tuple(int(s) for s in seeds)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    if workers is None:
        workers = min(len(seeds), available_cores())
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1 or None, got {workers!r}")
    workers = min(workers, len(seeds))
    if workers > 1 and "fork" not in mp.get_all_start_methods():
        workers = 1
    mode = _progress_mode(progress)

    report = _Progress(mode, seeds, workers)
    try:
        if workers == 1:
            states = (random.getstate(), np.random.get_state(), torch.random.get_rng_state(), torch.get_num_threads())
            try:
                outs = []
                for s in seeds:
                    outs.append(_run_one(fn, s))
                    report.seed_done(s)
            finally:
                random.setstate(states[0])
                np.random.set_state(states[1])
                torch.random.set_rng_state(states[2])
                torch.set_num_threads(states[3])
        else:
            global _FN
            _FN = fn
            try:
                ctx = mp.get_context("fork")
                with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init) as pool:
                    futures = {pool.submit(_run_inherited, s): s for s in seeds}
                    by_seed = {}
                    for fut in as_completed(futures):
                        by_seed[futures[fut]] = fut.result()
                        report.seed_done(futures[fut])
                outs = [by_seed[s] for s in seeds]
            finally:
                _FN = None
    finally:
        report.close()

    runs, logs = [], []
    for seed, rec, log, err in outs:
        if err is not None:
            raise SweepError(seed, err[0], err[1])
        runs.append(rec)
        logs.append(log)
    return SweepResult(seeds=seeds, runs=runs, logs=logs)
