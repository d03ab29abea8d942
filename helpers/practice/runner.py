r"""Run a learner's solution for one card in a child process, with a time limit.

:func:`run_solution` starts ``python -m helpers.practice._child`` with the card's id and the
learner's source (a JSON line on stdin). The child runs :data:`~helpers.practice.deck.PRELUDE`
and the source in a fresh namespace, looks up each name the card asks for, and calls its checker
(after ``helpers.seed_everything(0)``, as the notebooks do). It writes the verdicts as JSON after a
marker line; everything the learner's code printed (stdout and stderr) is kept and shown.

An infinite loop ends with "took longer than N s" (N from ``timeout``, default the environment
variable ``ATTN_PRACTICE_TIMEOUT`` or 60 s), never a hung kernel. The child runs in a session
(process group) of its own and ends with ``os._exit`` once its verdict is written, so a thread the
learner's code leaves running does not hold it; what is left of the group afterwards (a process
the code started) is killed, and the verdict is read even from output cut short by the time limit.
The child's output goes to temporary files, not pipes, so a lingering grandchild cannot hold it open. An exception while the code is
defined or checked is a FAIL with the traceback's last line, as the checkers report exceptions.
``sys.exit`` in the code is a FAIL like any exception. A solution that does not define the asked name is a :class:`~helpers.practice.deck.PracticeError`
(nothing is recorded).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .deck import PRELUDE, CardSpec, PracticeError
from .deck import card as _card

__all__ = ["Verdict", "Outcome", "run_solution", "evaluate_source", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 60.0
MARK = "\x1e--practice-verdicts--\x1e"
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Verdict:
    """One checker's verdict: as :class:`~helpers.practice.engine.CheckResult`, in plain data."""

    label: str
    passed: bool
    diagnosis: Optional[str]
    message: str


@dataclass
class Outcome:
    """What running a solution gave: the verdicts, what the code printed, and the overall result."""

    card: str
    verdicts: list[Verdict] = field(default_factory=list)
    output: str = ""  # what the learner's code printed (stdout, then stderr)
    error: Optional[str] = None  # "timeout" or "exception" when the code did not get to be checked

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.verdicts) and all(v.passed for v in self.verdicts)

    @property
    def diagnosis(self) -> Optional[str]:
        if self.error:
            return self.error
        return next((v.diagnosis for v in self.verdicts if not v.passed), None)

    def report(self) -> str:
        """The verdicts as the checkers print them, one per check (labelled when a card has several)."""
        lines = [f"{v.label}: {v.message}" if v.label else v.message for v in self.verdicts]
        return "\n".join(lines)


def _timeout() -> float:
    raw = os.environ.get("ATTN_PRACTICE_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise PracticeError(f"ATTN_PRACTICE_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise PracticeError(f"ATTN_PRACTICE_TIMEOUT must be > 0 seconds, got {raw!r}")
    return value


def run_solution(card_id: str | CardSpec, source: str, timeout: Optional[float] = None) -> Outcome:
    """Check ``source`` (the learner's code for the card) in a child process limited to ``timeout`` s.

    Raises:
        PracticeError: unknown card, ``source`` not a string, or a solution that does not define
            a name the card asks for (the error names the card and the rule).
    """
    spec = _card(card_id)
    if not isinstance(source, str):
        raise PracticeError(f"card {spec.id!r}: the solution must be Python source text, got {type(source).__name__}")
    limit = _timeout() if timeout is None else float(timeout)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    request = json.dumps({"card": spec.id, "source": source})
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write(request.encode())
        stdin.seek(0)
        proc = subprocess.Popen([sys.executable, "-m", "helpers.practice._child"], stdin=stdin, stdout=stdout,
                                stderr=stderr, env=env, cwd=str(_REPO), start_new_session=True)
        timed_out = True
        try:
            proc.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            pass
        finally:  # also when the caller is interrupted (Interrupt in JupyterLab, Ctrl-C): nothing is left running
            _kill_group(proc)  # the child on a timeout; after it, any process the learner's code left running
            proc.wait()
        stdout.seek(0)
        stderr.seek(0)
        out_text, err_text = _text(stdout.read()), _text(stderr.read())
    out, _, tail = out_text.partition(MARK)
    printed = out + err_text
    data = _verdicts(tail)
    if data is None and timed_out:
        msg = (f"FAIL: card {spec.id!r}: your code took longer than {limit:g} s and was stopped "
               f"(rule: each check runs in a child process with a time limit; an infinite loop?).")
        return Outcome(spec.id, [Verdict("", False, "timeout", msg)], printed, "timeout")
    if data is None:
        msg = f"FAIL: card {spec.id!r}: the check process ended with exit code {proc.returncode} before a verdict."
        return Outcome(spec.id, [Verdict("", False, "exception", msg)], printed, "exception")
    if data.get("missing"):
        raise PracticeError(
            f"card {spec.id!r}: your code does not define {data['missing']!r} (rule: the solution must "
            f"define {', '.join(spec.names)}, with the scaffold's signature)")
    verdicts = [Verdict(**v) for v in data["verdicts"]]
    return Outcome(spec.id, verdicts, printed, data.get("error"))


def _verdicts(tail: str) -> Optional[dict]:
    """The child's verdict JSON after the marker, or None if it is absent or cut short."""
    try:
        return json.loads(tail) if tail else None
    except json.JSONDecodeError:
        return None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child and whatever it started); nothing if it is gone."""
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    elif proc.poll() is None:
        proc.kill()


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def _last_line(e: BaseException, filename: str) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == filename]
    where = f" at line {frames[-1].lineno}" if frames else ""
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}){where}"
    return f"{type(e).__name__}{where}: {e}"


def evaluate_source(card_id: str | CardSpec, source: str) -> dict:
    """Run ``source`` and the card's checks **in this process** (the child's work; tests call it directly).

    Returns ``{"verdicts": [...], "error": None | "exception", "missing": None | name}``.
    """
    import importlib

    spec = _card(card_id)
    filename = f"<solution of card {spec.id}>"
    ns: dict = {"__name__": "__solution__"}
    exec(PRELUDE, ns)
    result: dict = {"verdicts": [], "error": None, "missing": None}
    try:
        exec(compile(source, filename, "exec"), ns)
    except BaseException as e:  # the learner's code: report, don't crash
        msg = (f"FAIL: card {spec.id!r}: your code raised {_last_line(e, filename)} while it was being defined "
               f"(rule: the solution must run top to bottom and define {', '.join(spec.names)}).")
        result.update(error="exception", verdicts=[dict(label="", passed=False, diagnosis="exception", message=msg)])
        return result
    result["missing"] = next((n for n in spec.names if n not in ns), None)
    if result["missing"]:
        return result
    from helpers.utils import seed_everything

    for check in spec.checks:
        module, fn = check.checker.split(":")
        checker = getattr(importlib.import_module(module), fn)
        seed_everything(0)
        try:
            r = checker(ns[check.name], **dict(check.kwargs))
        except BaseException as e:  # the checkers catch Exception; SystemExit or KeyboardInterrupt gets here
            msg = (f"FAIL: card {spec.id!r}: your code raised {_last_line(e, filename)} while it was being checked "
                   f"(rule: the solution's {check.name} must return a result, not exit or stop the process).")
            result.update(error="exception")
            result["verdicts"].append(dict(label=check.label, passed=False, diagnosis="exception", message=msg))
            return result
        result["verdicts"].append(dict(label=check.label, passed=bool(r.passed), diagnosis=r.diagnosis,
                                       message=r.message))
    return result
