"""What the slow tier's re-runs share: a re-run of committed seeds, and the band a re-run number must land in.

A committed sweep (``experiments/*.py`` -> ``experiments/results/*.json``) is checked seed by seed: the
re-run of seed ``s`` must reach the verdict the notebook draws for seed ``s`` from the committed record,
and each re-run number must land within :func:`band` of seed ``s``'s own committed value.

The band is ``max(floor, SHARE * (max - min over the committed seeds))``. The floor is measured, not
guessed. Each re-run seed was trained four ways: the committed record (made on another machine, mostly
with AVX2 kernels), a plain re-run on an AVX-512 machine, the same with ``ATEN_CPU_CAPABILITY=avx2``, and
the plain re-run under perturbed arithmetic (``tests/perturbed_arithmetic/perturb.py``: every
order-dependent result of torch moved by one ulp, standing in for another CPU's kernels). The largest
move of a key between the committed record and the others, or between the plain and the perturbed
re-run, is given in each test's comment; the floor is twice it, rounded up to a multiple of 0.005
(:func:`floor_of`). A seed whose verdict sits within the floor of its threshold is fragile: the tests
re-run other seeds (each comment says which and why).

To measure a move again (one seed, in this process, one thread, as ``helpers.lab.sweep`` runs it)::

    python tests/_rerun.py regularization_ablation run 0 '["none"]'              > plain.json
    python tests/_rerun.py --perturbed regularization_ablation run 0 '["none"]'  > perturbed.json

(script name under ``experiments/``, function, seed, then the function's other positional arguments
and, optionally, its keyword arguments, as JSON).
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
SHARE = 0.25        # of the committed across-seed range: a re-run may move a quarter of the way across it


def floor_of(largest_move: float, factor: float = 2.0) -> float:
    """The floor for a key whose largest measured move is ``largest_move``: ``factor`` times it, rounded up
    to a multiple of 0.005, at least 0.005."""
    return max(1, math.ceil(round(factor * largest_move / 0.005, 6))) * 0.005


def band(values: Iterable[float], floor: float, share: float = SHARE) -> float:
    """The half-width a re-run number may move from its seed's committed value: ``max(floor, share * range)``."""
    v = [float(x) for x in values]
    return max(floor, share * (max(v) - min(v)))


def check_near(what: str, got, committed, values, floor: float, outer: float | None = None) -> None:
    """Fail unless ``|got - committed| <= band(values, floor)`` and ``got`` lies within ``outer`` (default:
    ``floor``) of the committed range (a seed at the edge of the spread may not move a quarter of the range
    beyond it).

    ``values``: that key over the committed seeds. For a list-valued key (a curve, a grid) ``got`` and
    ``committed`` are lists and ``values`` a list of them: every entry is held to the band of its own column."""
    if isinstance(committed, (list, tuple)):
        assert len(got) == len(committed), f"{what}: {len(got)} entries re-run, {len(committed)} committed"
        for i, (g, c) in enumerate(zip(got, committed)):
            check_near(f"{what}[{i}]", g, c, [v[i] for v in values], floor, outer)
        return
    outer = floor if outer is None else outer
    b, lo, hi = band(values, floor), min(values) - outer, max(values) + outer
    assert abs(got - committed) <= b and lo <= got <= hi, (
        f"{what}: re-run {got:.4f}, committed for this seed {committed:.4f} (band {b:.4f}: floor {floor}, "
        f"{SHARE} x the committed range {min(values):.4f}-{max(values):.4f}; within {outer} of that range)")


def check_verdict(what: str, got: float, committed: float, threshold: float, floor: float) -> None:
    """The re-run is on the committed side of ``threshold`` (``value > threshold`` or not), and the committed
    value sits more than ``floor`` from it: a seed closer than that is fragile (a one-ulp move of the arithmetic
    could flip its verdict), so the test must re-run another seed instead, never loosen the check."""
    assert abs(committed - threshold) > floor, (f"{what}: committed {committed:.4f} is within {floor} of "
                                                f"{threshold}: a fragile seed for this verdict, re-run another one")
    assert (got > threshold) == (committed > threshold), (f"{what}: re-run {got:.4f}, committed {committed:.4f}: "
                                                          f"not on the same side of {threshold}")


def first_reaching(curve: Sequence[float], threshold: float) -> int | None:
    """Index of the first evaluation at or above ``threshold`` (None: never within the curve)."""
    return next((i for i, v in enumerate(curve) if v >= threshold), None)


def check_crossing(what: str, got: Sequence[float], committed: Sequence[float], threshold: float, floor: float) -> None:
    """The re-run curve first reaches ``threshold`` at the committed evaluation (or never, as committed).

    Fragile unless every committed evaluation up to the crossing (all of them if it never crosses) is more
    than ``floor`` away from the threshold: then a move within the floor cannot shift the crossing."""
    i = first_reaching(committed, threshold)
    upto = committed[: len(committed) if i is None else i + 1][: len(got)]
    near = [round(v, 4) for v in upto if abs(v - threshold) <= floor]
    assert not near, f"{what}: committed evaluations {near} within {floor} of {threshold}: a fragile seed"
    expected = i if i is not None and i < len(got) else None      # a shorter re-run sees only its own evaluations
    j = first_reaching(got, threshold)
    assert j == expected, f"{what}: re-run first reaches {threshold} at evaluation {j}, committed at {i}"


def rerun(fn: Callable[[int], Any], seeds: Sequence[int]) -> list[dict]:
    """``fn(seed)`` for each seed, through ``helpers.lab.sweep`` as the committed sweep ran it (seeded, one thread).

    In this process, one seed after another: the slow tier's two pytest workers already use both cores, and
    a seed's result does not depend on the number of workers (``helpers.lab.sweep``)."""
    from helpers.lab import sweep
    return list(sweep(fn, list(seeds), workers=1).runs)


def _load(name: str):
    path = ROOT / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"experiments_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    perturbed = "--perturbed" in argv
    args = [a for a in argv if a != "--perturbed"]
    if len(args) < 3:
        raise SystemExit(__doc__)
    script, func, seed = args[0], args[1], int(args[2])
    pos = json.loads(args[3]) if len(args) > 3 else []
    kw = json.loads(args[4]) if len(args) > 4 else {}
    sys.path.insert(0, str(ROOT))
    fn = getattr(_load(script), func)
    from helpers.lab import sweep
    call = lambda s: fn(s, *pos, **kw)  # noqa: E731
    if perturbed:
        spec = importlib.util.spec_from_file_location("perturbed_arithmetic", ROOT / "tests" / "perturbed_arithmetic"
                                                      / "perturb.py")
        pa = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pa)
        with pa.PerturbedArithmetic():
            rec = sweep(call, [seed], workers=1).runs[0]
        assert sum(pa.counts.values()) > 0, "the perturbation moved nothing"
    else:
        rec = sweep(call, [seed], workers=1).runs[0]
    print(json.dumps(dict(rec), default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


if __name__ == "__main__":
    main(sys.argv[1:])
