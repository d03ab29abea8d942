"""Progress lines for the one test command (`python -m pytest`).

pytest's quiet output shows one dot per test and nothing else, so the minutes of nbval
(every notebook re-executed cell by cell) and of the browser tests (JupyterLab in headless
Chromium) looked hung. These hooks name each notebook as nbval starts it and
announce the browser part before it begins. They only print; they change no test.

One guard (issue 33): no test and no nbval kernel may touch a learner's practice store. Before any
test runs, ``ATTN_PRACTICE_STORE`` is pointed at a file in a fresh temporary folder (removed at the
end), ``ATTN_PRACTICE_TESTING=1`` makes ``helpers.practice.store.store_path`` refuse the user data
folder, and ``ATTN_PRACTICE_DEMO=1`` keeps notebook 00 in its demo mode. Kernels started by nbval
inherit the environment, so this holds for the notebooks too.

A second guard (issue 32): studying must not break the check. Where a learner's working copy of a
notebook differs from the committed one (cells run, notes added, JupyterLab's autosave), the test
command tests the committed version instead (``tools/pristine.py``: a hidden copy beside it, removed
at the end) and names the edited notebooks at the start and at the end. ``--working-notebooks`` tests the
working copies instead (a contributor's regenerated notebooks before a commit), and so does naming a
notebook's file on the command line.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
import pristine  # noqa: E402  (tools/pristine.py)

_seen: set[str] = set()
_PRISTINE: dict[str, str] = {}   # working copy -> committed copy (this process's view)
_WROTE: list[dict[str, str]] = []  # the copies this process wrote (the controller), removed at the end


def pytest_addoption(parser) -> None:
    parser.addoption("--working-notebooks", action="store_true", default=False,
                     help="test the working copies of the notebooks even where they differ from the committed "
                          "version (by default the committed version is tested and the edited ones are named)")


def _display(path: str) -> str:
    name = Path(path).name
    if name.startswith(".") and name.endswith(pristine.SUFFIX):
        return pristine.working_name(name) + " (the committed version; your copy differs)"
    return name


def _write(config, text: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(text, bold=True)


def pytest_runtest_logstart(nodeid: str, location) -> None:
    path = nodeid.split("::", 1)[0]
    if path.endswith(".ipynb") and path not in _seen:
        _seen.add(path)
        _write(_CONFIG, f"[nbval] {_display(path)}: re-executing every cell and comparing its outputs")
    elif "/browser/" in path and "browser" not in _seen:
        _seen.add("browser")
        _write(_CONFIG, "[browser] JupyterLab in headless Chromium: the cells each explorer needs run, every slider moved "
                        "(a few minutes)")


_CONFIG = None


_PRACTICE_TMP: list[str] = []


def pytest_configure(config) -> None:
    global _CONFIG
    _CONFIG = config
    folder = tempfile.mkdtemp(prefix="attn-practice-tests-")
    _PRACTICE_TMP.append(folder)
    os.environ["ATTN_PRACTICE_STORE"] = os.path.join(folder, "practice.sqlite3")
    os.environ["ATTN_PRACTICE_TESTING"] = "1"
    os.environ["ATTN_PRACTICE_DEMO"] = "1"
    _PRISTINE.clear()
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller wrote the copies
        _PRISTINE.update(pristine.mapping_from_env())
    elif config.getoption("--working-notebooks"):
        os.environ.pop(pristine.ENV, None)
    else:
        named = {str(Path(a.split("::")[0]).resolve()) for a in config.args}  # a notebook named on the
        edited = [p for p in pristine.edited_notebooks(ROOT) if str(p) not in named]  # command line is tested as it is
        mapping = pristine.write_pristine_copies(ROOT, edited)
        _WROTE.append(mapping)
        _PRISTINE.update(mapping)
        os.environ[pristine.ENV] = json.dumps(mapping)


def pytest_ignore_collect(collection_path, config):
    """An edited notebook is replaced by its committed copy; a stale copy (a killed run's) is never collected."""
    path = str(Path(collection_path).resolve())
    if path in _PRISTINE:
        return True
    name = Path(collection_path).name
    if name.startswith(".") and name.endswith(pristine.SUFFIX) and path not in _PRISTINE.values():
        return True
    return None


def _edited_lines() -> list[str]:
    names = sorted(Path(p).relative_to(ROOT).as_posix() for p in _PRISTINE)
    if not names:
        return []
    return ([f"[your notebooks] {len(names)} differ from the committed version (your runs and notes): "
             + ", ".join(Path(n).name for n in names) + ".",
             "  The tests ran the committed versions instead; your copies were left as they are, untested.",
             "  To get a pristine copy back: git restore " + " ".join(names)])


def pytest_report_header(config):
    return _edited_lines() or None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in _edited_lines():
        terminalreporter.write_line(line, bold=line.startswith("["))


def pytest_unconfigure(config) -> None:
    while _WROTE:
        pristine.remove_pristine_copies(_WROTE.pop())
    while _PRACTICE_TMP:
        shutil.rmtree(_PRACTICE_TMP.pop(), ignore_errors=True)


def pytest_sessionstart(session) -> None:
    ipython_dir = os.environ.get("IPYTHONDIR", "")
    if Path(ipython_dir).resolve() == (Path(__file__).resolve().parent / "tests" / "perturbed_arithmetic" / "ipython"):
        _write(session.config, "[perturbed arithmetic] every kernel nbval starts moves torch's order-dependent "
                               "results by one ulp (tests/perturbed_arithmetic/perturb.py)")
