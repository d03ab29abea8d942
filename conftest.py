"""Progress lines for the one test command (`python -m pytest`).

pytest's quiet output shows one dot per test and nothing else, so the minutes of nbval
(every notebook re-executed cell by cell) and of the browser tests (JupyterLab in headless
Chromium) looked hung. These hooks name each notebook as nbval starts it and
announce the browser part before it begins. They only print; they change no test.
"""
from __future__ import annotations

import os
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


def pytest_configure(config) -> None:
    global _CONFIG
    _CONFIG = config


def pytest_sessionstart(session) -> None:
    ipython_dir = os.environ.get("IPYTHONDIR", "")
    if Path(ipython_dir).resolve() == (Path(__file__).resolve().parent / "tests" / "perturbed_arithmetic" / "ipython"):
        _write(session.config, "[perturbed arithmetic] every kernel nbval starts moves torch's order-dependent "
                               "results by one ulp (tests/perturbed_arithmetic/perturb.py)")
