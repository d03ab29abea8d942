r"""The diagnosing engine shared by every "write it from memory" checker of notebooks 01-07.

:func:`diagnose` takes

* the learner's function and a **reference** function, with the same signature;
* a list of **planted mistakes** (:class:`PlantedMistake`): each a copy of the reference
  with exactly one classic error, a name, and the advice to print;
* a list of **test inputs** (:class:`TestInput`) of several shapes (odd lengths, a batch of
  one, ``Lq != Lk``, a second width, ...);

and returns a :class:`CheckResult`: PASS when the learner's results equal the reference's on
every input; otherwise the planted mistake whose results the learner's reproduce on *every*
input (an exception counts as a result: raising the same exception type on the same inputs
reproduces it); otherwise the first input where they differ and by how much. An exception
raised by the learner's code is reported in a FAIL message, never raised.

Every topic checker (:mod:`helpers.practice.rope`, ``attention``, ``regularization``,
``heads``, ``positional``, ``kvcache``) is the same three things around it:

* a **reference**: the ``helpers`` function (itself tested against torch / Hugging Face);
* a **worked solution** written the way a learner would, with the learner's signature, so a
  notebook can show ``PASS`` on it;
* a dict of **planted mistakes** ``{name: function}``, each the solution with one classic
  error, and a dict of advice ``{name: text}`` printed when the learner's results equal that
  mistake's on every input.

:func:`run_check` wires them to :func:`diagnose`: the learner's function is wrapped by the
checker's ``call`` (which builds the learner's arguments from a test input, **cloning every
tensor** so that an in-place edit by the learner cannot change what the reference or a planted
mistake sees, and converts the result), an exception in the learner's code becomes a ``FAIL``
message, never an exception. :func:`mistake_symptoms` tabulates what a checker reports for
each of its planted mistakes. The MHA checker (:mod:`helpers.practice.mha`) runs on
:func:`diagnose` directly, since it checks a class rather than a function.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

__all__ = [
    "Reject", "TestInput", "PlantedMistake", "CheckResult", "diagnose", "mistake_symptoms",
    "run_check", "clone_args", "as_tensor_result",
]


class Reject(Exception):
    """Raised by a wrapper around the learner's code to report a precise problem.

    ``kind`` becomes the result's ``diagnosis`` (e.g. ``"interface"``, ``"shape"``) and
    ``message`` follows ``FAIL <input label>:`` in the report; ``diff`` is the result's
    ``max_abs_diff``. Like any exception, a planted mistake reproduces it by raising a
    :class:`Reject` of the same kind on the same inputs.
    """

    def __init__(self, kind: str, message: str, diff: float = 0.0) -> None:
        super().__init__(message)
        self.kind, self.message, self.diff = kind, message, diff


@dataclass(frozen=True)
class TestInput:
    """One input to check on: ``fn(*args)`` is called for the learner, the reference and each mistake.

    Attributes:
        label: how the report names this input (``"with a causal mask"``).
        args: the positional arguments.
        call: how the report names the call when the learner's code raises
            (``"forward(query, key, value)"``).
        atol, rtol: tolerances for this input only (e.g. looser for bfloat16 inputs);
            ``None`` uses those given to :func:`diagnose`.
    """

    __test__ = False  # not a pytest test class, whatever its name

    label: str
    args: tuple
    call: str = "your function"
    atol: Optional[float] = None
    rtol: Optional[float] = None


@dataclass(frozen=True)
class PlantedMistake:
    """A copy of the reference with exactly one classic mistake.

    Attributes:
        name: the diagnosis reported when the learner's results equal ``fn``'s on every input.
        fn: the mistaken function, with the reference's signature.
        advice: what to print after the symptom: the mistake and its fix.
    """

    name: str
    fn: Callable[..., Any]
    advice: str


@dataclass
class CheckResult:
    """What :func:`diagnose` (and so every checker) returns; ``print`` it.

    Attributes:
        passed: True if the results equal the reference's on every input.
        diagnosis: None when passed; else the name of the planted mistake reproduced, a
            :class:`Reject` kind (``"interface"``, ``"shape"``), the kind given for an
            exception (``"exception"``, or ``"interface"`` for
            :func:`~helpers.practice.mha.check_mha`),
            ``"shape"`` for a result of the wrong shape, or ``"unknown"``.
        message: the verdict: ``PASS ...`` or ``FAIL <input> (<difference>). <advice>``.
        max_abs_diff: the largest difference from the reference on the failing input
            (``inf`` for a wrong shape or a missing result, 0 for an exception).
        symptom: the verdict's first part, one line, without the advice: what the
            checker observed (``FAIL without a mask (max |diff| = 0.655)``).
        failed_input: the label of the first input where the learner's result differs.
        inputs: the labels of every input checked.
    """

    passed: bool
    diagnosis: Optional[str]
    message: str
    max_abs_diff: float = 0.0
    symptom: str = ""
    failed_input: Optional[str] = None
    inputs: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class _Mismatch:
    diff: float
    text: str
    kind: str  # "values", "shape" or "missing"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    d = (a.detach().to(wide) - b.detach().to(wide)).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    return float(d.max()) if d.numel() else 0.0


def _compare(got: Any, expected: Any, atol: float, rtol: float, name: Optional[str] = None) -> Optional[_Mismatch]:
    """None if ``got`` equals ``expected`` (tensors within tolerance, NaN where NaN), else the first difference.

    A dict is compared entry by entry, in order; the first entry is the main result and
    its difference reads ``max |diff| = x``, the others are named (``weights: ...``).
    """
    prefix = f"{name}: " if name else ""
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return _Mismatch(float("inf"), f"{prefix}got {type(got).__name__}, expected a dict", "missing")
        for i, (key, exp) in enumerate(expected.items()):
            m = _compare(got.get(key), exp, atol, rtol, None if i == 0 else (f"{name}.{key}" if name else key))
            if m is not None:
                return m
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return _Mismatch(float("inf"), f"{prefix}got {got!r:.60}, expected {len(expected)} results", "missing")
        for i, (g, e) in enumerate(zip(got, expected)):
            m = _compare(g, e, atol, rtol, None if (i == 0 and not name) else f"{name or 'result'}[{i}]")
            if m is not None:
                return m
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return _Mismatch(float("inf"), f"{prefix}got {'None' if got is None else type(got).__name__}, expected a "
                                           f"tensor of shape {tuple(expected.shape)}", "missing")
        if got.shape != expected.shape:
            return _Mismatch(float("inf"), f"{prefix}shape {tuple(got.shape)}, expected {tuple(expected.shape)}", "shape")
        a, e = got.detach(), expected.detach()
        if a.is_complex() or e.is_complex():
            same = torch.allclose(a.to(torch.complex128), e.to(torch.complex128), atol=atol, rtol=rtol, equal_nan=True)
        elif a.is_floating_point() or e.is_floating_point():
            same = torch.allclose(a.double(), e.double(), atol=atol, rtol=rtol, equal_nan=True)
        else:
            same = torch.equal(a, e)
        if same:
            return None
        diff = _max_diff(got, expected)
        return _Mismatch(diff, f"{prefix}max |diff| = {diff:.3g}", "values")
    if got == expected:
        return None
    return _Mismatch(float("inf"), f"{prefix}got {got!r}, expected {expected!r}", "values")


def _run(fn: Callable, args: tuple):
    """``("ok", result)`` or ``("raised", exception)``: a learner's exception is an outcome, not a crash."""
    try:
        with torch.no_grad():
            return "ok", fn(*args)
    except Exception as e:  # the learner's (or a planted mistake's) code: any exception is a result
        return "raised", e


def _same_outcome(a, b, atol: float, rtol: float) -> bool:
    (ka, va), (kb, vb) = a, b
    if ka != kb:
        return False
    if ka == "raised":
        if type(va) is not type(vb):
            return False
        return not isinstance(va, Reject) or va.kind == vb.kind
    return _compare(va, vb, atol, rtol) is None


def diagnose(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    mistakes: Sequence[PlantedMistake],
    inputs: Sequence[TestInput],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    exception_kind: str = "exception",
    unknown_hint: str = "",
    pass_message: str = "PASS: the results equal the reference's on every input.",
) -> CheckResult:
    """Run ``learner`` on every input, compare with ``reference``, and name the mistake if one is planted.

    1. For each input in order: the learner's result (or exception) against the
       reference's (tensors within ``atol``/``rtol``, NaN equal to NaN; dicts, tuples and
       lists entry by entry). The reference must not raise.
    2. All equal: PASS (``pass_message``).
    3. Otherwise the first differing input is the symptom, and every planted mistake is run
       on every input: the first (in the given order) whose outcomes equal the learner's on
       *all* inputs, and differ from the reference's on at least one, is the diagnosis
       (raising an exception of the same type, or a :class:`Reject` of the same kind, on
       the same inputs counts as equal). Mistakes that coincide on some inputs (e.g. two
       scales equal at one width) are told apart by the other inputs, so give inputs of
       several shapes.
    4. No mistake reproduces it: the symptom, ``unknown_hint``, and for an exception its
       type and text, with diagnosis ``exception_kind``.

    Args:
        learner: the learner's function (or a wrapper that builds and calls their module).
        reference: the correct function, same signature.
        mistakes: the planted mistakes, in the order they are tried.
        inputs: the inputs, in the order they are checked.
        atol, rtol: tolerances of the comparisons (also between the learner and a mistake);
            an input's own ``TestInput.atol``/``rtol`` override them for that input.
        exception_kind: the diagnosis when the learner's code raises and no mistake reproduces it.
        unknown_hint: appended to the message when no mistake reproduces a numerical difference.
        pass_message: the message of a PASS.

    Returns:
        :class:`CheckResult`. Nothing the learner's code raises propagates, and the global
        (CPU) random state is the same afterwards.
    """
    if not inputs:
        raise ValueError("inputs must list at least one TestInput, got none")
    with torch.random.fork_rng(devices=[]):  # whatever the code under test draws, the caller's RNG is untouched
        return _diagnose(learner, reference, mistakes, inputs, atol, rtol, exception_kind, unknown_hint, pass_message)


def _tolerances(t: TestInput, atol: float, rtol: float) -> tuple[float, float]:
    """The input's own tolerances where it sets them, else the call's."""
    return (atol if t.atol is None else t.atol), (rtol if t.rtol is None else t.rtol)


def _diagnose(learner, reference, mistakes, inputs, atol, rtol, exception_kind, unknown_hint, pass_message) -> CheckResult:
    labels = [t.label for t in inputs]
    outcomes, expected = [], []
    failed = None  # (index, mismatch or exception)
    for i, t in enumerate(inputs):
        with torch.no_grad():
            exp = reference(*t.args)
        expected.append(exp)
        out = _run(learner, t.args)
        outcomes.append(out)
        if failed is None:
            if out[0] == "raised":
                failed = (i, out[1])
            else:
                m = _compare(out[1], exp, *_tolerances(t, atol, rtol))
                if m is not None:
                    failed = (i, m)
    if failed is None:
        return CheckResult(True, None, pass_message, 0.0, pass_message, None, labels)

    i, problem = failed
    t = inputs[i]
    if isinstance(problem, Reject):
        symptom, detail, diff = f"FAIL {t.label}: {problem.message}", "", problem.diff
    elif isinstance(problem, Exception):
        symptom = f"FAIL {t.label}: {t.call} raised {type(problem).__name__}"
        detail, diff = f": {problem}", 0.0
    else:
        symptom, detail, diff = f"FAIL {t.label} ({problem.text})", "", problem.diff

    for mistake in mistakes:
        differs_somewhere = False
        for j, tj in enumerate(inputs):
            cand = _run(mistake.fn, tj.args)
            tol = _tolerances(tj, atol, rtol)
            if not _same_outcome(outcomes[j], cand, *tol):
                break
            differs_somewhere = differs_somewhere or not _same_outcome(cand, ("ok", expected[j]), *tol)
        else:
            if differs_somewhere:
                return CheckResult(False, mistake.name, f"{symptom}{detail}. {mistake.advice}", diff, symptom, t.label, labels)

    if isinstance(problem, Reject):
        return CheckResult(False, problem.kind, symptom, diff, symptom, t.label, labels)
    if isinstance(problem, Exception):
        return CheckResult(False, exception_kind, f"{symptom}{detail}", diff, symptom, t.label, labels)
    kind = "shape" if problem.kind == "shape" else "unknown"
    got = outcomes[i][1]
    got_main = next(iter(got.values()), None) if isinstance(got, dict) else got
    nan = (" The output contains NaN: is a row of scores entirely -inf (-inf - (-inf)), or does an infinite factor "
           "meet a zero (inf * 0, e.g. exp of a difference taken against -inf)?"
           if isinstance(got_main, torch.Tensor) and got_main.is_floating_point() and bool(torch.isnan(got_main).any()) else "")
    hint = f" {unknown_hint}" if unknown_hint else ""
    return CheckResult(False, kind, f"{symptom}, and no single common mistake reproduces it.{nan}{hint}",
                       diff, symptom, t.label, labels)


def mistake_symptoms(check: Callable[..., "CheckResult"], mistakes: dict, **check_kwargs) -> dict[str, str]:
    """``{name: symptom}``: the one line ``check`` reports for each planted mistake.

    E.g. ``mistake_symptoms(check_rotation_matrix, ROTATION_MATRIX_MISTAKES)`` (both from
    :mod:`helpers.practice.rope`).

    Raises:
        RuntimeError: if a planted mistake is not diagnosed as itself (the checker would be wrong).
    """
    table = {}
    for name, f in mistakes.items():
        r = check(f, **check_kwargs)
        if r.diagnosis != name:
            raise RuntimeError(f"planted mistake {name!r} was diagnosed as {r.diagnosis!r}: {r.message}")
        table[name] = r.symptom
    return table


# ------------------------------------------------- plumbing of the function checkers
def _check_callable(fn: Any, name: str = "fn") -> Callable:
    if isinstance(fn, type) or not callable(fn):
        raise TypeError(f"{name} must be a function (your implementation), got {type(fn).__name__} ({fn!r:.60})")
    return fn


def clone_args(args: Sequence[Any]) -> list:
    """A copy of ``args`` in which every tensor is cloned (so in-place edits stay local)."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def as_tensor_result(out: Any, what: str) -> torch.Tensor:
    """The learner's result as a tensor: a tensor, a NumPy array, a number or a list of numbers; else :class:`Reject`."""
    if isinstance(out, torch.Tensor):
        return out
    if type(out).__module__ == "numpy" or (isinstance(out, (int, float)) and not isinstance(out, bool)):
        return torch.as_tensor(out)
    if isinstance(out, (list, tuple)) and out and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in out):
        return torch.tensor(out, dtype=torch.float64)  # a list of numbers
    raise Reject("interface", f"your function must return {what}, got {type(out).__name__} ({out!r:.60})",
                 float("inf"))


def run_check(
    fn: Callable,
    call: Callable[[Callable], Callable],
    reference: Callable,
    mistakes: Mapping[str, Callable],
    advice: Mapping[str, str],
    inputs: Sequence[TestInput],
    *,
    variants: Sequence[tuple[str, Callable]] = (),
    atol: float = 1e-5,
    rtol: float = 1e-4,
    unknown_hint: str = "",
    pass_message: str,
) -> CheckResult:
    """Diagnose the learner's ``fn`` with :func:`diagnose`.

    Args:
        fn: the learner's function.
        call: ``call(f)`` returns the function the engine runs on a test input's arguments:
            it calls ``f`` (the learner's, the solution or a planted mistake, all with the
            learner's signature) on cloned arguments and returns a comparable result.
        reference: the engine-level reference (takes a test input's arguments directly).
        mistakes: ``{name: function with the learner's signature}``, tried in order.
        advice: ``{name: text}`` for every name in ``mistakes`` and ``variants``.
        inputs: the test inputs.
        variants: further ``(name, function)`` pairs tried after ``mistakes``: another way
            of writing the same mistake (e.g. ``-1e9`` instead of ``-inf`` in a mask), so the
            diagnosis does not hinge on a detail that does not matter.
        atol, rtol, unknown_hint, pass_message: as in :func:`diagnose`.
    """
    _check_callable(fn)
    planted = [PlantedMistake(name, call(f), advice[name]) for name, f in mistakes.items()]
    planted += [PlantedMistake(name, call(f), advice[name]) for name, f in variants]
    return diagnose(call(fn), reference, planted, inputs, atol=atol, rtol=rtol,
                    unknown_hint=unknown_hint, pass_message=pass_message)
