"""JupyterLab + headless Chromium fixtures for the browser tests (marker ``browser``).

A JupyterLab server is started on a free loopback port from a temporary copy of the
repository (autosave off, news pop-up off, a random token), and stopped by its own process
handle at the end, also when a test fails. Chromium is Debian's (/usr/bin/chromium), driven
by Playwright for Python; ``playwright install`` cannot download browsers on the course
machine, so without Chromium the tests are skipped with the install command as reason.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
SKIP_REASON = "Chromium not found: install it with `apt-get install chromium` (Debian) to run the browser tests"

#: lines collected by the tests and printed in pytest's terminal summary
REPORT: list[str] = []


def chromium_path() -> str | None:
    for candidate in [os.environ.get("CHROMIUM_PATH", "")] + CHROMIUM_CANDIDATES:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium")


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


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "attention-notebooks-browser" / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    REPORT.append(f"screenshots: {path}")
    return path


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    if chromium_path() is None:
        pytest.skip(SKIP_REASON)
    pytest.importorskip("playwright.sync_api", reason="playwright (pinned in requirements.txt) is not installed")
    tmp = tmp_path_factory.mktemp("lab")
    # Always a temporary copy: autosave once overwrote a committed notebook with cleared outputs.
    root = tmp / "repo"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".git", "__pycache__", ".ipynb_checkpoints", "*.egg-info"))
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
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
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
