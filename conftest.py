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
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

_seen: set[str] = set()


def _write(config, text: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(text, bold=True)


def pytest_runtest_logstart(nodeid: str, location) -> None:
    path = nodeid.split("::", 1)[0]
    if path.endswith(".ipynb") and path not in _seen:
        _seen.add(path)
        _write(_CONFIG, f"[nbval] {Path(path).name}: re-executing every cell and comparing its outputs")
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


def pytest_unconfigure(config) -> None:
    while _PRACTICE_TMP:
        shutil.rmtree(_PRACTICE_TMP.pop(), ignore_errors=True)


def pytest_sessionstart(session) -> None:
    ipython_dir = os.environ.get("IPYTHONDIR", "")
    if Path(ipython_dir).resolve() == (Path(__file__).resolve().parent / "tests" / "perturbed_arithmetic" / "ipython"):
        _write(session.config, "[perturbed arithmetic] every kernel nbval starts moves torch's order-dependent "
                               "results by one ulp (tests/perturbed_arithmetic/perturb.py)")
