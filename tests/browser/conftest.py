"""JupyterLab + headless Chromium fixtures for the browser tests (marker ``browser``).

A JupyterLab server is started on a free loopback port from a temporary copy of the
repository (autosave off, news pop-up off, a random token), and stopped by its own process
handle at the end, also when a test fails. Chromium is Debian's (/usr/bin/chromium), driven
by Playwright for Python (``playwright install`` cannot download browsers on the course machine);
elsewhere Playwright's own download (``python -m playwright install chromium``) is found too, or
any binary named by ``CHROMIUM_PATH``. Without Chromium the tests are skipped with the install
commands as reason (shown with ``pytest -rs``).

Screenshots (``screenshot_dir``, one folder per test under pytest's own temporary directory,
``--basetemp`` or ``pytest-of-USER/pytest-N``, of which pytest keeps the last three runs) are
kept only for a test that failed: the folder of a test that passed or was skipped is deleted
at its teardown, and a failing test's report names its folder. The temporary copy of the
repository that JupyterLab serves is deleted when the session ends.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest

try:
    import pristine  # noqa: E402  (tools/pristine.py, on the path from the root conftest)
except ModuleNotFoundError:  # imported by a conftest of its own (tests/browser/test_screenshots.py runs one)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import pristine  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
SKIP_REASON = ("Chromium not found: install it with `apt install chromium` (Debian/Ubuntu) or "
               "`python -m playwright install chromium` (macOS, Windows), or set CHROMIUM_PATH to a Chromium binary")

#: lines collected by the tests and printed in pytest's terminal summary
REPORT: list[str] = []
_CONFIG: list = []  # the session's config (pytest_configure), to tell a pytest-xdist worker from the controller


def report(request, lines: list[str]) -> None:
    """Add ``lines`` to the terminal summary. They travel with the test's report (``user_properties``), so that
    they reach the controller from a pytest-xdist worker, where the README's command runs the tests."""
    request.node.user_properties.append(("browser report", list(lines)))


def pytest_configure(config):
    _CONFIG[:] = [config]


def pytest_runtest_logreport(report):
    if report.when != "call" or (_CONFIG and hasattr(_CONFIG[0], "workerinput")):
        return  # a worker: its controller prints them
    for name, value in getattr(report, "user_properties", []):
        if name == "browser report":
            REPORT.extend(value)


def _playwright_chromium() -> str | None:
    """The Chromium that ``python -m playwright install chromium`` downloaded, if it did."""
    try:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            exe = p.chromium.executable_path
    except Exception:  # noqa: BLE001 - playwright missing or its driver unable to start: no browser
        return None
    return exe if exe and Path(exe).is_file() else None


@functools.lru_cache(maxsize=1)
def chromium_path() -> str | None:
    """The Chromium to drive, first found of: ``$CHROMIUM_PATH``, ``/usr/bin/chromium``,
    ``/usr/bin/chromium-browser``, ``chromium`` on the PATH, Playwright's own download."""
    for candidate in [os.environ.get("CHROMIUM_PATH", "")] + CHROMIUM_CANDIDATES:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium") or _playwright_chromium()


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.browser)


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("browser: explorer cells run times, slider latencies, screenshots")
        for line in REPORT:
            terminalreporter.write_line(line)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, url: str, token: str, root: Path):
        self.url, self.token, self.root = url, token, root

    def api(self, method: str, path: str):
        req = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def delete_sessions(self) -> None:
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")


_PHASES = pytest.StashKey[dict]()       # when -> TestReport of the test, filled by pytest_runtest_makereport
_SHOTS = pytest.StashKey[Path]()        # the test's screenshot folder


def keep_screenshots(reports: Mapping[str, object]) -> bool:
    """Whether a test's screenshots are kept, from its reports so far (``{"setup": report, "call": report}``,
    each with ``.failed``): kept when a phase failed or when the test never reached its call (an
    interrupted run); deleted when it passed or was skipped."""
    if any(getattr(r, "failed", False) for r in reports.values()):
        return True
    call = reports.get("call")
    setup = reports.get("setup")
    return call is None and not getattr(setup, "skipped", False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    item.stash.setdefault(_PHASES, {})[rep.when] = rep
    shots = item.stash.get(_SHOTS, None)
    if rep.failed and shots is not None and rep.when == "call":
        # a report section travels with the report (also from pytest-xdist workers) and prints with the failure
        rep.sections.append(("screenshots kept", f"screenshots of this test: {shots}"))


@pytest.fixture
def screenshot_dir(request, tmp_path_factory) -> Path:
    """A folder for this test's screenshots under pytest's temporary directory, deleted after the test
    unless it failed (:func:`keep_screenshots`)."""
    name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in request.node.name)[:60]
    path = tmp_path_factory.mktemp(f"screenshots-{name}")
    request.node.stash[_SHOTS] = path
    yield path
    if keep_screenshots(request.node.stash.get(_PHASES, {})) and any(path.iterdir()):
        REPORT.append(f"screenshots of the failed test {request.node.nodeid}: {path}")
    else:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    if chromium_path() is None:
        pytest.skip(SKIP_REASON)
    pytest.importorskip("playwright.sync_api", reason="playwright (pinned in requirements-dev.txt) is not installed")
    tmp = tmp_path_factory.mktemp("lab")
    # Always a temporary copy: autosave once overwrote a committed notebook with cleared outputs.
    root = tmp / "repo"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".git", "__pycache__", ".ipynb_checkpoints", "*.egg-info",
                                                              "*" + pristine.SUFFIX))
    for working, committed in pristine.mapping_from_env().items():  # the learner's edits are not what is tested
        shutil.copyfile(committed, root / Path(working).relative_to(REPO))
    settings = tmp / "settings"
    for rel, value in {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
        # every cell in the DOM, so that explorers far down the page can be found
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    }.items():
        f = settings / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root / 'notebooks'}",
        "--LabApp.expose_app_in_browser=True", f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        f"--LabApp.user_settings_dir={settings}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "lab.log", "w")
    # the kernels import the copy's helpers even where the editable install is missing or points elsewhere
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root, env=env)
    server = Lab(f"http://127.0.0.1:{port}", token, root)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}; log: {(tmp / 'lab.log').read_text()[-2000:]}")
            try:
                server.api("GET", "/api/status")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError("jupyter lab did not answer /api/status within 90 s")
                time.sleep(0.25)
        yield server
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)
        log.close()
        shutil.rmtree(root, ignore_errors=True)  # the copy JupyterLab served (lab.log stays beside it)


@pytest.fixture(scope="session")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def scratch_notebook(lab, browser, name: str, cells: list):
    """Write a notebook of ``cells`` (nbformat cells) as ``notebooks/<name>`` in the lab's copy, open it
    in a new page with no kernel session left from earlier tests, and yield the page once JupyterLab
    shows it; the page is closed and the file removed afterwards."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "notebooks" / name)
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    try:
        lab.delete_sessions()
        page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}&reset", wait_until="domcontentloaded")
        page.wait_for_function("() => !!window.jupyterapp && !!window.jupyterapp.shell.currentWidget && "
                               f"window.jupyterapp.shell.currentWidget.title.label === '{name}'", timeout=120_000)
        yield page
    finally:
        page.close()
        (lab.root / "notebooks" / name).unlink(missing_ok=True)
