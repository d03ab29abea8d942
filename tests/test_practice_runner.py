"""The learner's code in a child process (helpers.practice.runner) and the terminal commands.

Bad input gets a clear error naming the card and the rule; every store is under tmp_path.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.practice.daily import Practice
from helpers.practice.deck import PracticeError
from helpers.practice.runner import run_solution

REPO = Path(__file__).resolve().parent.parent
SDPA = """
def attention(q, k, v, causal=False):
    print("shapes", tuple(q.shape))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        allowed = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
"""


def test_pass_and_prints_kept():
    out = run_solution("causal_sdpa", SDPA)
    assert out.passed and out.report().startswith("PASS")
    assert "shapes (2, 3, 5, 8)" in out.output and "Warning" not in out.output


MHA_NO_TRANSPOSE = """
class MyMHA(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.linear_q, self.linear_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.linear_v, self.linear_out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        B, d = query.size(0), self.h * self.d_k
        q, k, v = (f(x).view(B, -1, self.h, self.d_k) for f, x in
                   ((self.linear_q, query), (self.linear_k, key), (self.linear_v, value)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return self.linear_out((weights @ v).transpose(1, 2).contiguous().view(B, -1, d)), weights
"""


def test_mha_transpose_forgotten_is_named_and_rated_again_then_hard(tmp_path):
    p = Practice(tmp_path / "s.sqlite3", now="2026-12-01T09:00")
    a = p.submit("mha", MHA_NO_TRANSPOSE, quiet=True)
    assert a.outcome.diagnosis == "split_not_transposed" and a.rating.name == "Again"
    assert "Heads split without the transpose" in a.outcome.report() and "transpose(1, 2)" in a.outcome.report()
    assert "mha" in [s.id for s, why in p.due() if why != "new"]  # due again today
    fixed = MHA_NO_TRANSPOSE.replace("view(B, -1, self.h, self.d_k)", "view(B, -1, self.h, self.d_k).transpose(1, 2)")
    b = p.submit("mha", fixed, quiet=True)
    assert b.passed and b.rating.name == "Hard"


def test_a_process_or_thread_left_running_does_not_lose_the_pass():
    """A solution that starts a process (in the child's process group) or a non-daemon thread still gets
    its PASS at once; the process is killed with the group and no marker is printed."""
    import random
    import time

    marker = f"45.{random.randrange(10**6):06d}"  # this run's own sleep: another test run's is never counted
    for extra in (f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\n",
                  "import threading, time\nthreading.Thread(target=lambda: time.sleep(45)).start()\n"):
        t0 = time.monotonic()
        out = run_solution("causal_sdpa", extra + SDPA, timeout=40)
        assert out.passed and time.monotonic() - t0 < 35, out.report()
        assert "\x1e" not in out.output and "practice-verdicts" not in out.output
    left = subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True, text=True).stdout.split()
    assert left == [], f"sleep {marker} outlived its check: {left}"


def test_sys_exit_while_checked_is_a_fail_with_its_cause():
    out = run_solution("causal_sdpa", "import sys\ndef attention(q, k, v, causal=False):\n    sys.exit(0)\n")
    assert not out.passed and out.diagnosis == "exception"
    assert "raised SystemExit(0) at line 3 while it was being checked" in out.report(), out.report()


def test_solution_that_raises_is_a_fail_naming_the_card_and_the_rule():
    out = run_solution("causal_sdpa", "x = 1\ny = x / 0\n")
    assert not out.passed and out.diagnosis == "exception"
    assert "card 'causal_sdpa'" in out.report() and "ZeroDivisionError at line 2" in out.report()
    assert "must run top to bottom and define attention" in out.report()


def test_function_that_raises_is_reported_as_the_checker_does():
    out = run_solution("causal_sdpa", "def attention(q, k, v, causal=False):\n    raise ValueError('oops')\n")
    assert not out.passed and "raised ValueError: oops" in out.report()


def test_infinite_loop_is_stopped():
    """The learner's code reaches its loop (its line printed before the loop is kept) and the limit ends it.
    The limit counts from the child's start, so it must exceed the child's start-up (about 1 s: torch and
    helpers); the CLI test below uses 1 s, since it checks the report, not the loop."""
    out = run_solution("causal_sdpa", "print('looping', flush=True)\nwhile True:\n    pass\n", timeout=3)
    assert out.diagnosis == "timeout" and "took longer than 3 s" in out.report() and "card 'causal_sdpa'" in out.report()
    assert "looping" in out.output, out.output


def test_an_interrupted_check_leaves_nothing_running(tmp_path):
    """Interrupt (SIGINT, as JupyterLab's Interrupt sends to the kernel) while a check runs: the caller gets its
    KeyboardInterrupt and the child is killed, not left looping."""
    import signal
    import threading
    import time

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    pid_file = tmp_path / "pid"
    code = f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass\n"

    def interrupt():
        for _ in range(300):  # once the child has written its pid (within 30 s)
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            run_solution("causal_sdpa", code, timeout=60)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, old)
    pid = int(pid_file.read_text())
    state = "?"
    for _ in range(50):
        state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
        if state in ("", "Z"):
            break
        time.sleep(0.1)
    assert state in ("", "Z"), f"the interrupted check's child {pid} is still running ({state})"


def test_missing_name_and_unknown_card_are_errors():
    with pytest.raises(PracticeError, match=r"card 'causal_sdpa': your code does not define 'attention'.*rule"):
        run_solution("causal_sdpa", "def attn(q, k, v, causal=False):\n    return q\n")
    with pytest.raises(PracticeError, match="unknown card 'nope'"):
        run_solution("nope", "")
    with pytest.raises(PracticeError, match="ATTN_PRACTICE_TIMEOUT must be a number"):
        os.environ["ATTN_PRACTICE_TIMEOUT"] = "soon"
        try:
            run_solution("causal_sdpa", SDPA)
        finally:
            del os.environ["ATTN_PRACTICE_TIMEOUT"]


def _cli(tmp_path, *args):
    """``python -m helpers.practice ARGS`` run in this process (``main(argv)``, the module's entry point), with
    the store and clock of a fresh CLI user. Two tests below start the real module in a child process."""
    import contextlib
    import io
    from types import SimpleNamespace

    from helpers.practice.__main__ import main

    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    try:
        for k in [k for k in os.environ if k.startswith("ATTN_PRACTICE")]:
            del os.environ[k]
        os.environ.update(ATTN_PRACTICE_STORE=str(tmp_path / "cli.sqlite3"), ATTN_PRACTICE_NOW="2026-12-01T09:00")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # argparse's own errors
                code = e.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_cli_due_check_stats_export_import(tmp_path):
    r = _cli(tmp_path, "due")
    assert r.returncode == 0 and "13 card(s) due today, 13 of them new" in r.stdout
    sol = tmp_path / "sdpa.py"
    sol.write_text(SDPA)
    r = _cli(tmp_path, "check", "causal_sdpa", sol)
    assert r.returncode == 0 and "Rated Good (passed at the first try)" in r.stdout
    r = _cli(tmp_path, "stats")
    assert "new 12" in r.stdout and "2026-12-01 1" in r.stdout
    r = _cli(tmp_path, "export", tmp_path / "e.json")
    assert r.returncode == 0 and (tmp_path / "e.json").exists()
    r = _cli(tmp_path, "import", tmp_path / "e.json")  # its own export: nothing added
    assert r.returncode == 0 and "imported 0 review(s)" in r.stdout
    assert "2026-12-01 1" in _cli(tmp_path, "stats").stdout
    r = _cli(tmp_path, "show", "mha")
    assert r.returncode == 0 and "class MyMHA" in r.stdout


def test_cli_bad_input(tmp_path):
    r = _cli(tmp_path, "check", "mha", tmp_path / "missing.py")
    assert r.returncode == 2 and "card 'mha': solution file" in r.stderr and "does not exist (rule:" in r.stderr
    r = _cli(tmp_path, "show", "mhaa")
    assert r.returncode == 2 and "Did you mean 'mha'" in r.stderr
    (tmp_path / "loop.py").write_text("while True:\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "helpers.practice", "check", "causal_sdpa", str(tmp_path / "loop.py")],
                       capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "ATTN_PRACTICE_STORE": str(tmp_path / "cli.sqlite3"),
                            "ATTN_PRACTICE_NOW": "2026-12-01T09:00", "ATTN_PRACTICE_TIMEOUT": "1"})
    assert r.returncode == 1 and "took longer than 1 s" in r.stdout and "Rated Again" in r.stdout


def test_cli_import_errors_exit_2_naming_the_rule(tmp_path):
    for name, text in (("partial.json", '{"format": "attention-notebooks practice", "schema_version": 1}'),
                       ("poison.json", '{"format": "attention-notebooks practice", "schema_version": 1, '
                                       '"cards": {"mha": {"due": "soon"}}, "reviews": [], "hints": []}')):
        (tmp_path / name).write_text(text)
        r = _cli(tmp_path, "import", tmp_path / name)
        assert r.returncode == 2 and r.stderr.startswith("error: import: ") and "(rule: import takes" in r.stderr, r
        assert "Traceback" not in r.stderr
        r = _cli(tmp_path, "due")
        assert r.returncode == 0 and "13 of them new" in r.stdout  # nothing was written


def test_cli_names_the_flag_that_was_used(tmp_path):
    r = _cli(tmp_path, "--now", "tomorrow", "due")
    assert r.returncode == 2 and "practice clock (--now)" in r.stderr and "ATTN_PRACTICE_NOW" not in r.stderr
    (tmp_path / "x.sqlite3").write_text("not a database")
    r = _cli(tmp_path, "--store", tmp_path / "x.sqlite3", "due")
    assert r.returncode == 2 and "(from --store)" in r.stderr and "pass another --store" in r.stderr, r.stderr
    assert "ATTN_PRACTICE_STORE" not in r.stderr


def test_submit_records_and_real_store_untouched(tmp_path, monkeypatch):
    """The CLI child and the check child inherit conftest.py's temporary store and guard: with HOME and
    XDG_DATA_HOME moved into tmp_path, nothing is created there."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    p = Practice(tmp_path / "s.sqlite3", now="2026-12-01T09:00")
    a = p.submit("causal_sdpa", SDPA, quiet=True)
    assert a.passed and a.rating.name == "Good"
    env = {k: v for k, v in os.environ.items() if k != "ATTN_PRACTICE_STORE"}
    r = subprocess.run([sys.executable, "-m", "helpers.practice", "due"], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=120)
    assert r.returncode == 2 and "never used" in r.stderr, r  # the guard, not the user data folder
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()


def test_walkthrough_cells_are_skipped_outside_the_demo(tmp_path, capsys):
    """Notebook 00 with ATTN_PRACTICE_DEMO=0: a %%submit cell marked demo never reaches the learner's store."""
    from IPython.core.interactiveshell import InteractiveShell

    from helpers.practice.daily import register_magic

    shell = InteractiveShell.instance()
    p = Practice(tmp_path / "s.sqlite3", now="2026-12-01T09:00")
    register_magic(p, walkthrough=False)
    shell.run_cell_magic("submit", "causal_sdpa demo", SDPA)
    assert "not checked outside the demo mode" in capsys.readouterr().out
    assert p.reviews() == []
