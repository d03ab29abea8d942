"""The worked solutions of every notebook's exercises still run (issue 23).

Solutions are folded where every renderer folds them: one markdown cell per solution,

    <details>
    <summary><b>Solution to exercise N</b> (click to show)</summary>

    ```python
    ...the solution code...
    ```

    </details>

(GitHub, nbviewer and JupyterLab all show it folded; a hidden code cell is folded in JupyterLab only).
Markdown is never executed, so this file does what nbval cannot: it extracts the ```python blocks of
every ``<details>`` whose ``<summary>`` starts with ``<b>Solution`` and runs them.

How each solution runs: in one Python process for all the notebooks of a test run, apart from the
tests' own (the setup cells seed torch, fix its thread count and switch on deterministic algorithms;
none of that leaks into the other tests of this worker). Before each notebook's solutions it moves to
the notebook's folder (as a kernel started there) and puts back what a new kernel would have: the
environment, no warning shown yet, torch's default dtype and grad mode, matplotlib's rcParams (backend
Agg). For each solution, a fresh namespace gets IPython's ``display`` (a builtin in a kernel) and then
the notebook's first code cell (its setup cell; its imports are cached after the first notebook, so
this costs milliseconds) and then the solution's python block(s) in order, in that same namespace.
Nothing else of the notebook runs, so a solution must rebuild the small tensors and modules it needs.
Figures are closed after each solution. A solution that calls a ``helpers`` checker asserts that the
checker passed, so a failing checker fails here.

What each solution prints is shown inside its fold, right after its code, as a ```text block under
the line ``<!-- solution output -->`` (a reader on GitHub sees the result without a kernel). That
block is written by ``python tests/test_solutions.py --write notebooks/NN_name.ipynb`` (run it after
editing a solution) and compared here with what the solution prints now, after the nbval sanitize
patterns (``tests/nbval_sanitize.cfg``, so round-off sizes are masked as in the notebooks). A solution
that trains (its code calls ``.backward(``, ``.step(``, ``train``, ``fit`` or ``sweep``) prints digits
that vary by CPU: its block is marked ``<!-- solution output, trained: numbers not compared -->`` and
compared with every number masked; its claims are its asserts.

Static checks beside it: no code cell is hidden with ``metadata.jupyter.source_hidden`` (the old
format, visible on GitHub); a notebook with an Exercises section has at least one solution in the
new format; a solution's code block is separated from its ``</summary>`` by a blank line (without
it, GitHub and JupyterLab print the fence as raw text inside the HTML block); a solution that calls
a ``check_*`` checker asserts on its ``.passed``; each exercise label has one solution block.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # also when run as a script (--write)
from pristine import pristine  # noqa: E402  (tools/pristine.py: the committed copy of a notebook the learner edited)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")) + sorted((NOTEBOOK_DIR / "appendix").glob("[0-9][0-9]*_*.ipynb"))
RUN_TIMEOUT_S = 600  # for all the solutions of a run together; each is meant to take < 3 s


# --------------------------------------------------------------------------------------------------
# Extraction (pure functions of the notebook's JSON)

@dataclass
class Solution:
    """One ``<details>`` block whose summary starts with ``<b>Solution``."""

    label: str                 # the exercise label ("1", "3a"), "?" when the summary names none
    cell: int                  # index of the markdown cell in nb["cells"]
    blocks: list[str]          # the ```python blocks, in order
    problems: list[str] = field(default_factory=list)   # format errors found while extracting
    key: str = ""              # unique within its notebook: the label, or "label (2)" for a repeat
    output: Optional[str] = None   # the committed ```text block under <!-- solution output -->, if any
    trained: bool = False          # its code trains: numbers in its output are not compared


_DETAILS_TAG = re.compile(r"<(/?)details\b[^>]*>", re.IGNORECASE)
_SUMMARY = re.compile(r"<summary\b[^>]*>(.*?)</summary>", re.IGNORECASE | re.DOTALL)
_LABEL = re.compile(r"^<b>\s*Solution(?:\s+to)?(?:\s+exercises?)?\s+([0-9][0-9A-Za-z.\-]*)", re.IGNORECASE)
_FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
_HEADING_EXERCISES = re.compile(r"^#{1,6}\s+(?:\d+[a-z]?\.?\s+)?Exercises\b", re.IGNORECASE | re.MULTILINE)


_OUTPUT_BLOCK = re.compile(r"\n*<!-- solution output(?P<kind>[^>]*)-->\n+(?:[^\n]*\n+)?```text\n(?P<text>.*?)```\n?",
                           re.DOTALL)
_TRAINS = re.compile(r"\.backward\(|\.step\(|\btrain\w*\(|\bfit\w*\(|\bsweep\(")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?%?")


def trains(code: str) -> bool:
    """Whether a solution's code trains something (its printed numbers then vary by CPU)."""
    return bool(_TRAINS.search(code))


def sanitize_patterns() -> list[tuple[re.Pattern, str]]:
    """The regex/replace pairs of tests/nbval_sanitize.cfg, in order."""
    pairs, regex = [], None
    for line in (ROOT / "tests" / "nbval_sanitize.cfg").read_text(encoding="utf-8").splitlines():
        if line.startswith("regex:"):
            regex = re.compile(line[len("regex:"):].strip())
        elif line.startswith("replace:") and regex is not None:
            pairs.append((regex, line[len("replace:"):].strip()))
            regex = None
    return pairs


def comparable(text: str, trained: bool) -> str:
    """Output as compared: sanitized like nbval, trailing spaces dropped, numbers masked for training."""
    for regex, repl in sanitize_patterns():
        text = regex.sub(repl, text)
    if trained:
        text = _NUMBER.sub("#", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def details_blocks(text: str) -> tuple[list[tuple[str, bool]], list[str]]:
    """The bodies of the outermost ``<details>`` elements of a markdown text as ``(body, closed)``, and
    the problems found (a stray ``</details>``). An unclosed ``<details>`` runs to the end of the text,
    with ``closed=False``. Nested elements stay inside their parent's body."""
    bodies, problems, depth, start = [], [], 0, 0
    for m in _DETAILS_TAG.finditer(text):
        if m.group(1) == "":
            if depth == 0:
                start = m.end()
            depth += 1
        elif depth == 0:
            problems.append("a </details> without its <details>")
        else:
            depth -= 1
            if depth == 0:
                bodies.append((text[start:m.start()], True))
    if depth:
        bodies.append((text[start:], False))
    return bodies, problems


def fenced_blocks(text: str, languages=("python", "py", "python3")) -> list[tuple[str, int]]:
    """The fenced code blocks of a markdown text whose info string names one of ``languages``:
    ``(code, line index of the opening fence)``. The code is dedented by the fence's indentation.
    An unclosed fence runs to the end of the text (as CommonMark reads it)."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, info = m.group("fence"), len(m.group("indent")), m.group("info").lower()
        close = re.compile(r"^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        body, j = [], i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            j += 1
        if info in languages:
            out.append(("\n".join(body) + "\n", i))
        i = j + 1
    return out


def _blank_line_before_first_fence(body: str) -> bool:
    """True when the text between ``</summary>`` and the first code fence contains a blank line.
    The ``<details>``/``<summary>`` lines open an HTML block that only a blank line ends; a fence
    inside it is not parsed as markdown."""
    after = re.split(r"</summary>", body, maxsplit=1, flags=re.IGNORECASE)[-1]
    lines = after.split("\n")
    for k, line in enumerate(lines):
        if _FENCE_OPEN.match(line):
            return any(not ln.strip() for ln in lines[1:k])  # lines[0]: the rest of the </summary> line
    return True


def extract_solutions(nb: dict) -> list[Solution]:
    """Every solution of a notebook, in cell order (see the module docstring for the format)."""
    found: list[Solution] = []
    for ci, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "markdown":
            continue
        bodies, problems = details_blocks(_source(cell))
        for body, closed in bodies:
            m = _SUMMARY.search(body)
            if not m or not m.group(1).strip().lower().startswith("<b>solution"):
                continue
            summary = m.group(1).strip()
            lm = _LABEL.match(summary)
            sol = Solution(label=lm.group(1).rstrip(".") if lm else "?", cell=ci,
                           blocks=[code for code, _ in fenced_blocks(body[m.end():])], problems=list(problems))
            om = _OUTPUT_BLOCK.search(body)
            if om:
                sol.output = om.group("text")
            sol.trained = trains("\n".join(sol.blocks))
            if not closed:
                sol.problems.append("its <details> is never closed with </details>")
            if not lm:
                sol.problems.append(f"its summary {summary[:60]!r} names no exercise "
                                    "(expected '<b>Solution to exercise N</b>')")
            if not sol.blocks:
                sol.problems.append("it holds no ```python code block")
            elif not _blank_line_before_first_fence(body):
                sol.problems.append("no blank line between </summary> and the code fence: "
                                    "GitHub and JupyterLab would show the fence as raw text")
            found.append(sol)
    seen: dict[str, int] = {}
    for sol in found:
        seen[sol.label] = seen.get(sol.label, 0) + 1
        sol.key = sol.label if seen[sol.label] == 1 else f"{sol.label} ({seen[sol.label]})"
    return found


def setup_source(nb: dict) -> str:
    """The notebook's first code cell (its setup cell, CONVENTIONS.md)."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            return _source(cell)
    return ""


def has_exercises_section(nb: dict) -> bool:
    return any(cell.get("cell_type") == "markdown" and _HEADING_EXERCISES.search(_source(cell))
               for cell in nb.get("cells", []))


def hidden_code_cells(nb: dict) -> list[int]:
    return [i for i, c in enumerate(nb.get("cells", []))
            if c.get("cell_type") == "code" and c.get("metadata", {}).get("jupyter", {}).get("source_hidden")]


# --------------------------------------------------------------------------------------------------
# Running (one child process for all the notebooks of a run)

_RUNNER = textwrap.dedent(r'''
    import io, json, linecache, os, sys, time, traceback, contextlib, warnings
    payload_path, result_path = sys.argv[1], sys.argv[2]
    payload = json.load(open(payload_path, encoding="utf-8"))
    try:
        from IPython.display import display
    except ImportError:
        display = print
    results = {}
    environ = dict(os.environ)

    def _compile(src, name):
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # source lines in tracebacks
        return compile(src, name, "exec")

    def _save():
        with open(result_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(results, f)
        os.replace(result_path + ".tmp", result_path)

    def _fresh_process_state(cwd):
        """What one notebook's solutions may change in the process, put back before the next notebook's: its
        kernel would start in its own folder with the environment, warnings and torch defaults of a new process."""
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        # a warning shown in an earlier notebook is shown again. The filters stay: modules add theirs when first
        # imported and are not imported again, so a later notebook keeps those of an earlier one's imports (e.g.
        # transformers adds three: scipy, numpy, sympy); harmless for these solutions. No setup cell or solution
        # sets one (test_no_solution_sets_warning_filters).
        warnings.onceregistry.clear()
        warnings._filters_mutated()  # empties every module's registry of warnings already shown
        if "torch" in sys.modules:
            torch = sys.modules["torch"]
            torch.set_default_dtype(torch.float32)
            torch.set_grad_enabled(True)
        if "matplotlib" in sys.modules:
            sys.modules["matplotlib"].rc_file_defaults()  # as a new process reads them (matplotlibrc included)

    for group in payload["groups"]:
        _fresh_process_state(group["cwd"])
        res_group = results.setdefault(group["name"], {})
        for sol in group["solutions"]:
            ns = {"__name__": "__main__", "display": display}
            out = io.StringIO()
            stage, t0 = "the setup cell (the notebook's first code cell)", time.perf_counter()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    exec(_compile(group["setup"], "<setup cell>"), ns)
                    for k, code in enumerate(sol["blocks"]):
                        stage = f"code block {k + 1} of the solution"
                        exec(_compile(code, f"<solution {sol['key']}, block {k + 1}>"), ns)
                res = {"ok": True}
            except KeyboardInterrupt:
                raise
            except BaseException:
                err = sys.exc_info()
                res = {"ok": False, "stage": stage,  # the traceback from the notebook's code on, without this runner's frame
                       "traceback": "".join(traceback.format_exception(err[0], err[1], err[2].tb_next))}
            finally:
                if "matplotlib.pyplot" in sys.modules:
                    sys.modules["matplotlib.pyplot"].close("all")
            res["seconds"] = round(time.perf_counter() - t0, 2)
            res["output_tail"] = out.getvalue()[-2000:]
            res["output"] = out.getvalue()
            res_group[sol["key"]] = res
            _save()
    _save()
''')


@dataclass
class Group:
    """The solutions of one notebook, as the runner takes them: run after ``setup``, in ``cwd``."""

    name: str
    setup: str
    solutions: list[Solution]
    cwd: Path


def run_groups(groups: list[Group], timeout: float = RUN_TIMEOUT_S) -> dict:
    """Run every group's solutions in one child process with matplotlib backend Agg: each solution after
    its group's ``setup``, in a fresh namespace, with working directory the group's ``cwd``. Before each
    group, the child puts back its environment, the record of warnings already shown, torch's default dtype and
    grad mode and matplotlib's rcParams, as a new kernel would have them (imported modules stay: that is the saving,
    one interpreter and one ``import torch`` for all the notebooks). Returns ``{group name: {key: result}}``:
    ``ok``, ``seconds``, ``output_tail`` and, on failure, ``stage`` and ``traceback``. A solution the child
    never reached (it crashed or ran out of time) gets ``ok=False`` and the reason."""
    todo = [{"name": g.name, "setup": g.setup, "cwd": str(g.cwd),
             "solutions": [{"key": s.key, "blocks": s.blocks} for s in g.solutions if s.blocks]} for g in groups]
    results: dict = {}
    if any(g["solutions"] for g in todo):
        with tempfile.TemporaryDirectory(prefix="solutions-") as tmp:
            payload, result = Path(tmp) / "payload.json", Path(tmp) / "result.json"
            payload.write_text(json.dumps({"groups": todo}), encoding="utf-8")
            env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
                [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            try:
                proc = subprocess.run([sys.executable, "-c", _RUNNER, str(payload), str(result)], cwd=ROOT, env=env,
                                      capture_output=True, text=True, timeout=timeout)
                why = f"the child process exited with code {proc.returncode}: {proc.stderr[-2000:]}"
            except subprocess.TimeoutExpired:
                why = f"the solutions run took more than {timeout:.0f} s together"
            results = json.loads(result.read_text(encoding="utf-8")) if result.exists() else {}
    for g in todo:
        got = results.setdefault(g["name"], {})
        for s in g["solutions"]:
            got.setdefault(s["key"], {"ok": False, "stage": "(not reached)", "traceback": why,
                                      "seconds": None, "output_tail": "", "output": ""})
    return results


def run_solutions(setup: str, solutions: list[Solution], cwd: Path, timeout: float = RUN_TIMEOUT_S) -> dict:
    """Run ``solutions`` of one notebook (see :func:`run_groups`). Returns ``{key: result}``."""
    return run_groups([Group("", setup, solutions, cwd)], timeout)[""]


def _load(path: Path, committed: bool = True) -> dict:
    """The notebook the tests read: its committed version where the learner edited it (``--write``
    reads and writes the working copy)."""
    return json.loads((pristine(path) if committed else path).read_text(encoding="utf-8"))


_CASES = [(p, s) for p in NOTEBOOKS for s in extract_solutions(_load(p))]


def _setup_only() -> Solution:
    return Solution(label="setup", cell=-1, blocks=["pass\n"], key=_SETUP_KEY)


@pytest.fixture(scope="module")
def solution_results(request):
    """``solution_results(path)``: the results of every solution of one notebook. On the first call, the
    solutions of every notebook this session runs ``test_solution_runs`` for are run, in one child process."""
    cache: dict[Path, dict] = {}

    def get(path: Path) -> dict:
        if path not in cache:
            selected = {item.callspec.params["path"] for item in request.session.items
                        if getattr(item, "originalname", None) == "test_solution_runs"} | {path}
            groups = []
            for nb_path in [p for p in NOTEBOOKS if p in selected]:
                nb = _load(nb_path)
                # The setup cell alone first: what it prints is cut from every solution's output (setup_free).
                groups.append(Group(str(nb_path), setup_source(nb), [_setup_only()] + extract_solutions(nb),
                                    nb_path.parent))
            for name, res in run_groups(groups).items():
                cache[Path(name)] = res
                _SETUP_OUTPUT[Path(name)] = res.pop(_SETUP_KEY, {}).get("output", "")
        return cache[path]

    return get


_SETUP_OUTPUT: dict[Path, str] = {}
_SETUP_KEY = "(the setup cell alone)"


def setup_free(output: str, path: Path) -> str:
    """A solution's output without what the setup cell printed first (the same for every solution
    of a notebook: it is the setup cell's own output in the notebook)."""
    if path not in _SETUP_OUTPUT:
        nb = _load(path)
        res = run_solutions(setup_source(nb), [Solution(label="setup", cell=-1, blocks=["pass\n"], key="setup")],
                            cwd=path.parent)
        _SETUP_OUTPUT[path] = res["setup"].get("output", "")
    pre = _SETUP_OUTPUT[path]
    return output[len(pre):] if pre and output.startswith(pre) else output


def write_outputs(path: Path) -> list[str]:
    """Run every solution of a notebook and write what it prints into its fold (see the module
    docstring). Returns one line per solution. Raises ``RuntimeError`` when a solution fails."""
    nb = _load(path, committed=False)
    sols = extract_solutions(nb)
    results = run_solutions(setup_source(nb), sols, cwd=path.parent)
    report = []
    for sol in sols:
        res = results.get(sol.key)
        if res is None:
            continue
        if not res["ok"]:
            raise RuntimeError(_failure(path.name, sol, res))
        text = setup_free(res["output"], path).strip("\n")
        cell = nb["cells"][sol.cell]
        src = _OUTPUT_BLOCK.sub("\n", _source(cell)) if sol.output is not None else _source(cell)
        # after the last ```python block of this solution's <details>
        start = src.find(sol_summary_anchor(sol, src))
        last_close = _last_python_fence_end(src, start)
        mark = "<!-- solution output, trained: numbers not compared -->" if sol.trained else "<!-- solution output -->"
        lead = ("It prints (on the machine that committed this notebook; trained numbers vary by CPU):"
                if sol.trained else "It prints:")
        block = f"\n\n{mark}\n{lead}\n\n```text\n{text if text else '(nothing)'}\n```\n"
        rest = src[last_close:].lstrip("\n")
        src = src[:last_close] + block + ("\n" + rest if rest else "")
        cell["source"] = src.splitlines(keepends=True)
        report.append(f"{path.name} exercise {sol.key}: {len(text.splitlines())} line(s){' (trained)' if sol.trained else ''}")
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return report


def sol_summary_anchor(sol: Solution, src: str) -> str:
    """The text of this solution's summary line in its cell (a cell may hold several folds)."""
    for m in _SUMMARY.finditer(src):
        lm = _LABEL.match(m.group(1).strip())
        if lm and lm.group(1).rstrip(".") == sol.label:
            return m.group(0)
    return "<summary>"


def _last_python_fence_end(src: str, start: int) -> int:
    """Index just after the closing fence of the last ```python block of the fold that starts at ``start``."""
    end = src.find("</details>", start)
    end = len(src) if end < 0 else end
    body = src[start:end]
    lines = body.split("\n")
    pos, last, i = 0, None, 0
    offsets = []
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if m:
            fence, info = m.group("fence"), m.group("info").lower()
            close = re.compile(r"^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
            j = i + 1
            while j < len(lines) and not close.match(lines[j]):
                j += 1
            if info in ("python", "py", "python3") and j < len(lines):
                last = offsets[j] + len(lines[j])
            i = j + 1
            continue
        i += 1
    return start + (last if last is not None else len(body))


def _failure(name: str, sol: Solution, res: dict) -> str:
    msg = f"{name}, solution to exercise {sol.key} (markdown cell {sol.cell}) failed in {res['stage']}:\n{res['traceback']}"
    if res.get("output_tail"):
        msg += f"\n--- its output (last 2000 characters) ---\n{res['output_tail']}"
    return msg


@pytest.mark.parametrize("path, sol", _CASES, ids=[f"{p.stem[:2]}-exercise-{s.key}" for p, s in _CASES])
def test_solution_runs(path: Path, sol: Solution, solution_results):
    assert not sol.problems, f"{path.name}, solution to exercise {sol.key} (markdown cell {sol.cell}): " + "; ".join(sol.problems)
    res = solution_results(path)[sol.key]
    if not res["ok"]:
        pytest.fail(_failure(path.name, sol, res), pytrace=False)
    assert sol.output is not None, (f"{path.name}, solution to exercise {sol.key}: no output block in its fold; "
                                    f"write it with `python tests/test_solutions.py --write notebooks/{path.name}`")
    got, want = comparable(setup_free(res["output"], path), sol.trained), comparable(sol.output, sol.trained)
    assert got == want, (f"{path.name}, solution to exercise {sol.key} prints something else than its committed output "
                         f"block{' (numbers masked: it trains)' if sol.trained else ''}; if the change is intended, "
                         f"rewrite it with `python tests/test_solutions.py --write notebooks/{path.name}`\n"
                         f"--- committed ---\n{want}\n--- now ---\n{got}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_with_exercises_has_solutions_in_details_blocks(path: Path):
    """Fails, naming the notebook, while its Exercises section has no ``<details>`` solution yet."""
    nb = _load(path)
    assert not (has_exercises_section(nb) and not extract_solutions(nb)), (
        f"{path.name} has an Exercises section but no solution in a "
        "'<details><summary><b>Solution to exercise N</b>' markdown cell (not yet converted: issue 23)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_hidden_code_cell(path: Path):
    """A code cell hidden with ``source_hidden`` is folded in JupyterLab only: GitHub and nbviewer show it."""
    hidden = hidden_code_cells(_load(path))
    assert not hidden, (f"{path.name}: code cell(s) at index {hidden} are hidden with metadata.jupyter.source_hidden; "
                        "fold solutions in a markdown <details> block instead (tests/test_solutions.py)")


def unasserted_checker_calls(code: str) -> list[str]:
    """Names of ``check_*`` calls (the ``helpers`` checkers) in a solution that never asserts on a
    ``.passed``: a failing checker returns a result, it does not raise, so such a solution would pass."""
    import ast
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []  # reported by the run itself, with its traceback
    calls = sorted({(n.func.id if isinstance(n.func, ast.Name) else n.func.attr) for n in ast.walk(tree)
                    if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))
                    and (n.func.id if isinstance(n.func, ast.Name) else n.func.attr).startswith("check_")})
    asserts_passed = any(isinstance(n, ast.Assert) and any(isinstance(m, ast.Attribute) and m.attr == "passed"
                                                           for m in ast.walk(n.test)) for n in ast.walk(tree))
    return [] if asserts_passed else calls


@pytest.mark.parametrize("path, sol", _CASES, ids=[f"{p.stem[:2]}-exercise-{s.key}" for p, s in _CASES])
def test_solution_asserts_its_checker_passed(path: Path, sol: Solution):
    bad = unasserted_checker_calls("\n".join(sol.blocks))
    assert not bad, (f"{path.name}, solution to exercise {sol.key}: calls {', '.join(bad)} without asserting the result "
                     "passed (e.g. `result = check_mha(MyMHA); assert result.passed; print(result)`)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_one_numbering_of_solutions(path: Path):
    """Each exercise label has one solution block (a repeated label means two numberings, or a solution split in two)."""
    labels = [s.label for s in extract_solutions(_load(path))]
    repeated = sorted({lab for lab in labels if labels.count(lab) > 1})
    assert not repeated, f"{path.name}: exercise label(s) {repeated} have more than one solution block: {labels}"


# --------------------------------------------------------------------------------------------------
# The extractor and the runner on small synthetic notebooks

def _nb(*cells: tuple[str, str]) -> dict:
    return {"cells": [{"cell_type": t, "metadata": {}, "source": s, **({"outputs": [], "execution_count": None}
                                                                       if t == "code" else {})} for t, s in cells]}


def _details(summary: str, code: str | None, blank: bool = True, prose: str = "") -> str:
    fence = f"```python\n{code}\n```\n" if code is not None else ""
    return f"<details>\n<summary>{summary}</summary>\n{chr(10) if blank else ''}{fence}{prose}\n</details>\n"


def test_extractor_finds_labels_blocks_and_ignores_other_summaries():
    nb = _nb(("code", "import math\nx = 2"),
             ("markdown", "## Exercises\n1. Do it.\n\n" + _details("<b>Hint</b>", "print('hint')")),
             ("markdown", _details("<b>Solution to exercise 1</b> (click to show)", "y = x + 1\nassert y == 3")),
             ("markdown", _details("Solution 4, discussion of 4b", "1/0")),
             ("markdown", _details("<b>Solution to exercise 3a</b>", "a = 1\n```\n\n```python\nb = a",
                                   prose="Some prose after the code.")),
             ("markdown", _details("<b>Solution to exercise 1</b>", "pass")),
             ("code", "z = 1"))
    sols = extract_solutions(nb)
    assert [(s.label, s.key, s.cell) for s in sols] == [("1", "1", 2), ("3a", "3a", 4), ("1", "1 (2)", 5)]
    assert sols[0].blocks == ["y = x + 1\nassert y == 3\n"]
    assert sols[1].blocks == ["a = 1\n", "b = a\n"]
    assert all(not s.problems for s in sols)
    assert setup_source(nb) == "import math\nx = 2"
    assert has_exercises_section(nb) and not has_exercises_section(_nb(("markdown", "## 8. Exercise-free section")))
    assert has_exercises_section(_nb(("markdown", "intro\n\n## 8. Exercises: write attention from memory")))


def test_extractor_reports_a_solution_without_code_and_malformed_blocks():
    nb = _nb(("markdown", _details("<b>Solution to exercise 2</b>", None, prose="Just words.")),
             ("markdown", _details("<b>Solution</b>", "pass")),
             ("markdown", _details("<b>Solution to exercise 5</b>", "pass", blank=False)),
             ("markdown", "<details>\n<summary><b>Solution to exercise 6</b></summary>\n\n```python\npass\n```\n"),
             ("markdown", _details("<b>Solution to exercise 7</b>", None, prose="```text\nnot python\n```")))
    problems = {s.key: " ".join(s.problems) for s in extract_solutions(nb)}
    assert "no ```python code block" in problems["2"]
    assert "names no exercise" in problems["?"]
    assert "no blank line" in problems["5"]
    assert "never closed" in problems["6"]
    assert details_blocks("text </details>")[1] == ["a </details> without its <details>"]
    assert "no ```python code block" in problems["7"]


def test_nested_details_stay_inside_their_solution():
    text = ("<details>\n<summary><b>Solution to exercise 1</b></summary>\n\n```python\nx = 1\n```\n\n"
            "<details><summary>Why</summary>\n\nbecause\n</details>\n\n```python\ny = 2\n```\n</details>\n")
    (sol,) = extract_solutions(_nb(("markdown", text)))
    assert sol.blocks == ["x = 1\n", "y = 2\n"] and not sol.problems


def test_runner_fails_a_raising_solution_and_isolates_namespaces(tmp_path: Path):
    nb = _nb(("code", "import os\nSETUP = os.getcwd()\nprint('setup ran')"),
             ("markdown", _details("<b>Solution to exercise 1</b>", "leak = 1\nassert SETUP == os.getcwd()")),
             ("markdown", _details("<b>Solution to exercise 2</b>", "assert 'leak' not in globals(), 'namespace reused'")),
             ("markdown", _details("<b>Solution to exercise 3</b>", "print('before')\nraise ValueError('planted failure')")),
             ("markdown", _details("<b>Solution to exercise 4</b>", "import os\nassert os.getcwd() == " + repr(str(tmp_path)))),
             ("markdown", _details("<b>Solution to exercise 5</b>", "display('shown')\nimport sys\nsys.exit(3)")))
    sols = extract_solutions(nb)
    res = run_solutions(setup_source(nb), sols, cwd=tmp_path, timeout=60)
    assert res["1"]["ok"] and res["2"]["ok"] and res["4"]["ok"], res
    assert not res["3"]["ok"] and "ValueError: planted failure" in res["3"]["traceback"]
    assert 'raise ValueError' in res["3"]["traceback"]  # the solution's own source line is in the traceback
    assert "setup ran" in res["3"]["output_tail"] and "before" in res["3"]["output_tail"]
    msg = _failure("x.ipynb", sols[2], res["3"])
    assert "x.ipynb, solution to exercise 3" in msg and "code block 1" in msg
    assert not res["5"]["ok"] and "SystemExit" in res["5"]["traceback"] and "shown" in res["5"]["output_tail"]


def _two_notebooks(tmp_path: Path, first: str, second: str) -> dict:
    """``first`` as notebook a's solution, then ``second`` as notebook b's, in one child."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sol = lambda code: extract_solutions(_nb(("markdown", _details("<b>Solution to exercise 1</b>", code))))  # noqa: E731
    res = run_groups([Group("a", "", sol(first), tmp_path / "a"), Group("b", "", sol(second), tmp_path / "b")], timeout=120)
    assert res["a"]["1"]["ok"], res["a"]["1"].get("traceback")
    assert res["b"]["1"]["ok"], res["b"]["1"].get("traceback")
    return res


def test_runner_gives_each_notebook_a_fresh_process_state(tmp_path: Path):
    """Two notebooks in one child: what the first changes (folder, environment, torch's default dtype and grad
    mode, matplotlib's rcParams) is as in a new process for the second."""
    pytest.importorskip("matplotlib")
    _two_notebooks(tmp_path,
                   "import os, torch, matplotlib\nos.environ['LEAK'] = '1'\n"
                   "torch.set_default_dtype(torch.float64); torch.set_grad_enabled(False)\n"
                   "matplotlib.rcParams['lines.linewidth'] = 9.0\n",
                   "import os, torch, matplotlib\nassert os.getcwd().endswith('b') and 'LEAK' not in os.environ\n"
                   "assert torch.get_default_dtype() == torch.float32, torch.get_default_dtype()\n"
                   "assert torch.is_grad_enabled()\nassert matplotlib.rcParams['lines.linewidth'] != 9.0\n")


def test_runner_shows_each_notebook_a_warning_already_shown_in_another(tmp_path: Path):
    """A warning is shown once per place in a process; the second notebook's kernel would show it again (no
    matplotlib here: resetting its rcParams would reset this record too, by the way)."""
    first = ("import sys, warnings\n"
             "def warn():\n    warnings.warn('shown in every notebook', UserWarning)\n"
             "sys.modules['__main__'].warn = warn\nwarn()\nwarn()\n")
    res = _two_notebooks(tmp_path, first, "import sys\nassert 'matplotlib' not in sys.modules\nsys.modules['__main__'].warn()\n")
    assert res["a"]["1"]["output"].count("UserWarning: shown in every notebook") == 1, res["a"]["1"]["output"]
    assert "UserWarning: shown in every notebook" in res["b"]["1"]["output"], res["b"]["1"]["output"]


def test_no_solution_sets_warning_filters():
    """The shared child keeps the warning filters that modules add on import (a new kernel has them too), so a
    setup cell or a solution that set one would leak it into later notebooks: none does."""
    calls = re.compile(r"\b(?:filterwarnings|simplefilter|resetwarnings)\(")
    found = [f"{p.name}: {'setup cell' if s is None else 'solution ' + s.key}"
             for p in NOTEBOOKS for s in [None, *extract_solutions(_load(p))]
             if calls.search(setup_source(_load(p)) if s is None else "\n".join(s.blocks))]
    assert not found, f"warning filters set in {found}: reset them in run_groups' _fresh_process_state"


def test_runner_reports_a_failing_setup_and_a_hang(tmp_path: Path):
    sols = extract_solutions(_nb(("markdown", _details("<b>Solution to exercise 1</b>", "pass"))))
    res = run_solutions("import no_such_module_here", sols, cwd=tmp_path, timeout=60)
    assert not res["1"]["ok"] and "setup cell" in res["1"]["stage"] and "ModuleNotFoundError" in res["1"]["traceback"]
    sols = extract_solutions(_nb(("markdown", _details("<b>Solution to exercise 1</b>", "pass")),
                                 ("markdown", _details("<b>Solution to exercise 2</b>", "import time\ntime.sleep(60)"))))
    res = run_solutions("", sols, cwd=tmp_path, timeout=3)
    assert res["1"]["ok"] and not res["2"]["ok"] and "more than 3 s" in res["2"]["traceback"]


def test_runner_uses_agg_and_closes_figures(tmp_path: Path):
    pytest.importorskip("matplotlib")
    nb = _nb(("markdown", _details("<b>Solution to exercise 1</b>",
                                   "import matplotlib\nassert matplotlib.get_backend().lower() == 'agg'\n"
                                   "import matplotlib.pyplot as plt\nplt.figure(); plt.plot([1, 2]); plt.show()")),
             ("markdown", _details("<b>Solution to exercise 2</b>",
                                   "import matplotlib.pyplot as plt\nassert plt.get_fignums() == [], plt.get_fignums()")))
    res = run_solutions("", extract_solutions(nb), cwd=tmp_path, timeout=60)
    assert res["1"]["ok"] and res["2"]["ok"], res


@pytest.mark.parametrize("code, bad", [
    ("r = check_mha(M)\nassert r.passed, r\nprint(r)", []),
    ("print(helpers.practice.check_rope_half(f))", ["check_rope_half"]),
    ("r = check_dropout(f)\nassert r", ["check_dropout"]),
    ("x = 1", []),
])
def test_unasserted_checker_calls(code, bad):
    assert unasserted_checker_calls(code) == bad


def test_hidden_code_cells_are_found():
    nb = _nb(("code", "x = 1"), ("code", "y = 2"))
    nb["cells"][1]["metadata"] = {"jupyter": {"source_hidden": True}}
    assert hidden_code_cells(nb) == [1]


def test_output_blocks_are_extracted_and_compared():
    code = "print('x =', 1.5)\nprint(roundoff)"
    text = (_details("<b>Solution to exercise 1</b>", code, prose="\n<!-- solution output -->\nIt prints:\n\n"
                     "```text\nx = 1.5\n2.4e-07 [round-off]\n```\n"))
    (sol,) = extract_solutions(_nb(("markdown", text)))
    assert sol.output == "x = 1.5\n2.4e-07 [round-off]\n" and not sol.trained and sol.blocks == [code + "\n"]
    assert comparable("x = 1.5\n3.1e-08 [round-off]\n", False) == comparable(sol.output, False)
    assert comparable("x = 1.6\n", False) != comparable("x = 1.5\n", False)
    assert comparable("loss 0.123 after 40 steps", True) == comparable("loss 0.119 after 41 steps", True)
    assert trains("opt.step()") and trains("loss.backward()") and trains("r = sweep(fn, seeds)") and not trains("x = 1")


if __name__ == "__main__":  # python tests/test_solutions.py --write notebooks/NN_name.ipynb [...]
    import argparse

    parser = argparse.ArgumentParser(description="Write each worked solution's output into its <details> fold.")
    parser.add_argument("--write", nargs="+", type=Path, required=True, metavar="NOTEBOOK")
    for nb_path in parser.parse_args().write:
        for line in write_outputs(nb_path.resolve()):
            print(line)
