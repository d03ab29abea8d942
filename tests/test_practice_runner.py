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
from helpers.practice.mha import SCAFFOLD
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
        q, k, v = (f(x).view(B, self.h, -1, self.d_k) for f, x in
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
    assert a.outcome.diagnosis == "wrong_split" and a.rating.name == "Again"
    assert "transpose(1, 2)" in a.outcome.report()
    assert "mha" in [s.id for s, why in p.due() if why != "new"]  # due again today
    fixed = MHA_NO_TRANSPOSE.replace("view(B, self.h, -1, self.d_k)", "view(B, -1, self.h, self.d_k).transpose(1, 2)")
    b = p.submit("mha", fixed, quiet=True)
    assert b.passed and b.rating.name == "Hard"


def test_solution_that_raises_is_a_fail_naming_the_card_and_the_rule():
    out = run_solution("causal_sdpa", "x = 1\ny = x / 0\n")
    assert not out.passed and out.diagnosis == "exception"
    assert "card 'causal_sdpa'" in out.report() and "ZeroDivisionError at line 2" in out.report()
    assert "must run top to bottom and define attention" in out.report()


def test_function_that_raises_is_reported_as_the_checker_does():
    out = run_solution("causal_sdpa", "def attention(q, k, v, causal=False):\n    raise ValueError('oops')\n")
    assert not out.passed and "raised ValueError: oops" in out.report()


def test_infinite_loop_is_stopped():
    out = run_solution("causal_sdpa", "while True:\n    pass\n", timeout=3)
    assert out.diagnosis == "timeout" and "took longer than 3 s" in out.report() and "card 'causal_sdpa'" in out.report()


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTN_PRACTICE")}
    env.update(ATTN_PRACTICE_STORE=str(tmp_path / "cli.sqlite3"), ATTN_PRACTICE_NOW="2026-12-01T09:00")
    return subprocess.run([sys.executable, "-m", "helpers.practice", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)


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
                            "ATTN_PRACTICE_NOW": "2026-12-01T09:00", "ATTN_PRACTICE_TIMEOUT": "3"})
    assert r.returncode == 1 and "took longer than 3 s" in r.stdout and "Rated Again" in r.stdout


def test_submit_records_and_real_store_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the user data folder, should anything reach it
    p = Practice(tmp_path / "s.sqlite3", now="2026-12-01T09:00")
    a = p.submit("causal_sdpa", SDPA, quiet=True)
    assert a.passed and a.rating.name == "Good"
    assert not (tmp_path / "home").exists()
