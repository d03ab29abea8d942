r"""Plumbing shared by the "write it from memory" checkers of notebooks 01-07.

Every checker (``helpers.check_rope``, ``check_attention``, ``check_regularization``,
``check_heads``, ``check_positional``, ``check_kvcache``) is the same three things around
the one engine :func:`helpers.check.diagnose`:

* a **reference**: the ``helpers`` function (itself tested against torch / Hugging Face);
* a **worked solution** written the way a learner would, with the learner's signature, so a
  notebook can show ``PASS`` on it;
* a dict of **planted mistakes** ``{name: function}``, each the solution with one classic
  error, and a dict of advice ``{name: text}`` printed when the learner's results equal that
  mistake's on every input.

:func:`run_check` wires them to :func:`~helpers.check.diagnose`: the learner's function is
wrapped by the checker's ``call`` (which builds the learner's arguments from a test input,
**cloning every tensor** so that an in-place edit by the learner cannot change what the
reference or a planted mistake sees, and converts the result), an exception in the learner's
code becomes a ``FAIL`` message, never an exception. :func:`mistake_symptoms` tabulates what a
checker reports for each of its planted mistakes.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from .check import CheckResult, PlantedMistake, Reject, TestInput, diagnose, mistake_symptoms  # re-exported

__all__ = ["run_check", "mistake_symptoms"]


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
    """Diagnose the learner's ``fn`` with :func:`~helpers.check.diagnose`.

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
        atol, rtol, unknown_hint, pass_message: as in :func:`~helpers.check.diagnose`.
    """
    _check_callable(fn)
    planted = [PlantedMistake(name, call(f), advice[name]) for name, f in mistakes.items()]
    planted += [PlantedMistake(name, call(f), advice[name]) for name, f in variants]
    return diagnose(call(fn), reference, planted, inputs, atol=atol, rtol=rtol,
                    unknown_hint=unknown_hint, pass_message=pass_message)


def labelled(label: str, args: tuple, call: str, atol: Optional[float] = None, rtol: Optional[float] = None) -> TestInput:
    """A :class:`~helpers.check.TestInput` (shorthand)."""
    return TestInput(label, args, call, atol, rtol)
