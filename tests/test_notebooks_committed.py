"""Guards for what nbval cannot see: a notebook committed without outputs passes nbval
silently (cells with no execution_count are not compared), so check here that every
notebook was committed from one clean "restart kernel and run all"."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from pristine import pristine  # tools/pristine.py: the committed copy of a notebook the learner edited

_NB = Path(__file__).resolve().parents[1] / "notebooks"
# The lessons and their appendix notebooks (notebooks/appendix/NNa_topic.ipynb), which nbval runs the same way.
NOTEBOOKS = sorted(_NB.glob("[0-9][0-9]_*.ipynb")) + sorted((_NB / "appendix").glob("[0-9][0-9]*_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_from_one_clean_run(path: Path):
    nb = json.loads(pristine(path).read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c.get("execution_count") for c in code]
    assert None not in counts, f"{path.name}: {counts.count(None)} code cell(s) never executed"
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(code)}: "
        "re-run with 'restart kernel and run all' before committing"
    )
    for i, c in enumerate(code):
        for out in c.get("outputs", []):
            assert out.get("output_type") != "error", f"{path.name}: code cell {i + 1} stored an error ({out.get('ename')})"


NBVAL_TAGS = {"nbval-ignore-output", "nbval-check-output", "nbval-skip", "raises-exception"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_output_hidden_without_reason(path: Path):
    """nbval markers are cell tags, out of the learner's sight, never ``# NBVAL_...`` comments in
    the code they read; a cell whose output nbval ignores says why in its metadata
    (``nbval-ignore-reason``), and no cell is skipped: its asserts must still run."""
    nb = json.loads(pristine(path).read_text(encoding="utf-8"))
    for i, c in enumerate(nb["cells"]):
        src = "".join(c["source"])
        if c["cell_type"] != "code":
            continue
        assert "NBVAL_" not in src, f"{path.name}: cell {i} carries an nbval comment: use a cell tag instead"
        tags = set(c.get("metadata", {}).get("tags", []))
        assert "nbval-skip" not in tags, f"{path.name}: cell {i} is skipped by nbval"
        if "nbval-ignore-output" in tags:
            reason = c["metadata"].get("nbval-ignore-reason", "")
            assert len(reason.strip()) > 10, (
                f"{path.name}: cell {i} ignores its output without an 'nbval-ignore-reason' in its metadata"
            )


# --------------------------------------------------------------------------------------------------
# Evidence that holds on any CPU (CONTRIBUTING.md, "What is compared"): no assert on where a round-off
# value falls, no decade printed as a result, and no trained digit in a cell whose output nbval compares.

_DECADE = re.compile(r"floor\(\s*(?:math|np|numpy|torch)\.log10|log10\([^)]*\)\s*-\s*(?:math\.)?floor")


def roundoff_position_asserts(source: str) -> list[str]:
    """Lines of a code cell that compute where a value sits between powers of ten (its decade, or its
    distance from one) or assert on a log10: a one-ulp change moves such a value across the boundary."""
    bad = []
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        if _DECADE.search(code) or ("assert" in code and "log10" in code):
            bad.append(line.strip())
    return bad


_TRAINERS = {"train", "sweep"}          # helpers functions that run an optimiser
_FLOAT_FMT = re.compile(r":[^{}:]*\.\d+[fge%]\}|%\.?\d*[fge]|\bround\(")

def _call_name(call):
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None

def _names(node):
    """Names a piece of code reads from outside: comprehension and lambda variables are its own."""
    own = set()
    for n in ast.walk(node):
        if isinstance(n, ast.comprehension):
            own |= {t.id for t in ast.walk(n.target) if isinstance(t, ast.Name)}
        elif isinstance(n, ast.Lambda):
            own |= {a.arg for a in n.args.args}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - own - {"_"}


def _reads(s):
    """Names a top-level statement reads before binding them itself (for loops bind their target first)."""
    if isinstance(s, ast.For):
        return _names(s.iter) | (set().union(*(_reads(b) for b in s.body)) - _names(s.target))
    if isinstance(s, (ast.FunctionDef, ast.ClassDef)):
        return set()
    if isinstance(s, (ast.Assign, ast.AnnAssign)):      # a plain name on the left is written, not read
        return _names(s.value) if s.value is not None else set()
    return _names(s)

def _optimises(node, trainers):
    """The code runs an optimiser: calls a trainer, or an optimizer's .step() or .backward() inside a loop
    (one step from fixed numbers is a computation, not a trajectory)."""
    for n in ast.walk(node):
        if isinstance(n, (ast.For, ast.While)) and any(
                isinstance(b, ast.Call) and _call_name(b) in ("backward", "step") for b in ast.walk(n)):
            return True
        if isinstance(n, ast.Call):
            name = _call_name(n)
            if name in trainers and (isinstance(n.func, ast.Name) or n.args or n.keywords):
                return True                      # train(...), helpers.train(model, ...); not module.train()
    return False

class _Flow:
    def __init__(self):
        self.trainers, self.trained = set(_TRAINERS), set()

    def bind(self, target, dirty):
        names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        self.trained = (self.trained | names) if dirty else (self.trained - names)

    def dirty(self, value):
        return bool(_names(value) & self.trained) or _optimises(value, self.trainers)

    def stmts(self, body):
        for s in body:
            self.stmt(s)

    def stmt(self, s):
        if isinstance(s, (ast.FunctionDef, ast.ClassDef)):
            if _optimises(s, self.trainers):
                self.trainers.add(s.name)
            self.trained.discard(s.name)
            return
        if isinstance(s, ast.Assign):
            d = self.dirty(s.value)
            for t in s.targets:
                self.bind(t, d)
        elif isinstance(s, (ast.AnnAssign, ast.AugAssign)) and s.value is not None:
            self.bind(s.target, self.dirty(s.value) or (isinstance(s, ast.AugAssign) and bool(_names(s.target) & self.trained)))
        elif isinstance(s, ast.For):
            self.bind(s.target, self.dirty(s.iter))
            self.stmts(s.body)   # twice: names dirtied late in the body
            self.stmts(s.body)
            self.stmts(s.orelse)
        elif isinstance(s, (ast.With, ast.If, ast.While, ast.Try)):
            for field in ("body", "orelse", "finalbody"):
                self.stmts(getattr(s, field, []) or [])
            for h in getattr(s, "handlers", []) or []:
                self.stmts(h.body)
        for n in ast.walk(s):                                   # train(model, ...) trains model in place
            if isinstance(n, ast.Call) and _call_name(n) == "train" and n.args:
                self.trained |= _names(n.args[0])

def trained_digit_cells(cells):
    """Yield (index, names) for code cells without the nbval-ignore-output tag that format floats
    (f"{x:.3f}", "%.2f", round(...)) and print them, at top level, from a trained result: a name bound to
    what a trainer returned (helpers.train/sweep, or a notebook function that calls opt.step() or a trainer),
    or to an expression of such names, or the model argument of train(model, ...)."""
    flow = _Flow()
    for i, (src, tags) in enumerate(cells):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        used, runs = set(), False
        for s in tree.body:
            if not isinstance(s, (ast.FunctionDef, ast.ClassDef)):
                used |= _reads(s) & flow.trained
                runs = runs or _optimises(s, flow.trainers)
            flow.stmt(s)
        if (used or runs) and "nbval-ignore-output" not in tags and _FLOAT_FMT.search(src) \
                and re.search(r"\bprint\(|display\(", src):
            yield i, sorted(used)[:4] or ["runs a trainer"]


def _cells(nb):
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    return code, [("".join(c["source"]), set(c.get("metadata", {}).get("tags", []))) for c in code]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_assert_on_where_a_roundoff_value_falls(path: Path):
    nb = json.loads(pristine(path).read_text(encoding="utf-8"))
    for i, (src, tags) in enumerate(_cells(nb)[1]):
        bad = roundoff_position_asserts(src)
        assert not bad, (f"{path.name}: code cell {i + 1} computes or asserts the decade of a value: {bad}. "
                         "Print a round-off size with helpers.lab.roundoff and assert only its bound")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_decade_printed_in_compared_output(path: Path):
    """The old convention printed 'of order 1e-7': a decade is not portable either (issue: AVX-512 printed
    1e-15 where 1e-16 was committed). Round-off sizes go through helpers.lab.roundoff, which nbval masks."""
    nb = json.loads(pristine(path).read_text(encoding="utf-8"))
    for i, c in enumerate(_cells(nb)[0]):
        if "nbval-ignore-output" in c.get("metadata", {}).get("tags", []):
            continue
        for out in c.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            assert not re.search(r"of order 1e[-+]?\d", text), (
                f"{path.name}: code cell {i + 1} prints a decade ('of order 1e..') in compared output; use helpers.lab.roundoff")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_trained_digit_in_a_compared_cell(path: Path):
    nb = json.loads(pristine(path).read_text(encoding="utf-8"))
    code, cells = _cells(nb)
    found = [(i + 1, names, cells[i][0].splitlines()[0][:70]) for i, names in trained_digit_cells(cells)]
    assert not found, (f"{path.name}: cells that print digits of a trained result but whose output nbval compares "
                       f"(tag them nbval-ignore-output with a reason and assert the claim with margins): {found}")


# The detectors themselves, on cells written to be caught and cells written to pass.
_TRAIN_LOOP = """
def fit_it(steps=100):
    w = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(steps):
        loss = ((w - 1) ** 2).sum(); opt.zero_grad(); loss.backward(); opt.step()
    return w.detach()
"""


@pytest.mark.parametrize("cells, caught", [
    ([(_TRAIN_LOOP, set()), ("w = fit_it()\nprint(f'{w[0]:.3f}')", set())], [1]),
    ([(_TRAIN_LOOP, set()), ("w = fit_it()\nprint(f'{w[0]:.3f}')", {"nbval-ignore-output"})], []),
    ([(_TRAIN_LOOP, set()), ("w = fit_it()", set()), ("v = w * 2\nprint(f'{v[0]:.3f}')", set())], [2]),
    ([(_TRAIN_LOOP, set()), ("w = fit_it()", set()), ("w = torch.ones(3)\nprint(f'{w[0]:.3f}')", set())], []),
    ([("res = train(model, task, steps=50)", {"nbval-ignore-output"}), ("print(f'{evaluate(model, d)[1]:.2f}')", set())], [1]),
    ([("model = TinyTransformer(8, 16, 2)\nmodel.train()\nprint(f'{model(x).sum():.2f}')", set())], []),
    ([("for s in range(3):\n    w = torch.zeros(2, requires_grad=True)\n    for _ in range(5):\n"
       "        w.sum().backward()\n    print(f'{w.grad[0]:.2f}')", set())], [0]),
    ([("acc = [r['val_acc'] for r in json.load(open('x.json'))]\nprint(f'{acc[0]:.3f}')", set())], []),
])
def test_trained_digit_detector(cells, caught):
    assert [i for i, _ in trained_digit_cells(cells)] == caught


@pytest.mark.parametrize("line, bad", [
    ("assert 0.25 <= frac <= 0.75", False),
    ("frac = math.log10(err) - math.floor(math.log10(err))", True),
    ('return "0" if err == 0 else f"1e{math.floor(math.log10(err))}"', True),
    ("assert math.log10(err) < -6", True),
    ("assert err < 1e-6", False),
    ("print(f'{roundoff(err)} (asserted < 1e-6)')", False),
])
def test_roundoff_position_detector(line, bad):
    assert bool(roundoff_position_asserts(line)) == bad


# --------------------------------------------------------------------------------------------------
# Issue 23: one Exercises section per notebook, one numbering (03 once had exercises 8a/8b in its §8 and
# "Exercises 1-5" again in its Takeaways). The solutions themselves are checked by tests/test_solutions.py.

_EXERCISES_HEADING = re.compile(r"^#{1,6}\s+(?:\d+[a-z]?\.?\s+)?Exercises\b.*$", re.IGNORECASE | re.MULTILINE)


def exercises_headings(nb: dict) -> list[str]:
    """The markdown headings that open an Exercises section ("## Exercises", "## 8. Exercises: ..."); a
    deeper heading inside the first such section ("### Exercises 3-6" under "## Exercises") is a part of it."""
    found = [m.group(0).strip() for c in nb["cells"] if c["cell_type"] == "markdown"
             for m in _EXERCISES_HEADING.finditer("".join(c["source"]))]
    if not found:
        return []
    level = len(found[0]) - len(found[0].lstrip("#"))
    return [found[0]] + [h for h in found[1:] if len(h) - len(h.lstrip("#")) <= level]


# An appendix holds evidence, not exercises; 00_daily_practice is the practice notebook itself (its cards
# are the lessons' from-memory exercises), so it has no Exercises section of its own.
LESSONS = [p for p in NOTEBOOKS if p.parent.name != "appendix" and p.stem != "00_daily_practice"]


@pytest.mark.parametrize("path", LESSONS, ids=[p.name for p in LESSONS])
def test_one_exercises_section(path: Path):
    headings = exercises_headings(json.loads(pristine(path).read_text(encoding="utf-8")))
    assert len(headings) == 1, f"{path.name}: expected one Exercises section, found {len(headings)}: {headings}"


def test_exercises_heading_detector():
    nb = {"cells": [{"cell_type": "markdown", "source": "## 8. Exercises: write attention from memory\ntext"},
                    {"cell_type": "markdown", "source": ["intro\n", "## Exercises\n", "### Exercise 1: x"]},
                    {"cell_type": "code", "source": "# Exercises"},
                    {"cell_type": "markdown", "source": "The exercises below ...\n#### Exercise 2\n### Exercises 3-6"}]}
    assert exercises_headings(nb) == ["## 8. Exercises: write attention from memory", "## Exercises"]
    assert exercises_headings({"cells": nb["cells"][1:]}) == ["## Exercises"]
