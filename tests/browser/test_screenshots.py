"""The browser tests keep screenshots only for a failing test, under pytest's temporary directory
(issue 23: every run used to leave about 5 MB in the system temp folder). No browser needed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from .conftest import keep_screenshots

REPO = Path(__file__).resolve().parents[2]


def _rep(outcome: str) -> SimpleNamespace:
    return SimpleNamespace(failed=outcome == "failed", skipped=outcome == "skipped", passed=outcome == "passed")


@pytest.mark.parametrize("phases, keep", [
    ({"setup": "passed", "call": "passed"}, False),
    ({"setup": "passed", "call": "failed"}, True),
    ({"setup": "failed"}, True),
    ({"setup": "skipped"}, False),                    # no Chromium: skipped in setup (the lab fixture)
    ({"setup": "passed", "call": "skipped"}, False),
    ({"setup": "passed"}, True),                      # interrupted before the call reported
])
def test_which_screenshots_are_kept(phases, keep):
    assert keep_screenshots({when: _rep(o) for when, o in phases.items()}) is keep


def test_the_fixture_deletes_a_passing_tests_folder_and_names_a_failing_ones(tmp_path: Path):
    (tmp_path / "conftest.py").write_text("from tests.browser.conftest import screenshot_dir, pytest_runtest_makereport\n")
    (tmp_path / "test_shots.py").write_text(
        "def test_ok(screenshot_dir):\n    (screenshot_dir / 'a.png').write_bytes(b'png')\n\n"
        "def test_bad(screenshot_dir):\n    (screenshot_dir / 'b.png').write_bytes(b'png')\n    assert False, 'planted'\n")
    base = tmp_path / "basetemp"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           f"--basetemp={base}", "test_shots.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr
    kept = sorted(p.relative_to(base).as_posix() for p in base.rglob("*.png"))
    assert len(kept) == 1 and kept[0].startswith("screenshots-test_bad") and kept[0].endswith("/b.png"), kept
    assert not [p for p in base.iterdir() if p.name.startswith("screenshots-test_ok")]
    assert f"screenshots of this test: {base / Path(kept[0]).parent}" in proc.stdout, proc.stdout
