r"""Statistics for seed sweeps, built on :mod:`scipy.stats`: paired arms, censored times, counts.

Three questions the notebooks ask of a sweep (:mod:`helpers.lab.sweep`), each with the summary
a referee expects and one line a notebook prints:

* :func:`paired` -- two arms run over the *same* seeds (seed ``s`` fixes the data, the
  initialisation and the batch order in both arms). The unit of evidence is the per-seed
  difference ``d_s = a_s - b_s``: "better in k of n seeds", the mean difference with a
  95% interval (t and bootstrap), the Wilcoxon signed-rank test and the sign test. A paired
  design is never summarised by comparing the effect with the between-seed spread of
  either arm: the seed-to-seed spread is shared by both arms and cancels in ``d_s``.
* :func:`time_to_threshold` -- the step at which a run first reaches a threshold, with a
  step budget ``B``. A run that did not reach it by ``B`` is *right-censored* at ``B``
  (we know only that its time is ``> B``): it is neither dropped nor "never". Reported as
  "k of n reached it by step B" and the Kaplan-Meier median (or "> B" when fewer than
  half reached it).
* :func:`k_of_n_interval` -- "k of n" with an exact (Clopper-Pearson) binomial interval.
  A threshold count is a coarse summary: when a continuous paired difference exists, it,
  not the count, is the headline.

No plotting here; the figures are :func:`helpers.viz.sweep.plot_paired` and
:func:`helpers.viz.sweep.plot_time_to_threshold`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


class _SciPyStats:
    """``scipy.stats``, imported on first use: it costs 0.8 s of the 2.1 s ``import helpers`` takes,
    and most notebooks and tests never call a statistic."""

    def __getattr__(self, name: str):
        import scipy.stats

        return getattr(scipy.stats, name)


st = _SciPyStats()

__all__ = ["Censored", "PairedComparison", "k_of_n_interval", "km_median", "paired", "proportion_interval",
           "time_to_threshold"]

# Wilcoxon with ties among |d| has no closed-form exact null distribution; up to this many
# non-zero differences all 2**n sign flips are enumerated (exact), above it the normal
# approximation (with the tie correction) is used.
_WILCOXON_MAX_ENUMERATE = 16


# --------------------------------------------------------------------------- validation


def _check_confidence(confidence: float) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number strictly between 0 and 1, got {confidence!r}")
    return float(confidence)


def _check_fmt(fmt: str, name: str = "fmt") -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"{name} must be a format spec string such as '.2f', got {type(fmt).__name__}")
    try:
        format(1.5, fmt)
    except ValueError:
        raise ValueError(f"{name} must be a valid float format spec such as '.2f', got {fmt!r}") from None
    return fmt


def _as_float_vector(values, name: str) -> np.ndarray:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        if isinstance(v, bool) or not isinstance(v, (numbers.Real, np.number)):
            raise TypeError(f"{name}[{i}] must be a number, got {type(v).__name__} {v!r}")
        out.append(float(v))
    return np.asarray(out, dtype=float)


def _check_seeds(seeds, n: int, name: str = "seeds") -> tuple[int, ...]:
    if seeds is None:
        return tuple(range(n))
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(seeds).__name__}")
    seeds = tuple(seeds)
    if len(seeds) != n:
        raise ValueError(f"{name} must have one seed per value ({n}), got {len(seeds)}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {type(s).__name__} {s!r}")
    seeds = tuple(int(s) for s in seeds)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{name} must be distinct, got {list(seeds)}")
    return seeds


def _fmt_p(p: float) -> str:
    """A p-value to two significant figures (``< 0.0001`` below that; ``nan`` if undefined)."""
    if not np.isfinite(p):
        return "n/a"
    if p < 1e-4:
        return "< 0.0001"
    return f"= {p:.2g}" if p < 0.995 else "= 1"


def _fmt_seeds(seeds: Sequence[int]) -> str:
    return ", ".join(str(s) for s in seeds)


# --------------------------------------------------------------------------- counts


def proportion_interval(k: int, n: int, confidence: float = 0.95, method: str = "exact") -> tuple[float, float]:
    r"""Two-sided binomial interval for a proportion ``k / n`` (``scipy.stats.binomtest``).

    ``method="exact"`` is the Clopper-Pearson interval (Clopper & Pearson 1934,
    *Biometrika* 26:404): the set of ``p`` not rejected by either one-sided exact binomial
    test at level ``(1 - confidence) / 2``, i.e. ``[B(α/2; k, n-k+1), B(1-α/2; k+1, n-k)]``
    with ``B`` the beta quantile (``lo = 0`` if ``k = 0``, ``hi = 1`` if ``k = n``). It
    never covers less than ``confidence``. ``method="wilson"`` is Wilson's score interval
    (Wilson 1927, *JASA* 22:209), shorter and close to nominal on average.

    Raises:
        TypeError / ValueError: ``k``, ``n`` not ints with ``0 <= k <= n``, ``n >= 1``.
    """
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k must satisfy 0 <= k <= n (n = {n}), got {k}")
    confidence = _check_confidence(confidence)
    if method not in ("exact", "wilson", "wilsoncc"):
        raise ValueError(f"method must be 'exact', 'wilson' or 'wilsoncc', got {method!r}")
    ci = st.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method=method)
    return float(ci.low), float(ci.high)


def k_of_n_interval(k: int, n: int, confidence: float = 0.95, *, what: str = "seeds",
                    method: str = "exact") -> str:
    r"""``"6 of 8 seeds (75%; 95% CI 35% to 97%, Clopper-Pearson)"``.

    The interval is :func:`proportion_interval` (exact Clopper-Pearson by default; Clopper &
    Pearson 1934). With a handful of seeds it is wide: 6 of 8 is compatible with anything
    from about a third to almost all seeds -- which is why a count over seeds is not the
    headline when a continuous paired difference is available (:func:`paired`).

    Args:
        k: how many seeds satisfied the condition.
        n: how many seeds there were.
        confidence: the interval's coverage (default 0.95).
        what: the noun after "of n" (default "seeds"; "" for none).
        method: "exact" (Clopper-Pearson), "wilson" or "wilsoncc" (with continuity correction).
    """
    lo, hi = proportion_interval(k, n, confidence, method)
    if not isinstance(what, str):
        raise TypeError(f"what must be a string, got {type(what).__name__}")
    name = {"exact": "Clopper-Pearson", "wilson": "Wilson", "wilsoncc": "Wilson, continuity-corrected"}[method]
    noun = f" {what}" if what else ""
    return (f"{k} of {n}{noun} ({100 * k / n:.0f}%; {_pct(confidence)} CI {100 * lo:.0f}% to "
            f"{100 * hi:.0f}%, {name})")


def _pct(confidence: float) -> str:
    return f"{100 * confidence:g}%"


# --------------------------------------------------------------------------- paired arms


@dataclass(frozen=True)
class PairedComparison:
    r"""Two arms over the same seeds, summarised through the per-seed differences.

    ``diffs[i] = a[i] - b[i]`` for ``seeds[i]``. With ``better="higher"`` a seed is
    "better" for ``a`` when ``diffs > 0``; with ``better="lower"`` (steps, losses) when
    ``diffs < 0``. Build with :func:`paired` or :meth:`helpers.lab.sweep.SweepResult.paired_with`.

    Attributes:
        a_name, b_name: the arms' names (the difference is ``a_name - b_name``).
        seeds, a, b, diffs: per-seed values and differences, in seed order.
        better: "higher" or "lower".
        n, n_better, n_worse, n_tied: seed counts (ties: ``diffs == 0`` exactly).
        mean_diff, sd_diff: mean and sample sd (``ddof=1``) of the differences.
        confidence: coverage of the intervals (0.95).
        t_ci: the paired t interval ``mean ± t_{n-1} sd / sqrt(n)``.
        t_p: the paired t-test's two-sided p (NaN when all differences are equal).
        boot_ci: the BCa bootstrap interval of the mean difference (fixed ``boot_seed``).
        wilcoxon_p: two-sided Wilcoxon signed-rank p on the non-zero differences (1.0 if none).
        wilcoxon_method: how ``wilcoxon_p`` was computed: "exact", "exact (enumerated, ties)",
            "normal approximation (ties)", or "none (all tied)".
        sign_p: two-sided exact sign-test p (``binomtest(n_better, n_better + n_worse)``).
        fmt: format spec of the differences in :meth:`line`.
    """

    a_name: str
    b_name: str
    seeds: tuple[int, ...]
    a: np.ndarray
    b: np.ndarray
    diffs: np.ndarray
    better: str
    n: int
    n_better: int
    n_worse: int
    n_tied: int
    mean_diff: float
    sd_diff: float
    confidence: float
    t_ci: tuple[float, float]
    t_p: float
    boot_ci: tuple[float, float]
    wilcoxon_p: float
    wilcoxon_method: str
    sign_p: float
    fmt: str = ".2f"

    @property
    def label(self) -> str:
        """``"a - b"``, the difference's name."""
        return f"{self.a_name} - {self.b_name}"

    def line(self, fmt: Optional[str] = None) -> str:
        """One line for a notebook, e.g.
        ``"dropout - none: better in 6 of 8 seeds, mean +0.28 [95% t CI +0.12, +0.44], Wilcoxon p = 0.016, sign test p = 0.29"``.

        The interval is the paired t interval (:attr:`t_ci`). Ties and worse seeds are named
        when there are ties; a note is added when the Wilcoxon test cannot reach 0.05 (fewer
        than 6 non-tied seeds); when every seed differs by the same amount the line says so
        instead of printing a zero-width interval.
        """
        f = _check_fmt(self.fmt if fmt is None else fmt)
        counts = f"better in {self.n_better} of {self.n} seeds"
        if self.n_tied:
            counts += f" (worse in {self.n_worse}, tied in {self.n_tied})"
        lo, hi = self.t_ci
        if self.sd_diff == 0.0:
            spread = f"every seed differs by exactly {self.mean_diff:+{f}} (no interval)"
        else:
            spread = f"mean {self.mean_diff:+{f}} [{_pct(self.confidence)} t CI {lo:+{f}}, {hi:+{f}}]"
        text = (f"{self.label}: {counts}, {spread}, Wilcoxon p {_fmt_p(self.wilcoxon_p)}, "
                f"sign test p {_fmt_p(self.sign_p)}")
        m = self.n_better + self.n_worse
        if 0 < m < 6:  # the signed-rank test's smallest two-sided p is 2 / 2**m: above 0.05 for m < 6, no power
            text += f" (with {m} non-tied seeds no p can go below {2.0 / 2 ** m:.2g})"
        if self.better == "lower":
            text += "; lower is better"
        return text

    def table(self, fmt: Optional[str] = None) -> str:
        """One row per seed: ``seed, a, b, a - b``."""
        f = _check_fmt(self.fmt if fmt is None else fmt)
        w = max(len(self.a_name), len(self.b_name), len(self.label), 8)
        rows = [f"seed  {self.a_name:>{w}s}  {self.b_name:>{w}s}  {self.label:>{w}s}"]
        for s, x, y, d in zip(self.seeds, self.a, self.b, self.diffs):
            rows.append(f"{s:4d}  {x:>{w}{f}}  {y:>{w}{f}}  {d:>+{w}{f}}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.line()


def _wilcoxon(nonzero: np.ndarray) -> tuple[float, str]:
    m = len(nonzero)
    if m == 0:
        return 1.0, "none (all tied)"
    absd = np.abs(nonzero)
    if len(np.unique(absd)) == m:
        return float(st.wilcoxon(nonzero, method="exact").pvalue), "exact"
    if m <= _WILCOXON_MAX_ENUMERATE:
        res = st.wilcoxon(nonzero, method=st.PermutationMethod(n_resamples=np.inf))
        return float(res.pvalue), "exact (enumerated, ties)"
    return float(st.wilcoxon(nonzero, method="asymptotic").pvalue), "normal approximation (ties)"


def paired(
    a_values: Sequence[float],
    b_values: Sequence[float],
    seeds: Optional[Sequence[int]] = None,
    *,
    a_name: str = "a",
    b_name: str = "b",
    better: str = "higher",
    confidence: float = 0.95,
    n_boot: int = 9999,
    boot_seed: int = 0,
    fmt: str = ".2f",
) -> PairedComparison:
    r"""Compare two arms run over the same seeds through the per-seed differences.

    With ``d_i = a_i - b_i`` (``i`` = seed), ``n`` seeds, mean ``d̄`` and sample sd ``s``:

    * counts: better / worse / tied in ``k`` of ``n`` seeds (tied: ``d_i == 0``).
    * paired t interval (Student 1908): ``d̄ ± t_{1-α/2, n-1} · s / sqrt(n)``, from
      ``scipy.stats.ttest_1samp(d, 0).confidence_interval``; and its two-sided p.
    * bootstrap interval of ``d̄``: BCa (Efron 1987, *JASA* 82:171), ``n_boot`` resamples of
      the seeds with ``numpy.random.default_rng(boot_seed)``, so the same inputs always give
      the same interval (``scipy.stats.bootstrap``). With few seeds it is too narrow; the t
      interval is the one :meth:`PairedComparison.line` prints.
    * Wilcoxon signed-rank test (Wilcoxon 1945, *Biometrics Bulletin* 1:80) of "``d`` is
      symmetric about 0": zero differences are dropped first (Wilcoxon's own rule,
      ``zero_method="wilcox"``; they carry no sign). Then, with ``m`` non-zero differences:
      no ties among ``|d|`` -> the exact null distribution (``method="exact"``, any ``m``);
      ties and ``m <= 16`` -> exact by enumerating all ``2**m`` sign flips
      (``scipy.stats.PermutationMethod``); ties and ``m > 16`` -> the normal approximation
      with the tie correction. ``m = 0`` -> ``p = 1`` (no evidence either way). With
      ``m < 6`` the smallest attainable two-sided p is ``2 / 2**m > 0.05``; the line says so.
    * sign test (Dixon & Mood 1946): two-sided exact binomial p of ``n_better`` successes in
      ``n_better + n_worse`` trials with ``p = 1/2`` (``scipy.stats.binomtest``); ties dropped.

    Args:
        a_values, b_values: per-seed results of the two arms, same length, same seed order,
            all finite (a censored time-to-threshold is not a number to subtract: use
            :func:`time_to_threshold` per arm).
        seeds: the seeds (default ``0 .. n-1``), for the per-seed table and figure.
        a_name, b_name: the arms' names; the difference is "a_name - b_name".
        better: "higher" (accuracy) or "lower" (steps, loss): which sign of ``d`` is "better".
        confidence: coverage of both intervals (default 0.95).
        n_boot: bootstrap resamples (>= 100).
        boot_seed: seed of the bootstrap's generator.
        fmt: format spec of the differences in the printed line.

    Returns:
        :class:`PairedComparison`.

    Raises:
        TypeError / ValueError: naming the argument, the rule and the value received.
    """
    a = _as_float_vector(a_values, "a_values")
    b = _as_float_vector(b_values, "b_values")
    if len(a) != len(b):
        raise ValueError(f"a_values and b_values must have the same length (one value per seed), "
                         f"got {len(a)} and {len(b)}")
    if len(a) < 2:
        raise ValueError(f"a_values and b_values must hold at least 2 seeds for a paired comparison, got {len(a)}")
    seeds = _check_seeds(seeds, len(a))
    for name, v in (("a_values", a), ("b_values", b)):
        bad = [s for s, x in zip(seeds, v) if not np.isfinite(x)]
        if bad:
            raise ValueError(f"{name} must be finite for every seed; seeds {bad} hold "
                             f"{[float(x) for x in v if not np.isfinite(x)]} (a censored time is not a "
                             "number to subtract: summarise each arm with time_to_threshold)")
    for name, v in (("a_name", a_name), ("b_name", b_name)):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be a string, got {type(v).__name__}")
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    confidence = _check_confidence(confidence)
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 100:
        raise ValueError(f"n_boot must be an int >= 100, got {n_boot!r}")
    if isinstance(boot_seed, bool) or not isinstance(boot_seed, (int, np.integer)) or boot_seed < 0:
        raise ValueError(f"boot_seed must be a non-negative int, got {boot_seed!r}")
    fmt = _check_fmt(fmt)

    d = a - b
    n = len(d)
    sign = 1.0 if better == "higher" else -1.0
    n_better = int(np.sum(sign * d > 0))
    n_worse = int(np.sum(sign * d < 0))
    n_tied = n - n_better - n_worse
    mean = float(np.mean(d))
    sd = float(np.std(d, ddof=1))

    if sd == 0.0:  # every seed moved by the same amount: the intervals collapse, t is undefined
        t_ci = (mean, mean)
        t_p = math.nan
        boot_ci = (mean, mean)
    else:
        tt = st.ttest_1samp(d, 0.0)
        ci = tt.confidence_interval(confidence_level=confidence)
        t_ci = (float(ci.low), float(ci.high))
        t_p = float(tt.pvalue)
        bs = st.bootstrap((d,), np.mean, n_resamples=int(n_boot), confidence_level=confidence,
                          method="BCa", rng=np.random.default_rng(int(boot_seed)))
        boot_ci = (float(bs.confidence_interval.low), float(bs.confidence_interval.high))
        if not all(np.isfinite(boot_ci)):  # BCa undefined (e.g. degenerate resamples): percentile
            bs = st.bootstrap((d,), np.mean, n_resamples=int(n_boot), confidence_level=confidence,
                              method="percentile", rng=np.random.default_rng(int(boot_seed)))
            boot_ci = (float(bs.confidence_interval.low), float(bs.confidence_interval.high))

    wp, wmethod = _wilcoxon(d[d != 0])
    m = n_better + n_worse
    sign_p = float(st.binomtest(n_better, m, 0.5).pvalue) if m else 1.0
    return PairedComparison(
        a_name=a_name, b_name=b_name, seeds=seeds, a=a, b=b, diffs=d, better=better,
        n=n, n_better=n_better, n_worse=n_worse, n_tied=n_tied, mean_diff=mean, sd_diff=sd,
        confidence=confidence, t_ci=t_ci, t_p=t_p, boot_ci=boot_ci, wilcoxon_p=wp,
        wilcoxon_method=wmethod, sign_p=sign_p, fmt=fmt)


# --------------------------------------------------------------------------- censored times


def km_median(times: np.ndarray, reached: np.ndarray) -> Optional[float]:
    r"""Kaplan-Meier median of right-censored times: the smallest ``t`` with ``Ŝ(t) <= 1/2``.

    ``Ŝ(t) = Π_{t_j <= t} (1 - d_j / r_j)`` (Kaplan & Meier 1958, *JASA* 53:457), ``d_j``
    runs reaching the threshold at ``t_j``, ``r_j`` runs still at risk just before ``t_j``
    (censored runs leave the risk set after their censoring time), computed by
    ``scipy.stats.ecdf`` on ``scipy.stats.CensoredData``. The median is the smallest time at
    which the estimate drops to 1/2 or below (Klein & Moeschberger 2003, §4.5); ``None``
    when it never does (fewer than half known to have reached it). Note: with no censoring
    and an even ``n`` this is the lower of the two middle values, not their average.
    """
    times = np.asarray(times, dtype=float)
    reached = np.asarray(reached, dtype=bool)
    if not reached.any():
        return None
    data = st.CensoredData(uncensored=times[reached], right=times[~reached])
    sf = st.ecdf(data).sf
    below = np.nonzero(sf.probabilities <= 0.5 + 1e-12)[0]
    return float(sf.quantiles[below[0]]) if len(below) else None


@dataclass(frozen=True)
class Censored:
    r"""Per-seed time to a threshold with right-censoring at a budget (:func:`time_to_threshold`).

    Attributes:
        seeds: the seeds, in the order given.
        times: the step each run reached the threshold, or (``reached`` False) the step at
            which it was last seen below it (its censoring time, usually the budget).
        reached: whether each run reached the threshold.
        budget: the step budget ``B``.
        threshold: the level (for the printed line; ``None``: "it").
        unit: the time unit in the printed line ("steps").
        k, n: runs that reached it, runs in all.
        median: the Kaplan-Meier median, or ``None`` when fewer than half reached it
            (then the median is greater than ``max(times)``, which is ``B`` when every
            censored run ran to the budget).
        reached_ci: Clopper-Pearson 95% interval of ``k / n``.
    """

    seeds: tuple[int, ...]
    times: np.ndarray
    reached: np.ndarray
    budget: float
    threshold: Optional[float]
    unit: str
    k: int
    n: int
    median: Optional[float]
    reached_ci: tuple[float, float]
    fmt: str = ".0f"

    @property
    def censored_seeds(self) -> tuple[int, ...]:
        return tuple(s for s, r in zip(self.seeds, self.reached) if not r)

    @property
    def median_text(self) -> str:
        """``"290 steps"`` or ``"> 500 steps"``."""
        if self.median is None:
            return f"> {float(np.max(self.times)):{self.fmt}} {self.unit}".rstrip()
        return f"{self.median:{self.fmt}} {self.unit}".rstrip()

    def km(self):
        """The Kaplan-Meier estimate, ``scipy.stats.ecdf(...).sf`` (``None`` if no run reached it)."""
        if not self.reached.any():
            return None
        return st.ecdf(st.CensoredData(uncensored=self.times[self.reached], right=self.times[~self.reached])).sf

    def line(self) -> str:
        """One line for a notebook, e.g. ``"6 of 8 seeds reached 0.99 by step 500 (95% CI 35% to 97%);
        Kaplan-Meier median 290 steps (censored: seeds 3, 7)"``."""
        what = "it" if self.threshold is None else f"{self.threshold:g}"
        lo, hi = self.reached_ci
        text = (f"{self.k} of {self.n} seeds reached {what} by step {self.budget:g} (95% CI {100 * lo:.0f}% "
                f"to {100 * hi:.0f}%); Kaplan-Meier median {self.median_text}")
        cens = self.censored_seeds
        if cens:
            early = [(s, t) for s, t, r in zip(self.seeds, self.times, self.reached) if not r and t < self.budget]
            text += f" (censored: seed{'s' if len(cens) > 1 else ''} {_fmt_seeds(cens)}"
            if early:
                text += "; stopped early: " + ", ".join(f"seed {s} at {t:{self.fmt}}" for s, t in early)
            text += ")"
        if self.median is None:
            text += "; fewer than half reached it"
        return text

    def __str__(self) -> str:
        return self.line()


def time_to_threshold(
    values: Sequence[Optional[float]],
    budget: float,
    *,
    seeds: Optional[Sequence[int]] = None,
    reached: Optional[Sequence[bool]] = None,
    threshold: Optional[float] = None,
    unit: str = "steps",
    fmt: str = ".0f",
) -> Censored:
    r"""Time to a threshold over seeds, the runs that did not reach it censored at the budget.

    Two ways in:

    * ``values`` alone: the step each run reached the threshold, with ``None``, ``inf`` or
      ``NaN`` for a run that did not reach it within ``budget`` (as
      :func:`helpers.lab.sweep.first_step_reaching` returns ``inf``); those runs are censored
      at ``budget``.
    * ``values`` and ``reached``: ``values[i]`` is the step run ``i`` reached it
      (``reached[i]`` True) or stopped below it (False: censored there, e.g. a run that
      stopped early or ran out of budget).

    Summary: ``k`` of ``n`` reached it by step ``B`` (Clopper-Pearson interval), and the
    Kaplan-Meier median (Kaplan & Meier 1958; :func:`km_median`): the smallest ``t`` with
    ``Ŝ(t) <= 1/2``, or "``> B``" when fewer than half reached it. A mean over the runs that
    reached it would leave the slowest runs out; none is given.

    Raises:
        TypeError / ValueError: a non-number, a negative time, a reached time above the
            budget, ``reached`` of the wrong length or not bools, a bad budget.
    """
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Real, np.number)) or not (
            math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget must be a finite number > 0 (the last step a run could reach the threshold), "
                         f"got {budget!r}")
    budget = float(budget)
    v = _as_float_vector(values, "values")
    if len(v) == 0:
        raise ValueError("values must hold at least one run, got none")
    seeds = _check_seeds(seeds, len(v))
    if reached is None:
        hit = np.isfinite(v)
        if np.any(v[hit] < 0):
            raise ValueError(f"values must be >= 0 (steps), got {v[hit][v[hit] < 0].tolist()}")
        over = [(s, float(t)) for s, t, h in zip(seeds, v, hit) if h and t > budget]
        if over:
            raise ValueError(f"values must be <= budget ({budget:g}) for runs that reached the threshold; "
                             f"got {over} (seed, step): raise the budget or mark those runs as not reached")
        times = np.where(hit, v, budget)
    else:
        if isinstance(reached, (str, bytes)) or not hasattr(reached, "__len__"):
            raise TypeError(f"reached must be a sequence of bools, got {type(reached).__name__}")
        flags = list(reached)
        if len(flags) != len(v):
            raise ValueError(f"reached must have one flag per value ({len(v)}), got {len(flags)}")
        for i, f in enumerate(flags):
            if not isinstance(f, (bool, np.bool_)):
                raise TypeError(f"reached[{i}] must be a bool, got {type(f).__name__} {f!r}")
        hit = np.asarray(flags, dtype=bool)
        if not np.all(np.isfinite(v)):
            raise ValueError(f"values must be finite steps when reached is given, got {v.tolist()}")
        if np.any(v < 0):
            raise ValueError(f"values must be >= 0 (steps), got {v[v < 0].tolist()}")
        if np.any(v > budget):
            raise ValueError(f"values must be <= budget ({budget:g}), got {v[v > budget].tolist()}")
        times = v.copy()
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (numbers.Real, np.number))):
        raise TypeError(f"threshold must be a number or None, got {type(threshold).__name__}")
    if not isinstance(unit, str):
        raise TypeError(f"unit must be a string, got {type(unit).__name__}")
    fmt = _check_fmt(fmt)
    k, n = int(hit.sum()), len(v)
    return Censored(seeds=seeds, times=times, reached=hit, budget=budget,
                    threshold=None if threshold is None else float(threshold), unit=unit, k=k, n=n,
                    median=km_median(times, hit), reached_ci=proportion_interval(k, n), fmt=fmt)
